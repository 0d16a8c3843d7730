"""The step faults of a fault plan (`lmk.run.faults`), fired from inside Lightning's training loop.

Armed when the fit starts (every rank reads the same markers then), each fires at the start of the step that
follows `step` optimizer steps, i.e. after step `step` was checkpointed (with `checkpoint_every_n_steps: 1`),
so a resume from `last` repeats no step.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from lmk.run import faults
from lmk.run.lock import job_identity

log = logging.getLogger(__name__)


def _timeout_signal() -> int:
    """The signal a scheduler sends a job about to overrun its time limit (submitit's: USR2 by default)."""
    return int(getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")))


class FaultCallback(pl.Callback):
    """Fires the armed step faults of this run's row (kill, timeout, stale_lock, nan_loss)."""

    def __init__(self, run_dir: str | os.PathLike, row: str | None) -> None:
        self.run_dir, self.row = Path(run_dir), row
        self.armed: list[faults.Fault] = []

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.armed = faults.armed_step_faults(self.row)
        if job_identity()[0] not in ("slurm", "local"):
            # a job run inside the sweeper's process (Hydra's basic launcher): killing it would kill the sweep
            for fault in [f for f in self.armed if f.kind in ("kill", "timeout", "stale_lock")]:
                log.warning("%s not fired: it needs a launcher that runs jobs as processes of their own "
                            "(launcher=submitit_local or submitit_slurm)", fault.describe())
                self.armed.remove(fault)
        for fault in self.armed:
            if fault.kind == "stale_lock" and trainer.is_global_zero and (self.run_dir / "run.lock").is_file():
                faults.claim_lock_as(self.run_dir, fault.host)  # this run now "lives" on another host

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        step = trainer.global_step
        for fault in [f for f in self.armed if f.step == step]:
            self.armed.remove(fault)
            if fault.kind == "nan_loss":
                self._nan(trainer, pl_module, fault)
            elif fault.kind == "timeout" and trainer.is_global_zero:
                if faults.fire_once(fault, step=step):
                    log.warning("%s", fault.describe())
                    os.kill(os.getpid(), _timeout_signal())  # submitit checkpoints and requeues the job
                    time.sleep(5)  # the handler runs at the next bytecode; never go on with the step
            elif (fault.kind == "kill" and trainer.global_rank == fault.rank) or (
                    fault.kind == "stale_lock" and trainer.is_global_zero):
                if faults.fire_once(fault, step=step, signal="SIGKILL"):
                    os.kill(os.getpid(), signal.SIGKILL)  # no cleanup at all, as the OOM killer does it

    @staticmethod
    def _nan(trainer: pl.Trainer, pl_module: pl.LightningModule, fault: faults.Fault) -> None:
        # every rank poisons the same weight, so the step's loss is non-finite everywhere (as a real NaN is)
        if trainer.is_global_zero:
            faults.fire_once(fault, step=trainer.global_step)
        param = next(p for p in pl_module.parameters() if p.requires_grad and p.is_floating_point())
        with torch.no_grad():
            param.view(-1)[0] = float("nan")
        log.warning("%s", fault.describe())
