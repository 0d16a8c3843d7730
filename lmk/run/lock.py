"""One live owner per run folder: `<run_dir>/run.lock` names the owning host, pid and start time.

Two runs in one folder would interleave metrics.csv and overwrite each other's results.json and
checkpoints, so a second run refuses with a message naming the owner. The lock is taken by the Hydra
callback `RunLockCallback` before Hydra writes `.hydra/` (single runs), else by `lmk.train.fit.fit`
(multirun jobs, in-process calls); taking it again from the owning process is a no-op.

Stale locks: on the same host a lock whose pid is gone (or reused by a newer process: the start time
differs, or a zombie) is replaced with a warning. A lock from another host cannot be checked from here
and is always honoured; the message says to delete the file when that host's run is known to be dead.
Under DDP only global rank 0 owns the folder (other ranks never lock).

A finished folder (results.json `status: done`) is reused only to resume it (`ckpt_path=last` or a
.ckpt path) or with `overwrite=true`.
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

from lmk.config.schema import UserError
from lmk.run.results import STATUS_DONE, read_results

log = logging.getLogger(__name__)

LOCK_FILE = "run.lock"
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


def _owner_record() -> dict[str, Any]:
    proc = _proc_start(os.getpid())
    return {"host": socket.gethostname(), "pid": os.getpid(), "proc_start": proc[1] if proc else None,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


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


def _busy_message(run_dir: Path, owner: dict[str, Any]) -> str:
    host, here = owner.get("host", "?"), socket.gethostname()
    where = "this host" if host == here else f"host {host} (cannot be checked from {here})"
    return (f"run folder {run_dir} is in use by another run: pid {owner.get('pid', '?')} on {where}, started "
            f"{owner.get('started', '?')}. Wait for it to finish or choose another hydra.run.dir; if that "
            f"process is known to be gone, delete {run_dir / LOCK_FILE}")


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
            if owner and (owner.get("host") != socket.gethostname() or _is_alive(owner)):
                raise RunFolderBusy(_busy_message(run_dir, owner)) from None
            # Stale: re-read just before removing so a lock retaken meanwhile is not deleted.
            if _read(path) == owner:
                # a warning, not a log line: Hydra has not configured logging yet when its callback claims
                warnings.warn(f"removing the stale lock {path} of pid {owner.get('pid')} (no longer running)",
                              stacklevel=2)
                path.unlink(missing_ok=True)
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
    """Refuse to start a new run over a finished one unless it resumes it or `overwrite=true`."""
    if overwrite or ckpt_path not in (None, "", "null"):
        return
    try:
        status = read_results(run_dir).get("status")
    except ValueError:
        return  # unreadable results.json: nothing finished to protect
    if status == STATUS_DONE:
        raise RunFolderBusy(f"run folder {run_dir} holds a finished run (results.json status: done): resume it "
                            "with ckpt_path=last, start over with overwrite=true, or choose another hydra.run.dir")


def claim(run_dir: str | os.PathLike, ckpt_path: Any = None, overwrite: bool = False) -> Path | None:
    """Lock `run_dir` for this run (global rank 0 only), refusing a finished folder; the lock path or None."""
    if not is_global_rank_zero():
        return None
    path = acquire(run_dir)
    try:
        check_reuse(run_dir, ckpt_path, overwrite)
    except RunFolderBusy:
        release(run_dir)
        raise
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
