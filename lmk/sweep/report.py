"""The console lines of a sweep (printed by the row sweeper): per row one start line and one result line; the
row's own progress line comes from its job (`lmk.train.progress`), everything else is in the row's log file.

    row cls [1/7] -> outputs/table2/tiny/train/cls: python -m lmk.train pooling=cls
    row cls: done in 41s | local-short 54.8 | local-passkey 25.0 | W&B offline: `wandb sync <dir>` later
    row mean: FAILED after 12s: <what is wrong>; <the fix> (log: <run dir>/train.log)
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lmk.run.console import verbose
from lmk.run.results import Results

# Hydra's launchers announce every job with its full override list: jobs.json holds those, the start line says
# what the row is.
_LAUNCHER_LOGGERS = ("hydra._internal.core_plugins.basic_launcher",
                     "hydra_plugins.hydra_submitit_launcher.submitit_launcher")


def print_line(line: str) -> None:
    print(line, flush=True)


def _seconds(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def start_line(job: dict[str, Any], row_overrides: Sequence[str], index: int, total: int, program: Sequence[str],
               eta: str = "") -> str:
    """Which row starts, where its run folder is and what is launched (the row's own overrides)."""
    seed = [f"seed={job['seed']}"] if job.get("seed") is not None else []
    what = " ".join([*program, *row_overrides, *seed])
    return f"row {job['job']} [{index}/{total}{eta}] -> {job['job_dir']}: {what}"


def _scores(results: Results) -> list[str]:
    scores = [f"{g} {100 * v:.1f}" for g, v in results.eval.groups.items() if v is not None]
    if scores:
        return scores
    metrics = results.metrics
    if "train/loss" in metrics:  # evaluated later (a scale's eval stage): the training's own numbers
        return [f"{metrics.get('global_step', '?')} steps, loss {metrics['train/loss']:.4g}"]
    return []


def _wandb(results: Results) -> list[str]:
    info = results.wandb
    if info.get("mode") == "offline" and info.get("sync"):
        return [f"W&B offline: `{info['sync']}` later"]
    if info.get("mode") == "online" and info.get("url"):
        return [f"W&B {info['url']}"]
    return []


def result_line(job: dict[str, Any], seconds: float, error: str | None = None) -> str:
    """The row's outcome: its main scores (x100, as in the table), wall time and W&B run; or its error."""
    run_dir = Path(job["job_dir"])
    if error is not None:
        logs = sorted(run_dir.glob("*.log"))
        where = f" (log: {logs[0]})" if logs else ""
        return f"row {job['job']}: FAILED after {_seconds(seconds)}: {error}{where}"
    results = Results.read(run_dir)
    return " | ".join([f"row {job['job']}: done in {_seconds(seconds)}", *_scores(results), *_wandb(results)])


@contextmanager
def quiet_launcher() -> Iterator[None]:
    """Hydra's launchers' per-job announcements off the console (not with LMK_VERBOSE=1)."""
    loggers = [logging.getLogger(name) for name in _LAUNCHER_LOGGERS]
    levels = [lg.level for lg in loggers]
    if not verbose():
        for lg in loggers:
            lg.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
