"""Eval task names checked before mteb loads: the local tasks' declared names (`lmk.config.eval.LOCAL_TASK_NAMES`)
and mteb's (`lmk.hub.task_registry`, cached per mteb version). An unknown name fails with the closest valid ones."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from functools import lru_cache

from lmk.config.eval import LOCAL_TASK_NAMES, EvalConfigError
from lmk.hub.task_registry import hub_task_names


class UnknownTaskError(EvalConfigError):
    """A task name that is neither an mteb task nor a local task."""


@lru_cache(maxsize=1)
def valid_task_names() -> tuple[str, ...]:
    """Local task names, then every mteb task name (no data is loaded)."""
    return (*LOCAL_TASK_NAMES, *sorted(hub_task_names()))


def check_task_names(names: Sequence[str]) -> None:
    """Raise UnknownTaskError for the first unknown names, listing the closest valid names."""
    known = set(valid_task_names())
    problems = []
    for name in names:
        if name in known:
            continue
        close = difflib.get_close_matches(name, valid_task_names(), n=5, cutoff=0.6)
        problems.append(f"{name!r} (closest: {', '.join(close) if close else 'none'})")
    if problems:
        raise UnknownTaskError(
            "unknown eval task(s): " + "; ".join(problems)
            + f". Local tasks are {list(LOCAL_TASK_NAMES)}; hub task names are mteb's (mteb.get_tasks())."
        )
