"""Checkpoints a scheduler cannot corrupt, and the one rule that says which one a job resumes from.

Writing: `AtomicCheckpointIO` writes `<name>.ckpt` as a temporary file in the checkpoint's own folder,
syncs it and renames it into place (`os.replace`). The previous checkpoint stays whole until the new one is
complete: a job killed mid-save (a requeue, a node lost, a full quota) leaves the old file and a temporary one,
never a truncated `last.ckpt`. (Lightning's own save writes to the local TMPDIR and moves the file onto the
shared file system, which truncates the old file first.)

Resuming: every job start applies `resume_point`, whoever started it (the sweeper, submitit's requeue,
SLURM's own requeue of the original batch script): the newest checkpoint of the run folder that loads and
whose recorded config hash is the job's, else a fresh start with the old checkpoints moved aside
(`checkpoints.superseded/`), so a changed config never resumes old weights.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from lmk.config import CKPT_AUTO, CKPT_FRESH
from lmk.model.checkpoint import load_checkpoint
from lmk.run.checkpoint_dir import SUPERSEDED_DIR, TMP_MARK, candidates, clear_partial_saves, move_aside

__all__ = ["SUPERSEDED_DIR", "AtomicCheckpointIO", "CheckpointInfo", "ResumePoint", "candidates",
           "clear_partial_saves", "move_aside", "newest_valid", "read_info", "resume_point"]

log = logging.getLogger(__name__)

RUN_KEY = "lmk_run"  # top-level checkpoint entry: {"config_hash", "global_step"} of the run that wrote it


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on a directory; the rename is still atomic
    finally:
        os.close(fd)


class AtomicCheckpointIO(TorchCheckpointIO):
    """torch.save into a temporary file beside the target, fsync, then rename over the target."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError("AtomicCheckpointIO takes no storage_options")
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{target.name}{TMP_MARK}{os.getpid()}")
        try:
            with open(tmp, "wb") as fh:
                torch.save(checkpoint, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(target.parent)


@dataclass
class CheckpointInfo:
    path: Path
    global_step: int
    config_hash: str | None


def read_info(path: str | os.PathLike) -> tuple[CheckpointInfo | None, str]:
    """(what a checkpoint records, "") if it loads; (None, why not) if it does not."""
    path = Path(path)
    try:
        # mmap: the header and the small entries are read, the tensors stay on disk; weights_only with lmk's
        # types: a checkpoint holding anything else is refused, its code never runs
        ckpt = load_checkpoint(path, mmap=True)
    except Exception as err:  # noqa: BLE001 - any failure to load means "not resumable"
        return None, f"does not load ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
    run = ckpt.get(RUN_KEY) or {}
    return CheckpointInfo(path, int(ckpt.get("global_step", run.get("global_step", 0))), run.get("config_hash")), ""


@dataclass
class ResumePoint:
    """What a job start found: the checkpoint to resume (None: start fresh) and the candidates passed over."""

    path: Path | None
    step: int | None = None
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    moved_to: Path | None = None

    def describe(self) -> str:
        passed = "; ".join(f"{p.name} {why}" for p, why in self.skipped)
        head = f"resuming from {self.path} (step {self.step})" if self.path else "starting fresh"
        tail = f"; old checkpoints moved to {self.moved_to}" if self.moved_to else ""
        return head + (f" (passed over: {passed})" if passed else "") + tail


def newest_valid(run_dir: str | os.PathLike, config_hash: str) -> ResumePoint:
    """The newest checkpoint (by the step it records) that loads and was written under `config_hash`."""
    found: list[CheckpointInfo] = []
    skipped: list[tuple[Path, str]] = []
    for path in candidates(run_dir):
        info, why = read_info(path)
        if info is None:
            skipped.append((path, why))
        elif info.config_hash != config_hash:
            skipped.append((path, f"was written under config {info.config_hash}, not {config_hash}"))
        else:
            found.append(info)
    if not found:
        return ResumePoint(None, skipped=skipped)
    best = max(found, key=lambda i: (i.global_step, i.path.name == "last.ckpt"))
    return ResumePoint(best.path, best.global_step, skipped=skipped)


def resume_point(ckpt_path: str | None, run_dir: str | os.PathLike, config_hash: str,
                 start_over: bool = False) -> ResumePoint:
    """The rule every job start applies (see the module docstring).

    `ckpt_path`: auto/last (the rule), null (a fresh start), or a file (that file; it must load).
    `start_over`: the run folder holds a finished run that `overwrite=true` starts over.
    Only global rank 0 may call it with side effects: it moves checkpoints aside.
    """
    run_dir = Path(run_dir)
    clear_partial_saves(run_dir)
    if ckpt_path not in (*CKPT_AUTO, *CKPT_FRESH):
        info, why = read_info(ckpt_path)
        if info is None:
            raise FileNotFoundError(f"ckpt_path={ckpt_path!r} {why or 'does not exist'}; use auto (resume this "
                                    "run folder's newest valid checkpoint), null (start fresh) or a .ckpt that loads")
        return ResumePoint(Path(ckpt_path), info.global_step)
    if ckpt_path in CKPT_AUTO and not start_over:
        point = newest_valid(run_dir, config_hash)
        if point.path is not None:
            return point
        why = "; ".join(f"{p.name} {w}" for p, w in point.skipped) or "no checkpoint"
    else:
        point, why = ResumePoint(None), "a fresh start was asked for" if not start_over else "overwrite=true"
    point.moved_to = move_aside(run_dir, f"fresh start of config {config_hash}: {why}")
    return point
