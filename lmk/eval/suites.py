"""Suite config -> mteb task objects, with every check done before any text is encoded.

Hub tasks come from `mteb.get_task` (reading the hub mirror when it holds their dataset); local tasks
(`Local*`) are regenerated offline by the data package. An unknown name fails with the closest valid names.
"""

from __future__ import annotations

import logging

import mteb
from mteb.abstasks.abstask import AbsTask
from mteb.abstasks.aggregated_task import AbsTaskAggregate

from lmk.config.eval import EvalConfig
from lmk.eval.task_names import check_task_names
from lmk.eval.tasks import LOCAL_TASKS, build_local_task
from lmk.hub.mirror import apply_mirror

logger = logging.getLogger(__name__)


def build_tasks(cfg: EvalConfig) -> list[AbsTask]:
    """The suite's mteb tasks, in config order (names checked first). A hub task whose dataset is in the
    hub mirror (`lmk.hub.mirror`) reads it from there; whether each one's data is at hand offline is
    checked before compute by `lmk.hub.artifacts.check_available` (config validation), not here."""
    check_task_names(cfg.tasks)
    tasks: list[AbsTask] = []
    for name in cfg.tasks:
        if name in LOCAL_TASKS:
            tasks.append(build_local_task(name, cfg))
            continue
        opts = cfg.task_options.get(name, {})
        task = mteb.get_task(name, languages=opts.get("languages"), eval_splits=opts.get("eval_splits"),
                             hf_subsets=opts.get("hf_subsets"))
        # an aggregate (CQADupstackRetrieval) loads through its sub-tasks: each reads its own mirrored repo
        for leaf in task.metadata.tasks if isinstance(task, AbsTaskAggregate) else [task]:
            folder = apply_mirror(leaf)
            if folder is not None:
                logger.info("eval task %s reads %s from the hub mirror", leaf.metadata.name, folder)
        tasks.append(task)
    return tasks
