"""One `lmk.evaluate` job after validation: resolve the device, load the model (any reference, any pooling),
build the suite's tasks, run it (`lmk.eval.runner.run_suite`) and record everything in results.json.

`lmk.eval.command.run` calls `evaluate` once the config validated, so a bad value fails before torch loads.
"""

from __future__ import annotations

import logging
import os
import shutil
import traceback
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from lmk.config import ConfigError, derive_seeds
from lmk.config.eval import EvalConfig
from lmk.config.schema import get_key
from lmk.eval.prepared import attach, reading
from lmk.eval.runner import run_suite
from lmk.eval.suites import build_tasks
from lmk.hub.artifacts import check_available
from lmk.model.device import resolve_device, resolve_precision
from lmk.model.loading import load_model
from lmk.model.multi_vector import no_landmarks
from lmk.run.cli import group_overridden
from lmk.run.quiet_logging import use_hydra_logging
from lmk.run.results import Timer, config_hash_of, git_commit, update_results

log = logging.getLogger(__name__)


def _experiment_loggers(logger_cfg: Any, run_dir: Path, resolved: dict[str, Any]) -> Any:
    """The job's W&B / CSV loggers; None for `logger=none` (the default), which loads no Lightning."""
    logger_cfg = logger_cfg or {"name": "none"}
    if get_key(logger_cfg, "name", "csv") == "none":
        return None
    # Lightning's logger classes: seconds of start-up, paid by a job that logs only
    from lmk.run.loggers import build_logger

    return build_logger(logger_cfg, run_dir, resolved)


def _record(cfg: DictConfig, info: dict[str, Any], section: dict[str, Any], out_dir: Path,
            cross_pooling: bool) -> None:
    """record=true: the scores become the training run's own (its results.json eval section, replaced, and its
    per-query file), which `python -m lmk.export` publishes."""
    run = info.get("run_dir")
    if not run or cross_pooling:
        why = "another pooling than the run's" if cross_pooling else f"a {info['kind']}, not a training run folder"
        raise ConfigError(f"record=true: model={cfg.get('model')!r} was evaluated as {why}, so its scores are not the "
                          "run's; give model=<training run folder> without pooling=, or leave record out")
    per_query = section.get("per_query")
    if per_query and (out_dir / per_query).is_file():
        shutil.copyfile(out_dir / per_query, Path(run) / per_query)
    update_results(run, eval=None)  # replaced, not merged: no task of an earlier evaluation stays behind
    update_results(run, eval=section)
    log.info("scores recorded in %s (python -m lmk.export %s publishes them)", Path(run) / "results.json", run)


def evaluate(cfg: DictConfig, run_dir: str | os.PathLike | None = None, cross_pooling: bool | None = None
             ) -> dict[str, Any]:
    """Evaluate per a validated `cfg`; returns the eval section written to results.json."""
    eval_cfg = EvalConfig.from_cfg(cfg.eval)
    device = resolve_device(eval_cfg.device)  # so does a cuda request on a machine without CUDA
    check_available(cfg)  # offline (HF_HUB_OFFLINE): every hub dataset / model is on disk, else name them
    if run_dir is None:
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
        use_hydra_logging()

        with timer.section("tasks"):
            tasks = build_tasks(eval_cfg)  # unknown names / offline hub tasks fail before the model loads
            prepared_root = (cfg.get("hub") or {}).get("prepared")
            if prepared_root:
                attach(tasks, prepared_root)  # data not prepared for a task fails here too
        with timer.section("load_model"):
            seeded = derive_seeds(cfg)  # a null encoder.seed (random init) is the root seed, as in training
            model, info = load_model(cfg.get("model"), seeded.get("encoder"), cfg.get("pooling"), int(cfg.get("seed", 0)),
                                     trust_remote_code=bool(cfg.get("trust_remote_code", False)))
            if cross_pooling is None:
                cross_pooling = group_overridden("pooling")
            # a plain HF encoder was built with cfg.pooling already: nothing to swap
            if cfg.get("model") not in (None, "") and cross_pooling and info["kind"] != "hf-encoder":
                trained = model.pooling_cfg.label if model.pooling_cfg is not None else "?"
                model = model.with_pooling(cfg.pooling)
                log.info("cross-pooling: trained with %s, evaluating with %s", trained, model.pooling_cfg.label)
                info["trained_pooling"] = trained
            why = no_landmarks(model) if eval_cfg.scoring == "maxsim" else None
            if why is not None:  # before any text is encoded
                raise ConfigError(why)
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
        loggers = _experiment_loggers(cfg.get("logger"), run_dir, resolved)
        # hub.prepared: the hub tasks read data prepared once for every job (the sweep's eval stage), so this job
        # writes no `datasets` cache and takes no lock in a shared folder
        with timer.section("eval"), reading(tasks, prepared_root) as prepared:
            if prepared:
                log.info("eval data of %d hub tasks read from %s", len(prepared), prepared_root)
            section = run_suite(model, eval_cfg, cache_dir, logger=loggers, out_dir=run_dir, tasks=tasks)
        section["cache_dir"] = str(cache_dir)
        if cfg.get("record"):
            _record(cfg, info, section, run_dir, cross_pooling)
        update_results(run_dir, status="done", eval=section, timings=dict(timer.timings))
        exit_code = 0
        return section
    except BaseException as err:
        update_results(run_dir, status="failed", error=f"{type(err).__name__}: {err}",
                       traceback=traceback.format_exc(limit=20), timings=dict(timer.timings))
        raise
    finally:
        if loggers is not None:
            from lmk.run.loggers import finish_loggers  # loaded where a logger was built

            finish_loggers(loggers, exit_code=exit_code)
