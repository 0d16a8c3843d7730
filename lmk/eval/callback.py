"""Lightning callback: the eval suite during training (every N steps) and at the end of fit.

Rank 0 evaluates (the other ranks would wait at a barrier under the process group's 30-minute timeout, so
`python -m lmk.train` refuses in-training evaluation of a multi-process run at validation: the sweep's eval stage
evaluates those); the model is put in eval mode and its train mode restored. It evaluates where it trains: on the trainer's device (never moved, so training goes
on where it was), under an autocast of `eval.precision` (auto: bf16 on GPUs, fp32 on CPU), since
Lightning's own autocast covers only the training step. Every score goes to the trainer's loggers (eval/<task>, eval/<task>/<split>,
eval/group/<group>: one W&B panel per task and per length) and into the run's results.json
(`eval` for the fit-end suite, `eval_history.<step>` for mid-training evals) via
`lmk.run.results.update_results`, so nothing already written is lost.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from lmk.config.eval import EvalConfig
from lmk.run.results import update_results

log = logging.getLogger(__name__)


def _embedding_model(pl_module: Any) -> Any:
    # ContrastiveModule keeps the EmbeddingModel as `.model`; a bare EmbeddingModel also works.
    model = getattr(pl_module, "model", None)
    return model if model is not None and hasattr(model, "encode") else pl_module


def _check_device(spec: str, device: Any) -> None:
    """eval.device is for `lmk.evaluate`; during a fit the trainer's device is used (say so if they differ)."""
    if spec == "auto":
        return
    want, have = torch.device(spec), torch.device(device)
    if want.type != have.type or (want.index is not None and want.index != have.index):
        log.warning("eval.device=%s is ignored during training: the eval suite runs on the trainer's device %s "
                    "(moving the model would leave it away from the trainer)", spec, have)


class EvalCallback(pl.Callback):
    def __init__(self, eval_cfg: Any, run_dir: str | os.PathLike) -> None:
        super().__init__()
        self.cfg = EvalConfig.from_cfg(eval_cfg)
        self.run_dir = Path(run_dir)
        self.cache_dir = Path(self.cfg.cache_dir) if self.cfg.cache_dir else self.run_dir / "mteb_cache"
        self._tasks: list[Any] | None = None
        self._last_step: int | None = None
        self.history: dict[int, dict[str, Any]] = {}

    def _build_tasks(self) -> list[Any]:
        # Built once (names + network checked, local data regenerated), reused at every eval.
        if self._tasks is None:
            from lmk.eval.suites import build_tasks  # mteb: loaded by a job that evaluates, not by every rank

            self._tasks = build_tasks(self.cfg)
        return self._tasks

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # Build the tasks (local data regenerated, hub tasks pointed at the mirror) before the first step;
        # names and offline availability were checked before the model was built (lmk.hub.artifacts).
        if stage == "fit" and trainer.is_global_zero:
            self._build_tasks()

    def run(self, trainer: pl.Trainer, pl_module: pl.LightningModule, final: bool) -> dict[str, Any] | None:
        step = int(trainer.global_step)
        section = None
        if trainer.is_global_zero:
            model = _embedding_model(pl_module)
            _check_device(self.cfg.device, pl_module.device)
            log.info("eval suite %s at step %d%s", self.cfg.name, step, " (fit end)" if final else "")
            from lmk.eval.runner import run_suite  # mteb, with the suites: loaded where a job evaluates

            section = run_suite(
                model,
                self.cfg,
                self.cache_dir,
                logger=list(trainer.loggers) or None,
                out_dir=self.run_dir,
                # mid-training weights change under one name: the step is part of the cache identity
                per_query_file="per_query.json" if final else None,
                tag=None if final else f"step{step}",
                step=step,
                tasks=self._build_tasks(),
            )
            summary = {"step": step, "tasks": {t: e["main_score"] for t, e in section["tasks"].items()},
                       "groups": section["groups"]}
            self.history[step] = summary
            if final:
                update_results(self.run_dir, eval=section, eval_history={str(step): summary})
            else:
                update_results(self.run_dir, eval_history={str(step): summary})
        self._last_step = step
        trainer.strategy.barrier("lmk_eval")
        return section

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        n = self.cfg.every_n_steps
        step = int(trainer.global_step)
        # global_step counts optimizer steps; with gradient accumulation several batches share one.
        if n and step > 0 and step % n == 0 and step != self._last_step:
            if trainer.max_steps and trainer.max_steps > 0 and step >= trainer.max_steps and self.cfg.at_fit_end:
                return  # the fit-end eval covers the last step
            self.run(trainer, pl_module, final=False)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # on_train_end runs before the loggers are finalized (on_fit_end comes after teardown).
        if self.cfg.at_fit_end:
            self.run(trainer, pl_module, final=True)


def build_eval_callback(eval_cfg: Any, run_dir: str | os.PathLike) -> EvalCallback | None:
    """The eval callback for this suite, or None when the suite has no tasks (eval=none) or the training job
    evaluates none of it (`eval.in_training: none`: the sweep's eval stage does)."""
    cfg = EvalConfig.from_cfg(eval_cfg).training_view()
    if not cfg.enabled or (cfg.every_n_steps is None and not cfg.at_fit_end):
        return None
    return EvalCallback(cfg, run_dir)
