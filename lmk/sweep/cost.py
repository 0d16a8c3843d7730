"""Model-size maths: parameter count, FLOPs per token and per-device training memory of an encoder.

One place for the numbers the paper-scale dry run prints (memory per device against the GPU's) and the
cost estimate builds on (training FLOPs = tokens x `train_flops_per_token`). Pure arithmetic on an
`EncoderShape` (layers, hidden, intermediate, heads, vocabulary): nothing is allocated, so the paper's
ModernBERT-base x 256 queries x 8 passages is estimated on a laptop in microseconds.

The memory model (bytes per token per layer, `layer_activation_bytes`) counts the tensors autograd saves
in one pre-norm transformer layer (ModernBERT: GeGLU MLP, no biases, no dropout):
  attention: norm input (stream) + norm output, fused QKV, rotated q/k, attention output  -> s*h + 7a*h
  MLP:       norm input (stream) + norm output, Wi output (2I), GELU output, gated product -> s*h + a*h + 4a*I
with `a` the compute dtype's bytes and `s` the residual stream's. Under bf16-mixed the linear layers run in
bf16 but the residual stream stays float32 (fp32 embeddings + bf16 branch outputs promote to fp32), so
`s` = 4 there: that is why checkpointed activations of 256 x 8 x 512 tokens are about 70 GB.
Gradient checkpointing keeps only each layer's input (s*h per token per layer) plus one layer's full
activations while it is recomputed; gradient caching bounds the tokens in flight to one chunk.
`overhead` (CUDA context, cuBLAS workspace, allocator fragmentation) is an assumption; the GPU check
(`make gpu-check`) measures the real peak next to this estimate.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from transformers import AutoConfig

from lmk.config import to_container
from lmk.config.schema import get_key as _get
from lmk.model.backbone import SHIPPED_CONFIGS, load_config_json, package_model_path

GIB = 1024**3
MIXED = ("16-mixed", "bf16-mixed", "16", "bf16")
HALF_TRUE = ("16-true", "bf16-true")
CONTEXT_OVERHEAD_GIB = 1.5  # CUDA context + cuBLAS/cuDNN workspaces (assumed)
FRAGMENTATION = 0.10  # allocator slack on top of activations (assumed)
GPU_CHECK_JSON = "outputs/gpu_check/gpu_check.json"  # where `make gpu-check` writes its report


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

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> EncoderShape:
        """From a Hugging Face config dict (ModernBERT; BERT-like models: ungated MLP with biases)."""
        model_type = config.get("model_type", "modernbert")
        modern = model_type == "modernbert"
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

    # ---- parameters ---------------------------------------------------------------------------
    def layer_params(self) -> int:
        h, i = self.hidden, self.intermediate
        attn = 4 * h * h + (4 * h if self.biases else 0)
        mlp = h * i * (3 if self.gated_mlp else 2) + ((2 * i + h) if self.biases and self.gated_mlp else 0)
        if self.biases and not self.gated_mlp:
            mlp += i + h
        norms = 2 * h * (2 if self.biases else 1)
        return attn + mlp + norms

    def params(self) -> int:
        """Parameter count, embeddings included (ModernBERT-base: 149,014,272)."""
        embed = self.vocab * self.hidden + self.hidden  # tokens + embedding norm
        if not self.gated_mlp:  # BERT-like: absolute positions, token types, norm bias
            embed += self.max_positions * self.hidden + 2 * self.hidden + self.hidden
        layers = self.layers * self.layer_params()
        # ModernBERT adds a final norm, and its first layer has no attention norm: the two cancel out
        return embed + layers

    # ---- FLOPs --------------------------------------------------------------------------------
    def attention_span(self, layer: int, seq_len: int) -> int:
        if self.local_window is None or layer % self.global_every == 0:
            return seq_len
        return min(seq_len, self.local_window)

    def forward_flops_per_token(self, seq_len: int) -> float:
        """2 x the matmul weights per token + attention scores and weighted values (2 x 2 x span x h)."""
        dense = 2 * self.layers * self.layer_params()
        attention = sum(4 * self.attention_span(layer, seq_len) * self.hidden for layer in range(self.layers))
        return float(dense + attention)

    @staticmethod
    def train_passes(checkpointing: bool = False, grad_cache: bool = False) -> int:
        """Forward-pass equivalents per training token, as `lmk.train` runs them: forward + backward (2x a
        forward), + the forward gradient checkpointing recomputes, + grad cache's first no-grad embedding
        pass (lmk.train.gradcache: embed without grad, loss, then each chunk forward + backward again)."""
        return 3 + int(checkpointing) + int(grad_cache)

    def train_flops_per_token(self, seq_len: int, checkpointing: bool = False, grad_cache: bool = False) -> float:
        """FLOPs per training token: `train_passes` x a forward."""
        return self.train_passes(checkpointing, grad_cache) * self.forward_flops_per_token(seq_len)

    # ---- memory -------------------------------------------------------------------------------
    def layer_activation_bytes(self, compute_bytes: int, stream_bytes: int) -> int:
        """Bytes autograd keeps per token for one layer (see the module docstring)."""
        h, i, a, s = self.hidden, self.intermediate, compute_bytes, stream_bytes
        mlp = 4 * a * i if self.gated_mlp else 2 * a * i + a * i
        return 2 * s * h + 8 * a * h + mlp


@dataclass(frozen=True)
class Precision:
    """Bytes per element of weights, the compute dtype and the residual stream."""

    weight_bytes: int
    compute_bytes: int
    stream_bytes: int
    autocast_copy: bool  # autocast caches a half copy of every weight during the forward

    @classmethod
    def of(cls, trainer_precision: Any = "32-true", weight_dtype: str = "float32") -> Precision:
        p = str(trainer_precision)
        w = 2 if weight_dtype in ("bfloat16", "float16") or p in HALF_TRUE else 4
        if p in MIXED:
            # fp32 master weights + half compute; half weights (encoder.dtype) stream in half too
            return cls(weight_bytes=w, compute_bytes=2, stream_bytes=w, autocast_copy=w == 4)
        return cls(weight_bytes=w, compute_bytes=w, stream_bytes=w, autocast_copy=False)


@dataclass
class MemoryEstimate:
    """Per-device training memory in bytes, by component."""

    weights: float
    grads: float
    optimizer: float
    autocast_weights: float
    ddp_buckets: float
    activations: float
    attention_masks: float
    loss: float
    overhead: float
    tokens_in_flight: int
    notes: list[str] = field(default_factory=list)

    COMPONENTS = ("weights", "grads", "optimizer", "autocast_weights", "ddp_buckets", "activations",
                  "attention_masks", "loss", "overhead")

    @property
    def total(self) -> float:
        return sum(getattr(self, k) for k in self.COMPONENTS)

    def gib(self) -> dict[str, float]:
        out = {k: round(getattr(self, k) / GIB, 2) for k in self.COMPONENTS}
        out["total"] = round(self.total / GIB, 2)
        return out

    def fits(self, gpu_memory_gb: float) -> bool:
        return self.total <= gpu_memory_gb * GIB

    def summary(self, gpu_memory_gb: float | None = None) -> str:
        g = self.gib()
        parts = (f"weights {g['weights']} + grads {g['grads']} + AdamW {g['optimizer']} + autocast copies "
                 f"{g['autocast_weights']} + DDP buckets {g['ddp_buckets']} + activations {g['activations']} "
                 f"({self.tokens_in_flight:,} tokens in flight) + masks {g['attention_masks']} + loss {g['loss']} "
                 f"+ overhead {g['overhead']} = {g['total']} GiB")
        if gpu_memory_gb is None:
            return parts
        verdict = "fits" if self.fits(gpu_memory_gb) else "DOES NOT FIT"
        return f"{parts} -> {verdict} a {gpu_memory_gb:g} GB GPU"

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["gib"] = self.gib()
        return d


def estimate_memory(
    shape: EncoderShape,
    *,
    queries: int,
    group_size: int,
    query_len: int,
    passage_len: int,
    precision: Precision | None = None,
    checkpointing: bool = False,
    grad_cache_chunk: int | None = None,
    world_size: int = 1,
    attn_implementation: str = "sdpa",
) -> MemoryEstimate:
    """Peak training memory of one device for `queries` queries x `group_size` passages per step.

    Inputs are assumed padded to the max lengths (the worst case of a batch). `grad_cache_chunk` (rows
    per chunk, `train.grad_cache_chunk`) when gradient caching is on, else None.
    """
    for name, value in (("queries", queries), ("group_size", group_size), ("query_len", query_len),
                        ("passage_len", passage_len), ("world_size", world_size)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    prec = precision or Precision.of()
    n = shape.params()
    notes: list[str] = []
    # (rows, length) blocks whose graphs are alive at the same time
    if grad_cache_chunk:
        chunk = max(1, int(grad_cache_chunk))
        blocks = [(min(chunk, queries * group_size), passage_len)] if passage_len >= query_len else \
                 [(min(chunk, queries), query_len)]
        notes.append(f"grad cache: one chunk of {chunk} rows in flight")
    else:
        blocks = [(queries, query_len), (queries * group_size, passage_len)]
    tokens = sum(r * t for r, t in blocks)
    per_layer = shape.layer_activation_bytes(prec.compute_bytes, prec.stream_bytes)
    s = prec.stream_bytes
    if checkpointing:
        # each layer's input + the final hidden states; one layer's full activations while recomputed
        biggest = max(r * t for r, t in blocks)
        activations = tokens * s * shape.hidden * (shape.layers + 1) + biggest * per_layer
        notes.append("gradient checkpointing: layer inputs kept, one layer recomputed at a time")
    else:
        activations = tokens * (per_layer * shape.layers + s * shape.hidden * 2)
    if attn_implementation in ("sdpa", "eager"):
        # transformers builds dense [rows, 1, T, T] masks (boolean for SDPA) for global and sliding layers
        mask_bytes = 1 if attn_implementation == "sdpa" else prec.compute_bytes
        masks = sum(r * t * t for r, t in blocks) * mask_bytes * (2 if shape.local_window else 1)
        if attn_implementation == "eager":  # attention probabilities are kept too
            activations += sum(r * t * t for r, t in blocks) * shape.heads * prec.compute_bytes * shape.layers
    else:
        masks = 0
    # gathered passages (+ their gradients) and the [B, W*B*G] score matrix (+ softmax, grads), float32
    gathered = world_size * queries * group_size
    loss = 4 * (2 * gathered * shape.hidden + 3 * queries * gathered)
    if grad_cache_chunk:
        loss += 4 * 2 * queries * (group_size + 1) * shape.hidden  # cached embeddings + their gradients
    return MemoryEstimate(
        weights=n * prec.weight_bytes, grads=n * prec.weight_bytes, optimizer=2 * n * prec.weight_bytes,
        autocast_weights=n * 2 if prec.autocast_copy else 0,
        ddp_buckets=n * prec.weight_bytes if world_size > 1 else 0,
        activations=float(activations), attention_masks=float(masks), loss=float(loss),
        overhead=CONTEXT_OVERHEAD_GIB * GIB + FRAGMENTATION * activations, tokens_in_flight=tokens, notes=notes,
    )


# ---- from a composed job config -----------------------------------------------------------------


def encoder_shape(encoder: Any) -> EncoderShape:
    """The shape of an `encoder:` config section, without loading weights or touching the network.

    `config` (a shipped resource name or a config.json path) or a shipped hub id, a local model folder,
    a cached hub config, or transformers' defaults for a random-init `architecture`; then
    `config_overrides` on top.
    """
    overrides = dict(_get(encoder, "config_overrides", None) or {})
    spec, model_id = _get(encoder, "config", None), _get(encoder, "model_id", None)
    if spec:
        base = load_config_json(str(spec))
    elif model_id and (model_id in SHIPPED_CONFIGS or os.path.isdir(os.path.expanduser(model_id))):
        base = load_config_json(model_id)
    elif model_id:
        try:
            base = AutoConfig.from_pretrained(model_id, local_files_only=True).to_dict()
        except OSError as e:
            raise ValueError(f"encoder {model_id!r}: no local config to size it; prefetch it into the Hugging Face "
                             f"cache or point encoder.model_id at a local folder ({e})") from e
    elif _get(encoder, "source", None) == "package" and _get(encoder, "package", None):
        base = load_config_json(package_model_path(_get(encoder, "package")))
    elif _get(encoder, "architecture", None):
        # random init: the vocabulary comes from the tokenizer at build time (not sized here unless
        # config_overrides names vocab_size)
        base = AutoConfig.for_model(_get(encoder, "architecture")).to_dict()
    else:
        raise ValueError("encoder config names no model config (config, model_id, package or architecture)")
    base.update(overrides)
    return EncoderShape.from_config(base)


def _sections(cfg: Any) -> dict[str, Any]:
    return to_container(cfg) if not isinstance(cfg, dict) else cfg


def job_world_size(cfg: Any) -> int:
    """Data-parallel ranks of a job: trainer.devices (or launcher.gpus_per_node) x trainer.num_nodes."""
    c = _sections(cfg)
    trainer, launcher = c.get("trainer") or {}, c.get("launcher") or {}
    devices = trainer.get("devices", 1)
    per_node = devices if isinstance(devices, int) else int(launcher.get("gpus_per_node", 1) or 1)
    return max(1, per_node) * int(trainer.get("num_nodes", 1) or 1)


def job_memory(cfg: Any) -> MemoryEstimate:
    """The memory estimate of one composed `lmk.train` job config (DictConfig or dict)."""
    c = _sections(cfg)
    enc, data, train, trainer = (c.get(k) or {} for k in ("encoder", "data", "train", "trainer"))
    return estimate_memory(
        encoder_shape(enc), queries=int(data.get("batch_size", 1)), group_size=int(data.get("group_size", 1)),
        query_len=int(data.get("query_max_length", 128)), passage_len=int(data.get("passage_max_length", 512)),
        precision=Precision.of(trainer.get("precision", "32-true"), enc.get("dtype", "float32")),
        checkpointing=bool(enc.get("gradient_checkpointing", False)),
        grad_cache_chunk=int(train.get("grad_cache_chunk", 32)) if train.get("grad_cache") else None,
        world_size=job_world_size(c), attn_implementation=str(enc.get("attn_implementation", "sdpa")),
    )


def job_train_flops(cfg: Any) -> dict[str, float]:
    """Training tokens and FLOPs of one job (every rank, every step, texts padded to their max length):
    the numerator of a GPU-hours estimate (divide by a measured or published FLOP/s)."""
    c = _sections(cfg)
    enc, data, train, trainer = (c.get(k) or {} for k in ("encoder", "data", "train", "trainer"))
    shape = encoder_shape(enc)
    steps, world = int(trainer.get("max_steps", 1)), job_world_size(c)
    b, g = int(data.get("batch_size", 1)), int(data.get("group_size", 1))
    q_len, p_len = int(data.get("query_max_length", 128)), int(data.get("passage_max_length", 512))
    ckpt, cache = bool(enc.get("gradient_checkpointing", False)), bool(train.get("grad_cache", False))
    per_step = b * q_len * shape.train_flops_per_token(q_len, ckpt, cache) + \
        b * g * p_len * shape.train_flops_per_token(p_len, ckpt, cache)
    tokens = steps * world * b * (q_len + g * p_len)
    return {"steps": steps, "world_size": world, "tokens": float(tokens), "flops": float(steps * world * per_step)}


# Only ways that keep fp32 master weights: bf16 weights (encoder.dtype=bfloat16, trainer.precision=bf16-true)
# lose most AdamW updates at lr 2e-5, so they are not suggested.
FIT_HINT = ("to fit: train.grad_cache=true (same loss, one chunk in flight), or a smaller data.batch_size on more "
            "GPUs (launcher.nodes)")


def job_report(cfg: Any) -> dict[str, Any]:
    """What the row sweeper prints and stores in jobs.json for a job: the memory estimate against
    `launcher.gpu_memory_gb` (null for CPU jobs: then no verdict)."""
    c = _sections(cfg)
    gpu_gb = (c.get("launcher") or {}).get("gpu_memory_gb")
    est = job_memory(c)
    fits = None if gpu_gb is None else est.fits(float(gpu_gb))
    summary = "memory per device: " + est.summary(gpu_gb) + ("" if fits is not False else f"; {FIT_HINT}")
    return {"memory_gib": est.gib(), "gpu_memory_gb": gpu_gb, "fits": fits, "notes": est.notes,
            "world_size": job_world_size(c), "summary": summary}


def read_gpu_check(path: str | os.PathLike = GPU_CHECK_JSON, modes: tuple[str, ...] = ("gpu",)
                   ) -> dict[str, Any] | None:
    """The throughput a gpu-check report measured (its "throughput" section, plus the per-length figures of
    its `encode_pipeline` section when present), or None: no file, an unreadable one, a check that did not
    finish "ok", or a mode not in `modes`. The default takes only a CUDA run: a `--cpu-smoke` report
    measures the CPU and must never pass for a GPU measurement."""
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            report = json.load(fh)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(report, dict) or report.get("status") != "ok" or report.get("mode") not in modes:
        return None
    tp = dict(report.get("throughput") or {})
    if not tp:
        return None
    tp.setdefault("mode", report.get("mode"))
    tp.setdefault("device", report.get("device"))
    pipeline = report.get("encode_pipeline")
    if isinstance(pipeline, dict) and pipeline.get("status", "ok") == "ok":
        figures = {str(k): v for k, v in pipeline.items()
                   if isinstance(v, dict) and isinstance(v.get("end_to_end_tokens_per_s"), int | float)}
        if figures:
            tp["encode_pipeline"] = figures
    return tp
