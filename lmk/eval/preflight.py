"""Checks before compute that read this machine but build nothing: local training data paths exist, eval task
names resolve (mteb's registry, offline), and, offline, every hub artifact a job loads is on disk.

Config validation (`lmk.config.validate`) reads the config only; the entry points call `preflight` right after
it (`lmk.train`, `lmk.evaluate`, and the row sweeper for every job before launching)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmk.config.data import LOCAL_SOURCE as LOCAL_DATA
from lmk.config.data import is_named_source
from lmk.config.eval import EvalConfig
from lmk.config.schema import UserError
from lmk.config.schema import get_key as _get
from lmk.eval.task_names import check_task_names
from lmk.hub import mirror
from lmk.hub.artifacts import check_available, data_sources, eval_task_names
from lmk.hub.offline import is_hub_id


class PreflightError(UserError, ValueError):
    """A job config names a data or model path that does not exist or an eval task that does not resolve."""


def check_data_paths(data: Any) -> None:
    """Every local training data path exists (a missing file fails here, not after the model is built)."""
    missing = []
    for src in data_sources(data):
        path = src.get("path", LOCAL_DATA)
        if is_named_source(path) or is_hub_id(path) and not Path(path).suffix:
            continue  # `local` and `replica:<name>` are built on demand in the lmk cache
        if not Path(path).expanduser().exists():
            missing.append(path)
    if missing:
        raise PreflightError(f"data.sources: path(s) {missing} do not exist; give existing .jsonl/.json/.parquet "
                             "files or folders, 'local' (the offline default set), 'replica:bge-full-data' or a hub id (owner/name)")


def check_model_paths(encoder: Any) -> None:
    """An encoder's model_id / tokenizer given as a local path (/, ., ~) exists as a folder (else the model load
    would fail after seconds of imports, in a traceback)."""
    if encoder is None or _get(encoder, "source") not in ("hub", "random"):
        return
    for key in ("model_id", "tokenizer"):
        ref = _get(encoder, key)
        if isinstance(ref, str) and ref.startswith(("/", ".", "~")) and not Path(ref).expanduser().is_dir():
            raise PreflightError(f"encoder.{key}={ref!r} looks like a local path but is not a folder; give an "
                                 "existing model folder or a hub id (owner/name)")


def check_eval_tasks(eval_cfg: Any) -> None:
    """Every eval task name resolves (mteb's registry, offline; or a local task)."""
    names = eval_task_names(eval_cfg)
    if names:  # a job that evaluates nothing (eval=none) never loads mteb: seconds per rank
        check_task_names(names)  # mteb's registry names, cached per mteb version: mteb loads once per version


def preflight(cfg: Any, artifacts: bool = False, evaluated_only: bool = False) -> None:
    """Checks that need no compute: local data paths exist, eval task names resolve and (artifacts=True)
    offline, every hub artifact the job loads is on disk. The row sweeper runs it on every job before launching
    without `artifacts` (also on a laptop that plans a cluster sweep); the jobs themselves (lmk.train,
    lmk.evaluate) run it with `artifacts` on the node that computes, before any model is built.

    `evaluated_only`: a training job checks the task names of the part of the suite it evaluates
    (`eval.in_training`); the sweeper checked every name before launching it, and a rank that evaluates nothing
    then never loads mteb's registry."""
    mirror.configure(_get(_get(cfg, "hub"), "mirror"))
    check_data_paths(_get(cfg, "data"))
    check_model_paths(_get(cfg, "encoder"))
    eval_cfg = _get(cfg, "eval")
    if evaluated_only and eval_cfg is not None:
        eval_cfg = EvalConfig.from_cfg(eval_cfg).training_view()
    check_eval_tasks(eval_cfg)
    if artifacts:
        check_available(cfg)
