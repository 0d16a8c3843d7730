"""What SLURM says about a job: alive, ended, or nothing this user can see (never read as "ended").

One place asks the scheduler (`squeue`, then `sacct`), for the run lock's judgement of another host's run and
for the sweep's reattachment to the jobs it launched. An empty answer is not a death: where the cluster sets
`PrivateData=jobs`, another user's job is invisible, and a job is only "ended" when the scheduler says how it
ended, or when a job of this very user is gone from the controller.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass

# SLURM job states (squeue %T / sacct State, first word) of a job that still holds or waits for resources
ALIVE = frozenset({"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "COMPLETING",
                   "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD", "SPECIAL_EXIT"})
ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                   "DEADLINE", "PREEMPTED", "REVOKED"})
TIMEOUT_S = 30


@dataclass(frozen=True)
class JobState:
    verdict: str  # "alive" | "dead" | "unknown"
    state: str | None  # SLURM's word, when it gave one
    source: str  # which command said so, or why nothing could


def current_user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def _run(cmd: list[str]) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None


def _word(text: str) -> str | None:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0].split()[0].rstrip("+") if lines else None  # "CANCELLED by 0" -> CANCELLED


def classify(state: str | None) -> str:
    if state in ALIVE:
        return "alive"
    if state in ENDED:
        return "dead"
    return "unknown"


def slurm_job(job_id: str, owner: str | None = None) -> JobState:
    """The scheduler's verdict on `job_id` (`<id>` or `<array>_<task>`); `owner`: the user who submitted it."""
    if shutil.which("squeue") is None:
        return JobState("unknown", None, "no squeue on this host")
    proc = _run(["squeue", "-h", "-j", job_id, "-o", "%T"])
    invalid = proc is not None and proc.returncode != 0 and "invalid job id" in proc.stderr.lower()
    if proc is not None and proc.returncode == 0 and _word(proc.stdout):
        return JobState(classify(_word(proc.stdout)), _word(proc.stdout), "squeue")
    if shutil.which("sacct") is not None:
        acct = _run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"])
        if acct is not None and acct.returncode == 0 and _word(acct.stdout):
            return JobState(classify(_word(acct.stdout)), _word(acct.stdout), "sacct")
    mine = owner is None or owner == current_user()
    if mine and (invalid or (proc is not None and proc.returncode == 0)):
        # this user sees all of its own jobs: one the controller no longer knows has ended
        return JobState("dead", None, "squeue: not known to the controller")
    if proc is None:
        return JobState("unknown", None, "squeue did not answer")
    return JobState("unknown", None, f"squeue shows nothing of another user's ({owner}) job (PrivateData?)")
