"""The run folder's `results.json`: one file per run, merged by every writer, never overwritten blind.

Train, the eval callback, `lmk.evaluate` and the sweep all write through `update_results`, so a
crash in a later stage never loses what an earlier stage computed.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from lmk.run.environment import environment_info
from lmk.run.files import write_json

RESULTS_FILE = "results.json"


def _deep_merge(base: dict[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in new.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def read_results(run_dir: str | os.PathLike) -> dict[str, Any]:
    """The run's results, or {} when it has none yet."""
    path = Path(run_dir) / RESULTS_FILE
    if not path.exists():
        return {}
    with open(path) as fh:
        return json.load(fh)


def update_results(run_dir: str | os.PathLike, *, fresh: bool = False, **sections: Any) -> dict[str, Any]:
    """Deep-merge `sections` into `<run_dir>/results.json` and write it atomically.

    `fresh=True` starts the file over: a new run in an old folder must not inherit the previous
    run's eval scores or error under its own config hash.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    merged = _deep_merge({} if fresh else read_results(run_dir), sections)
    # every results.json names the environment lock it was computed under (and what differed from it);
    # a later writer under another lock is recorded beside the first, never in its place
    env = environment_info()
    first = merged.setdefault("environment", dict(env))
    if first.get("lock") != env.get("lock") or first.get("differs_from_lock") != env.get("differs_from_lock"):
        others = first.setdefault("also_written_under", [])
        if env not in others:
            others.append(env)
    merged["updated_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
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
# The status a finished run records; the sweeper skips rows whose results say this.
STATUS_DONE = "done"


def config_hash_of(cfg: Any, ignore: tuple[str, ...] = HASH_IGNORED_KEYS) -> str:
    """The config hash of a composed Hydra/OmegaConf config, equal inside and outside a Hydra job.

    Keys in `ignore` (top-level names, or dotted paths into a section) are dropped. Interpolations are
    resolved, except those that point at Hydra's runtime or a location key (HASH_LOCATION_KEYS: kept
    verbatim), so the sweeper (which composes outside the job) and the job itself compute the same hash.
    """
    def walk(node: Any, prefix: str = "") -> Any:
        if isinstance(node, DictConfig):
            return {str(k): leaf(node, k, f"{prefix}{k}.") for k in node.keys() if f"{prefix}{k}" not in ignore}
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
