"""What a sweep does with each row's job: skip it, wait for it, leave it alone, or launch it.

The row sweeper (`hydra_plugins.lmk_row_sweeper`) gathers the facts of a job (its folder's results.json and
run.lock, the previous sweep's record of the job it launched there and what the scheduler says of that job)
and asks `decide`; it only adapts the answer to Hydra's launcher. The rules:

- a job this sweep launched before that the scheduler still holds (pending, running, requeued) is
  **reattached**: never submitted a second time, waited for, its outcome recorded;
- a folder another live run holds (its run.lock; "unknown" where it cannot be judged) is **busy**: left alone;
- a finished row of the same config is **skipped**;
- a row the non-finite guard stopped is **not retried** under the same config: an exact resume replays the same
  batches into the same NaN (`retry_nonfinite` asks for it anyway);
- every other row is **launched**: a finished folder of another config (or any row under `force`) is started
  over, the rest start with `ckpt_path=auto`, the one resume rule every job start applies
  (`lmk.train.checkpoints`), so a requeue by the scheduler resumes the same way as a rerun of the sweep.

After a launch, a job reported failed whose folder records it done under its config counts as finished
(`finished_after_all`); the outcome of a job that no longer holds its row (a newer job was launched for it, or a
newer run finished in its folder) is stale (`newer_holder`) and recorded nowhere.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from lmk.run import lock as run_lock
from lmk.run.results import STATUS_DONE, UPDATED_AT_FORMAT, Results
from lmk.run.scheduler import slurm_job

STATUS_FILE = "sweep_status.json"  # per block: {job: {status, job_id, scheduler, host, ...}}
LAUNCHED = ("launched", "reattached")  # record states of a job handed to a scheduler and not seen to end


@dataclass(frozen=True)
class RowState:
    """The facts of one job the sweeper gathered."""

    job: str
    digest: str  # the config hash of the job as composed now
    results: Results  # its folder's results.json (an empty record when none)
    record: Mapping[str, Any]  # the previous sweep's entry for this job ({} when none)
    lock: str  # "free" | "alive" | "dead" | "unknown": the folder's run.lock
    lock_owner: Mapping[str, Any] | None
    recorded_job: str  # "alive" | "dead" | "unknown" | "none": the scheduler on the job recorded in `record`
    recorded_state: str | None = None  # the scheduler's word for it (PENDING, RUNNING, ...)
    has_checkpoints: bool = False


@dataclass(frozen=True)
class Decision:
    action: str  # "skip" | "reattach" | "busy" | "not_retried" | "launch"
    why: str
    overwrite: bool = False  # a finished folder is started over (`overwrite=true`)
    start_over: bool = False  # its checkpoints are moved aside before the launch (`force`)
    resumes: bool = False  # the job will find a checkpoint of its config (for the console; the job decides)


def decide(state: RowState, force: bool = False, retry_nonfinite: bool = False) -> Decision:
    res, record = state.results, state.record
    status, same, recorded = res.status, res.config_hash == state.digest, not res.is_empty
    if state.recorded_job == "alive":
        return Decision("reattach", f"job {record.get('job_id')} launched by an earlier sweep is "
                                    f"{state.recorded_state or 'alive'}: waiting for it, not submitting again")
    if state.lock in ("alive", "unknown"):
        return Decision("busy", busy_message(state))
    if not force and status == STATUS_DONE and same:
        return Decision("skip", "done, same config")
    if not force and not retry_nonfinite and same and status == "failed" and res.non_finite:
        nf = res.non_finite
        return Decision("not_retried", f"stopped by the non-finite guard ({nf.get('what')} at step {nf.get('step')}); "
                        "a rerun of the same config replays the same batches: change the config (e.g. a lower "
                        "train.lr) or pass --retry-nonfinite")
    resumes = not force and same and state.has_checkpoints
    if force:
        why = "forced: starts over"
    elif recorded and not same:
        why = "changed config: starts over"
    else:
        why = "resumes from its last checkpoint" if resumes else "new" if not recorded else "starts over (no checkpoint)"
    return Decision("launch", why, overwrite=status == STATUS_DONE, start_over=force, resumes=resumes)


def finished_after_all(job_dir: Path, digest: str) -> bool:
    """Whether a launched job that reported a failure finished anyway: its folder records it done under this config
    (a rank's stale failure after rank 0 finished). Its own record then wins over the launcher's report."""
    results = Results.read(job_dir)
    return results.status == STATUS_DONE and results.config_hash == digest


def newer_holder(mine: Mapping[str, Any], on_record: Mapping[str, Any], results: Results, digest: str) -> str | None:
    """Who holds a row now, when it is no longer the job whose outcome is in hand; None when the outcome is that
    job's to record. `mine`: this sweep's record of the row (the job it launched or reattached, `queued_at`);
    `on_record`: the row's entry in the sweep's status file as it is now; `results`: its folder's results.json.

    A sweep waiting for a job (its own, or one an earlier sweep launched and it reattached) can read that job's
    death after another sweep of the same folder launched the row again and the new job finished: the death must
    not be written over the newer results."""
    job, holder = str(mine.get("job_id") or ""), str(on_record.get("job_id") or "")
    if job and holder and holder != job:
        return f"job {holder}"  # only a launch records another job id for a row: a newer job
    # a run of another config finished in the folder after this job was queued (a run this job made would carry
    # its config; one launched in-process records no job id)
    queued, written = mine.get("queued_at"), results.updated_at
    if queued is None or written is None or results.status != STATUS_DONE or results.config_hash == digest:
        return None
    try:
        finished = datetime.strptime(written, UPDATED_AT_FORMAT).timestamp()
    except ValueError:
        return None
    return f"the run done at {written} under config {results.config_hash}" if finished > float(queued) else None


def busy_message(state: RowState) -> str:
    owner = state.lock_owner or {}
    where = f"pid {owner.get('pid')} on {owner.get('host')} (job {owner.get('job_id')})"
    tail = "" if state.lock == "alive" else "; it cannot be checked from here: delete the lock if that job is gone"
    return f"running elsewhere: {where} holds its {run_lock.LOCK_FILE}{tail}"


# ------------------------------------------------------------------------------------------- the facts


def ended_jobs(record: Mapping[str, Any]) -> list[str]:
    """The ids of a row's jobs that a sweep saw end (carried from sweep to sweep)."""
    ended = list(record.get("ended_jobs") or [])
    if record.get("job_id") and record.get("status") in ("completed", "failed"):
        ended.append(str(record["job_id"]))
    return sorted(set(ended))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def recorded_job(record: Mapping[str, Any]) -> tuple[str, str | None]:
    """(verdict, scheduler state) of the job an earlier sweep launched for this row and did not see end."""
    job = str(record.get("job_id") or "")
    if record.get("status") not in LAUNCHED or not job:
        return "none", None
    if record.get("scheduler") == "slurm":
        answer = slurm_job(job)
        return answer.verdict, answer.state
    if record.get("scheduler") == "local" and job.isdigit():
        if record.get("host") != socket.gethostname():
            return "unknown", None
        alive = _pid_alive(int(job))  # submitit's local job id is its controller's pid
        return ("alive", "RUNNING") if alive else ("dead", None)
    return "unknown", None


def lock_verdict(job_dir: Path, record: Mapping[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """(verdict, owner) of a row folder's run.lock: "free" (none), "alive", "dead" or "unknown". What
    `lmk.run.lock.judge` cannot tell from here is judged from the sweep's record: a job it saw end is dead;
    a job it queued on submitit's local executor on this host lives as long as its controller process."""
    owner = run_lock.read_owner(job_dir)
    if not owner:
        return "free", owner  # none, or half-written: the job's own claim judges that one
    verdict = run_lock.judge(owner)
    job = str(owner.get("job_id") or "")
    if verdict == "unknown" and job:
        if job in ended_jobs(record):
            verdict = "dead"
        elif record.get("job_id") == job and record.get("scheduler") == "local" \
                and record.get("host") == socket.gethostname() and job.isdigit():
            verdict = "alive" if _pid_alive(int(job)) else "dead"  # the job's controller
    return verdict, owner


def gather(job: str, job_dir: Path, digest: str, results: Results, record: Mapping[str, Any],
           has_checkpoints: bool) -> RowState:
    """The facts `decide` needs (asks the scheduler about a recorded job; reads the lock)."""
    verdict, state = recorded_job(record)
    lock, owner = lock_verdict(job_dir, record)
    return RowState(job, digest, results, record, lock, owner, verdict, state, has_checkpoints)
