"""A checkpoint at the scheduler's warning signal, then the requeue: a time limit or preemption loses no step.

SLURM sends the job's tasks a warning signal before its time limit (submitit asks for USR2, `signal_delay_s`
ahead) and on a `PreemptMode=REQUEUE` preemption. submitit's own handler requeues at once, from inside the
signal handler, wherever the training step happens to be, and saves nothing. `RequeueOnSignal` takes the
signal over while a fit runs: the handler only notes it; at the end of the current optimiser step every rank
agrees (one all-reduce) and saves `last.ckpt` together; at the start of the next step (once Lightning logged
the step that was saved) rank 0 hands over to the handler that was there before (submitit's: it requeues the job, counting time limits against `max_num_timeout`, and exits without a
result, so the sweep keeps waiting for the requeued job) and the other ranks wait for the scheduler to stop
them. Without a previous handler (a run started by hand) the fit stops after the save, as interrupted.

SIGTERM (a `scontrol requeue`, a node lost, `scancel`) gives no warning: Lightning stops at the next step
boundary when it can, and the job resumes from its last periodic checkpoint (`train.checkpoint_every_n_steps`).
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

log = logging.getLogger(__name__)

WAIT_FOR_STOP_S = 120.0  # a non-zero rank's wait for the scheduler to stop the requeued job


class RequeueRequested(SystemExit):
    """The job stops for a requeue (or at a warning signal with no scheduler to requeue it): not a failure."""

    def __init__(self, message: str, code: int | str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            # the exit status the scheduler's handler chose: submitit's local executor requeues a job only when
            # a task exits with its requeue code
            self.code = code

    def __str__(self) -> str:
        return self.message


def warning_signal() -> int:
    """The signal submitit asks the scheduler to send before a time limit (USR2 unless configured)."""
    return int(getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")))


class RequeueOnSignal(pl.Callback):
    """Defers the scheduler's warning signal to the next step boundary, saving `last.ckpt` first."""

    def __init__(self, run_dir: str | os.PathLike, signum: int | None = None) -> None:
        self.path = Path(run_dir) / "checkpoints" / "last.ckpt"
        self.signum = warning_signal() if signum is None else signum
        self._previous: Any = None
        self._received: int | None = None
        self._installed = False
        self._pending_stop: str | None = None

    def _note(self, signum: int, frame: Any) -> None:
        self._received = signum  # only a flag: the step in progress finishes first

    @property
    def signalled(self) -> bool:
        """Whether the warning signal has arrived (it is acted on at the step's end)."""
        return self._received is not None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        try:
            self._previous = signal.signal(self.signum, self._note)
            self._installed = True
        except ValueError:  # not the main thread (a notebook's worker): the scheduler's handler stays
            log.debug("requeue signal not taken over: not in the main thread")

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._restore()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._restore()

    def _restore(self) -> None:
        if self._installed:
            signal.signal(self.signum, self._previous if self._previous is not None else signal.SIG_DFL)
            self._installed = False

    def _agreed(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> bool:
        flag = torch.tensor(0.0 if self._received is None else 1.0, device=pl_module.device)
        if trainer.world_size > 1:
            flag = trainer.strategy.reduce(flag, reduce_op="sum")
        return bool(flag > 0)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not self._installed or self._pending_stop is not None or not self._agreed(trainer, pl_module):
            return
        step = int(trainer.global_step)
        trainer.save_checkpoint(str(self.path))  # every rank takes part; rank 0 writes
        name = signal.Signals(self._received or self.signum).name
        log.warning("%s at step %d: saved %s; handing the job to the scheduler for a requeue", name, step, self.path)
        # Lightning logs this step's metrics after this hook: the stop comes at the next step's start, so
        # metrics.csv keeps the step (the logger is flushed on the way out)
        self._pending_stop = f"stopped at step {step} by {name} (a time limit or preemption) after saving {self.path}"

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self._pending_stop is None:
            return
        message, previous = self._pending_stop, self._previous
        self._restore()
        if callable(previous) and trainer.is_global_zero:
            try:
                # submitit's handler: requeue + SystemExit (no result is written, the sweep waits for the
                # requeued job); it raises UncompletedJobError instead when the job timed out too often
                previous(self._received or self.signum, None)
            except SystemExit as handler_exit:
                raise RequeueRequested(f"{message}; requeued", code=handler_exit.code) from None
        elif callable(previous):
            time.sleep(WAIT_FOR_STOP_S)  # rank 0's requeue stops every task; exiting first would fail the job
        raise RequeueRequested(message)
