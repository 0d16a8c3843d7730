"""One live owner per run folder: `<run_dir>/run.lock` names the owning host, pid and start time.

Two runs in one folder would interleave metrics.csv and overwrite each other's results.json and
checkpoints, so a second run refuses with a message naming the owner. The lock is taken by the Hydra
callback `RunLockCallback` before Hydra writes `.hydra/` (single runs), else by `lmk.train.fit.fit`
(multirun jobs, in-process calls); taking it again from the owning process is a no-op.

Stale locks: the lock names the owner's host, pid and process start time, and the scheduler's job id
(SLURM's, or submitit's local job), so it can be judged from any host (`judge`): on the owner's host by its
pid (gone, reused by a newer process, or a zombie: stale); elsewhere by the scheduler (`lmk.run.scheduler`: a job
it reports ended, or a job of this user it no longer knows, is over; another user's job it does not show is
"unknown", never "dead"); a lock of this very job left by an earlier incarnation (a requeue that landed on
another host) is stale. What cannot be judged is honoured, with the fix named; the row sweeper,
which knows the jobs it launched, clears such a lock when its job is known to be over.
Under DDP only global rank 0 owns the folder; the other ranks wait (before any process group forms) until
the lock names their job, or rank 0 recorded its refusal (`run.lock.refused`): then they exit at once too.

A finished folder (results.json `status: done`) is reused only with `overwrite=true` (or a named .ckpt file).
Rank 0 also publishes its resume decision in the lock (`publish`), which the other ranks read
(`await_published`), so every rank resumes from the same checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

from lmk.config import CKPT_AUTO, CKPT_FRESH
from lmk.config.schema import UserError
from lmk.run.results import STATUS_DONE, Results
from lmk.run.scheduler import current_user, slurm_job
from lmk.run.umask_files import write_json

log = logging.getLogger(__name__)

LOCK_FILE = "run.lock"
REFUSED_FILE = "run.lock.refused"  # rank 0's refusal, read by the job's other ranks
TOKEN_VAR = "LMK_RUN_TOKEN"  # a job id for runs without a scheduler; Lightning's DDP children inherit it
FOLLOW_TIMEOUT_S = 300.0  # how long a non-zero rank waits for rank 0 to claim the folder
_T0 = time.time()  # about when this process started (a refusal older than that is another job's)
# Env vars launchers set on non-zero ranks (Lightning's DDP children, torchrun, SLURM tasks, the tasks of
# submitit's local executor: without the last, rank 1 of a rehearsal found rank 0's lock and quit).
_RANK_VARS = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK", "SUBMITIT_LOCAL_GLOBALID")


class RunFolderBusy(UserError, RuntimeError):
    """The run folder is owned by another live run, or holds a finished run that was not meant to be reused."""


def is_global_rank_zero() -> bool:
    return all(int(os.environ.get(k) or 0) == 0 for k in _RANK_VARS)


def _proc_start(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks since boot) from /proc, or None where there is no /proc entry."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
    return fields[0], int(fields[19])


def job_identity() -> tuple[str | None, str | None]:
    """(scheduler, job id) of this process's job, shared by all its ranks: SLURM's job id (`<array>_<task>`
    for an array task, as submitit names it), submitit's local job, or $LMK_RUN_TOKEN; (None, None) else."""
    env = os.environ
    if env.get("SLURM_JOB_ID"):
        array = env.get("SLURM_ARRAY_JOB_ID")
        return "slurm", f"{array}_{env.get('SLURM_ARRAY_TASK_ID')}" if array else env["SLURM_JOB_ID"]
    if env.get("SUBMITIT_EXECUTOR") == "local" and env.get("SUBMITIT_LOCAL_JOB_ID"):
        return "local", env["SUBMITIT_LOCAL_JOB_ID"]
    if env.get(TOKEN_VAR):
        return "lmk", env[TOKEN_VAR]
    return None, None


def _owner_record() -> dict[str, Any]:
    proc = _proc_start(os.getpid())
    if job_identity()[1] is None:  # no scheduler: Lightning's DDP children inherit this token and follow
        os.environ[TOKEN_VAR] = f"{socket.gethostname()}:{os.getpid()}:{proc[1] if proc else time.time()}"
    scheduler, job_id = job_identity()
    return {"host": socket.gethostname(), "pid": os.getpid(), "proc_start": proc[1] if proc else None,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "scheduler": scheduler, "job_id": job_id,
            "user": current_user()}


def _is_alive(owner: dict[str, Any]) -> bool:
    """Whether the lock's owner (on this host) still runs; the same pid started later is another process."""
    pid = int(owner.get("pid", -1))
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    proc = _proc_start(pid)
    if proc is None:  # no /proc (macOS): the pid exists, trust it
        return True
    state, start = proc
    return state != "Z" and (owner.get("proc_start") is None or start == owner["proc_start"])


def judge(owner: dict[str, Any]) -> str:
    """Whether a lock's owner still runs, judged from this host: "alive", "dead" or "unknown"."""
    scheduler, job_id = job_identity()
    if scheduler in ("slurm", "local") and owner.get("job_id") == job_id and owner.get("scheduler") == scheduler \
            and not _is_me(owner):
        return "dead"  # an earlier incarnation of this job (requeued): a scheduler never runs a job twice
    if owner.get("host") == socket.gethostname():
        return "alive" if _is_alive(owner) else "dead"
    if owner.get("scheduler") == "slurm" and owner.get("job_id"):
        return slurm_job(str(owner["job_id"]), owner.get("user")).verdict
    return "unknown"


def read_owner(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The lock's record (None: no lock; {}: unreadable)."""
    return _read(Path(run_dir) / LOCK_FILE)


def remove_stale(run_dir: str | os.PathLike, owner: dict[str, Any]) -> bool:
    """Remove the lock if it still holds `owner`'s record (judged stale by the caller); whether it did."""
    path = Path(run_dir) / LOCK_FILE
    if _read(path) != owner:
        return False  # retaken meanwhile
    path.unlink(missing_ok=True)
    return True


def _is_me(owner: dict[str, Any]) -> bool:
    me = _owner_record()
    return owner.get("host") == me["host"] and owner.get("pid") == me["pid"] and (
        owner.get("proc_start") == me["proc_start"])


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # half-written by a process that died mid-write: no owner to honour


_WRITE_GRACE_S = 10.0  # an empty/unreadable lock younger than this is being written, not stale


def _age(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def _busy_message(run_dir: Path, owner: dict[str, Any], verdict: str = "alive") -> str:
    host, here = owner.get("host", "?"), socket.gethostname()
    where = "this host" if host == here else f"host {host}" + (
        f" (cannot be checked from {here})" if verdict == "unknown" else "")
    job = f" (job {owner['job_id']})" if owner.get("job_id") else ""
    return (f"run folder {run_dir} is in use by another run: pid {owner.get('pid', '?')} on {where}{job}, started "
            f"{owner.get('started', '?')}; wait for it to finish or choose another hydra.run.dir, and if that "
            f"process is known to be gone, delete {run_dir / LOCK_FILE} (a rerun of the sweep that launched it "
            "clears it by itself)")


def acquire(run_dir: str | os.PathLike) -> Path:
    """Take `<run_dir>/run.lock` for this process (a no-op when it already owns it); raises RunFolderBusy."""
    run_dir = Path(run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    for _ in range(20):  # about 2 s at most
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)  # atomic: one creator wins
        except FileExistsError:
            owner = _read(path)
            if owner is None:
                continue  # released meanwhile: try again
            if not owner and _age(path) < _WRITE_GRACE_S:
                time.sleep(0.1)  # just created by a run that has not written its record yet
                continue
            if owner and _is_me(owner):
                return path
            verdict = judge(owner) if owner else "dead"
            if verdict != "dead":
                raise RunFolderBusy(_busy_message(run_dir, owner, verdict)) from None
            # Stale: re-read just before removing so a lock retaken meanwhile is not deleted.
            if remove_stale(run_dir, owner):
                # a warning, not a log line: Hydra has not configured logging yet when its callback claims
                warnings.warn(f"removing the stale lock {path} of pid {owner.get('pid')} on "
                              f"{owner.get('host', '?')} (no longer running)", stacklevel=2)
            continue
        with os.fdopen(fd, "w") as fh:  # os.open applies the umask to 0o666 itself
            json.dump(_owner_record(), fh)
        return path
    raise RunFolderBusy(f"could not take {path}: another run is taking this folder right now; choose another "
                        "hydra.run.dir (or delete the lock if no run is starting there)")


def release(run_dir: str | os.PathLike) -> None:
    """Remove the lock if this process owns it."""
    path = Path(run_dir).resolve() / LOCK_FILE
    owner = _read(path)
    if owner and _is_me(owner):
        path.unlink(missing_ok=True)


def check_reuse(run_dir: str | os.PathLike, ckpt_path: Any, overwrite: bool) -> None:
    """Refuse to start a new run over a finished one unless `overwrite=true` (or a named checkpoint file)."""
    if overwrite or ckpt_path not in (*CKPT_AUTO, *CKPT_FRESH):
        return
    try:
        status = Results.read(run_dir).status
    except ValueError:
        return  # unreadable results.json: nothing finished to protect
    if status == STATUS_DONE:
        raise RunFolderBusy(f"run folder {run_dir} holds a finished run (results.json status: done): start it over "
                            "with overwrite=true, or choose another hydra.run.dir")


def publish(run_dir: str | os.PathLike, **fields: Any) -> None:
    """Rank 0: add `fields` to the lock it owns (its decisions the other ranks of the job follow)."""
    path = Path(run_dir).resolve() / LOCK_FILE
    owner = _read(path)
    if owner and _is_me(owner):
        write_json(path, {**owner, **fields})


def follow_rank_zero(run_dir: str | os.PathLike, timeout_s: float = FOLLOW_TIMEOUT_S,
                     need: str | None = None) -> dict[str, Any] | None:
    """A non-zero rank: rank 0's lock record once it names this job (and holds the key `need`, which rank 0
    `publish`es); raise RunFolderBusy as soon as rank 0 recorded its refusal (so no rank waits at the rendezvous
    for a rank 0 that is gone). Without a job identity (an unknown launcher) there is nothing to compare: None."""
    scheduler, job_id = job_identity()
    if job_id is None:
        return None
    run_dir = Path(run_dir).resolve()
    deadline = time.monotonic() + timeout_s
    while True:
        owner = _read(run_dir / LOCK_FILE)
        if owner and owner.get("job_id") == job_id and owner.get("scheduler") == scheduler and (
                need is None or need in owner):
            return owner
        refusal = _read(run_dir / REFUSED_FILE)
        if refusal and refusal.get("job_id") == job_id and float(refusal.get("t", 0)) >= _T0 - 600:
            raise RunFolderBusy(str(refusal.get("message")))
        if time.monotonic() > deadline:
            raise RunFolderBusy(f"rank 0 of job {job_id} did not claim {run_dir} within {timeout_s:.0f} s; see "
                                "rank 0's log for why it stopped")
        time.sleep(0.2)


def _record_refusal(run_dir: str | os.PathLike, message: str) -> None:
    scheduler, job_id = job_identity()
    if job_id is not None:
        write_json(Path(run_dir) / REFUSED_FILE, {"scheduler": scheduler, "job_id": job_id, "message": message,
                                                 "t": time.time()})


def claim(run_dir: str | os.PathLike, ckpt_path: Any = None, overwrite: bool = False,
          check_finished: bool = True) -> Path | None:
    """Lock `run_dir` for this run (global rank 0), refusing a finished folder (`check_reuse`, unless not
    `check_finished`); the lock path. Other ranks take no lock: they follow rank 0's verdict
    (`follow_rank_zero`) and get None."""
    if not is_global_rank_zero():
        follow_rank_zero(run_dir)
        return None
    try:
        path = acquire(run_dir)
        try:
            if check_finished:
                check_reuse(run_dir, ckpt_path, overwrite)
        except RunFolderBusy:
            release(run_dir)
            raise
    except RunFolderBusy as err:
        _record_refusal(run_dir, str(err))  # the job's other ranks exit on it at once
        raise
    (Path(run_dir).resolve() / REFUSED_FILE).unlink(missing_ok=True)
    return path


class RunLockCallback(Callback):
    """Hydra callback (`hydra.callbacks.run_lock` in conf/train.yaml): claims `hydra.run.dir` before Hydra
    writes `.hydra/` into it, so a refused run leaves the owner's folder untouched."""

    def on_run_start(self, config: Any, **kwargs: Any) -> None:
        try:
            run_dir = str(OmegaConf.select(config, "hydra.run.dir"))
            ckpt, overwrite = OmegaConf.select(config, "ckpt_path"), bool(OmegaConf.select(config, "overwrite"))
        except Exception as err:  # noqa: BLE001 - lmk.train.fit claims the folder anyway
            log.debug("run lock: hydra.run.dir does not resolve before the job (%s); locking in the job", err)
            return
        try:
            claim(run_dir, ckpt, overwrite)
        except RunFolderBusy as err:
            # Hydra would print a traceback of its own internals: one clear line, then a non-zero exit.
            print(f"Error: {err}", flush=True, file=sys.stderr)
            raise SystemExit(1) from None

    def on_run_end(self, config: Any, **kwargs: Any) -> None:
        try:
            release(str(OmegaConf.select(config, "hydra.run.dir")))
        except Exception:  # noqa: BLE001
            pass
