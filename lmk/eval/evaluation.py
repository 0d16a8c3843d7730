"""One `lmk.evaluate` job after validation, as stages its config walks through once, each taking the previous
one's output:

    open_job(cfg) -> Job              the device and the run folder; results.json says "running" from here on
    prepare(Job) -> JobPrepared       the suite's tasks, the model (any reference, any pooling) on its device, the
                                      mteb cache, the loggers
    encode_suite(..) -> Encoded       every task through mteb, cached splits reused       (lmk.eval.runner)
    score_suite(..) -> Scored         the group means, the "eval" section                  (lmk.eval.runner)
    record(Scored) -> section         per_query.json, the loggers, results.json (record=true: the training run's too)

`Job.recording()` around the stages records a failure in results.json and finishes the loggers.
`lmk.eval.command.run` calls `evaluate` once the config validated, so a bad value fails before torch loads.
"""

from __future__ import annotations

import logging
import os
import shutil
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from lmk.config import MAXSIM_SCORINGS, ConfigError, derive_seeds
from lmk.config.eval import EvalConfig
from lmk.config.schema import get_key
from lmk.eval.prepared import attach
from lmk.eval.runner import Prepared, Scored, encode_suite, record_suite, score_suite
from lmk.eval.suites import build_tasks
from lmk.hub.artifacts import check_available
from lmk.model.device import resolve_device, resolve_precision
from lmk.model.loading import load_model
from lmk.model.multi_vector import no_landmarks
from lmk.run.cli import group_overridden
from lmk.run.quiet_logging import use_hydra_logging
from lmk.run.results import Timer, config_hash_of, git_commit, update_results

log = logging.getLogger(__name__)


def evaluate(cfg: DictConfig, run_dir: str | os.PathLike | None = None, cross_pooling: bool | None = None
             ) -> dict[str, Any]:
    """Evaluate per a validated `cfg`; returns the eval section written to results.json."""
    job = open_job(cfg, run_dir, cross_pooling)
    with job.recording():
        prepared = prepare(job)
        with job.timer.section("eval"):
            encoded = encode_suite(prepared)
            scored = score_suite(encoded)
        return record(scored)


@dataclass
class Job:
    """One `lmk.evaluate` job: its validated config, device and run folder, and what its stages record in."""

    cfg: DictConfig
    eval_cfg: EvalConfig
    device: Any
    run_dir: Path
    resolved: dict[str, Any]
    cross_pooling: bool | None  # None: a pooling= on the command line decides
    timer: Timer = field(default_factory=Timer)
    loggers: Any = None  # set by prepare, so that a failure of any later stage finishes them

    @contextmanager
    def recording(self) -> Iterator[None]:
        """A stage that fails is recorded in results.json (its error, traceback and the timings so far); the
        loggers are finished either way."""
        exit_code = 1
        try:
            yield
            exit_code = 0
        except BaseException as err:
            update_results(self.run_dir, status="failed", error=f"{type(err).__name__}: {err}",
                           traceback=traceback.format_exc(limit=20), timings=dict(self.timer.timings))
            raise
        finally:
            if self.loggers is not None:
                from lmk.run.loggers import finish_loggers  # loaded where a logger was built

                finish_loggers(self.loggers, exit_code=exit_code)


@dataclass(kw_only=True)
class JobPrepared(Prepared):
    """The prepare stage's output: what the suite's stages take (`lmk.eval.runner.Prepared`) and what the record
    stage needs of the job."""

    job: Job
    info: dict[str, Any]  # the model's description (results.json "model")
    cross_pooling: bool
    cache_dir_text: str  # the cache folder as configured: results.json's eval.cache_dir


def open_job(cfg: DictConfig, run_dir: str | os.PathLike | None = None, cross_pooling: bool | None = None) -> Job:
    """The job's device and run folder (Hydra's, by default); results.json starts afresh with status running."""
    eval_cfg = EvalConfig.from_cfg(cfg.eval)
    device = resolve_device(eval_cfg.device)  # so does a cuda request on a machine without CUDA
    check_available(cfg)  # offline (HF_HUB_OFFLINE): every hub dataset / model is on disk, else name them
    if run_dir is None:
        run_dir = HydraConfig.get().runtime.output_dir
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(resolved, dict)
    resolved.pop("hydra", None)
    job = Job(cfg, eval_cfg, device, Path(run_dir), resolved, cross_pooling)
    # fresh: a re-run in the same folder (a sweep row after a failure) must not inherit old scores
    update_results(job.run_dir, fresh=True, status="running", command="evaluate", config=resolved,
                   config_hash=config_hash_of(cfg), git_commit=git_commit())
    return job


def prepare(job: Job) -> JobPrepared:
    """The suite's tasks (unknown names, offline hub tasks and unprepared data fail before the model loads), the
    model on the job's device, the mteb cache folder and the loggers."""
    cfg, eval_cfg = job.cfg, job.eval_cfg
    use_hydra_logging()
    with job.timer.section("tasks"):
        tasks = build_tasks(eval_cfg)
        data_root = (cfg.get("hub") or {}).get("prepared")
        if data_root:
            attach(tasks, data_root)  # data not prepared for a task fails here too
    with job.timer.section("load_model"):
        model, info, cross_pooling = _load_model(job)
    update_results(job.run_dir, model=info)
    cache_dir = cfg.get("cache_dir") or eval_cfg.cache_dir
    if not cache_dir:
        # a trained run's own cache: the fit-end eval of the same weights is reused, not recomputed
        cache_dir = Path(info["run_dir"]) / "mteb_cache" if info.get("run_dir") else job.run_dir / "mteb_cache"
    job.loggers = _experiment_loggers(cfg.get("logger"), job.run_dir, job.resolved)
    # hub.prepared: the hub tasks read data prepared once for every job (the sweep's eval stage), so this job
    # writes no `datasets` cache and takes no lock in a shared folder
    return JobPrepared(model, eval_cfg, tasks, Path(cache_dir), job.run_dir, data_root=data_root, logger=job.loggers,
                       job=job, info=info, cross_pooling=cross_pooling, cache_dir_text=str(cache_dir))


def _load_model(job: Job) -> tuple[Any, dict[str, Any], bool]:
    """The model per `model=` and `pooling=` (a cross-pooling swaps a trained model's pooling), on the job's
    device; its description; whether it is a cross-pooling."""
    cfg, device = job.cfg, job.device
    seeded = derive_seeds(cfg)  # a null encoder.seed (random init) is the root seed, as in training
    model, info = load_model(cfg.get("model"), seeded.get("encoder"), cfg.get("pooling"), int(cfg.get("seed", 0)),
                             trust_remote_code=bool(cfg.get("trust_remote_code", False)))
    cross_pooling = group_overridden("pooling") if job.cross_pooling is None else job.cross_pooling
    # a plain HF encoder was built with cfg.pooling already: nothing to swap
    if cfg.get("model") not in (None, "") and cross_pooling and info["kind"] != "hf-encoder":
        trained = model.pooling_cfg.label if model.pooling_cfg is not None else "?"
        model = model.with_pooling(cfg.pooling)
        log.info("cross-pooling: trained with %s, evaluating with %s", trained, model.pooling_cfg.label)
        info["trained_pooling"] = trained
    why = no_landmarks(model) if job.eval_cfg.scoring in MAXSIM_SCORINGS else None
    if why is not None:  # before any text is encoded
        raise ConfigError(why)
    model = model.to(device)
    info.update(name=model.name, fingerprint=model.fingerprint(),
                pooling=model.pooling_cfg.label if model.pooling_cfg is not None else None,
                device=str(device), precision=resolve_precision(job.eval_cfg.precision, device))
    log.info("evaluating %s on %s (%s)", model.name, device, info["precision"])
    return model, info, cross_pooling


def _experiment_loggers(logger_cfg: Any, run_dir: Path, resolved: dict[str, Any]) -> Any:
    """The job's W&B / CSV loggers; None for `logger=none` (the default), which loads no Lightning."""
    logger_cfg = logger_cfg or {"name": "none"}
    if get_key(logger_cfg, "name", "csv") == "none":
        return None
    # Lightning's logger classes: seconds of start-up, paid by a job that logs only
    from lmk.run.loggers import build_logger

    return build_logger(logger_cfg, run_dir, resolved)


def record(scored: Scored) -> dict[str, Any]:
    """The suite's per-query scores and figures (`lmk.eval.runner.record_suite`), then results.json: status done,
    the eval section, the timings; with record=true the training run's own results too."""
    prepared = scored.encoded.prepared
    assert isinstance(prepared, JobPrepared)  # evaluate's prepare stage made it
    job = prepared.job
    section = record_suite(scored)
    section["cache_dir"] = prepared.cache_dir_text
    if job.cfg.get("record"):
        _record(job.cfg, prepared.info, section, job.run_dir, prepared.cross_pooling)
    update_results(job.run_dir, status="done", eval=section, timings=dict(job.timer.timings))
    return section


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
