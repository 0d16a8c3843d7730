"""Suite config -> mteb task objects, with every check done before any text is encoded.

Hub tasks come from `mteb.get_task`; local tasks (`Local*`) are regenerated offline by the data
package. An unknown name fails with the closest valid names; a hub task asked for without a
network fails fast, naming the offline suite `eval=local`.
"""

from __future__ import annotations

import difflib
import logging
import os
import socket
from collections.abc import Sequence
from functools import lru_cache

import mteb
from mteb.abstasks.abstask import AbsTask

from lmk.eval.config import LOCAL_TASKS, EvalConfig, EvalConfigError

logger = logging.getLogger(__name__)

_TRUE = {"1", "true", "yes", "on"}


class UnknownTaskError(EvalConfigError):
    """A task name that is neither an mteb task nor a local task."""


class OfflineError(RuntimeError):
    """A hub task was requested but the Hugging Face hub cannot be reached."""


@lru_cache(maxsize=1)
def mteb_task_names() -> tuple[str, ...]:
    """Names of every task mteb knows (no data is loaded)."""
    from mteb.get_tasks import _TASKS_REGISTRY

    return tuple(sorted(_TASKS_REGISTRY))


def valid_task_names() -> tuple[str, ...]:
    return (*LOCAL_TASKS, *mteb_task_names())


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
            + f". Local tasks are {list(LOCAL_TASKS)}; hub task names are mteb's (mteb.get_tasks())."
        )


def is_offline(timeout: float = 2.0) -> bool:
    """True when HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set or huggingface.co cannot be reached."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in _TRUE:
            return True
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    host = endpoint.split("://", 1)[-1].split("/", 1)[0]
    port = 443 if endpoint.startswith("https") else 80
    if ":" in host:
        host, port_s = host.rsplit(":", 1)
        port = int(port_s)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return False
    except OSError:
        return True


def check_network(hub_tasks: Sequence[str]) -> None:
    """Fail fast (before any encoding) when hub tasks are asked for without a network."""
    if hub_tasks and is_offline():
        raise OfflineError(
            f"eval tasks {list(hub_tasks)} are mteb hub tasks: their data must be downloaded from the Hugging "
            "Face hub, which is unreachable here (HF_HUB_OFFLINE is set or there is no network). Run with a "
            "network, or with a local copy of the datasets in the Hugging Face cache (then unset "
            "HF_HUB_OFFLINE), or use the offline suite `eval=local`."
        )


def build_tasks(cfg: EvalConfig, check_offline: bool = True) -> list[AbsTask]:
    """The suite's mteb tasks, in config order. Names and the network are checked first."""
    check_task_names(cfg.tasks)
    hub = [t for t in cfg.tasks if t not in LOCAL_TASKS]
    if check_offline:
        check_network(hub)
    from lmk.eval.tasks import build_local_task  # heavy data imports only when needed

    tasks: list[AbsTask] = []
    for name in cfg.tasks:
        if name in LOCAL_TASKS:
            tasks.append(build_local_task(name, cfg))
            continue
        opts = cfg.task_options.get(name, {})
        tasks.append(
            mteb.get_task(
                name,
                languages=opts.get("languages"),
                eval_splits=opts.get("eval_splits"),
                hf_subsets=opts.get("hf_subsets"),
            )
        )
    return tasks
