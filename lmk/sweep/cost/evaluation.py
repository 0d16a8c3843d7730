"""The evaluation's cost, per shard of the suite: each task's corpus and query counts and average lengths from
mteb's own descriptive statistics (`task.metadata.descriptive_stats`: characters, converted at CHARS_PER_TOKEN
and truncated at the suite's max lengths), at one forward pass per token, at the encode throughput of the
rates (end to end when measured so, else forward-only plus tokenization at an assumed CPU rate), plus the exact
search (queries x corpus dot products on the CPU) and a per-job fixed cost."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import mteb
from mteb.abstasks.aggregated_task import AbsTaskAggregate

from lmk.eval.tasks import LOCAL_TASKS
from lmk.model.shape import EncoderShape
from lmk.sweep.cost.stage import StageCost, hours
from lmk.sweep.cost.throughput import Rates

CHARS_PER_TOKEN = 4.0  # English BPE / WordPiece: about 4 characters per token
IN_TRAINING = "in training"  # the shard name of a suite the training jobs evaluate themselves


def _side(stats: Mapping[str, Any], key: str, n_key: str, max_len: int) -> tuple[float, float]:
    text = stats.get(key) or {}
    n = float(stats.get(n_key) or 0)
    avg = float(text.get("average_text_length") or 0) / CHARS_PER_TOKEN
    return n, min(avg, float(max_len))


def task_tokens(task: Any, query_max_length: int, passage_max_length: int) -> list[tuple[float, float]]:
    """[(documents, tokens per document), (queries, tokens per query)] of each requested split/subset of
    one mteb task, from its descriptive stats (documents first in every pair of entries)."""
    leaves = list(task.metadata.tasks) if isinstance(task, AbsTaskAggregate) else [task]
    out = []
    for leaf in leaves:
        stats = leaf.metadata.descriptive_stats or {}
        for split in leaf.eval_splits:
            s = stats.get(split) or {}
            by_subset = s.get("hf_subset_descriptive_stats") or {}
            parts = [by_subset[x] for x in leaf.hf_subsets if x in by_subset] if by_subset else [s]
            for part in parts:
                out.append(_side(part, "documents_text_statistics", "num_documents", passage_max_length))
                out.append(_side(part, "queries_text_statistics", "num_queries", query_max_length))
    return out


def encode_seconds(parts: Sequence[tuple[float, float]], shape: EncoderShape, rates: Rates) -> float:
    """Encode (+ tokenization when the figure excludes it) + exact search of one task's splits."""
    seconds = 0.0
    for i, (n, per_text) in enumerate(parts):
        seconds += n * per_text * shape.forward_flops_per_token(per_text) / rates.encode_at(per_text).flops_per_s
        if not rates.encode_includes_tokenization:
            seconds += n * per_text / rates.tokenize_tokens_per_s
        if i % 2:  # (documents, queries): every query against every document
            seconds += 2.0 * parts[i - 1][0] * n * shape.hidden / rates.search_flops_per_s
    return seconds


def eval_cost(suite: Any, n_rows: int, shards: Mapping[str, Sequence[str]] | None, shape: EncoderShape,
              rates: Rates | None = None) -> StageCost:
    """Every row evaluates the whole suite once: one job per (row, shard) in the eval stage's order (rows outer),
    or (`shards` None) inside each training job, where the time per row goes into the training job's."""
    tokens = flops = 0.0
    missing: list[str] = []
    task_s: dict[str, float] = {}
    for name in suite.tasks:
        if name in LOCAL_TASKS:
            continue
        opts = suite.task_options.get(name, {})
        task = mteb.get_task(name, eval_splits=opts.get("eval_splits"), hf_subsets=opts.get("hf_subsets"),
                             languages=opts.get("languages"))
        parts = task_tokens(task, suite.query_max_length, suite.passage_max_length)
        if not parts:
            missing.append(name)
        for n, per_text in parts:
            tokens += n * per_text
            flops += n * per_text * shape.forward_flops_per_token(per_text)
        task_s[name] = encode_seconds(parts, shape, rates) if rates is not None else 0.0
    notes = [f"{len(suite.tasks)} tasks at {suite.query_max_length}/{suite.passage_max_length} tokens, "
             f"{CHARS_PER_TOKEN:g} characters per token, encode + tokenization + exact search"]
    if missing:
        notes.append(f"no descriptive statistics for {missing}: not counted")
    plan = dict(shards) if shards is not None else {IN_TRAINING: list(suite.tasks)}
    cost = StageCost("eval", n_rows * len(plan) if shards is not None else 0, tokens * n_rows, flops * n_rows, notes)
    cost.shards = {s: [(t, task_s[t]) for t in tasks if t in task_s] for s, tasks in plan.items()}
    if rates is None:
        return cost
    shard_s = {s: sum(sec for _, sec in tasks) for s, tasks in cost.shards.items()}
    if shards is None:  # the training jobs run it: its time is theirs (lmk.sweep.cost.estimate adds it)
        cost.job_wall_s = shard_s[IN_TRAINING]
        notes.append(f"inside each training job: {hours(cost.job_wall_s)} per row, counted in its wall time")
        return cost
    overhead = rates.job_overhead_s
    cost.durations = [shard_s[s] + overhead for _ in range(n_rows) for s in plan]
    cost.device_s = sum(cost.durations)
    cost.longest = max(shard_s, key=shard_s.__getitem__)
    cost.job_wall_s = shard_s[cost.longest] + overhead
    return cost
