"""Fault injection: rehearse a cluster's bad day through the real path (`make reproduce-table2 FAULTS=<plan>`).

A fault plan is a YAML file (`experiments/table2/faults/<name>.yaml`):

    faults:
      - {kind: kill, row: mean, rank: 1, step: 2}        # SIGKILL of rank 1 of row `mean` once step 2 is done
      - {kind: requeue, row: cls, step: 1}               # `scontrol requeue` of the row's job (SLURM)
      - {kind: nan_loss, row: lmk-fixed-64, step: 2, recurring: true}   # a NaN that comes back on every resume

Where a fault is a real scheduler action it is the scheduler's own (`scontrol requeue`, `scontrol update
TimeLimit=...` with the launcher's warning signal, `scontrol update NodeName=... State=DOWN`), fired from inside
the job at a chosen step; `FIRES_UNDER` says which launchers a kind needs (under submitit's local executor the
SLURM kinds are skipped with a line saying so, and `timeout`, the job signalling itself, stands in for a time
limit). Kinds:

    kill                SIGKILL of one rank (a dead rank: OOM killer, a segfault)
    timeout             the time-limit warning signal sent by the job to itself (local stand-in)
    time_limit          the job's time limit cut to `minutes` from now and its steps stalled until the warning
    requeue             `scontrol requeue` of the job mid-training
    requeue_mid_save    `scontrol requeue` while the checkpoint of `step` is half-written
    node_down           the node of the job's last rank set DOWN (back after `down_s` seconds)
    stale_lock          run.lock rewritten as another host's, then SIGKILL
    nan_loss            the step's loss is non-finite (`recurring`: on every run, as a data-caused NaN is)
    driver_kill         SIGKILL of the sweep's own processes (`lmk.sweep` and the row sweeper) while jobs run
    partial_download    an interrupted download into the hub mirror (applied by the sweep driver)
    truncate_checkpoint the row's last.ckpt cut in half, as a node dying mid-copy leaves it (applied by the
                        driver before launching, on a row that is not done)

`python -m lmk.sweep ... --faults <name|path>` puts the plan's path in `$LMK_FAULTS` and a folder of markers in
`$LMK_FAULTS_STATE` (`<out>/faults`); every job inherits both through the launcher, so the config (and its hash)
is the one an undisturbed run has. Each fault fires once (unless `recurring`): firing writes
`<state>/<fault id>.json` first, so the same command run again resumes each interrupted row and meets no fault.
Step faults are armed when a fit starts (all ranks see the same markers then) and fire at the start of the step
that follows `step` optimizer steps, i.e. after step `step`'s checkpoint.

This module is torch-free; the step hooks are `lmk.train.fault_hooks.FaultCallback`, the mirror and checkpoint
faults run in the sweep driver before its jobs launch.
"""

from __future__ import annotations

import fnmatch
import json
import os
import socket
import time
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from lmk.run.umask_files import write_json

ENV_PLAN = "LMK_FAULTS"
ENV_STATE = "LMK_FAULTS_STATE"
STEP_KINDS = ("kill", "timeout", "time_limit", "requeue", "requeue_mid_save", "node_down", "stale_lock", "nan_loss",
              "driver_kill")
KINDS = (*STEP_KINDS, "partial_download", "truncate_checkpoint")
# The scheduler a kind needs (`lmk.run.lock.job_identity`'s name); kinds not listed fire under any job launcher.
FIRES_UNDER = {"time_limit": ("slurm",), "requeue": ("slurm",), "requeue_mid_save": ("slurm",),
               "node_down": ("slurm",), "timeout": ("local",)}
ENV_SWEEP_PIDS = "LMK_SWEEP_PIDS"  # the sweep's processes (driver, row sweeper): what driver_kill kills


@dataclass(frozen=True)
class Fault:
    kind: str
    row: str | None = None        # the job's `row` (the table row id); step faults need one
    step: int | None = None       # optimizer steps done when it fires (step faults)
    rank: int = 0                 # kill: the global rank killed
    host: str = "node-gone"       # stale_lock: the host its run.lock names
    repo: str | None = None       # partial_download: the mirror's repo (owner/name)
    repo_kind: str = "dataset"    # partial_download: dataset | model
    keep: tuple[str, ...] = ("README.md",)  # partial_download: files left in place (glob patterns)
    recurring: bool = False       # nan_loss: fires on every run, not once
    minutes: int = 1              # time_limit: the new limit, in minutes from now
    down_s: int = 20              # node_down: seconds the node stays down

    @property
    def id(self) -> str:
        target = self.row if self.kind in STEP_KINDS else str(self.repo).replace("/", "__")
        return f"{self.kind}-{target}" + (f"-step{self.step}" if self.step is not None else "") + (
            f"-rank{self.rank}" if self.kind == "kill" else "")

    def describe(self) -> str:
        what = {"kill": f"SIGKILL of rank {self.rank}", "timeout": "the time-limit signal, sent by the job itself",
                "time_limit": f"the job's time limit cut to {self.minutes} min from now, its steps stalled",
                "requeue": "scontrol requeue of the job", "requeue_mid_save": "scontrol requeue mid-checkpoint-save",
                "node_down": f"a node of the job set DOWN for {self.down_s} s",
                "stale_lock": f"a run.lock claimed from host {self.host}, then SIGKILL",
                "nan_loss": "a non-finite loss" + (" (on every run)" if self.recurring else ""),
                "driver_kill": "SIGKILL of the sweep driver and the row sweeper",
                "partial_download": f"an interrupted download of {self.repo}",
                "truncate_checkpoint": f"last.ckpt of row {self.row} cut in half"}
        where = f" at step {self.step} of row {self.row}" if self.kind in STEP_KINDS else ""
        return f"injected fault {self.kind}: {what[self.kind]}{where}"


def _fault(entry: Any, where: str) -> Fault:
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: a fault must be a mapping like {{kind: kill, row: cls, step: 2}}; got {entry!r}")
    names = {f.name for f in fields(Fault)}
    unknown = sorted(set(entry) - names)
    if unknown:
        raise ValueError(f"{where}: unknown fault keys {unknown}; allowed: {', '.join(sorted(names))}")
    kind = entry.get("kind")
    if kind not in KINDS:
        raise ValueError(f"{where}: fault kind {kind!r} is not valid; allowed: {', '.join(KINDS)}")
    if kind in STEP_KINDS and (not entry.get("row") or not isinstance(entry.get("step"), int) or entry["step"] < 0):
        raise ValueError(f"{where}: a {kind} fault needs `row` and `step` (an integer >= 0); got {entry}")
    if kind == "partial_download" and not entry.get("repo"):
        raise ValueError(f"{where}: a partial_download fault needs `repo` (owner/name); got {entry}")
    if kind == "truncate_checkpoint" and not entry.get("row"):
        raise ValueError(f"{where}: a truncate_checkpoint fault needs `row`; got {entry}")
    values = dict(entry)
    if "keep" in values:
        values["keep"] = tuple(str(k) for k in values["keep"])
    return Fault(**values)


def load_plan(path: str | os.PathLike, rows: Collection[str] | None = None) -> list[Fault]:
    """The faults of a plan file; ValueError (one line, naming the fix) for a malformed plan, or for one naming a
    row outside `rows` (the table's rows, where given): such a fault would never fire, and a rehearsal would pass
    without it."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"fault plan {path} does not exist; name a file of experiments/<table>/faults/ or a path")
    data = yaml.safe_load(path.read_text()) or {}
    entries = data.get("faults") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f"fault plan {path}: expected a mapping with a `faults:` list")
    faults = [_fault(e, f"fault plan {path}, fault {i + 1}") for i, e in enumerate(entries)]
    ids = [f.id for f in faults]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ValueError(f"fault plan {path}: faults {dupes} are listed twice; keep one of each")
    strangers = sorted({f.row for f in faults if f.row and f.row not in rows}) if rows is not None else []
    if strangers:
        raise ValueError(f"fault plan {path} names rows {strangers} that its table does not have; name one of its rows: "
                         f"{', '.join(rows)}")
    return faults


def resolve_plan(name: str, spec_dir: str | os.PathLike) -> Path:
    """`--faults bad-day` -> `<spec dir>/faults/bad-day.yaml`; a path is taken as it is."""
    candidate = Path(name)
    if candidate.suffix in (".yaml", ".yml") or candidate.is_file():
        return candidate.resolve()
    return (Path(spec_dir) / "faults" / f"{name}.yaml").resolve()


def activate(plan: str | os.PathLike, state_dir: str | os.PathLike,
             rows: Collection[str] | None = None) -> list[Fault]:
    """Validate `plan` (against the table's `rows`, where given) and publish it to this process's children (every
    job of the sweep)."""
    faults = load_plan(plan, rows)
    Path(state_dir).mkdir(parents=True, exist_ok=True)
    os.environ[ENV_PLAN] = str(Path(plan).resolve())
    os.environ[ENV_STATE] = str(Path(state_dir).resolve())
    return faults


def active() -> list[Fault]:
    """The plan of this process ($LMK_FAULTS), [] when none is set."""
    plan = os.environ.get(ENV_PLAN, "").strip()
    return load_plan(plan) if plan else []


def _state_dir() -> Path:
    value = os.environ.get(ENV_STATE, "").strip()
    if value:
        return Path(value)
    return Path(os.environ[ENV_PLAN]).resolve().parent / ".fired"


def _marker(fault: Fault) -> Path:
    return _state_dir() / f"{fault.id}.json"


def has_fired(fault: Fault) -> bool:
    return _marker(fault).is_file()


def fire_once(fault: Fault, **details: Any) -> bool:
    """Record that `fault` fires now; False when it fired before (then it must not fire again). A recurring
    fault fires every time (its marker is rewritten)."""
    path = _marker(fault)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fault.recurring:
        path.unlink(missing_ok=True)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)  # atomic: one firing ever
    except FileExistsError:
        return False
    record = {**asdict(fault), "id": fault.id, "cause": fault.describe(), "host": socket.gethostname(),
              "pid": os.getpid(), "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **details}
    with os.fdopen(fd, "w") as fh:
        json.dump(record, fh)
        fh.flush()
        os.fsync(fh.fileno())  # a SIGKILL follows: the marker must be on disk first
    return True


def fired(row: str | None = None, since: float = 0.0) -> list[dict[str, Any]]:
    """The markers of faults that fired (of `row` only, when given; at or after `since`, a time.time()),
    oldest first."""
    if not os.environ.get(ENV_PLAN) and not os.environ.get(ENV_STATE):
        return []
    folder = _state_dir()
    out = []
    paths = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime) if folder.is_dir() else []
    for path in (p for p in paths if p.stat().st_mtime >= since):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if row is None or record.get("row") == row:
            out.append(record)
    return out


def armed_step_faults(row: str | None) -> list[Fault]:
    """The step faults of `row` that have not fired yet (read once when a fit starts, the same on every rank)."""
    if not row:
        return []
    return [f for f in active() if f.kind in STEP_KINDS and f.row == row and (f.recurring or not has_fired(f))]


def note_sweep_process(pid: int | None = None) -> None:
    """Add this process (the sweep driver, the row sweeper) to what a driver_kill fault kills; a no-op without a
    plan. Jobs inherit the list through the launcher's environment."""
    if not os.environ.get(ENV_PLAN):
        return
    pids = [p for p in os.environ.get(ENV_SWEEP_PIDS, "").split(",") if p]
    os.environ[ENV_SWEEP_PIDS] = ",".join([*pids, str(pid or os.getpid())])


def sweep_pids() -> list[int]:
    return [int(p) for p in os.environ.get(ENV_SWEEP_PIDS, "").split(",") if p.strip().isdigit()]


def inject_checkpoint_faults(train_dir: str | os.PathLike, is_done: Callable[[Path], bool]) -> list[str]:
    """The plan's truncate_checkpoint faults (each once) on rows under `train_dir` that have a last.ckpt and are
    not done (`is_done(row_dir)`): what a node dying mid-copy leaves; the descriptions of those fired."""
    done = []
    for fault in (f for f in active() if f.kind == "truncate_checkpoint"):
        last = Path(train_dir) / str(fault.row) / "checkpoints" / "last.ckpt"
        if not last.is_file() or is_done(last.parent.parent) or has_fired(fault):
            continue
        if fire_once(fault, path=str(last)):
            data = last.read_bytes()
            last.write_bytes(data[: len(data) // 2])
            done.append(fault.describe())
    return done


def claim_lock_as(run_dir: str | os.PathLike, host: str) -> None:
    """stale_lock: rewrite this run's lock as if it had been taken on `host` (a host no pid check reaches)."""
    path = Path(run_dir) / "run.lock"
    record = json.loads(path.read_text())
    write_json(path, {**record, "host": host})


def leave_partial_download(folder: str | os.PathLike, keep: tuple[str, ...] = ("README.md",)) -> list[Path]:
    """What an interrupted download leaves: the repo folder with only the files matching `keep`."""
    removed = []
    for path in sorted(Path(folder).rglob("*")):
        if path.is_file() and not any(fnmatch.fnmatch(path.name, k) for k in keep):
            path.unlink()
            removed.append(path)
    return removed


def inject_mirror_faults(mirror_root: str | os.PathLike | None,
                         mark_interrupted: Callable[[Path, str], None] | None = None) -> list[str]:
    """The plan's partial_download faults into the hub mirror (each once); the descriptions of those fired.
    `mark_interrupted(folder, repo)` leaves the marker a download under way writes (the hub layer's, which
    this layer cannot import), so that the mirror's availability check sees the copy as partial."""
    if mirror_root is None:
        return []
    done = []
    for fault in (f for f in active() if f.kind == "partial_download"):
        folder = Path(mirror_root) / f"{fault.repo_kind}s" / str(fault.repo)
        if not folder.is_dir() or has_fired(fault):
            continue
        if fire_once(fault, folder=str(folder)):
            leave_partial_download(folder, fault.keep)
            if mark_interrupted is not None:
                mark_interrupted(folder, str(fault.repo))
            done.append(fault.describe())
    return done
