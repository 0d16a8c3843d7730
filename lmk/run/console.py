"""What reaches the console: lmk's own event lines; everything else goes to the run's log file.

- A job of a sweep (a Hydra multirun: local, submitit, SLURM) prints nothing itself but its progress line: the
  row sweeper prints one start and one result line per row. `job_output` sends the job's stdout and stderr (the
  third-party bars, W&B's banners, warnings, Lightning's messages) into the job's log file, next to the log
  records Hydra writes there, and keeps the real stdout for `console_stream()`.
- A single run keeps Hydra's console: lmk's lines, Lightning's, warnings (`lmk.run.quiet_logging.use_hydra_logging`).
- `LMK_VERBOSE=1` (or Hydra's `hydra.verbose=true`) shows everything on the console again, as before.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

VERBOSE_ENV = "LMK_VERBOSE"
_console: TextIO | None = None  # the real stdout while a sweep job's output goes to its log file


def verbose() -> bool:
    """Whether the user asked to see everything: LMK_VERBOSE=1, or Hydra's verbose logging of lmk."""
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0", "false") or logging.getLogger("lmk").isEnabledFor(
        logging.DEBUG)


def console_stream() -> TextIO:
    """Where lmk's own event lines go: the terminal (or the sweep's log), also while a job's output is redirected."""
    return _console or sys.stdout


def redirected() -> bool:
    """Whether this is a sweep job whose output goes to its log file (`job_output`)."""
    return _console is not None


def interactive() -> bool:
    """Whether the console is a terminal (a progress line then updates in place, else it prints every ~10%)."""
    try:
        return console_stream().isatty()
    except (AttributeError, ValueError):
        return False


def say(line: str) -> None:
    """One event line on the console (and in the job's log file when its output is redirected there)."""
    stream = console_stream()
    print(line, file=stream, flush=True)
    if stream is not sys.stdout:
        print(line, file=sys.stdout, flush=True)


def job_log_file() -> Path | None:
    """The log file Hydra configured for this job (`<run dir>/<job name>.log`), if any."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            return Path(handler.baseFilename)
    return None


@contextmanager
def job_output(log_file: Path | None) -> Iterator[None]:
    """Inside the block the process's stdout and stderr (file descriptors 1 and 2: Python, C extensions, tqdm,
    W&B) append to `log_file`, the console handlers of the root logger are off (the file handler keeps every
    record), and `console_stream()` is the real stdout. Nothing changes without a log file or with LMK_VERBOSE."""
    global _console
    if log_file is None or verbose() or _console is not None:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    console = os.fdopen(os.dup(saved[0]), "w", buffering=1, encoding="utf-8", errors="replace")
    root = logging.getLogger()
    handlers = [h for h in root.handlers if type(h) is logging.StreamHandler]  # the console, not the file
    target = os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.dup2(target, 1)
        os.dup2(target, 2)
        for handler in handlers:
            root.removeHandler(handler)
        _console = console
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        _console = None
        for handler in handlers:
            root.addHandler(handler)
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, target):
            os.close(fd)
        console.close()
