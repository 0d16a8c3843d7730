"""A run folder's checkpoint files, torch-free: where they are, what a kill left, moving them aside.

The resume rule itself (which checkpoint loads and carries the job's config) is `lmk.train.checkpoints`; the
sweeper, which starts rows over without loading torch, moves checkpoints aside through this module.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

log = logging.getLogger(__name__)

CHECKPOINT_DIR = "checkpoints"
SUPERSEDED_DIR = "checkpoints.superseded"
TMP_MARK = ".tmp-"  # <name>.ckpt.tmp-<pid>: a save in progress (or one a kill interrupted)


def candidates(run_dir: str | os.PathLike) -> list[Path]:
    """The run folder's checkpoint files (temporary files of an interrupted save excluded)."""
    folder = Path(run_dir) / CHECKPOINT_DIR
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob("*.ckpt") if p.is_file())


def clear_partial_saves(run_dir: str | os.PathLike) -> list[Path]:
    """Remove the temporary files of saves that a kill interrupted (the checkpoints beside them are whole)."""
    folder = Path(run_dir) / CHECKPOINT_DIR
    stale = [p for p in folder.glob(f"*{TMP_MARK}*") if p.is_file()] if folder.is_dir() else []
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def move_aside(run_dir: str | os.PathLike, why: str) -> Path | None:
    """Move the run's checkpoints out of the way of a fresh start (kept, never deleted); where they went."""
    run_dir = Path(run_dir)
    folder = run_dir / CHECKPOINT_DIR
    if not folder.is_dir() or not any(folder.iterdir()):
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dest, n = run_dir / SUPERSEDED_DIR / stamp, 0
    while dest.exists():
        n += 1
        dest = run_dir / SUPERSEDED_DIR / f"{stamp}.{n}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(folder), str(dest))
    (dest / "WHY").write_text(why + "\n")
    log.warning("moved the old checkpoints of %s to %s (%s)", run_dir, dest, why)
    return dest
