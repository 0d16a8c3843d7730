"""Models to evaluate or analyse, from whatever a user points at: a training run folder, an lmk export, a
.ckpt, or any Hugging Face encoder (a transformers or sentence-transformers folder, or a hub id), with any
pooling. Model side: `lmk.evaluate` (the command) and `lmk.analysis` (the notebook) both load through here."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from transformers import AutoConfig

from lmk.config.model import EncoderConfig
from lmk.hub.offline import is_hub_id
from lmk.model.backbone import config_positions
from lmk.model.checkpoint import load_checkpoint
from lmk.model.embedding import MODEL_CONFIG_FILE, EmbeddingModel
from lmk.model.exported import is_export, load_exported
from lmk.model.landmark.legacy_config import saved_config_file

log = logging.getLogger(__name__)


def _load_from_checkpoint(ckpt: Path, run_dir: Path, trust_remote_code: bool = False) -> Any:
    """Rebuild the run's EmbeddingModel from its composed config, then load the checkpoint weights (weights_only:
    no code in the checkpoint runs). Whether the backbone's hub code may run is the caller's `trust_remote_code`,
    never the run folder's config."""
    cfg_file = run_dir / ".hydra" / "config.yaml"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{ckpt}: the run's config {cfg_file} is missing, so the model cannot be rebuilt")
    run_cfg = OmegaConf.load(cfg_file)
    data = run_cfg.get("data") or {}
    encoder = EncoderConfig.coerce(run_cfg.encoder)
    encoder.trust_remote_code = trust_remote_code
    model = EmbeddingModel.build(encoder, run_cfg.pooling,
                                 query_max_length=int(data.get("query_max_length", 128)),
                                 passage_max_length=int(data.get("passage_max_length", 512)))
    state = load_checkpoint(ckpt)["state_dict"]
    # ContrastiveModule keeps the EmbeddingModel as `.model`: strip that prefix.
    weights = {k[len("model."):]: v for k, v in state.items() if k.startswith("model.")}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    # a LoRA run's checkpoint leaves out the frozen base weights: the rebuilt model has them already
    frozen = {name for name, param in model.named_parameters() if not param.requires_grad}
    missing = [k for k in missing if k not in frozen]
    if missing:
        raise RuntimeError(f"{ckpt}: weights missing for {missing[:5]} ({len(missing)} keys)")
    if unexpected:
        log.warning("%s: ignoring %d unexpected keys (%s...)", ckpt, len(unexpected), unexpected[:3])
    return model




def _st_transformer_dir(path: Path) -> Path:
    """The Transformer module's folder of a sentence-transformers layout (the root for most models)."""
    for module in json.loads((path / "modules.json").read_text()):
        if str(module.get("type", "")).endswith("Transformer"):
            return path / module.get("path", "")
    return path


def load_hf_encoder(ref: str, pooling_cfg: Any, seed: int = 0, trust_remote_code: bool = False) -> Any:
    """Any Hugging Face encoder (hub id or local folder, no lmk metadata) with `pooling_cfg` on top; its own code
    (auto_map) runs only with `trust_remote_code=True`."""
    if pooling_cfg is None:
        raise ValueError(f"model={ref!r} is a plain Hugging Face encoder: give pooling=<row> (e.g. lmk-fixed, mean)")
    local = Path(ref).expanduser()
    src = str(_st_transformer_dir(local) if (local / "modules.json").is_file() else local) if local.is_dir() else ref
    try:
        config = AutoConfig.from_pretrained(src, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
        why = "HF_HUB_OFFLINE=1 is set and it is not in the local cache" if offline else "the hub refused or failed"
        raise OSError(
            f"model={ref!r} is not a local folder, so it was looked up as a Hugging Face hub id: {why}. "
            "Download it first (online, or into the cache), or give a local folder / training run dir. "
            f"(cause: {type(err).__name__}: {err})"
        ) from err
    name = local.name if local.is_dir() else ref.replace("/", "--")
    enc = EncoderConfig(name=f"hf-{name}", source="hub", model_id=src, max_positions=config_positions(config),
                        seed=seed, trust_remote_code=trust_remote_code)
    return EmbeddingModel.build(enc, pooling_cfg, seed=seed)


def load_model(ref: str | os.PathLike | None, encoder_cfg: Any = None, pooling_cfg: Any = None,
               seed: int = 0, trust_remote_code: bool = False) -> tuple[Any, dict[str, Any]]:
    """The EmbeddingModel named by `ref` (see module doc) and a description for results.json.

    `trust_remote_code` (the caller's, never read from the folder) lets a backbone's own code (auto_map) run; an
    lmk export always loads with lmk's classes and runs no code from its folder."""
    if ref is None or str(ref) in ("", "null", "None"):
        if encoder_cfg is None or pooling_cfg is None:
            raise ValueError("model=null evaluates the untrained encoder config: give encoder= and pooling=")
        return EmbeddingModel.build(encoder_cfg, pooling_cfg, seed=seed), {"kind": "encoder-config", "source": None}
    path = Path(ref).expanduser()
    if not path.exists():
        if is_hub_id(str(ref), bare=True):  # not a folder here: a hub id (owner/name or name)
            return load_hf_encoder(str(ref), pooling_cfg, seed, trust_remote_code), {"kind": "hf-encoder",
                                                                                      "source": str(ref)}
        raise FileNotFoundError(
            f"model={ref!r} does not exist; give a training run dir, an exported model folder, a .ckpt, "
            "a Hugging Face encoder (hub id or folder) or null"
        )
    if path.is_file() and path.suffix == ".ckpt":
        return _load_from_checkpoint(path, path.parent.parent, trust_remote_code), {"kind": "checkpoint",
                                                                                     "source": str(path)}
    if is_export(path):  # before a save_pretrained folder: older exports hold its (legacy) description too
        return load_exported(path), {"kind": "export", "source": str(path)}
    if saved_config_file(path, MODEL_CONFIG_FILE) is not None:
        return EmbeddingModel.from_pretrained(path, trust_remote_code=trust_remote_code), {"kind": "pretrained",
                                                                                            "source": str(path)}
    if (path / "export" / "modules.json").is_file():
        return load_exported(path / "export"), {"kind": "run-export", "source": str(path / "export"),
                                                "run_dir": str(path)}
    last = path / "checkpoints" / "last.ckpt"
    if last.is_file():
        return _load_from_checkpoint(last, path, trust_remote_code), {"kind": "run-checkpoint", "source": str(last),
                                                                       "run_dir": str(path)}
    if (path / "modules.json").is_file() or (path / "config.json").is_file():
        # a published model (transformers or sentence-transformers folder) without lmk metadata
        return load_hf_encoder(str(path), pooling_cfg, seed, trust_remote_code), {"kind": "hf-encoder",
                                                                                   "source": str(path)}
    raise FileNotFoundError(
        f"model={ref!r}: no {MODEL_CONFIG_FILE}, modules.json (export), export/, checkpoints/last.ckpt or config.json "
        "(a Hugging Face encoder) found"
    )
