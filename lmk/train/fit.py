"""One training run after validation: seed -> model -> data -> module -> Lightning fit -> export -> results.json.

`fit(cfg, typed)` is what `python -m lmk.train` runs once the config validated (`lmk.train.command`). Every
phase writes through `lmk.run.results.update_results`, so a failure in a later phase never loses what an
earlier one recorded, and a failed run records its error.
"""

from __future__ import annotations

import logging
import os
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hydra
import lightning.pytorch as pl
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf

from lmk.config import CKPT_AUTO, CKPT_FRESH, RootConfig, derive_seeds, to_container, trains_landmark_states
from lmk.data.datamodule import PairDataModule
from lmk.data.landmarks import flat_summary
from lmk.eval.callback import build_eval_callback
from lmk.hub.mirror import with_mirrored_sources
from lmk.model.checkpoint import allowed_types, check_checkpoint
from lmk.model.embedding import EmbeddingModel
from lmk.run import faults
from lmk.run import lock as run_lock
from lmk.run.cluster import cluster_plugins, submitit_rank
from lmk.run.console import redirected
from lmk.run.loggers import build_logger, find_wandb, finish_loggers, wandb_info
from lmk.run.quiet_logging import quiet_progress_bars, use_hydra_logging
from lmk.run.results import STATUS_DONE, Results, Timer, config_hash_of, git_commit, update_results
from lmk.sharing.st_folder import export_multi_vector, export_sentence_transformers
from lmk.train.checkpoints import AtomicCheckpointIO, ResumePoint, newest_valid, read_info, resume_point
from lmk.train.fault_hooks import FaultCallback
from lmk.train.guard import NonFiniteError, NonFiniteGuard
from lmk.train.memory import decide_checkpointing
from lmk.train.module import build_module
from lmk.train.progress import LineProgress
from lmk.train.requeue import RequeueOnSignal, RequeueRequested
from lmk.train.resume import ExactResume, last_logged, start_fresh

log = logging.getLogger(__name__)


def is_rank_zero() -> bool:
    """Whether this process is global rank 0 (known before `fit` under submitit's local executor too)."""
    rank = submitit_rank()  # a task of submitit's local executor: Lightning cannot tell before fit
    if rank is not None:
        rank_zero_only.rank = rank
        return rank == 0
    return rank_zero_only.rank == 0


def build_model(cfg: DictConfig, typed: RootConfig) -> EmbeddingModel:
    """The EmbeddingModel of the config, at the training max lengths (data.query/passage_max_length)."""
    return EmbeddingModel.build(cfg.encoder, cfg.pooling, query_max_length=typed.data.query_max_length,
                                passage_max_length=typed.data.passage_max_length, seed=typed.seed)


def build_datamodule(typed: RootConfig, model: Any) -> PairDataModule:
    """The PairDataModule of the validated `data` section, tokenizing with the model's tokenizer."""
    # hub-id sources held by the hub mirror (`hub.mirror`) are read from it (compute nodes without internet)
    return PairDataModule(with_mirrored_sources(typed.data), tokenizer=model.landmark_tokenizer)


def build_callbacks(typed: RootConfig, run_dir: Path, has_logger: bool, config_hash: str) -> list[Any]:
    """ModelCheckpoint first (the run reads it back), ExactResume, the non-finite guard, the requeue signal, then
    the LR monitor and eval callback."""
    t = typed.train
    every = t.checkpoint_every_n_steps or max(typed.trainer.max_steps, 1)
    callbacks: list[Any] = [
        # no version counter: a new run never writes last-v1.ckpt beside an old last.ckpt (the resume rule and
        # AtomicCheckpointIO make overwriting safe)
        ModelCheckpoint(
            dirpath=str(run_dir / "checkpoints"), filename="best", monitor=t.monitor, mode=t.monitor_mode,
            save_top_k=1, save_last=True, every_n_train_steps=every, auto_insert_metric_name=False,
            enable_version_counter=False,
        ),
        ExactResume(run_dir, config_hash),
        NonFiniteGuard(),
        RequeueOnSignal(run_dir),
    ]
    if has_logger:
        callbacks.append(LearningRateMonitor(logging_interval="step"))
    cb = build_eval_callback(typed.eval, run_dir) if typed.eval is not None else None
    if cb is not None:
        callbacks.append(cb)
    if faults.active():  # a rehearsal of a bad day (`--faults`): the plan's step faults of this row
        callbacks.append(FaultCallback(run_dir, typed.row))
    return callbacks


def build_trainer(typed: RootConfig, cfg: DictConfig, run_dir: Path, callbacks: list[Any], loggers: Any) -> Any:
    kwargs = OmegaConf.to_container(cfg.trainer, resolve=True)
    assert isinstance(kwargs, dict)
    if typed.train.grad_cache:
        kwargs["gradient_clip_val"] = None  # Lightning refuses it under manual optimisation; the module clips
    # One progress line (lmk.train.progress) instead of Lightning's bar ("Epoch 0/-2" under max_steps); a sweep's
    # job always shows it (its other output goes to the log file)
    if kwargs.pop("enable_progress_bar", True) or redirected():
        row = cfg.get("row")
        callbacks = [LineProgress(label=f"{row}: " if row else ""), *callbacks]  # its last line before the eval
    kwargs["enable_progress_bar"] = False
    kwargs.setdefault("default_root_dir", str(run_dir))
    # checkpoints renamed into place, never truncated; submitit's local executor started the ranks: Lightning
    # must not spawn
    plugins = [AtomicCheckpointIO(), *cluster_plugins()]
    return hydra.utils.instantiate(kwargs, callbacks=callbacks, logger=loggers if loggers else False,
                                   plugins=plugins)


def trainer_metrics(trainer: Any, run_dir: Path | None = None) -> dict[str, float]:
    """The trainer's last logged metrics; a fit resumed at its last step ran none: its loss from metrics.csv."""
    out: dict[str, float] = {}
    for key, value in trainer.callback_metrics.items():
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            continue
    out["global_step"] = int(trainer.global_step)
    if "train/loss" not in out and run_dir is not None:
        loss = last_logged(run_dir, "train/loss")
        if loss is not None:
            out["train/loss"] = loss
    return out


@dataclass
class _Run:
    """What the phases of one training run share."""

    cfg: DictConfig
    typed: RootConfig
    run_dir: Path
    resolved: dict[str, Any]
    digest: str
    rank_zero: bool
    timer: Timer = field(default_factory=Timer)
    point: ResumePoint = field(default_factory=lambda: ResumePoint(None))
    loggers: Any = None
    model: Any = None
    datamodule: Any = None
    module: Any = None
    callbacks: list[Any] = field(default_factory=list)
    trainer: Any = None


def _resume_point(run: _Run) -> ResumePoint:
    """The checkpoint this job resumes from (`lmk.train.checkpoints.resume_point`): rank 0 decides (it may move
    old checkpoints aside) and publishes it in the run lock; the other ranks take the same one."""
    typed = run.typed
    if run.rank_zero:
        start_over = typed.overwrite and Results.read(run.run_dir).status == STATUS_DONE
        point = resume_point(typed.ckpt_path, run.run_dir, run.digest, start_over=start_over)
        run_lock.publish(run.run_dir, resume=str(point.path) if point.path else None)
        return point
    owner = run_lock.follow_rank_zero(run.run_dir, need="resume")
    if owner is not None:
        return ResumePoint(Path(owner["resume"]) if owner["resume"] else None)
    # no job identity to follow (a launcher lmk does not know): the same rule, without moving anything
    if typed.ckpt_path in CKPT_FRESH:
        return ResumePoint(None)
    if typed.ckpt_path in CKPT_AUTO:
        return newest_valid(run.run_dir, run.digest)
    info, _ = read_info(typed.ckpt_path)
    return ResumePoint(Path(typed.ckpt_path), info.global_step if info else None)


def _start(run: _Run) -> None:
    """Resolve the checkpoint; a new run starts its files over, a resumed one adds to them."""
    run.point = _resume_point(run)
    if run.rank_zero:
        resumed = run.point.path is not None
        if not resumed:
            start_fresh(run.run_dir)  # a new run never appends to an old metrics.csv / W&B run
        log.info("%s", run.point.describe())
        update_results(run.run_dir, fresh=not resumed, status="running", config=run.resolved,
                       config_hash=run.digest, git_commit=git_commit(),
                       resume={"from": str(run.point.path) if resumed else None, "step": run.point.step,
                               "passed_over": [f"{p.name}: {why}" for p, why in run.point.skipped],
                               "moved_aside": str(run.point.moved_to) if run.point.moved_to else None},
                       **(_interruptions(run.run_dir, run.point) if resumed else {}))


def _interruptions(run_dir: Path, point: ResumePoint) -> dict[str, Any]:
    """A resumed run: what stopped the previous attempt moves to `interruptions` (a finished run shows no error)."""
    previous = Results.read(run_dir)
    history = list(previous.interruptions)
    status = previous.status
    if status in ("running", "interrupted", "failed"):
        error = previous.error or ("stopped without a trace: killed, requeued by the scheduler or its node "
                                   "lost" if status == "running" else None)
        history.append({"status": status, "error": error, "at": previous.updated_at,
                        "resumed_from": str(point.path), "step": point.step,
                        "scheduler_restarts": os.environ.get("SLURM_RESTART_COUNT")})
    return {"error": None, "traceback": None, "interruptions": history} if history else {}


def _setup(run: _Run) -> None:
    """Seed, model, data, module, loggers, callbacks and the Trainer."""
    use_hydra_logging()
    # seed_everything(0) is a real seed: never `if cfg.seed` (that skips seed 0).
    pl.seed_everything(run.typed.seed, workers=True)
    # encoder.gradient_checkpointing resolved once (auto: from the memory estimate the dry run printed)
    checkpointing = decide_checkpointing(run.resolved)
    log.info(checkpointing.line)
    run.model = build_model(run.cfg, run.typed)
    run.datamodule = build_datamodule(run.typed, run.model)
    run.module = build_module(run.typed, run.model, checkpointing.on)
    run.loggers = build_logger(run.typed.logger, run.run_dir, run.resolved, resume=run.point.path is not None)
    if run.rank_zero:
        # now, not only at the end: a killed run's results.json still points at its W&B run
        update_results(run.run_dir, wandb=wandb_info(run.loggers), gradient_checkpointing=checkpointing.record())
    for lg in (run.loggers if isinstance(run.loggers, list) else [run.loggers] if run.loggers else []):
        lg.log_hyperparams(run.resolved)  # resolved: no ${...} left in W&B / hparams.yaml
    run.callbacks = build_callbacks(run.typed, run.run_dir, has_logger=bool(run.loggers), config_hash=run.digest)
    run.trainer = build_trainer(run.typed, run.cfg, run.run_dir, run.callbacks, run.loggers)
    t = run.trainer
    log.info("rank %d of %d: node %d, local rank %d", t.global_rank, t.world_size, t.node_rank, t.local_rank)


def _fit(run: _Run) -> float:
    """Lightning's fit (resumed from `run.ckpt`), the final step always checkpointed; returns its seconds."""
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        if not run.typed.data.streaming:
            # The map-style sampler resumes mid-epoch (lmk.train.resume); Lightning cannot tell and warns it
            # does not. A stream has no position to restore: that warning stays.
            warnings.filterwarnings("ignore", message=".*dataloader is not resumable.*")
        ckpt = str(run.point.path) if run.point.path else None
        if run.point.path:
            check_checkpoint(run.point.path)  # a foreign type: one line naming the file and the type
        with allowed_types():  # weights_only: no code a checkpoint holds runs, only lmk's types load
            run.trainer.fit(run.module, datamodule=run.datamodule, ckpt_path=ckpt, weights_only=True)
    if run.callbacks[0]._last_global_step_saved != run.trainer.global_step:
        run.trainer.save_checkpoint(str(run.run_dir / "checkpoints" / "last.ckpt"))
    return time.perf_counter() - t0


def query_prompts(sources: Any) -> dict[str, str]:
    """The training sources' query instructions as sentence-transformers' named prompts: one per source (its name)
    and, where every instructed source shares one, `query` too (what mteb and `encode(prompt_name="query")` use)."""
    prompts = {s.name: s.query_prompt for s in sources if s.query_prompt}
    if len(set(prompts.values())) == 1:
        prompts["query"] = next(iter(prompts.values()))
    return prompts


def _finish(run: _Run, fit_s: float, metrics: dict[str, float]) -> None:
    """Rank 0: the export and the finished results.json (metrics, timings, data report, checkpoints)."""
    typed, run_dir = run.typed, run.run_dir
    if typed.train.export:
        with run.timer.section("export"), quiet_progress_bars():
            if trains_landmark_states(typed.train.objective):  # trained for MaxSim: shared as its landmark states
                export_multi_vector(run.model, run_dir / "export", maxsim_query=typed.train.maxsim_query)
            else:
                export_sentence_transformers(run.model, run_dir / "export", prompts=query_prompts(typed.data.sources))
    timings: dict[str, Any] = dict(run.timer.timings)
    steps = metrics["global_step"] - (run.point.step or 0)  # a resumed fit ran only the rest
    timings["fit_steps"] = steps
    timings["fit_steps_per_s"] = round(steps / fit_s, 4) if fit_s > 0 else None
    landmarks = _landmark_report(run.datamodule)
    fill = run.module.fill_record()  # tokens computed against real tokens (lmk.train.chunks)
    wandb_logger = find_wandb(run.loggers)
    if wandb_logger is not None:  # the same figures in the W&B run's summary
        wandb_logger.log_summary(flat_summary("fill", fill))
        if landmarks:
            wandb_logger.log_summary(flat_summary("landmarks/train", landmarks))
    update_results(
        run_dir, status="done", metrics=metrics, timings=timings, wandb=wandb_info(run.loggers),
        landmarks={"train": landmarks} if landmarks else {}, fill=fill,
        data_fingerprint=getattr(run.datamodule, "fingerprint", None),
        data=getattr(run.datamodule, "report", None),  # per source: rows kept / skipped as bad
        checkpoints={"last": str(run_dir / "checkpoints" / "last.ckpt"),
                     "best": run.callbacks[0].best_model_path or None,
                     "resumed_from": str(run.point.path) if run.point.path else None},
        export=str(run_dir / "export") if typed.train.export else None,
    )


def _landmark_report(datamodule: Any) -> dict[str, Any] | None:
    """The training sources' landmark statistics (`PairDataModule.landmark_report`); a failure to count them (a
    stream that cannot be reopened) is a warning, never a failed run that trained."""
    try:
        return datamodule.landmark_report() if hasattr(datamodule, "landmark_report") else None
    except Exception as err:  # noqa: BLE001 - statistics of a finished run
        log.warning("landmark statistics of the training sources not recorded (%s: %s)", type(err).__name__, err)
        return None


def _non_finite(err: BaseException, run_dir: Path) -> dict[str, Any]:
    """results.json's `non_finite` record (step, what, sample keys, the last good checkpoint) for a guard stop."""
    if not isinstance(err, NonFiniteError):
        return {}
    info = dict(err.info)
    last = run_dir / "checkpoints" / "last.ckpt"
    if not info.get("last_good_checkpoint") and last.exists():
        info["last_good_checkpoint"] = str(last)
    return {"non_finite": info}


def stop_status(err: BaseException, run: _Run) -> tuple[str, str]:
    """(results.json status, error) of a run that stopped on `err`: "interrupted" when the scheduler or a user
    stopped it (it resumes from its last checkpoint), "failed" otherwise."""
    step = int(run.trainer.global_step) if run.trainer is not None else None
    at = f" at step {step}" if step is not None else ""
    if isinstance(err, RequeueRequested):
        return "interrupted", str(err)
    if isinstance(err, SIGTERMException):
        return "interrupted", (f"stopped by SIGTERM{at} (a requeue, preemption, lost node or scancel); a rerun or "
                               "the requeued job resumes from the last checkpoint")
    if isinstance(err, (SystemExit, KeyboardInterrupt)):
        return "interrupted", f"{type(err).__name__}{at}: {err}"
    return "failed", f"{type(err).__name__}: {err}"


def fit(cfg: DictConfig, typed: RootConfig) -> float | None:
    """Train one run from a validated config; returns the optimised metric (`train.monitor`)."""
    run_dir = Path(typed.run_dir)
    digest = config_hash_of(cfg)  # before deriving seeds: the sweeper hashes the config as composed
    cfg = derive_seeds(cfg)  # null encoder.seed / data.seed = the root seed
    resolved = to_container(cfg)
    resolved.pop("hydra", None)
    run = _Run(cfg, typed, run_dir, resolved, digest, rank_zero=is_rank_zero())
    exit_code = 1
    # Before anything is written: a folder owned by another live run, or a finished run not meant to be
    # reused, is refused here (and leaves results.json alone). Usually the Hydra callback took it already.
    lock = run_lock.claim(run_dir, typed.ckpt_path, typed.overwrite)
    try:
        _start(run)
        with run.timer.section("setup"):
            _setup(run)
        with run.timer.section("fit"):
            fit_s = _fit(run)
        metrics = trainer_metrics(run.trainer, run_dir)
        run.rank_zero = run.trainer.is_global_zero
        if run.rank_zero:
            _finish(run, fit_s, metrics)
        exit_code = 0
        value = metrics.get(typed.train.monitor)
        return None if value is None else float(value)
    except BaseException as err:
        if run.rank_zero:
            try:
                status, error = stop_status(err, run)
                update_results(run_dir, status=status, error=error,
                               traceback=traceback.format_exc(limit=20), timings=dict(run.timer.timings),
                               **_non_finite(err, run_dir))
            except Exception:  # noqa: BLE001 - never mask the real error
                log.exception("could not write results.json")
        raise
    finally:
        finish_loggers(run.loggers, exit_code=exit_code)
        if lock is not None:
            run_lock.release(run_dir)
