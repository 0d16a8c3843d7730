"""The names of mteb's tasks without importing mteb: read once from its registry (seconds), then from a file in
lmk's cache kept per mteb version, so a misspelt task is refused before mteb loads."""

from __future__ import annotations

import json
import logging
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version

from lmk.run.umask_files import cache_root, write_json

log = logging.getLogger(__name__)


def _cache_file() -> str | None:
    try:
        mteb_version = version("mteb")
    except PackageNotFoundError:
        return None
    return str(cache_root() / "mteb-task-names" / f"{mteb_version}.json")


@lru_cache(maxsize=1)
def hub_task_names() -> frozenset[str]:
    """The names of every mteb task (their data is on the hub; no data is loaded). Local tasks are not among them."""
    path = _cache_file()
    if path is not None:
        try:
            with open(path) as fh:
                return frozenset(json.load(fh))
        except (OSError, ValueError):
            pass  # not written yet (or torn): mteb's registry below
    # mteb (seconds) loads here, once a suite names a task: a training job that evaluates nothing never does
    from mteb.get_tasks import _TASKS_REGISTRY

    names = frozenset(_TASKS_REGISTRY)  # mteb's own name -> class map (it has no public accessor)
    if path is not None:
        try:
            write_json(path, sorted(names))  # atomic: a reader never sees half a list
        except OSError as err:
            log.debug("mteb task names not cached (%s): the next check loads mteb again", err)
    return names
