"""Quiet console logging: one console line per event under Hydra, the chatter in the job's log file only, and no
progress bars for short work. Lightning-free, so that a job that logs to no experiment tracker (an evaluation
with `logger=none`, the default) does not import Lightning (seconds of start-up per job) to set up its console.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from datasets.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
from transformers.utils import logging as tf_logging

from lmk.run.console import verbose

# Third-party loggers whose INFO lines narrate every step (mteb: 15 lines per task, bm25s: index
# building): the run's log file keeps them, the console shows their warnings only.
# lmk's own per-phase detail (each encode phase, each local task built, data set builds) likewise: the console
# keeps one line per eval task.
FILE_ONLY_LOGGERS = ("mteb", "bm25s", "sentence_transformers", "datasets", "httpx", "lmk.eval.encoder",
                     "lmk.model.embedding", "lmk.eval.tasks", "lmk.eval.detail", "lmk.data")
# Lightning's advertising for its paid services: dropped everywhere (not an event of the run).
ADVERT_MARKERS = ("litlogger", "litmodels")
# Library-internal deprecations a user cannot act on (Lightning calling a deprecated torch API).
IGNORED_WARNINGS = (r".*isinstance\(treespec, LeafSpec\)` is deprecated",
                    # a run on a login node (or any host with SLURM's client tools) that is not a SLURM job:
                    # Lightning's advice to prepend srun is wrong there
                    r"The `srun` command is available on your system but is not used")


class _NoAdverts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("lightning"):
            return True
        message = str(record.msg).lower()
        return not any(marker in message for marker in ADVERT_MARKERS)


class _ConsoleFilter(logging.Filter):
    """Console: warnings from everyone, INFO only from loggers that report events (lmk, Lightning, ...)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        if record.levelno < logging.INFO:
            return False  # DEBUG (bm25s sets its own logger to DEBUG) belongs in the file
        return not record.name.startswith(FILE_ONLY_LOGGERS)


def _add_filter(handler: logging.Handler, kind: type[logging.Filter]) -> None:
    if not any(isinstance(f, kind) for f in handler.filters):  # idempotent: called once per job
        handler.addFilter(kind())


def use_hydra_logging() -> None:
    """One console line per event under Hydra; the chatter goes to the job's log file only.

    Lightning attaches its own console handlers (on `lightning`, and on `lightning.pytorch` /
    `lightning.fabric` when imported before logging was configured) *and* propagates to the root logger,
    which Hydra has configured: every Lightning line would print twice. Here Lightning's handlers go,
    its records propagate to Hydra's handlers, its advertising tips are dropped, third-party INFO/DEBUG
    chatter (`FILE_ONLY_LOGGERS`) reaches only the log file, and Python warnings are logged through the
    same handlers (one format, also in the file). Without handlers on the root logger (not under Hydra)
    nothing changes, so Lightning keeps its own console output.
    """
    root = logging.getLogger()
    if not root.handlers:
        return
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        lg = logging.getLogger(name)
        lg.handlers.clear()
        lg.propagate = True
    for handler in root.handlers:
        _add_filter(handler, _NoAdverts)
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
            _add_filter(handler, _ConsoleFilter)
    for pattern in IGNORED_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    logging.captureWarnings(True)
    if not verbose():
        # datasets' "Generating train split" and transformers' "Loading weights" bars: seconds of work each, one
        # console line per bar; lmk's own progress (training steps, encode phases) stays
        if os.environ.get("HF_DATASETS_DISABLE_PROGRESS_BARS") is None:
            disable_progress_bars()
        tf_logging.disable_progress_bar()


@contextmanager
def quiet_progress_bars() -> Iterator[None]:
    """No `datasets` / `transformers` progress bars inside the block (short per-task work such as mteb's
    "Standardizing text corpus format" map, or writing one weight shard); restored after. Long work (a
    training epoch, encoding a corpus) keeps its own bars. An HF_DATASETS_DISABLE_PROGRESS_BARS setting wins.
    """
    ds_before = are_progress_bars_disabled()
    tf_before = tf_logging.is_progress_bar_enabled()
    env_set = os.environ.get("HF_DATASETS_DISABLE_PROGRESS_BARS") is not None
    if not env_set:
        disable_progress_bars()
    tf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if not env_set and not ds_before:
            enable_progress_bars()
        if tf_before:
            tf_logging.enable_progress_bar()
