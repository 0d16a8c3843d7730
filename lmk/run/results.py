"""The run folder's `results.json`: one file per run, merged by every writer, never overwritten blind.

`Results` is its typed record: every key a writer may write is a field of it (`update_results` refuses any
other), and readers (tables, reports, the eval stage, publishing, the analysis) read it through
`Results.read(run_dir)`. Train, the eval callback, `lmk.evaluate` and the sweep all write through
`update_results`, so a crash in a later stage never loses what an earlier stage computed. The file stays
plain JSON: keys a newer or older writer added that the record does not name are kept in `extra`.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import DictConfig, ListConfig, OmegaConf

from lmk.config import hash_neutral_keys
from lmk.run.cpu_kernels import in_use as cpu_kernels_in_use
from lmk.run.environment import environment_info
from lmk.run.umask_files import write_json

RESULTS_FILE = "results.json"
UPDATED_AT_FORMAT = "%Y-%m-%dT%H:%M:%S%z"  # `updated_at`: local time with its offset, to the second


def _deep_merge(base: dict[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in new.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def read_results(run_dir: str | os.PathLike) -> dict[str, Any]:
    """The run's results as written (plain JSON), or {} when it has none yet; readers use `Results.read`."""
    path = Path(run_dir) / RESULTS_FILE
    if not path.exists():
        return {}
    with open(path) as fh:
        return json.load(fh)


_R = TypeVar("_R")


def _record(cls: type[_R], data: Mapping[str, Any] | None) -> _R:
    """`cls` from a JSON mapping: a missing or null key takes the field's default (an empty section), keys the
    record does not name go to `extra`."""
    data = dict(data or {})
    names = {f.name for f in fields(cls)} - {"extra"}  # type: ignore[arg-type]
    known = {k: data.pop(k) for k in list(data) if k in names}
    return cls(**{k: v for k, v in known.items() if v is not None}, extra=data)  # type: ignore[call-arg]


@dataclass
class EvalRecord:
    """results.json's `eval` section: what one evaluation of the run wrote (lmk.eval.runner, lmk.sweep.eval_stage)."""

    tasks: dict[str, Any] = field(default_factory=dict)  # task -> {main_score, scores per split, ...}
    groups: dict[str, float | None] = field(default_factory=dict)  # group -> the mean of its tasks' main scores
    group_tasks: dict[str, list[str]] = field(default_factory=dict)  # group -> its tasks (tables pair by group)
    per_query: str | None = None  # the per-query scores file beside results.json
    timings: dict[str, Any] = field(default_factory=dict)
    suite: str | None = None
    model: str | None = None  # the mteb model name the scores are cached under
    fingerprint: str | None = None  # the evaluated weights' fingerprint
    query_max_length: int | None = None
    passage_max_length: int | None = None
    cache_dir: str | None = None  # the mteb ResultCache the scores are in (None: <run dir>/mteb_cache)
    scoring: str = "single"  # eval.scoring the scores used: single (one vector, cosine) or maxsim (lmk.eval.maxsim)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Results:
    """The typed `results.json` of a run folder (training, `lmk.evaluate` or a failed sweep row)."""

    status: str | None = None  # running | done | failed | interrupted
    error: str | None = None
    traceback: str | None = None
    command: str | None = None  # "evaluate" for an lmk.evaluate folder
    row: str | None = None  # the table row (a row the sweeper recorded as failed before its job ran)
    config: dict[str, Any] = field(default_factory=dict)  # the resolved config the run used
    config_hash: str | None = None
    git_commit: str | None = None
    model: dict[str, Any] = field(default_factory=dict)  # what lmk.evaluate loaded
    resume: dict[str, Any] = field(default_factory=dict)  # the checkpoint this attempt resumed from, and why
    interruptions: list[dict[str, Any]] = field(default_factory=list)  # earlier attempts that stopped
    gradient_checkpointing: dict[str, Any] = field(default_factory=dict)  # the decision and why
    wandb: dict[str, Any] = field(default_factory=dict)  # mode, url, sync command
    metrics: dict[str, Any] = field(default_factory=dict)  # the trainer's last logged metrics, global_step
    timings: dict[str, Any] = field(default_factory=dict)  # seconds per phase, fit steps per second
    data_fingerprint: str | None = None
    data: dict[str, Any] = field(default_factory=dict)  # per source: rows kept / skipped
    # per training source: landmarks per text, single-landmark / truncated shares (lmk.data.landmarks); the eval
    # tasks' own are in eval.tasks.<task>.landmarks
    landmarks: dict[str, Any] = field(default_factory=dict)
    checkpoints: dict[str, Any] = field(default_factory=dict)  # last, best, resumed_from
    # real tokens against tokens computed (rows x width) over the run's batches: train.grad_cache_tokens's effect
    fill: dict[str, Any] = field(default_factory=dict)
    export: str | None = None  # the sentence-transformers folder
    non_finite: dict[str, Any] = field(default_factory=dict)  # where the non-finite guard stopped the run
    eval: EvalRecord = field(default_factory=EvalRecord)
    eval_history: dict[str, Any] = field(default_factory=dict)  # step -> scores of in-training evaluations
    environment: dict[str, Any] = field(default_factory=dict)  # the lock the results were computed under
    updated_at: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # keys this record does not name, kept as read

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Results:
        record = _record(cls, data)
        record.eval = _record(EvalRecord, record.eval if isinstance(record.eval, Mapping) else None)
        return record

    @classmethod
    def read(cls, run_dir: str | os.PathLike) -> Results:
        """The run's record; an empty one (status None) when it has no results.json yet."""
        return cls.from_dict(read_results(run_dir))

    @property
    def is_empty(self) -> bool:
        """No results.json yet (or an empty one)."""
        return self == Results()

    @property
    def row_id(self) -> str | None:
        """The table row: the recorded one, else the config's (`++row=...`)."""
        return self.row or self.config.get("row")

    def section(self, name: str) -> dict[str, Any]:
        """A section of the run's config (`encoder`, `data`, `eval`, ...) as a mapping; {} when absent."""
        value = self.config.get(name)
        return dict(value) if isinstance(value, Mapping) else {}


RESULT_KEYS = frozenset(f.name for f in fields(Results)) - {"extra"}


def update_results(run_dir: str | os.PathLike, *, fresh: bool = False, **sections: Any) -> dict[str, Any]:
    """Deep-merge `sections` (fields of `Results`) into `<run_dir>/results.json` and write it atomically.

    `fresh=True` starts the file over: a new run in an old folder must not inherit the previous
    run's eval scores or error under its own config hash.
    """
    unknown = sorted(set(sections) - RESULT_KEYS)
    if unknown:
        raise TypeError(f"results.json has no key {unknown[0]!r}; add it to lmk.run.results.Results first")
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    merged = _deep_merge({} if fresh else read_results(run_dir), sections)
    # every results.json names the environment lock it was computed under (and what differed from it);
    # a later writer under another lock is recorded beside the first, never in its place
    env = {**environment_info(), "cpu_kernels": cpu_kernels_in_use()}  # the kernels: what decides a CPU run's floats
    first = merged.setdefault("environment", dict(env))
    if first.get("lock") != env.get("lock") or first.get("differs_from_lock") != env.get("differs_from_lock"):
        others = first.setdefault("also_written_under", [])
        if env not in others:
            others.append(env)
    merged["updated_at"] = time.strftime(UPDATED_AT_FORMAT)
    write_json(run_dir / RESULTS_FILE, merged)  # atomic: a crash mid-write never truncates results.json
    return merged


def config_hash(config: Mapping[str, Any], ignore: tuple[str, ...] = ()) -> str:
    """A short stable hash of a (resolved, plain-dict) config; keys in `ignore` are dropped first."""
    cleaned = {k: v for k, v in config.items() if k not in ignore}
    blob = json.dumps(cleaned, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def git_commit(cwd: str | os.PathLike | None = None) -> str | None:
    """The current git commit (with a `-dirty` suffix when the tree has changes), or None outside git."""
    cwd = cwd or Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd, capture_output=True, text=True, timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{sha}-dirty" if dirty else sha


class Timer:
    """Collects named wall-clock durations (seconds) for the `timings` section."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}

    def section(self, name: str) -> _Section:
        return _Section(self, name)


class _Section:
    def __init__(self, timer: Timer, name: str) -> None:
        self.timer, self.name = timer, name

    def __enter__(self) -> _Section:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.timer.timings[self.name] = round(time.perf_counter() - self.start, 3)


# Keys that say where a run is stored: their values differ between the sweeper and the job (Hydra's
# runtime folder), so interpolations into them are hashed verbatim.
HASH_LOCATION_KEYS = ("hydra", "run_dir", "ckpt_path", "paths", "cache_dir")
# Keys that say where or how a run is stored/logged, not what it computes: two runs that differ only
# in these produce the same numbers, so they share a config hash. (A value interpolated *from* the
# launcher, e.g. trainer.num_nodes, does change the global batch, so it is resolved and hashed.)
HASH_IGNORED_KEYS = (*HASH_LOCATION_KEYS, "logger", "launcher", "hub", "overwrite",  # hub: where repos are read from
                     # how encode batches are built: the embeddings are bitwise equal for any value
                     "eval.workers", "eval.prefetch")
# Settings added after runs were hashed, at the value that computes what those runs computed: left out of the hash
# while they hold it, so finished runs keep their hash (and a sweep does not recompute them); any other value hashes.
# Each is declared where it is defined (lmk.config.schema.hash_neutral on its schema field), never listed here.
HASH_NEUTRAL_DEFAULTS: dict[str, Any] = hash_neutral_keys()
# The status a finished run records; the sweeper skips rows whose results say this.
STATUS_DONE = "done"


def _neutral(node: DictConfig, key: Any, path: str) -> bool:
    return path in HASH_NEUTRAL_DEFAULTS and node[key] == HASH_NEUTRAL_DEFAULTS[path]


def config_hash_of(cfg: Any, ignore: tuple[str, ...] = HASH_IGNORED_KEYS) -> str:
    """The config hash of a composed Hydra/OmegaConf config, equal inside and outside a Hydra job.

    Keys in `ignore` (top-level names, or dotted paths into a section) are dropped. Interpolations are
    resolved, except those that point at Hydra's runtime or a location key (HASH_LOCATION_KEYS: kept
    verbatim), so the sweeper (which composes outside the job) and the job itself compute the same hash.
    """
    def walk(node: Any, prefix: str = "") -> Any:
        if isinstance(node, DictConfig):
            return {str(k): leaf(node, k, f"{prefix}{k}.") for k in node.keys() if f"{prefix}{k}" not in ignore
                    and not _neutral(node, k, f"{prefix}{k}")}
        if isinstance(node, ListConfig):
            return [leaf(node, i, prefix) for i in range(len(node))]
        return node

    def leaf(node: Any, key: Any, prefix: str) -> Any:
        raw = node._get_node(key)._value() if hasattr(node, "_get_node") else node[key]
        if isinstance(raw, str) and "${" in raw and any(k in raw for k in HASH_LOCATION_KEYS):
            return raw
        value = node[key]
        if isinstance(value, (DictConfig, ListConfig)):
            return walk(value, prefix)
        return value

    if not isinstance(cfg, DictConfig):
        cfg = OmegaConf.create(cfg)
    return config_hash(walk(cfg))
