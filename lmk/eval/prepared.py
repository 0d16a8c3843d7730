"""Evaluation datasets prepared once for many jobs, read-only in the jobs.

Left alone, every `lmk.evaluate` job converts each hub task's data itself: mteb's loaders call
`datasets.load_dataset`, which writes an Arrow copy of the parquet files into the `datasets` cache under a file
lock, and mteb's maps write further cache files beside it. Sixty eval-stage jobs on one shared file system then
either all fail (no working `flock` there) or convert the same corpora one after the other. So the eval stage
prepares the suite's data once, before any job starts (`prepare`, `python -m lmk.eval.prepared`), and the jobs
read it (`hub.prepared=<folder>`, `reading`) without writing to or locking any shared folder:

    <folder>/<task>/<fingerprint>/<subset>/<split>/corpus/      Dataset.save_to_disk (memory-mapped on load)
                                                 /queries/
                                                 /relevant_docs.json, top_ranked.json
    <folder>/<task>/<fingerprint>/.lmk_prepared.json            written last: the layout and every file's size

The data saved is what mteb's own `load_data` (and its v1 -> v2 conversion) made of the task, for the splits
and subsets the task evaluates, so scores are those of a job that loads the data itself. The fingerprint names
what the data came from (the task, its dataset path / revision / config, its splits and subsets, the
mirror folder's files with their sizes and times, the mteb and datasets versions): a rerun finds it and
converts nothing; a changed replica or download gets a new fingerprint and is prepared again. Local tasks
(`Local*`) are generated in memory and never touch a cache: they are not prepared.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import datasets
import mteb
from datasets import Dataset
from hydra import compose, initialize_config_dir
from mteb.abstasks.abstask import AbsTask
from mteb.abstasks.aggregated_task import AbsTaskAggregate

from lmk.config import CONF_DIR
from lmk.config.eval import EvalConfig
from lmk.config.schema import UserError
from lmk.eval.suites import build_tasks
from lmk.eval.tasks import LOCAL_TASKS
from lmk.hub import mirror
from lmk.run.quiet_logging import quiet_progress_bars
from lmk.run.umask_files import write_json

log = logging.getLogger("lmk.eval.prepared")  # also under `python -m` (not "__main__")

FORMAT = 1  # the folder layout below; a change makes every fingerprint new
MARKER = ".lmk_prepared.json"
_SKIP = (".cache",)  # huggingface_hub's download bookkeeping inside a mirror folder


class PreparedDataError(UserError, ValueError):
    """A job was pointed at prepared eval data (`hub.prepared`) that does not hold one of its tasks."""


# ---- what a task's data is made of ----------------------------------------------------------------------
def hub_leaves(tasks: Sequence[AbsTask]) -> list[AbsTask]:
    """The tasks whose data mteb loads from a hub repo (or its mirror): aggregates by their sub-tasks."""
    out: list[AbsTask] = []
    for task in tasks:
        for leaf in task.metadata.tasks if isinstance(task, AbsTaskAggregate) else [task]:
            if leaf.metadata.name not in LOCAL_TASKS:
                out.append(leaf)
    return out


def _source_files(path: Path) -> list[list[Any]]:
    """[relative name, size, mtime_ns] of every file of a local dataset folder (a mirror copy)."""
    rows = []
    for p in sorted(path.rglob("*")):
        rel = p.relative_to(path).as_posix()
        if p.is_file() and not rel.startswith(_SKIP):
            st = p.stat()
            rows.append([rel, st.st_size, st.st_mtime_ns])
    return rows


def fingerprint(task: AbsTask) -> str:
    """What the task's data is built from, hashed: the same value in the preparation and in every job. A mirror
    folder counts by its files (names, sizes, times), not its absolute path, so nodes that mount it elsewhere
    agree; a hub id counts by its revision."""
    dataset = dict(task.metadata.dataset)
    path = Path(str(dataset.pop("path", "")))
    source: Any = _source_files(path) if path.is_dir() else str(path)
    record = {"format": FORMAT, "task": task.metadata.name,
              "dataset": dataset, "source": source, "splits": list(task.eval_splits),
              "subsets": list(task.hf_subsets), "mteb": mteb.__version__, "datasets": datasets.__version__}
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()[:16]


def task_folder(root: str | os.PathLike, task: AbsTask) -> Path:
    """Where the prepared data of `task` (as it is now) lives under `root`."""
    return Path(root) / task.metadata.name / fingerprint(task)


def incomplete(folder: Path) -> str | None:
    """None when `folder` holds a complete preparation (its marker, every file it lists with its size)."""
    marker = folder / MARKER
    if not marker.is_file():
        return "not prepared"
    try:
        meta = json.loads(marker.read_text())
    except json.JSONDecodeError:
        return f"{marker} is not valid JSON"
    return mirror.missing_or_truncated(folder, meta.get("files") or {})


# ---- writing: once, before the jobs ----------------------------------------------------------------------
def _component(name: str) -> str:
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"{name!r} cannot name a folder of prepared eval data")
    return name


def _save_split(data: dict[str, Any], where: Path, task: str) -> dict[str, str]:
    """Save one split's entries (Datasets with save_to_disk, mappings as JSON); returns {key: kind}."""
    kinds: dict[str, str] = {}
    for key, value in data.items():
        target = where / _component(key)
        if isinstance(value, Dataset):
            value.save_to_disk(str(target))
            kinds[key] = "dataset"
        elif value is None:
            kinds[key] = "none"
        elif isinstance(value, dict) and all(isinstance(k, str) for k in value):
            target.with_suffix(".json").write_text(json.dumps(value))
            kinds[key] = "json"
        else:
            raise TypeError(f"eval task {task}: its split data {key!r} is a {type(value).__name__}; prepared eval "
                            "data holds Datasets and string-keyed mappings (retrieval tasks). Run the eval stage "
                            "without prepared data for this task (drop it from the suite) or extend "
                            "lmk.eval.prepared")
    return kinds


def _write(task: AbsTask, folder: Path) -> None:
    """Load the task's data through mteb (the one conversion) and save it into `folder`, whole or not at all."""
    name = task.metadata.name
    task.load_data()
    convert = getattr(task, "convert_v1_dataset_format_to_v2", None)
    if convert is not None:  # what mteb's evaluate does first (LongEmbed's loaders fill the v1 attributes)
        convert(num_proc=None)
    tmp = folder.parent / f".{folder.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    layout: dict[str, dict[str, dict[str, str]]] = {}
    try:
        for subset in task.hf_subsets:
            for split in task.eval_splits:
                data = (task.dataset or {}).get(subset, {}).get(split)
                if data is None:
                    raise ValueError(f"eval task {name}: mteb loaded no data for subset {subset!r}, split {split!r}")
                where = tmp / _component(subset) / _component(split)
                where.mkdir(parents=True)
                layout.setdefault(subset, {})[split] = _save_split(dict(data), where, name)
        files = {p.relative_to(tmp).as_posix(): p.stat().st_size for p in sorted(tmp.rglob("*")) if p.is_file()}
        write_json(tmp / MARKER, {"task": name, "fingerprint": folder.name, "layout": layout, "files": files,
                                  "dataset": dict(task.metadata.dataset)}, indent=1)
        if folder.exists() and incomplete(folder) is not None:
            shutil.rmtree(folder)  # a copy cut short (a full quota, a node lost in rsync): never read
        try:
            os.replace(tmp, folder)  # the whole folder appears at once
        except OSError:
            if incomplete(folder) is not None:  # not another preparation that finished first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        task.unload_data()


def prepare(cfg: EvalConfig, root: str | os.PathLike) -> dict[str, str]:
    """Prepare every hub task of suite `cfg` under `root` (the hub mirror must be configured, as in the jobs);
    returns {task: "prepared <fingerprint>" | "reused <fingerprint>" | "failed: <why>"}. A task already prepared
    is not loaded; a task whose data cannot be loaded (a partial download) fails alone: the jobs of the others
    run, its own job fails naming why."""
    root = Path(root)
    report: dict[str, str] = {}
    for task in hub_leaves(build_tasks(cfg)):
        name, folder = task.metadata.name, task_folder(root, task)
        if incomplete(folder) is None:
            report[name] = f"reused {folder.name}"
            continue
        folder.parent.mkdir(parents=True, exist_ok=True)
        log.info("preparing the eval data of %s (fingerprint %s)", name, folder.name)
        try:
            _write(task, folder)
        except Exception as err:  # any loader error: the other tasks are still prepared
            report[name] = f"failed: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            log.error("eval data of %s not prepared: %s", name, report[name], exc_info=True)
            continue
        report[name] = f"prepared {folder.name}"
    return report


# ---- reading: in every job -----------------------------------------------------------------------------
def read(folder: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """A prepared task's `dataset` ({subset: {split: {corpus, queries, relevant_docs, top_ranked}}}), its
    Datasets memory-mapped from `folder`: nothing is written or locked."""
    meta = json.loads((folder / MARKER).read_text())
    dataset: dict[str, dict[str, dict[str, Any]]] = {}
    for subset, splits in meta["layout"].items():
        for split, kinds in splits.items():
            where = folder / subset / split
            entry: dict[str, Any] = {}
            for key, kind in kinds.items():
                if kind == "dataset":
                    entry[key] = datasets.load_from_disk(str(where / key))
                elif kind == "json":
                    entry[key] = json.loads((where / f"{key}.json").read_text())
                else:
                    entry[key] = None
            dataset.setdefault(subset, {})[split] = entry
    return dataset


_PREPARED_CLASSES: dict[type, type] = {}


def _prepared_class(base: type) -> type:
    """`base` whose `load_data` reads the prepared folder (`_lmk_prepared`) and whose `unload_data` keeps the
    instance metadata (mteb's drops it, and the mirror's path with it)."""
    if base not in _PREPARED_CLASSES:
        def load_data(self: Any, num_proc: int | None = None, **kwargs: Any) -> None:
            if self.data_loaded:
                return
            self.dataset = read(self._lmk_prepared)
            self.data_loaded = True

        def unload_data(self: Any) -> None:
            metadata = self.metadata
            base.unload_data(self)
            self.metadata = metadata

        _PREPARED_CLASSES[base] = type(base.__name__, (base,), {"load_data": load_data, "unload_data": unload_data,
                                                                "__module__": __name__})
    return _PREPARED_CLASSES[base]


def attach(tasks: Sequence[AbsTask], root: str | os.PathLike) -> list[Path]:
    """Point every hub task of `tasks` at its prepared data under `root`; returns the folders. A task whose data
    (as the job sees it now) was not prepared fails here, before the model loads, naming the fix."""
    folders = []
    for task in hub_leaves(tasks):
        folder = task_folder(root, task)
        why = incomplete(folder)
        if why is not None:
            there = sorted(p.name for p in (Path(root) / task.metadata.name).glob("*") if not p.name.startswith("."))
            raise PreparedDataError(
                f"eval task {task.metadata.name}: hub.prepared={root} has no prepared data for it as this job sees "
                f"it (fingerprint {folder.name}: {why}; prepared: {', '.join(there) or 'none'}); prepare it with "
                f"`python -m lmk.eval.prepared --out {root} <the job's eval and hub overrides>` (the sweep's eval "
                "stage does this before launching), or drop hub.prepared to load the data in the job")
        if type(task) not in _PREPARED_CLASSES.values():
            task.__class__ = _prepared_class(type(task))
        task._lmk_prepared = folder
        folders.append(folder)
    return folders


@contextmanager
def reading(tasks: Sequence[AbsTask], root: str | os.PathLike | None) -> Iterator[list[Path]]:
    """With `root` (hub.prepared): the tasks read their prepared data, and `datasets` caches the maps mteb
    runs on it in a private temporary folder instead of beside the prepared files. Without: nothing changes."""
    if root in (None, ""):
        yield []
        return
    folders = attach(tasks, str(root))
    caching = datasets.is_caching_enabled()
    datasets.disable_caching()
    try:
        yield folders
    finally:
        if caching:
            datasets.enable_caching()


# ---- the command ---------------------------------------------------------------------------------------
def compose_eval(overrides: Sequence[str]) -> tuple[EvalConfig, str | None]:
    """The suite and hub mirror an `lmk.evaluate` job with `overrides` sees."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose("evaluate", overrides=list(overrides))
    hub = cfg.get("hub") or {}
    return EvalConfig.from_cfg(cfg.eval), hub.get("mirror")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lmk.eval.prepared", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the folder jobs then read with hub.prepared=<it>")
    parser.add_argument("overrides", nargs="*", help="the jobs' overrides (eval=..., hub.mirror=...)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="[%(name)s] %(message)s")  # mteb's loaders: per-split chatter
    log.setLevel(logging.INFO)  # which task is being converted (a paper corpus takes minutes)
    try:
        suite, hub_mirror = compose_eval(args.overrides)
        mirror.configure(hub_mirror)
        with quiet_progress_bars():  # datasets' per-split save bars
            report = prepare(suite, args.out)
    except UserError as err:
        print(f"[lmk.eval.prepared] {err}", file=sys.stderr)
        return 2
    for task, what in report.items():
        print(f"[lmk.eval.prepared] {task:<28} {what}")
    failed = [t for t, what in report.items() if what.startswith("failed")]
    print(f"[lmk.eval.prepared] {len(report)} hub tasks in {Path(args.out).resolve()} (jobs: hub.prepared=<it>)"
          + (f"; not prepared: {', '.join(failed)}" if failed else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
