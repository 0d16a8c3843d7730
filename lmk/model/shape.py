"""An encoder's shape and what follows from it: parameter count and FLOPs per token.

`encoder_shape(encoder)` is the one way the project sizes an `encoder:` config section without loading weights:
its config.json (shipped in lmk/resources, a local folder, the Hugging Face cache) or, for a hub encoder whose
config is not on disk yet, the public config values in `PUBLISHED_CONFIGS`. The training memory estimate
(`lmk.train.memory`) and the sweep's cost estimate (`lmk.sweep.cost`) both read it.

FLOPs per token of a forward pass: 2 x the matmul weights of every layer + the attention scores and weighted
values (2 x 2 x span x width per layer, the span being the sliding window on ModernBERT's local layers).

Decoders (Llama, Mistral, Granite, Qwen: `DECODER_TYPES`) have grouped-query attention (`kv_heads` key/value heads,
`head_dim` each), a SwiGLU MLP and RMSNorm without biases. A LoRA adapter (`encoder.lora`) adds r x (in + out)
trainable weights per target module and layer (`lora_params`), and the tensors its own backward needs
(`lora_activation_bytes`); the base weights stay frozen.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lmk.config.schema import get_key
from lmk.model.config_files import SHIPPED_CONFIGS, load_config_json, package_model_path

_XLMR_LARGE = {"model_type": "xlm-roberta", "num_hidden_layers": 24, "hidden_size": 1024,
               "intermediate_size": 4096, "num_attention_heads": 16, "vocab_size": 250002}
# The sizing keys of public config.json files, for hub encoders whose config is not on disk before a download (`python -m lmk.download`).
PUBLISHED_CONFIGS: dict[str, dict[str, Any]] = {
    "answerdotai/ModernBERT-large": {
        "model_type": "modernbert", "num_hidden_layers": 28, "hidden_size": 1024, "intermediate_size": 2624,
        "num_attention_heads": 16, "vocab_size": 50368, "max_position_embeddings": 8192, "local_attention": 128,
        "global_attn_every_n_layers": 3},
    "BAAI/bge-m3": {**_XLMR_LARGE, "max_position_embeddings": 8194},
    "FacebookAI/xlm-roberta-large": {**_XLMR_LARGE, "max_position_embeddings": 514},
    "google-bert/bert-base-uncased": {
        "model_type": "bert", "num_hidden_layers": 12, "hidden_size": 768, "intermediate_size": 3072,
        "num_attention_heads": 12, "vocab_size": 30522, "max_position_embeddings": 512},
    # the decoders of the authors' decoder recipe (conf/encoder/): their published config.json sizes; granite-4.1-8b
    # from IBM's Granite 4.1 model card (40 layers, 4096 wide, 32 heads / 8 KV heads of 128, SwiGLU 12800, 100k vocab)
    "ibm-granite/granite-4.1-8b": {
        "model_type": "granite", "num_hidden_layers": 40, "hidden_size": 4096, "intermediate_size": 12800,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 100352,
        "max_position_embeddings": 131072},
    "ibm-granite/granite-3.3-8b-instruct": {
        "model_type": "granite", "num_hidden_layers": 40, "hidden_size": 4096, "intermediate_size": 12800,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 49159, "max_position_embeddings": 131072},
    "mistralai/Mistral-7B-v0.3": {
        "model_type": "mistral", "num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 14336,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 32768,
        "max_position_embeddings": 32768},
}
DECODER_TYPES = ("llama", "mistral", "granite", "qwen2", "qwen3")  # GQA, SwiGLU, RMSNorm: sized alike
# a LoRA target module -> its (input, output) width, by the names Llama-like blocks give their projections
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class EncoderShape:
    """The sizes that set an encoder's parameters, FLOPs and activation memory."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    vocab: int
    gated_mlp: bool = True  # GeGLU (ModernBERT): Wi maps hidden -> 2 x intermediate
    biases: bool = False
    max_positions: int = 8192
    local_window: int | None = None  # sliding-window layers attend to this many tokens
    global_every: int = 1  # every n-th layer attends globally (ModernBERT: 3)
    kv_heads: int | None = None  # grouped-query attention: key/value heads (None: one per query head)
    head_dim: int | None = None  # None: hidden / heads
    decoder: bool = False  # a Llama-like block (DECODER_TYPES)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> EncoderShape:
        """From a Hugging Face config dict (ModernBERT; BERT-like models: ungated MLP with biases)."""
        model_type = config.get("model_type", "modernbert")
        modern = model_type == "modernbert"
        if model_type in DECODER_TYPES:
            return cls._decoder(config)
        try:
            return cls(
                layers=int(config["num_hidden_layers"]), hidden=int(config["hidden_size"]),
                intermediate=int(config["intermediate_size"]), heads=int(config["num_attention_heads"]),
                vocab=int(config["vocab_size"]), gated_mlp=modern,
                biases=bool(config.get("attention_bias", False)) if modern else True,
                max_positions=int(config.get("max_position_embeddings", 512)),
                local_window=int(config["local_attention"]) if modern and config.get("local_attention") else None,
                global_every=int(config.get("global_attn_every_n_layers", 1)) if modern else 1,
            )
        except KeyError as e:
            raise ValueError(f"model config lacks {e.args[0]!r}: cannot size the encoder (model_type={model_type})") from e

    @classmethod
    def _decoder(cls, config: Mapping[str, Any]) -> EncoderShape:
        try:
            heads = int(config["num_attention_heads"])
            return cls(layers=int(config["num_hidden_layers"]), hidden=int(config["hidden_size"]),
                       intermediate=int(config["intermediate_size"]), heads=heads, vocab=int(config["vocab_size"]),
                       gated_mlp=True, biases=False, max_positions=int(config.get("max_position_embeddings", 4096)),
                       kv_heads=int(config.get("num_key_value_heads") or heads),
                       head_dim=int(config["head_dim"]) if config.get("head_dim") else None, decoder=True)
        except KeyError as e:
            raise ValueError(f"model config lacks {e.args[0]!r}: cannot size the decoder "
                             f"(model_type={config.get('model_type')})") from e

    @property
    def q_dim(self) -> int:
        return self.heads * (self.head_dim or self.hidden // self.heads)

    @property
    def kv_dim(self) -> int:
        return (self.kv_heads or self.heads) * (self.head_dim or self.hidden // self.heads)

    # ---- parameters ---------------------------------------------------------------------------
    def layer_params(self) -> int:
        h, i = self.hidden, self.intermediate
        if self.decoder:  # q, k, v, o projections (GQA), SwiGLU gate / up / down, two RMSNorms; no biases
            return 2 * h * self.q_dim + 2 * h * self.kv_dim + 3 * h * i + 2 * h
        attn = 4 * h * h + (4 * h if self.biases else 0)
        mlp = h * i * (3 if self.gated_mlp else 2) + ((2 * i + h) if self.biases and self.gated_mlp else 0)
        if self.biases and not self.gated_mlp:
            mlp += i + h
        norms = 2 * h * (2 if self.biases else 1)
        return attn + mlp + norms

    def params(self) -> int:
        """Parameter count, embeddings included (ModernBERT-base: 149,014,272; a decoder's final norm included, its LM
        head not: an embedding model loads the base model)."""
        embed = self.vocab * self.hidden + self.hidden  # tokens + embedding norm
        if not self.gated_mlp:  # BERT-like: absolute positions, token types, norm bias
            embed += self.max_positions * self.hidden + 2 * self.hidden + self.hidden
        layers = self.layers * self.layer_params()
        # ModernBERT adds a final norm, and its first layer has no attention norm: the two cancel out
        return embed + layers

    # ---- FLOPs --------------------------------------------------------------------------------
    def attention_span(self, layer: int, seq_len: float) -> float:
        if self.local_window is None or layer % self.global_every == 0:
            return seq_len
        return min(seq_len, self.local_window)

    def forward_flops_per_token(self, seq_len: float) -> float:
        """2 x the matmul weights per token + attention scores and weighted values (2 x 2 x span x h)."""
        dense = 2 * self.layers * self.layer_params()
        attention = sum(4 * self.attention_span(layer, seq_len) * self.q_dim for layer in range(self.layers))
        return float(dense + attention)

    @staticmethod
    def train_passes(checkpointing: bool = False, grad_cache: bool = False, frozen: bool = False) -> int:
        """Forward-pass equivalents per training token, as `lmk.train` runs them: forward + backward (2x a
        forward; 1x when the base weights are frozen under LoRA: input gradients only, no weight gradients),
        + the forward gradient checkpointing recomputes, + grad cache's first no-grad embedding pass
        (lmk.train.gradcache: embed without grad, loss, then each chunk forward + backward again)."""
        return 3 - int(frozen) + int(checkpointing) + int(grad_cache)

    def train_flops_per_token(self, seq_len: float, checkpointing: bool = False, grad_cache: bool = False,
                              lora: Mapping[str, Any] | None = None) -> float:
        """FLOPs per training token: `train_passes` x a forward; with LoRA the frozen base's backward is one
        forward, and the adapters' own weights cost a full forward + backward (+ recompute, + cache pass)."""
        base = self.train_passes(checkpointing, grad_cache, frozen=lora is not None) * self.forward_flops_per_token(seq_len)
        if lora is None:
            return base
        return base + self.train_passes(checkpointing, grad_cache) * 2.0 * self.lora_params(lora)

    # ---- LoRA ---------------------------------------------------------------------------------
    def module_widths(self) -> dict[str, tuple[int, int]]:
        """(input, output) width of each projection a LoRA adapter can target (`LORA_MODULES`)."""
        h, i, q, kv = self.hidden, self.intermediate, self.q_dim, self.kv_dim
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h), "gate_proj": (h, i),
                "up_proj": (h, i), "down_proj": (i, h)}

    def _targets(self, lora: Mapping[str, Any]) -> list[tuple[int, int]]:
        widths = self.module_widths()
        unknown = [t for t in lora["target_modules"] if t not in widths]
        if unknown:
            raise ValueError(f"lora.target_modules {unknown} cannot be sized; known: {', '.join(LORA_MODULES)}")
        return [widths[t] for t in lora["target_modules"]]

    def lora_params(self, lora: Mapping[str, Any]) -> int:
        """Trainable adapter weights (A: r x in, B: out x r per target module and layer; peft adds no bias)."""
        return self.layers * sum(int(lora["r"]) * (i + o) for i, o in self._targets(lora))

    def lora_activation_bytes(self, compute_bytes: int, lora: Mapping[str, Any]) -> int:
        """Bytes per token per layer the adapters keep for their backward: A's output (r) per module, and with
        dropout on each module's own dropped-out input and its mask (peft drops out per module)."""
        targets = self._targets(lora)
        kept = len(targets) * int(lora["r"]) * compute_bytes
        if float(lora.get("dropout") or 0) > 0:
            kept += sum(i * (compute_bytes + 1) for i, _ in targets)
        return kept

    # ---- memory -------------------------------------------------------------------------------
    def layer_activation_bytes(self, compute_bytes: int, stream_bytes: int) -> int:
        """Bytes autograd keeps per token for one layer (lmk.train.memory says what they are)."""
        h, i, a, s = self.hidden, self.intermediate, compute_bytes, stream_bytes
        mlp = 4 * a * i if self.gated_mlp else 2 * a * i + a * i
        # two norm outputs, q/k/v, rotated q/k and the attention output (8h without grouped-query attention)
        attention = a * (2 * h + 3 * self.q_dim + 3 * self.kv_dim)
        return 2 * s * h + attention + mlp


def _base_config(encoder: Any) -> dict[str, Any]:
    """The config dict an `encoder:` section starts from (before its `config_overrides`)."""
    get = functools.partial(get_key, encoder)
    spec, model_id = get("config"), get("model_id")
    if spec:
        return load_config_json(str(spec))
    if model_id and (model_id in SHIPPED_CONFIGS or os.path.isdir(os.path.expanduser(model_id))):
        return load_config_json(model_id)
    if model_id:
        from transformers import AutoConfig  # fast path: transformers (with torch) only for a hub config

        try:
            return AutoConfig.from_pretrained(model_id, local_files_only=True).to_dict()
        except OSError as e:
            if model_id in PUBLISHED_CONFIGS:
                return dict(PUBLISHED_CONFIGS[model_id])
            raise ValueError(f"encoder {model_id!r}: no local config to size it; download it into the Hugging Face "
                             f"cache, point encoder.model_id at a local folder, or add its sizes to "
                             f"lmk.model.shape.PUBLISHED_CONFIGS ({e})") from e
    if get("source") == "package" and get("package"):
        return load_config_json(package_model_path(get("package")))
    if get("architecture"):
        # random init: the vocabulary comes from the tokenizer at build time (not sized here unless
        # config_overrides names vocab_size)
        from transformers import AutoConfig  # fast path: (as above) only for a random init

        return AutoConfig.for_model(get("architecture")).to_dict()
    raise ValueError("encoder config names no model config (config, model_id, package or architecture)")


def encoder_shape(encoder: Any) -> EncoderShape:
    """The shape of an `encoder:` config section (mapping, DictConfig or EncoderConfig), without loading weights
    or touching the network: `config` (a shipped resource name or a config.json path) or a shipped hub id, a local
    model folder, a cached hub config, a published one, or transformers' defaults for a random-init
    `architecture`; then `config_overrides` on top."""
    base = _base_config(encoder)
    base.update(dict(get_key(encoder, "config_overrides", None) or {}))
    return EncoderShape.from_config(base)
