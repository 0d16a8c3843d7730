"""The evaluation's cost, per shard of the suite: each task's corpus and query counts and average lengths from
mteb's own descriptive statistics (`task.metadata.descriptive_stats`: characters, converted at CHARS_PER_TOKEN
and truncated at the suite's max lengths), at one forward pass per token, at the encode throughput of the
rates (end to end when measured so, else forward-only plus tokenization at an assumed CPU rate), plus the exact
search (queries x corpus dot products on the CPU) and a per-job fixed cost. A row scored by MaxSim adds, per task,
its index and exact MaxSim search (`lmk.sweep.cost.index`) to its own jobs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from lmk.config.eval import LOCAL_TASK_NAMES
from lmk.eval.residual_sizes import BITS
from lmk.model.shape import EncoderShape
from lmk.sweep.cost.index import Layout, TaskIndex, compressed_index_bytes, task_index
from lmk.sweep.cost.lengths import CHARS_PER_TOKEN
from lmk.sweep.cost.stage import StageCost, hours
from lmk.sweep.cost.throughput import Rates

IN_TRAINING = "in training"  # the shard name of a suite the training jobs evaluate themselves


def _side(stats: Mapping[str, Any], key: str, n_key: str, max_len: int) -> tuple[float, float]:
    text = stats.get(key) or {}
    n = float(stats.get(n_key) or 0)
    avg = float(text.get("average_text_length") or 0) / CHARS_PER_TOKEN
    return n, min(avg, float(max_len))


def task_tokens(task: Any, query_max_length: int, passage_max_length: int) -> list[tuple[float, float]]:
    """[(documents, tokens per document), (queries, tokens per query)] of each requested split/subset of
    one mteb task, from its descriptive stats (documents first in every pair of entries)."""
    from mteb.abstasks.aggregated_task import AbsTaskAggregate  # fast path: (see eval_cost)

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


def maxsim_indexes(suite: Any, parts: Mapping[str, Sequence[tuple[float, float]]], task_s: Mapping[str, float],
                   layout: Layout, rates: Rates) -> list[TaskIndex]:
    """Each task's MaxSim index and search for rows of `layout` (the search on `rates.maxsim`)."""
    rate = rates.maxsim.flops_per_s if rates.maxsim is not None else rates.search_flops_per_s
    return [task_index(name, p, layout, suite.query_max_length, suite.passage_max_length, rate, task_s[name])
            for name, p in parts.items() if sum(n for n, _ in p[::2])]  # tasks without statistics: not counted


def eval_cost(suite: Any, n_rows: int, shards: Mapping[str, Sequence[str]] | None, shape: EncoderShape,
              rates: Rates | None = None, layouts: Mapping[str, Layout | None] | None = None) -> StageCost:
    """Every row evaluates the whole suite once: one job per (row, shard) in the eval stage's order (rows outer),
    or (`shards` None) inside each training job, where the time per row goes into the training job's. `layouts`
    (row -> its MaxSim layout, None for a single-vector row; in the rows' order) adds each MaxSim row's index and
    search to its jobs and the stage's notes."""
    tokens = flops = 0.0
    missing: list[str] = []
    task_s: dict[str, float] = {}
    task_parts: dict[str, list[tuple[float, float]]] = {}
    # fast path: mteb (its task statistics; datasets and torch with it) loads only when a suite is costed
    import mteb

    for name in suite.tasks:
        if name in LOCAL_TASK_NAMES:  # the local tasks' declared names (lmk.eval.tasks registers none other)
            continue
        opts = suite.task_options.get(name, {})
        task = mteb.get_task(name, eval_splits=opts.get("eval_splits"), hf_subsets=opts.get("hf_subsets"),
                             languages=opts.get("languages"))
        parts = task_tokens(task, suite.query_max_length, suite.passage_max_length)
        task_parts[name] = parts
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
    rows = dict(layouts) if layouts is not None else {f"row {i}": None for i in range(n_rows)}
    search = _maxsim(cost, suite, task_parts, task_s, rows, rates)  # row -> shard -> its MaxSim search seconds
    if shards is None:  # the training jobs run it: its time is theirs (lmk.sweep.cost.estimate adds it)
        cost.job_wall_s = shard_s[IN_TRAINING] + max((sum(s.values()) for s in search.values()), default=0.0)
        notes.append(f"inside each training job: {hours(cost.job_wall_s)} per row, counted in its wall time")
        return cost
    overhead = rates.job_overhead_s
    cost.durations = [shard_s[s] + search.get(row, {}).get(s, 0.0) + overhead for row in rows for s in plan]
    cost.device_s = sum(cost.durations)
    slowest = max(range(len(cost.durations)), key=cost.durations.__getitem__)
    cost.longest = list(plan)[slowest % len(plan)]
    cost.job_wall_s = cost.durations[slowest]
    if search:  # the shard's tasks with the slowest row's MaxSim search: what a time limit is checked against
        row = list(rows)[slowest // len(plan)]
        by_task = {i.task: i.search_s for i in cost.maxsim.get(row, [])}
        cost.shards = {**cost.shards, cost.longest: [(t, sec + by_task.get(t, 0.0)) for t, sec in cost.shards[cost.longest]]}
    return cost


def _maxsim(cost: StageCost, suite: Any, parts: Mapping[str, Sequence[tuple[float, float]]],
            task_s: Mapping[str, float], rows: Mapping[str, Layout | None], rates: Rates) -> dict[str, dict[str, float]]:
    """Each MaxSim row's index and search per task (into `cost.maxsim` and the notes); returns row -> shard -> its
    search seconds."""
    by_layout: dict[Layout, list[TaskIndex]] = {}
    search: dict[str, dict[str, float]] = {}
    for row, layout in rows.items():
        if layout is None:
            continue
        if layout not in by_layout:  # rows of one layout share their index and search
            by_layout[layout] = maxsim_indexes(suite, parts, task_s, layout, rates)
        cost.maxsim[row] = indexes = by_layout[layout]
        by_task = {i.task: i.search_s for i in indexes}
        search[row] = {s: sum(by_task.get(t, 0.0) for t, _ in tasks) for s, tasks in cost.shards.items()}
    for layout, indexes in by_layout.items():
        names = ", ".join(r for r, lay in rows.items() if lay == layout)
        cost.notes.append(f"MaxSim index and search of {names} ({layout.describe()}), per task: documents x landmark "
                          f"vectors = bytes per document, per task; queries x vectors; exact search FLOPs and time "
                          f"beside the encode time (the same forward as a single-vector row)")
        cost.notes += [f"  {i.line()}" for i in indexes]
        total = sum(i.index_bytes for i in indexes)
        compressed = sum(compressed_index_bytes(i, layout) for i in indexes)
        cost.notes.append(f"  all tasks: index {total / 1e9:.1f} GB, search {hours(sum(i.search_s for i in indexes))} "
                          f"per row; compressed ({layout.bits}-bit residual codes + centroid ids, "
                          f"eval.scoring=maxsim-compressed): {compressed / 1e9:.1f} GB ({total / compressed:.1f}x less)")
        # every width beside it: the choice is size against fidelity (docs/method.md section 4 measures the latter)
        widths = ", ".join(f"{b}-bit {sum(compressed_index_bytes(i, replace(layout, bits=b)) for i in indexes) / 1e9:.1f}"
                           f" GB" for b in BITS)
        cost.notes.append(f"  compressed at each eval.maxsim_bits: {widths}")
    return search
