"""The step faults of a fault plan (`lmk.run.faults`), fired from inside Lightning's training loop.

Armed when the fit starts (every rank reads the same markers then), each fires at the start of the step that
follows `step` optimizer steps, i.e. after step `step` was checkpointed (with `checkpoint_every_n_steps: 1`),
so a resume from `last` repeats no step; `requeue_mid_save` fires inside the save of step `step`'s checkpoint.
The scheduler faults call SLURM's own commands for the job they run in (`$SLURM_JOB_ID`), then wait to be
stopped by it, as a job does that the scheduler takes away.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from lmk.run import faults
from lmk.run.checkpoint_dir import TMP_MARK
from lmk.run.lock import job_identity
from lmk.train.requeue import RequeueOnSignal, warning_signal

log = logging.getLogger(__name__)

STOP_WAIT_S = 300.0  # how long a job waits for the scheduler to stop it after a scheduler fault
PROCESS_KINDS = ("kill", "timeout", "stale_lock", "driver_kill", "requeue", "requeue_mid_save", "node_down",
                 "time_limit")  # faults that need the job to be a process of its own


def _scontrol(*args: str) -> None:
    proc = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"fault plan: scontrol {' '.join(args)} failed: {proc.stderr.strip()}")


def _wait_to_be_stopped(what: str) -> None:
    deadline = time.monotonic() + STOP_WAIT_S
    while time.monotonic() < deadline:
        time.sleep(0.5)
    raise RuntimeError(f"fault plan: the scheduler did not stop the job within {STOP_WAIT_S:.0f} s after {what}")


def _requeue_watch(trainer: pl.Trainer) -> RequeueOnSignal | None:
    """The run's RequeueOnSignal callback (it notes the scheduler's warning signal), if it has one."""
    return next((c for c in trainer.callbacks if isinstance(c, RequeueOnSignal)), None)


def _wait_until(done: Callable[[], bool], seconds: float, poll: float) -> None:
    """Poll `done` every `poll` s until it holds or `seconds` have passed."""
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        time.sleep(poll)


def _this_job() -> str:
    """This job as scontrol names it: `<array>_<task>` for an array task (its SLURM_JOB_ID alone can be the
    array's own id, which addresses every task of the array)."""
    job = job_identity()[1]
    if job is None:
        raise RuntimeError("fault plan: a scheduler fault runs inside a SLURM job only")
    return job


def _elapsed_minutes(job: str) -> float:
    out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%M"], capture_output=True, text=True, timeout=60)
    parts = [int(p) for p in out.stdout.strip().replace("-", ":").split(":") if p.isdigit()]
    seconds = 0
    for part in parts:
        seconds = seconds * 60 + part
    return seconds / 60


class FaultCallback(pl.Callback):
    """Fires the armed step faults of this run's row."""

    def __init__(self, run_dir: str | os.PathLike, row: str | None) -> None:
        self.run_dir, self.row = Path(run_dir), row
        self.armed: list[faults.Fault] = []

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.armed = faults.armed_step_faults(self.row)
        scheduler = job_identity()[0]
        for fault in list(self.armed):
            needs = faults.FIRES_UNDER.get(fault.kind)
            if fault.kind in PROCESS_KINDS and scheduler not in ("slurm", "local"):
                # a job run inside the sweeper's process (Hydra's basic launcher): it would kill the sweep
                why = "a launcher that runs jobs as processes of their own (submitit_local or submitit_slurm)"
            elif needs and scheduler not in needs:
                why = "SLURM (launcher=submitit_slurm)" if "slurm" in needs else "submitit's local executor"
            else:
                continue
            if trainer.is_global_zero:
                log.warning("%s not fired: it needs %s", fault.describe(), why)
            self.armed.remove(fault)
        for fault in self.armed:
            if fault.kind == "stale_lock" and trainer.is_global_zero and (self.run_dir / "run.lock").is_file():
                faults.claim_lock_as(self.run_dir, fault.host)  # this run now "lives" on another host
            if fault.kind == "requeue_mid_save":
                self._cut_the_save(trainer, fault)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        step = trainer.global_step
        for fault in [f for f in self.armed if f.step == step and f.kind != "requeue_mid_save"]:
            self.armed.remove(fault)
            if fault.kind == "nan_loss":
                self._nan(trainer, pl_module, fault)
            elif fault.kind == "time_limit":
                self._time_limit(trainer, fault)
            elif fault.kind == "driver_kill" and trainer.is_global_zero:
                self._kill_the_sweep(fault, step)
            elif fault.kind in ("timeout", "requeue", "node_down") and trainer.is_global_zero:
                self._scheduler_fault(fault, step, trainer)
            elif (fault.kind == "kill" and trainer.global_rank == fault.rank) or (
                    fault.kind == "stale_lock" and trainer.is_global_zero):
                if faults.fire_once(fault, step=step, signal="SIGKILL"):
                    os.kill(os.getpid(), signal.SIGKILL)  # no cleanup at all, as the OOM killer does it

    @staticmethod
    def _scheduler_fault(fault: faults.Fault, step: int, trainer: pl.Trainer) -> None:
        if not faults.fire_once(fault, step=step):
            return
        log.warning("%s", fault.describe())
        if fault.kind == "timeout":
            os.kill(os.getpid(), warning_signal())  # submitit checkpoints and requeues the job
            # the handler runs at the next bytecode: submitit's exits (never go on with the step); RequeueOnSignal's
            # notes the signal, which it acts on at the step's end (go on once it has noted it)
            watch = _requeue_watch(trainer)
            _wait_until(lambda: watch is not None and watch.signalled, 5, poll=0.05)
            return
        job = _this_job()
        if fault.kind == "node_down":
            nodes = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
                                   capture_output=True, text=True, timeout=60).stdout.split()
            node = nodes[-1]
            # back in service later, whatever happens to this job (a process of its own session outlives it)
            subprocess.Popen(["sh", "-c", f"sleep {fault.down_s}; scontrol update NodeName={node} State=RESUME"],
                             start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            _scontrol("update", f"NodeName={node}", "State=DOWN", "Reason=lmk-fault-plan")
        else:
            _scontrol("requeue", job)
        _wait_to_be_stopped(fault.describe())

    @staticmethod
    def _time_limit(trainer: pl.Trainer, fault: faults.Fault) -> None:
        """Cut the job's limit to `minutes` from now, then stall every rank until the scheduler's warning signal
        arrives (a job running long): RequeueOnSignal saves at the end of this step and hands over the requeue."""
        if trainer.is_global_zero and faults.fire_once(fault, step=trainer.global_step):
            job = _this_job()
            limit = math.ceil(_elapsed_minutes(job)) + fault.minutes
            log.warning("%s: TimeLimit=%d min", fault.describe(), limit)
            _scontrol("update", f"JobId={job}", f"TimeLimit={limit}")
        watch = _requeue_watch(trainer)
        if watch is not None:
            _wait_until(lambda: watch.signalled, fault.minutes * 60 + STOP_WAIT_S, poll=0.5)

    @staticmethod
    def _kill_the_sweep(fault: faults.Fault, step: int) -> None:
        pids = faults.sweep_pids()
        if pids and faults.fire_once(fault, step=step, pids=pids):
            log.warning("%s (pids %s)", fault.describe(), pids)
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    @staticmethod
    def _cut_the_save(trainer: pl.Trainer, fault: faults.Fault) -> None:
        """Rank 0's checkpoint writer, cut inside the save of step `fault.step`: half the file written beside the
        target (as AtomicCheckpointIO names it), then the scheduler requeues the job."""
        if not trainer.is_global_zero:
            return
        io = trainer.strategy.checkpoint_io
        save = io.save_checkpoint

        def cut(checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
            if int(checkpoint.get("global_step", -1)) != fault.step or not faults.fire_once(fault, step=fault.step):
                return save(checkpoint, path, storage_options)
            tmp = Path(path).with_name(f"{Path(path).name}{TMP_MARK}{os.getpid()}")
            with open(tmp, "wb") as fh:
                torch.save(checkpoint, fh)
                fh.truncate(fh.tell() // 2)
                fh.flush()
                os.fsync(fh.fileno())
            log.warning("%s (%s half-written)", fault.describe(), tmp.name)
            _scontrol("requeue", _this_job())
            _wait_to_be_stopped(fault.describe())
            return None

        io.save_checkpoint = cut

    @staticmethod
    def _nan(trainer: pl.Trainer, pl_module: pl.LightningModule, fault: faults.Fault) -> None:
        # every rank poisons the same weight, so the step's loss is non-finite everywhere (as a real NaN is)
        if trainer.is_global_zero:
            faults.fire_once(fault, step=trainer.global_step)
        param = next(p for p in pl_module.parameters() if p.requires_grad and p.is_floating_point())
        with torch.no_grad():
            param.view(-1)[0] = float("nan")
        log.warning("%s", fault.describe())
