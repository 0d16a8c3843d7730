"""A scale's hub mirror (`hub_mirror:` in a table spec): the folder every job of the sweep reads hub repos
from offline (`hub.mirror=<folder>`, see `lmk.hub.mirror`), made ready before any job starts.

    hub_mirror:
      path: hub-mirror   # relative to the sweep folder (--out), or absolute (a shared scratch folder)
      replicas: true     # true | {n_queries, n_docs, lengths, seed}: the sweep writes `lmk.eval.replicas`
                         # into it for the suite's tasks whose repo is missing (the rehearsal's stand-in
                         # for `make download`); false: it must exist (filled by `make download MIRROR=...`)

A cluster user fills the mirror on a login node and the jobs run with HF_HUB_OFFLINE=1 and hub.mirror; the
rehearsal takes the same path with replicas written where the download would have gone.
"""

from __future__ import annotations

import logging
from dataclasses import fields
from pathlib import Path
from typing import Any

from lmk.config import group_file
from lmk.hub import mirror
from lmk.sweep.spec import CONF_DIR, Scale, SpecError, experiment_eval

log = logging.getLogger(__name__)

KEYS = ("path", "replicas")


def mirror_dir(scale: Scale, out: Path) -> Path | None:
    """The scale's mirror folder (absolute), or None when the scale names none."""
    spec = dict(scale.hub_mirror or {})
    if not spec:
        return None
    unknown = sorted(set(spec) - set(KEYS))
    if unknown:
        raise SpecError(f"scale {scale.name!r}: unknown hub_mirror keys {unknown}; allowed: {', '.join(KEYS)}")
    path = Path(str(spec.get("path") or "hub-mirror")).expanduser()
    return (path if path.is_absolute() else Path(out) / path).resolve()


def _sizes(value: Any) -> Any:
    from lmk.eval.replicas import Sizes  # fast path: (see prepare)

    if value is True:
        return Sizes()
    names = {f.name for f in fields(Sizes)}
    if not isinstance(value, dict) or set(value) - names:
        raise SpecError(f"hub_mirror.replicas must be true, false or a mapping of {', '.join(sorted(names))}; "
                        f"got {value!r}")
    return Sizes(**{k: tuple(int(x) for x in v) if k == "lengths" else int(v) for k, v in value.items()})


def suite_tasks(scale: Scale, conf_dir: Path = CONF_DIR) -> list[str]:
    """The mteb task names of the eval suite the scale's jobs run (its eval stage's, else its experiment's)."""
    name = experiment_eval(scale, conf_dir)
    if name is None:
        return []
    return [str(t) for t in group_file("eval", name, conf_dir).get("tasks") or []]


def prepare(scale: Scale, out: Path, dry_run: bool = False) -> Path | None:
    """Make the scale's mirror ready (write missing replicas) and return its folder; None when the scale
    has no `hub_mirror`. A dry run writes nothing."""
    root = mirror_dir(scale, out)
    if root is None:
        return None
    replicas = scale.hub_mirror.get("replicas", False)
    if replicas is False or replicas is None:
        if not root.is_dir() and not dry_run:
            raise SpecError(f"scale {scale.name!r}: hub mirror {root} does not exist; fill it on a machine with "
                            f"the network: make download SCALE={scale.name} MIRROR={root}")
        return root
    # fast path: the replicas' data code (datasets, mteb) loads only for a scale that writes replicas
    from lmk.eval.replicas import REPLICAS, task_dataset, write_replicas

    sizes = _sizes(replicas)
    tasks = [t for t in suite_tasks(scale) if t in REPLICAS]
    repos = {t: str(task_dataset(t)["path"]) for t in tasks}
    # judged per (repo, config): LongEmbed's five configs share one repo. write_replicas rewrites a repo
    # folder whole, so every suite task of a repo with a config missing is written
    lacking = {repos[t] for t in tasks if mirror.find("dataset", repos[t], root, task_dataset(t).get("name")) is None}
    todo = [t for t in tasks if repos[t] in lacking]
    if todo and not dry_run:
        print(f"[lmk.sweep] hub mirror {root}: writing replicas of {', '.join(todo)}", flush=True)
        write_replicas(root, todo, sizes)
    elif todo:
        print(f"[lmk.sweep] dry run: would write replicas of {', '.join(todo)} into {root}", flush=True)
    return root
