"""EmbeddingModel = Hugging Face backbone + LandmarkTokenizer + pooler: texts -> L2-normalised vectors.

As in sentence-transformers' modules, `.tokenizer` is the Hugging Face tokenizer; the landmark tokenizer that wraps
it (insertion, truncation, pool_mask) is `.landmark_tokenizer`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModel, AutoTokenizer, PreTrainedModel

from lmk.config.model import EncoderConfig, PoolingConfig
from lmk.model.backbone import is_checkpointing, load_backbone, set_checkpointing, set_rope
from lmk.model.device import autocast, resolve_precision
from lmk.model.landmark import build_pooler
from lmk.model.landmark.backbone_inputs import backbone_inputs
from lmk.model.landmark.legacy_config import saved_config_file
from lmk.model.landmark.sliding_window_guard import guard_padded_rows
from lmk.model.landmark.tokenization import LandmarkTokenizer
from lmk.model.long_attention import lean_attention
from lmk.model.lora import merged
from lmk.model.multi_vector import padded_states
from lmk.model.packed_attention import Packing, choose, pack_plan, packed_hidden_states
from lmk.model.pipeline import encode_texts
from lmk.run.umask_files import write_json

log = logging.getLogger(__name__)

SIDES = ("query", "passage")
MODEL_CONFIG_FILE = "embedding_model.json"  # save_pretrained's description (legacy_config reads older folders)
POOLER_WEIGHTS_FILE = "pooler.safetensors"
FORMAT_VERSION = 1


def make_tokenizer(tokenizer: Any, pooling: PoolingConfig, max_length: int, seed: int) -> LandmarkTokenizer:
    """The run's landmark tokenizer (`LandmarkTokenizer.from_pooling`, the one constructor)."""
    return LandmarkTokenizer.from_pooling(tokenizer, pooling, max_length, seed)


def _has_params(module: Any) -> bool:
    return isinstance(module, torch.nn.Module) and any(True for _ in module.parameters())


class EmbeddingModel(torch.nn.Module):
    """Backbone + landmark tokenizer + pooler.

    `encoder_cfg` / `pooling_cfg` are optional (a model assembled by hand works), but `save_pretrained`,
    `with_pooling` and `name` use them when present.
    """

    def __init__(
        self,
        backbone: PreTrainedModel,
        landmark_tokenizer: LandmarkTokenizer,
        pooler: Any,
        query_max_length: int = 128,
        passage_max_length: int = 512,
        name: str = "model",
        encoder_cfg: EncoderConfig | None = None,
        pooling_cfg: PoolingConfig | None = None,
    ) -> None:
        super().__init__()
        # every model built or loaded (training, evaluation, probes): padded rows of sliding-window layers get a
        # key, since a CUDA kernel can return NaN for a row without one and the next global layer spreads it
        guard_padded_rows(backbone)
        self.backbone = backbone
        self.landmark_tokenizer = landmark_tokenizer
        self.pooler = pooler
        self.query_max_length = int(query_max_length)
        self.passage_max_length = int(passage_max_length)
        self.name = name
        self.encoder_cfg = encoder_cfg
        self.pooling_cfg = pooling_cfg
        # How many texts of the last encode() call hit max_length (truncated, or exactly full).
        self.truncation_count = 0
        self._warned_clamp: set[int] = set()
        # follow the backbone's mode (eval after from_pretrained) instead of nn.Module's default train mode,
        # so encode() restoring the mode never switches dropout on by surprise
        self.train(backbone.training)

    # ----------------------------------------------------------------------------- construction
    @classmethod
    def build(
        cls,
        encoder_cfg: Any,
        pooling_cfg: Any,
        query_max_length: int = 128,
        passage_max_length: int = 512,
        seed: int | None = None,
    ) -> EmbeddingModel:
        """From encoder + pooling configs (dataclasses, DictConfigs or dicts). `seed` (default: the
        encoder's seed) drives the variable-chunk sampling of the landmark tokenizer."""
        enc = EncoderConfig.coerce(encoder_cfg)
        pool = PoolingConfig.coerce(pooling_cfg)
        for key, value in (("query_max_length", query_max_length), ("passage_max_length", passage_max_length)):
            if not isinstance(value, int) or value < 3:
                raise ValueError(f"{key}={value!r} must be an int >= 3 (e.g. 128 for queries, 512 for passages)")
        backbone, hf_tok = load_backbone(enc)
        tok = make_tokenizer(hf_tok, pool, passage_max_length, enc.seed if seed is None else seed)
        pooler = build_pooler(pool.pooler, hidden_size=int(backbone.config.hidden_size), **pool.pooler_kwargs)
        return cls(
            backbone,
            tok,
            pooler,
            query_max_length=query_max_length,
            passage_max_length=passage_max_length,
            name=f"{enc.name}__{pool.label}",
            encoder_cfg=enc,
            pooling_cfg=pool,
        )

    def with_pooling(self, pooling_cfg: Any) -> EmbeddingModel:
        """Same backbone object (shared weights), another tokenization + pooler (cross-pooling eval)."""
        pool = PoolingConfig.coerce(pooling_cfg)
        tok = make_tokenizer(self.tokenizer, pool, self.landmark_tokenizer.max_length, self.landmark_tokenizer.seed)
        pooler = build_pooler(pool.pooler, hidden_size=self.hidden_size, **pool.pooler_kwargs)
        if isinstance(pooler, torch.nn.Module):
            pooler = pooler.to(self.device)
        enc_name = self.encoder_cfg.name if self.encoder_cfg is not None else self.name.split("__")[0]
        return type(self)(
            self.backbone,
            tok,
            pooler,
            query_max_length=self.query_max_length,
            passage_max_length=self.passage_max_length,
            name=f"{enc_name}__{pool.label}",
            encoder_cfg=self.encoder_cfg,
            pooling_cfg=pool,
        )

    # ------------------------------------------------------------------------------- properties
    @property
    def tokenizer(self) -> Any:
        """The Hugging Face tokenizer (sentence-transformers' meaning of the name)."""
        return self.landmark_tokenizer.tokenizer

    @property
    def hidden_size(self) -> int:
        return int(self.backbone.config.hidden_size)

    @property
    def max_positions(self) -> int:
        if self.encoder_cfg is not None:
            return int(self.encoder_cfg.max_positions)
        return int(self.tokenizer.model_max_length)

    @property
    def device(self) -> torch.device:
        return next(self.backbone.parameters()).device

    def gradient_checkpointing_enable(self) -> None:
        set_checkpointing(self.backbone, True)

    def gradient_checkpointing_disable(self) -> None:
        set_checkpointing(self.backbone, False)

    @property
    def gradient_checkpointing(self) -> bool:
        return is_checkpointing(self.backbone)

    # ----------------------------------------------------------------------------- tokenization
    def _max_length(self, side: str, max_length: int | None) -> int:
        if side not in SIDES:
            raise ValueError(f"side={side!r} is not valid; allowed values: {', '.join(SIDES)}")
        if max_length is None:
            max_length = self.query_max_length if side == "query" else self.passage_max_length
        if max_length > self.max_positions:
            # eval asks for e.g. 8192 on a 512-position backbone: truncate to what it can take
            if max_length not in self._warned_clamp:
                self._warned_clamp.add(max_length)
                log.warning(
                    "%s: max_length=%d exceeds the backbone's %d positions; texts are truncated to %d",
                    self.name, max_length, self.max_positions, self.max_positions,
                )
            max_length = self.max_positions
        return max_length

    def tokenize(
        self, texts: Sequence[str], side: str = "passage", train: bool = False, max_length: int | None = None,
        prompt: str | Sequence[str | None] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Landmark-tokenize texts for one side (queries and passages only differ in max length); `prompt`: an
        instruction before each text, without landmarks (LandmarkTokenizer)."""
        return self.landmark_tokenizer(texts, train=train, max_length=self._max_length(side, max_length),
                                       prompt=prompt)

    # ---------------------------------------------------------------------------------- forward
    def token_embeddings(self, features: dict[str, torch.Tensor]) -> torch.Tensor:
        """Last-layer hidden states [B, T, H]."""
        inputs = backbone_inputs(self.backbone, features)
        return self.backbone(**inputs).last_hidden_state

    def forward(self, features: dict[str, torch.Tensor]) -> torch.Tensor:
        """L2-normalised embeddings [B, H] (the pooler normalises)."""
        hidden = self.token_embeddings(features)
        return self.pooler(hidden, features["attention_mask"], features.get("pool_mask"))

    def landmark_states(self, features: dict[str, torch.Tensor], which: str = "landmarks"
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """Training forward for multi-vector objectives: (states [B, L, H], mask [B, L]) of each text's landmark
        states (`which="tokens"`: all its token states), each L2-normalised, float32, with gradients; exactly the
        states eval MaxSim scores (`lmk.model.multi_vector`: the same `vector_mask`), padded to the batch's most."""
        hidden = self.token_embeddings(features)
        return padded_states(hidden, features["attention_mask"], features.get("pool_mask"), which)

    def token_lengths(self, texts: Sequence[str], side: str = "passage", max_length: int | None = None,
                      window: int = 256) -> np.ndarray:
        """Tokens per text after landmark insertion and truncation (what a batch of it pads to)."""
        max_length = self._max_length(side, max_length)
        texts = list(texts)
        out = np.zeros(len(texts), dtype=np.int64)
        # windows of texts so the padded id tensors stay small (window x longest)
        for start in range(0, len(texts), window):
            mask = self.landmark_tokenizer(texts[start : start + window], train=False,
                                           max_length=max_length)["attention_mask"]
            out[start : start + len(mask)] = mask.sum(dim=1).numpy()
        return out

    @torch.inference_mode()
    def encode(
        self,
        texts: Sequence[str],
        side: str = "passage",
        batch_size: int = 32,
        max_length: int | None = None,
        show_progress: bool = False,
        *,
        max_tokens_per_batch: int | None = None,
        precision: str = "fp32",
        workers: int | str = "auto",
        prefetch: int = 2,
        prompt: str | None = None,
    ) -> np.ndarray:
        """float32 [N, H] embeddings in input order; batches are length-sorted to minimise padding.

        max_tokens_per_batch: fill each batch up to this many tokens, padding counted (rows x longest
        row), instead of `batch_size` rows; a text longer than the budget goes alone. precision:
        auto|bf16|fp16|fp32 autocast of the backbone on the model's device (auto: bf16 on GPUs, fp32 on
        CPU); the weights are not cast and pooling runs in float32. workers: tokenization processes
        (auto: from the cores and the device; 0: in this thread, for debugging), each keeping `prefetch`
        batches ready (lmk.model.pipeline). Each text is tokenized once; the values do not depend on workers.
        prompt: an instruction before every text (a query-side instruction), which gets no landmark.
        Raises EncodeError (a text that cannot be tokenized) or NonFiniteEmbeddingError, naming the index.
        """
        if isinstance(texts, str):
            raise TypeError("encode() takes a list of texts; wrap a single text as [text]")
        texts = list(texts)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} must be a positive int")
        if max_tokens_per_batch is not None and (isinstance(max_tokens_per_batch, bool) or not isinstance(
                max_tokens_per_batch, int) or max_tokens_per_batch < 1):
            raise ValueError(f"max_tokens_per_batch={max_tokens_per_batch!r} must be a positive int")
        max_length = self._max_length(side, max_length)
        device = self.device
        precision = resolve_precision(precision, device, key="precision")
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise ValueError(f"texts[{i}] is {type(t).__name__}; every text must be a str")
        was_training = self.training
        self.eval()
        try:
            out, self.truncation_count = encode_texts(
                functools.partial(self.landmark_tokenizer, train=False, max_length=max_length,
                                  **({"prompt": prompt} if prompt else {})),
                functools.partial(self._embed_batch, precision=precision), texts,
                hidden_size=self.hidden_size, max_length=max_length, device=device, batch_size=batch_size,
                max_tokens_per_batch=max_tokens_per_batch, pad=(self.landmark_tokenizer.pad_id,
                                                                self.landmark_tokenizer.padding_side == "left"),
                workers=workers, prefetch=prefetch, progress=f"encode {side}" if show_progress else None,
            )
        finally:
            self.train(was_training)
        if self.truncation_count:
            log.info("%s: %d/%d %s texts reached max_length=%d (truncated)", self.name, self.truncation_count,
                     len(texts), side, max_length)
        return out

    def attention_path(self, precision: str) -> tuple[bool, str]:
        """(packed?, why) of an inference encode at `precision` (resolved) on the model's device: `encoder.packed`
        (auto | true | false) decided by lmk.model.packed_attention.choose; what results.json records."""
        setting = self.encoder_cfg.packed if self.encoder_cfg is not None else "auto"
        return choose(self.backbone, self.device, precision, setting)

    def _embed_batch(self, feats: dict[str, torch.Tensor], precision: str) -> torch.Tensor:
        """One CPU batch -> float32 [B, H] embeddings on the model's device (copied without blocking; whether
        the batch is padded, and its packing, are read on the CPU, so nothing waits on the device)."""
        unpadded = feats["input_ids"].shape[0] == 1 and bool(feats["attention_mask"].all())
        device = self.device
        packing = pack_plan(feats["attention_mask"]).to(device) if self.attention_path(precision)[0] else None
        return self._embed({k: v.to(device, non_blocking=True) for k, v in feats.items()}, precision, unpadded,
                           packing)

    def _embed(self, feats: dict[str, torch.Tensor], precision: str, unpadded: bool | None = None,
               packing: Packing | None = None) -> torch.Tensor:
        """Inference forward of one tokenized batch -> float32 [B, H] embeddings."""
        hidden = self.hidden_states(feats, precision, unpadded, packing)
        # pool and normalise in float32 whatever the autocast dtype
        return self.pooler(hidden, feats["attention_mask"], feats.get("pool_mask")).float()

    def hidden_states(self, feats: dict[str, torch.Tensor], precision: str, unpadded: bool | None = None,
                      packing: Packing | None = None) -> torch.Tensor:
        """Inference forward of one tokenized batch (on the model's device) -> float32 last hidden states [B, T, H]:
        what the pooler pools, and what multi-vector scoring (lmk.model.multi_vector) keeps apart. Packed (the real
        tokens as one row, zeros at padding) where `attention_path` says so, else padded."""
        if packing is not None or self.attention_path(precision)[0]:
            with autocast(self.device, precision):
                return packed_hidden_states(self.backbone, feats, packing).float()
        inputs = backbone_inputs(self.backbone, feats)
        if unpadded is None:
            unpadded = inputs["input_ids"].shape[0] == 1 and bool(feats["attention_mask"].all())
        if unpadded:
            # one unpadded row needs no mask: transformers then builds no [T, T] mask, and lean_attention
            # keeps ModernBERT's sliding-window layers free of one too (32k tokens fit in a few GB)
            inputs.pop("attention_mask", None)
        with autocast(self.device, precision), lean_attention(self.backbone):
            hidden = self.backbone(**inputs).last_hidden_state
        return hidden.float()

    # ------------------------------------------------------------------------------ persistence
    def config_dict(self) -> dict[str, Any]:
        """JSON-able description of everything but the weights."""
        return {
            "format_version": FORMAT_VERSION,
            "name": self.name,
            "encoder": self.encoder_cfg.to_dict() if self.encoder_cfg is not None else None,
            "pooling": self.pooling_cfg.to_dict() if self.pooling_cfg is not None else None,
            "query_max_length": self.query_max_length,
            "passage_max_length": self.passage_max_length,
            "max_positions": self.max_positions,
            "tokenizer": self.landmark_tokenizer.config(),
            "pooler": {
                "name": self.pooling_cfg.pooler if self.pooling_cfg is not None else type(self.pooler).__name__,
                "kwargs": self.pooling_cfg.pooler_kwargs if self.pooling_cfg is not None else {},
                "weights": POOLER_WEIGHTS_FILE if _has_params(self.pooler) else None,
            },
        }

    def save_pretrained(self, path: str | os.PathLike) -> None:
        """Backbone (HF format) + tokenizer + embedding_model.json (+ pooler weights when trainable)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        merged(self.backbone).save_pretrained(path)  # LoRA folded in: the folder loads as a plain model
        self.tokenizer.save_pretrained(path)
        cfg = self.config_dict()
        if cfg["pooler"]["weights"]:
            state = {k: v.detach().cpu().contiguous() for k, v in self.pooler.state_dict().items()}
            save_file(state, str(path / POOLER_WEIGHTS_FILE))
        write_json(path / MODEL_CONFIG_FILE, cfg)

    @classmethod
    def from_pretrained(
        cls, path: str | os.PathLike, pooler_weights: str | os.PathLike | None = None,
        trust_remote_code: bool = False, **model_kwargs: Any
    ) -> EmbeddingModel:
        """Reload a `save_pretrained` folder; `model_kwargs` go to AutoModel.from_pretrained (e.g. dtype).

        The backbone's own code (auto_map) runs only when the caller passes `trust_remote_code=True`: the
        folder's embedding_model.json records the training flag, which is never read as permission."""
        path = Path(path)
        cfg_file = saved_config_file(path, MODEL_CONFIG_FILE)
        if cfg_file is None:
            raise FileNotFoundError(
                f"{path / MODEL_CONFIG_FILE} not found: {path} is not an EmbeddingModel folder (write one with save_pretrained, "
                "or load a sentence-transformers export with lmk.export.load_exported)"
            )
        cfg = json.loads(cfg_file.read_text())
        if cfg.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"{cfg_file}: format_version {cfg.get('format_version')!r} != {FORMAT_VERSION}")
        enc = EncoderConfig.coerce(cfg["encoder"]) if cfg.get("encoder") else None
        pool = PoolingConfig.coerce(cfg["pooling"]) if cfg.get("pooling") else None
        kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
        if enc is not None:
            kwargs.update(attn_implementation=enc.attn_implementation)
        kwargs.update(model_kwargs)
        backbone = AutoModel.from_pretrained(path, **kwargs)
        max_positions = int(cfg.get("max_positions") or (enc.max_positions if enc else 512))
        hf_tok = AutoTokenizer.from_pretrained(path, model_max_length=max_positions,
                                               trust_remote_code=trust_remote_code)
        tok = LandmarkTokenizer.from_config(hf_tok, cfg["tokenizer"])
        pooler = build_pooler(cfg["pooler"]["name"], hidden_size=int(backbone.config.hidden_size),
                              **cfg["pooler"].get("kwargs", {}))
        weights = pooler_weights or (path / cfg["pooler"]["weights"] if cfg["pooler"].get("weights") else None)
        if weights:
            pooler.load_state_dict(load_file(str(weights)))
        if isinstance(pooler, torch.nn.Module):
            pooler = pooler.to(backbone.device)
        if enc is not None:
            set_rope(backbone, enc.rope, enc.name)  # zeroed rotary buffers are not saved: reapply
        if enc is not None and enc.gradient_checkpointing is True:  # auto: a training job's decision
            set_checkpointing(backbone, True)
        return cls(
            backbone,
            tok,
            pooler,
            query_max_length=cfg["query_max_length"],
            passage_max_length=cfg["passage_max_length"],
            name=cfg["name"],
            encoder_cfg=enc,
            pooling_cfg=pool,
        )

    # ------------------------------------------------------------------------------ fingerprint
    def fingerprint(self) -> str:
        """Short hash of weights + config: equal fingerprints mean equal embeddings at equal max lengths (eval cache
        key, with the per-side lengths)."""
        h = hashlib.blake2b(digest_size=8)
        cfg = self.config_dict()
        # the default lengths are not the model: an export's one max_seq_length (lmk.sharing.st_folder) and a run's
        # training lengths give the same weights one identity; the eval cache keys the lengths used apart
        for key in ("query_max_length", "passage_max_length"):
            cfg.pop(key)
        cfg["tokenizer"] = {k: v for k, v in cfg["tokenizer"].items() if k != "max_length"}
        h.update(json.dumps(cfg, sort_keys=True, default=str).encode())
        for module in (self.backbone, self.pooler):
            if not isinstance(module, torch.nn.Module):
                continue
            for key, t in sorted(module.state_dict().items()):
                h.update(key.encode())
                h.update(str(t.dtype).encode())
                h.update(str(tuple(t.shape)).encode())
                # raw bytes (view as uint8 works for bf16, which numpy lacks)
                h.update(t.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes())
        return h.hexdigest()[:12]

    def __repr__(self) -> str:
        return f"EmbeddingModel(name={self.name!r}, hidden_size={self.hidden_size}, landmark_tokenizer={self.landmark_tokenizer!r})"
