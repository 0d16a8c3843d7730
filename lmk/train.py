"""`python -m lmk.train`: compose -> validate -> seed -> model -> data -> module -> fit -> export -> results.json.

Examples:
    python -m lmk.train encoder=tiny-modernbert pooling=lmk-variable trainer=cpu logger=wandb
    python -m lmk.train -m pooling=lmk-fixed pooling.chunk_size=32,64,128
    python -m lmk.train ckpt_path=last hydra.run.dir=<run dir>      # resume <run dir>/checkpoints/last.ckpt
    python -m lmk.train overwrite=true hydra.run.dir=<finished run>  # start a finished folder over

A run folder has one live owner (`lmk.run_lock`); a resumed run continues exactly (`lmk.resume`).
"""

from __future__ import annotations

import logging
import os
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from lmk import run_lock
from lmk.config import RootConfig, derive_seeds, to_container, validate
from lmk.results import Timer, config_hash_of, git_commit, update_results

log = logging.getLogger(__name__)


def _is_rank_zero() -> bool:
    from lightning.pytorch.utilities import rank_zero_only

    from lmk.cluster import submitit_rank

    rank = submitit_rank()  # a task of submitit's local executor: Lightning cannot tell before fit
    if rank is not None:
        rank_zero_only.rank = rank
        return rank == 0
    return rank_zero_only.rank == 0


def resolve_ckpt_path(ckpt_path: str | None, run_dir: Path) -> str | None:
    """`last` -> <run_dir>/checkpoints/last.ckpt (None with a warning when there is none yet)."""
    if ckpt_path in (None, "", "null"):
        return None
    if ckpt_path == "last":
        path = run_dir / "checkpoints" / "last.ckpt"
        if not path.exists():
            log.warning("ckpt_path=last but %s does not exist: starting from scratch", path)
            return None
        return str(path)
    if not Path(ckpt_path).exists():
        raise FileNotFoundError(f"ckpt_path={ckpt_path!r} does not exist; use null, last or an existing .ckpt")
    return ckpt_path


def _max_lengths(typed: RootConfig) -> tuple[int, int]:
    data = typed.data
    get = (lambda k, d: data.get(k, d)) if isinstance(data, dict) else (lambda k, d: getattr(data, k, d))
    return int(get("query_max_length", 128)), int(get("passage_max_length", 512))


def build_datamodule(cfg: DictConfig, model: Any) -> Any:
    """`instantiate(cfg.data, tokenizer=model.tokenizer)` (the PairDataModule of lmk.data)."""
    from lmk.eval.mirror import with_mirrored_sources

    # hub-id sources held by the hub mirror (`hub.mirror`) are read from it (compute nodes without internet)
    return hydra.utils.instantiate(with_mirrored_sources(cfg.data), tokenizer=model.tokenizer, _convert_="all")


def build_module(typed: RootConfig, model: Any) -> Any:
    from lmk.module import ContrastiveModule

    t = typed.train
    return ContrastiveModule(
        model, tau=t.tau, lr=t.lr, weight_decay=t.weight_decay, warmup_steps=t.warmup_steps,
        warmup_shape=t.warmup_shape, grad_scale=t.grad_scale,
        max_steps=typed.trainer.max_steps, grad_cache=t.grad_cache, grad_cache_chunk=t.grad_cache_chunk,
        gather_across_devices=t.gather_across_devices, in_batch_negatives=t.in_batch_negatives,
        use_teacher_scores=t.use_teacher_scores, teacher_temperature=t.teacher_temperature,
        gradient_checkpointing=bool(getattr(typed.encoder, "gradient_checkpointing", False)),
        # manual optimisation (grad cache) clips in the module; otherwise the Trainer clips
        gradient_clip_val=typed.trainer.gradient_clip_val if t.grad_cache else None,
    )


def build_callbacks(typed: RootConfig, cfg: DictConfig, run_dir: Path, has_logger: bool) -> list[Any]:
    """ModelCheckpoint first (run() reads it back), ExactResume, then the LR monitor and eval callback."""
    from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint

    from lmk.resume import ExactResume

    t = typed.train
    every = t.checkpoint_every_n_steps or max(typed.trainer.max_steps, 1)
    callbacks: list[Any] = [
        ModelCheckpoint(
            dirpath=str(run_dir / "checkpoints"), filename="best", monitor=t.monitor, mode=t.monitor_mode,
            save_top_k=1, save_last=True, every_n_train_steps=every, auto_insert_metric_name=False,
        ),
        ExactResume(run_dir),
    ]
    if has_logger:
        callbacks.append(LearningRateMonitor(logging_interval="step"))
    try:
        from lmk.eval.callback import build_eval_callback
    except ImportError:
        build_eval_callback = None
    if build_eval_callback is not None and typed.eval is not None:
        cb = build_eval_callback(typed.eval, run_dir)
        if cb is not None:
            callbacks.append(cb)
    return callbacks


def build_trainer(typed: RootConfig, cfg: DictConfig, run_dir: Path, callbacks: list[Any], loggers: Any) -> Any:
    kwargs = OmegaConf.to_container(cfg.trainer, resolve=True)
    assert isinstance(kwargs, dict)
    if typed.train.grad_cache:
        kwargs["gradient_clip_val"] = None  # Lightning refuses it under manual optimisation; the module clips
    kwargs.setdefault("default_root_dir", str(run_dir))
    from lmk.cluster import cluster_plugins

    plugins = cluster_plugins()  # submitit's local executor started the ranks: Lightning must not spawn
    extra = {"plugins": plugins} if plugins else {}
    return hydra.utils.instantiate(kwargs, callbacks=callbacks, logger=loggers if loggers else False, **extra)


def _metrics(trainer: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in trainer.callback_metrics.items():
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            continue
    out["global_step"] = int(trainer.global_step)
    return out


def run(cfg: DictConfig) -> float | None:
    """Train one run from a composed config; returns the optimised metric (`train.monitor`)."""
    typed = validate(cfg)  # fails in about a second, before torch / the model load
    from lmk.prefetch import check_available

    check_available(cfg)  # offline (HF_HUB_OFFLINE): every hub model / dataset this job loads is on disk
    run_dir = Path(typed.run_dir)
    digest = config_hash_of(cfg)  # before deriving seeds: the sweeper hashes the config as composed
    cfg = derive_seeds(cfg)  # null encoder.seed / data.seed = the root seed
    resolved = to_container(cfg)
    resolved.pop("hydra", None)
    timer = Timer()
    loggers = None
    exit_code = 1
    rank_zero = _is_rank_zero()
    ckpt: str | None = None
    # Before anything is written: a folder owned by another live run, or a finished run not meant to be
    # reused, is refused here (and leaves results.json alone). Usually the Hydra callback took it already.
    lock = run_lock.claim(run_dir, typed.ckpt_path, typed.overwrite)
    try:
        ckpt = resolve_ckpt_path(typed.ckpt_path, run_dir)
        if rank_zero:
            if ckpt is None:
                from lmk.resume import start_fresh

                start_fresh(run_dir)  # a new run never appends to an old metrics.csv / W&B run
            # A resumed run adds to its results; a new run in an old folder starts them over.
            update_results(run_dir, fresh=ckpt is None, status="running", config=resolved,
                           config_hash=digest, git_commit=git_commit())
        with timer.section("setup"):
            import lightning.pytorch as pl

            from lmk.loggers import build_logger, use_hydra_logging
            from lmk.model import EmbeddingModel

            use_hydra_logging()

            # seed_everything(0) is a real seed: never `if cfg.seed` (that skips seed 0).
            pl.seed_everything(typed.seed, workers=True)
            q_len, p_len = _max_lengths(typed)
            model = EmbeddingModel.build(cfg.encoder, cfg.pooling, query_max_length=q_len,
                                         passage_max_length=p_len, seed=typed.seed)
            datamodule = build_datamodule(cfg, model)
            module = build_module(typed, model)
            loggers = build_logger(typed.logger, run_dir, resolved, resume=ckpt is not None)
            if rank_zero:
                from lmk.loggers import wandb_info

                # now, not only at the end: a killed run's results.json still points at its W&B run
                update_results(run_dir, wandb=wandb_info(loggers))
            for lg in (loggers if isinstance(loggers, list) else [loggers] if loggers else []):
                lg.log_hyperparams(resolved)  # resolved: no ${...} left in W&B / hparams.yaml
            callbacks = build_callbacks(typed, cfg, run_dir, has_logger=bool(loggers))
            trainer = build_trainer(typed, cfg, run_dir, callbacks, loggers)
        t0 = time.perf_counter()
        with timer.section("fit"), warnings.catch_warnings():
            if getattr(getattr(datamodule, "cfg", None), "streaming", True) is False:
                # The map-style sampler resumes mid-epoch (lmk.resume); Lightning cannot tell and warns it
                # does not. A stream has no position to restore: that warning stays.
                warnings.filterwarnings("ignore", message=".*dataloader is not resumable.*")
            trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt)
        ckpt_cb = callbacks[0]
        if ckpt_cb._last_global_step_saved != trainer.global_step:  # the final step is always checkpointed
            trainer.save_checkpoint(str(run_dir / "checkpoints" / "last.ckpt"))
        fit_s = time.perf_counter() - t0
        metrics = _metrics(trainer)
        rank_zero = trainer.is_global_zero
        if rank_zero and typed.train.export:
            from lmk.export import export_sentence_transformers
            from lmk.loggers import quiet_progress_bars

            with timer.section("export"), quiet_progress_bars():
                export_sentence_transformers(model, run_dir / "export")
        if rank_zero:
            timings = dict(timer.timings)
            steps = metrics["global_step"] - module.fit_start_step  # a resumed fit ran only the rest
            timings["fit_steps"] = steps
            timings["fit_steps_per_s"] = round(steps / fit_s, 4) if fit_s > 0 else None
            from lmk.loggers import wandb_info

            update_results(
                run_dir, status="done", metrics=metrics, timings=timings, wandb=wandb_info(loggers),
                data_fingerprint=getattr(datamodule, "fingerprint", None),
                data=getattr(datamodule, "report", None),  # per source: rows kept / skipped as bad
                checkpoints={"last": str(run_dir / "checkpoints" / "last.ckpt"),
                             "best": ckpt_cb.best_model_path or None, "resumed_from": ckpt},
                export=str(run_dir / "export") if typed.train.export else None,
            )
        exit_code = 0
        value = metrics.get(typed.train.monitor)
        return None if value is None else float(value)
    except BaseException as err:
        if rank_zero:
            try:
                update_results(run_dir, status="failed", error=f"{type(err).__name__}: {err}",
                               traceback=traceback.format_exc(limit=20), timings=dict(timer.timings))
            except Exception:  # noqa: BLE001 - never mask the real error
                log.exception("could not write results.json")
        raise
    finally:
        from lmk.loggers import finish_loggers

        finish_loggers(loggers, exit_code=exit_code)
        if lock is not None:
            run_lock.release(run_dir)


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # dataloader workers fork after tokenizing
    return run(cfg)


if __name__ == "__main__":
    from lmk.cli import run_app

    run_app(main, "train")  # a command line that does not compose: one line, not Hydra's report
