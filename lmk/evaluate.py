"""`python -m lmk.evaluate`: one model through one eval suite -> results.json in this run's folder.

Examples:
    python -m lmk.evaluate model=outputs/train/<run> eval=local            # a trained run
    python -m lmk.evaluate model=outputs/train/<run> pooling=mean eval=local   # cross-pooling
    python -m lmk.evaluate model=<exported sentence-transformers folder> eval=longembed6
    python -m lmk.evaluate model=null encoder=minilm-l6 pooling=lmk-fixed eval=local  # untrained

`model` may be a run dir (its export/, else checkpoints/last.ckpt), an exported folder, a
save_pretrained folder, a .ckpt file, or null (the encoder config, untrained). A `pooling=` given on
the command line overrides a trained model's pooling (same backbone, other tokenization + pooler).
"""

from __future__ import annotations

import logging
import os
import traceback
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from lmk.config import derive_seeds
from lmk.eval.config import EvalConfig
from lmk.results import Timer, config_hash_of, git_commit, update_results

log = logging.getLogger(__name__)



def _load_from_checkpoint(ckpt: Path, run_dir: Path) -> Any:
    """Rebuild the run's EmbeddingModel from its composed config, then load the checkpoint weights."""
    import torch

    from lmk.model import EmbeddingModel

    cfg_file = run_dir / ".hydra" / "config.yaml"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{ckpt}: the run's config {cfg_file} is missing, so the model cannot be rebuilt")
    run_cfg = OmegaConf.load(cfg_file)
    data = run_cfg.get("data") or {}
    model = EmbeddingModel.build(run_cfg.encoder, run_cfg.pooling,
                                 query_max_length=int(data.get("query_max_length", 128)),
                                 passage_max_length=int(data.get("passage_max_length", 512)))
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    # ContrastiveModule keeps the EmbeddingModel as `.model`: strip that prefix.
    weights = {k[len("model."):]: v for k, v in state.items() if k.startswith("model.")}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if missing:
        raise RuntimeError(f"{ckpt}: weights missing for {missing[:5]} ({len(missing)} keys)")
    if unexpected:
        log.warning("%s: ignoring %d unexpected keys (%s...)", ckpt, len(unexpected), unexpected[:3])
    return model


def load_model(ref: str | os.PathLike | None, encoder_cfg: Any = None, pooling_cfg: Any = None,
               seed: int = 0) -> tuple[Any, dict[str, Any]]:
    """The EmbeddingModel named by `ref` (see module doc) and a description for results.json."""
    from lmk.model import EmbeddingModel

    if ref is None or str(ref) in ("", "null", "None"):
        if encoder_cfg is None or pooling_cfg is None:
            raise ValueError("model=null evaluates the untrained encoder config: give encoder= and pooling=")
        return EmbeddingModel.build(encoder_cfg, pooling_cfg, seed=seed), {"kind": "encoder-config", "source": None}
    path = Path(ref).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"model={ref!r} does not exist; give a training run dir, an exported model folder, a .ckpt or null"
        )
    if path.is_file() and path.suffix == ".ckpt":
        return _load_from_checkpoint(path, path.parent.parent), {"kind": "checkpoint", "source": str(path)}
    if (path / "lmk_config.json").is_file():
        return EmbeddingModel.from_pretrained(path), {"kind": "pretrained", "source": str(path)}
    if (path / "modules.json").is_file():
        from lmk.export import load_exported

        return load_exported(path), {"kind": "export", "source": str(path)}
    if (path / "export" / "modules.json").is_file():
        from lmk.export import load_exported

        return load_exported(path / "export"), {"kind": "run-export", "source": str(path / "export"),
                                                "run_dir": str(path)}
    last = path / "checkpoints" / "last.ckpt"
    if last.is_file():
        return _load_from_checkpoint(last, path), {"kind": "run-checkpoint", "source": str(last), "run_dir": str(path)}
    raise FileNotFoundError(
        f"model={ref!r}: no lmk_config.json, modules.json (export), export/ or checkpoints/last.ckpt found"
    )


def _pooling_overridden() -> bool:
    try:
        from hydra.core.hydra_config import HydraConfig

        overrides = HydraConfig.get().overrides.task
    except Exception:  # not under Hydra (tests call run() directly)
        return False
    return any(o.lstrip("+~").split("=", 1)[0].split(".", 1)[0] == "pooling" for o in overrides)


def validate_config(cfg: DictConfig) -> None:
    """Check an evaluate config without loading anything (the row sweeper calls this per job)."""
    from lmk.model_config import EncoderConfig, PoolingConfig

    EvalConfig.from_cfg(cfg.eval)
    if cfg.get("encoder") is not None:
        EncoderConfig.coerce(cfg.encoder)
    if cfg.get("pooling") is not None:
        PoolingConfig.coerce(cfg.pooling)


def run(cfg: DictConfig, run_dir: str | os.PathLike | None = None, cross_pooling: bool | None = None) -> dict[str, Any]:
    """Evaluate per `cfg` (the composed evaluate config); returns the eval section written to results.json."""
    eval_cfg = EvalConfig.from_cfg(cfg.eval)  # bad values fail here, before loading anything
    if run_dir is None:
        from hydra.core.hydra_config import HydraConfig

        run_dir = HydraConfig.get().runtime.output_dir
    run_dir = Path(run_dir)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(resolved, dict)
    resolved.pop("hydra", None)
    timer = Timer()
    loggers = None
    exit_code = 1
    # fresh: a re-run in the same folder (a sweep row after a failure) must not inherit old scores
    update_results(run_dir, fresh=True, status="running", command="evaluate", config=resolved,
                   config_hash=config_hash_of(cfg), git_commit=git_commit())
    try:
        from lmk.eval.runner import run_suite
        from lmk.eval.suites import build_tasks
        from lmk.loggers import build_logger, use_hydra_logging

        use_hydra_logging()

        with timer.section("tasks"):
            tasks = build_tasks(eval_cfg)  # unknown names / offline hub tasks fail before the model loads
        with timer.section("load_model"):
            seeded = derive_seeds(cfg)  # a null encoder.seed (random init) is the root seed, as in training
            model, info = load_model(cfg.get("model"), seeded.get("encoder"), cfg.get("pooling"), int(cfg.get("seed", 0)))
            if cross_pooling is None:
                cross_pooling = _pooling_overridden()
            if cfg.get("model") not in (None, "") and cross_pooling:
                trained = model.pooling_cfg.label if model.pooling_cfg is not None else "?"
                model = model.with_pooling(cfg.pooling)
                log.info("cross-pooling: trained with %s, evaluating with %s", trained, model.pooling_cfg.label)
                info["trained_pooling"] = trained
            info.update(name=model.name, fingerprint=model.fingerprint(),
                        pooling=model.pooling_cfg.label if model.pooling_cfg is not None else None)
        update_results(run_dir, model=info)
        cache_dir = cfg.get("cache_dir") or eval_cfg.cache_dir
        if not cache_dir:
            # a trained run's own cache: the fit-end eval of the same weights is reused, not recomputed
            cache_dir = Path(info["run_dir"]) / "mteb_cache" if info.get("run_dir") else run_dir / "mteb_cache"
        loggers = build_logger(cfg.get("logger") or {"name": "none"}, run_dir, resolved)
        with timer.section("eval"):
            section = run_suite(model, eval_cfg, cache_dir, logger=loggers, out_dir=run_dir, tasks=tasks)
        section["cache_dir"] = str(cache_dir)
        update_results(run_dir, status="done", eval=section, timings=dict(timer.timings))
        exit_code = 0
        return section
    except BaseException as err:
        update_results(run_dir, status="failed", error=f"{type(err).__name__}: {err}",
                       traceback=traceback.format_exc(limit=20), timings=dict(timer.timings))
        raise
    finally:
        from lmk.loggers import finish_loggers

        finish_loggers(loggers, exit_code=exit_code)


@hydra.main(version_base="1.3", config_path="../conf", config_name="evaluate")
def main(cfg: DictConfig) -> float | None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    section = run(cfg)
    groups = [v for v in section.get("groups", {}).values() if v is not None]
    return float(sum(groups) / len(groups)) if groups else None  # a sweep's objective: mean group score


if __name__ == "__main__":
    main()
