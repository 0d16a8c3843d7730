"""`python -m lmk.evaluate`: one model through one eval suite -> results.json in this run's folder.

Examples:
    python -m lmk.evaluate model=outputs/train/<run> eval=local            # a trained run
    python -m lmk.evaluate model=outputs/train/<run> pooling=mean eval=local   # cross-pooling
    python -m lmk.evaluate model=<exported sentence-transformers folder> eval=longembed6
    python -m lmk.evaluate model=null encoder=minilm-l6 pooling=lmk-fixed eval=local  # untrained
    python -m lmk.evaluate model=BAAI/bge-base-en-v1.5 pooling=lmk-fixed eval=beir15  # any HF encoder
    python -m lmk.evaluate model=... eval.device=cuda:1 eval.precision=fp32

`model` may be a run dir (its export/, else checkpoints/last.ckpt), an exported folder, a
save_pretrained folder, a .ckpt file, null (the encoder config, untrained), or any Hugging Face
encoder: a hub id or a local folder (transformers or sentence-transformers layout) without lmk
metadata, evaluated with `pooling=` (zero-shot LMK on a published model, the paper's baselines). A
`pooling=` given on the command line overrides a trained model's pooling (same backbone, other
tokenization + pooler). The model runs on `eval.device` under an autocast of `eval.precision`.
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
from lmk.loading import load_hf_encoder, load_model  # noqa: F401 - load_hf_encoder: part of this command's API
from lmk.results import Timer, config_hash_of, git_commit, update_results

log = logging.getLogger(__name__)



def _pooling_overridden() -> bool:
    try:
        from hydra.core.hydra_config import HydraConfig

        overrides = HydraConfig.get().overrides.task
    except Exception:  # not under Hydra (tests call run() directly)
        return False
    return any(o.lstrip("+~").split("=", 1)[0].split(".", 1)[0] == "pooling" for o in overrides)


def validate_config(cfg: DictConfig) -> None:
    """Check an evaluate config without loading anything (the row sweeper calls this per job)."""
    from lmk.config import ConfigError
    from lmk.model_config import EncoderConfig, PoolingConfig
    from lmk.prefetch import is_hub_id, preflight

    checks = [("eval", EvalConfig.from_cfg), ("encoder", EncoderConfig.coerce), ("pooling", PoolingConfig.coerce)]
    for key, check in checks:
        if cfg.get(key) is None:
            continue
        try:
            check(cfg[key])
        except (ValueError, TypeError) as err:  # one line on the console, not a traceback (ConfigError)
            raise ConfigError(str(err) if str(err).startswith(f"{key}.") else f"{key}: {err}") from err
    model = cfg.get("model")
    if model not in (None, "", "null") and not is_hub_id(model) and not Path(str(model)).expanduser().exists():
        raise FileNotFoundError(f"model={model!r} does not exist; give a training run dir, an exported model "
                                "folder, a .ckpt, a Hugging Face encoder (folder or hub id owner/name) or null")
    preflight(cfg)  # eval task names resolve (mteb's registry, offline), the hub mirror is set


def run(cfg: DictConfig, run_dir: str | os.PathLike | None = None, cross_pooling: bool | None = None) -> dict[str, Any]:
    """Evaluate per `cfg` (the composed evaluate config); returns the eval section written to results.json."""
    from lmk.device import resolve_device, resolve_precision

    validate_config(cfg)  # bad values, task names and paths fail here, before loading anything
    eval_cfg = EvalConfig.from_cfg(cfg.eval)
    device = resolve_device(eval_cfg.device)  # so does a cuda request on a machine without CUDA
    from lmk.prefetch import check_available

    check_available(cfg)  # offline (HF_HUB_OFFLINE): every hub dataset / model is on disk, else name them
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
            # a plain HF encoder was built with cfg.pooling already: nothing to swap
            if cfg.get("model") not in (None, "") and cross_pooling and info["kind"] != "hf-encoder":
                trained = model.pooling_cfg.label if model.pooling_cfg is not None else "?"
                model = model.with_pooling(cfg.pooling)
                log.info("cross-pooling: trained with %s, evaluating with %s", trained, model.pooling_cfg.label)
                info["trained_pooling"] = trained
            model = model.to(device)
            info.update(name=model.name, fingerprint=model.fingerprint(),
                        pooling=model.pooling_cfg.label if model.pooling_cfg is not None else None,
                        device=str(device), precision=resolve_precision(eval_cfg.precision, device))
            log.info("evaluating %s on %s (%s)", model.name, device, info["precision"])
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
    from lmk.cli import run_app

    run_app(main, "evaluate")  # a command line that does not compose: one line, not Hydra's report
