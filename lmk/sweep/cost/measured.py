"""Each training row's GPU-hours padded (the stage table's figure) and at its texts' token lengths by path
(`paths.py`), with where the lengths come from (`lengths.py`): the per-row block of the dry run's estimate."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lmk.model.landmark.names import STRATEGY_TRAITS
from lmk.model.shape import EncoderShape
from lmk.sweep.cost.lengths import Lengths, job_lengths
from lmk.sweep.cost.paths import PATHS, job_path, maxsim_flops, objective, step_flops, token_budget
from lmk.sweep.cost.throughput import Rates
from lmk.train.memory import decide_checkpointing, job_lora

TARGET_GPU_HOURS = 300.0  # the paper sweep's training budget the figures are read against


@dataclass
class RowHours:
    """One training row's device-hours per path; `path` is the one its job takes."""

    row: str
    objective: str
    hours: dict[str, float]
    path: str
    lengths: Lengths | None
    why: str = ""  # why a source was not measured (its profile stands in), or why no lengths at all
    maxsim_hours: float | None = None  # what the MaxSim objective's score matrix adds (a landmark row), any path


def row_hours(row: str, c: Mapping[str, Any], shape: EncoderShape, gpus: int, rates: Rates, padded_wall_s: float,
              eval_s: float = 0.0, cache_dir: Any = None) -> RowHours:
    """A row's GPU-hours: padded = the table's job (`padded_wall_s` on `gpus`), the other paths = its steps at
    the simulated FLOPs per device step over the training rate, plus the job's fixed cost and evaluation."""
    lengths, why = job_lengths(c, cache_dir)
    padded = padded_wall_s * gpus / 3600.0
    if lengths is None:
        return RowHours(row, objective(c), {"padded": padded}, job_path(c), None, why)
    ckpt, cache, lora = decide_checkpointing(c).on, bool((c.get("train") or {}).get("grad_cache")), job_lora(c)

    def per_token(n: float) -> float:
        return shape.train_flops_per_token(n, ckpt, cache, lora)

    steps = int((c.get("trainer") or {}).get("max_steps") or 0)
    flops = step_flops(c, shape, per_token, lengths.queries, lengths.passages, gpus)
    hours = {p: (steps * flops[p] / rates.train.flops_per_s + rates.job_overhead_s + eval_s) * gpus / 3600.0
             for p in PATHS}
    hours["padded"] = padded  # the table's own figure (its time-limit verdict included)
    extra = None
    if STRATEGY_TRAITS.get(str((c.get("pooling") or {}).get("strategy")), {}).get("marks_pooled"):
        score = maxsim_flops(c, lengths.queries, lengths.passages, gpus, shape.hidden)
        extra = steps * score / rates.train.flops_per_s * gpus / 3600.0
    return RowHours(row, objective(c), hours, job_path(c), lengths, why, extra)


def _cell(r: RowHours, path: str) -> str:
    if path not in r.hours:
        return f"{'-':>8}"
    return f"{r.hours[path]:>7.1f}" + ("*" if path == r.path else " ")


def format_rows(rows: Sequence[RowHours], c: Mapping[str, Any], unit: str = "GPU-hours") -> list[str]:
    """The per-row block: padded and measured-length figures per row and in total, the lengths' source, what
    is left above TARGET_GPU_HOURS and why."""
    if not rows:
        return []
    data, train = c.get("data") or {}, c.get("train") or {}
    chunk = (f"mini-batches of {token_budget(c)} tokens" if token_budget(c) else
             f"grad cache's chunks of {train.get('grad_cache_chunk')} rows" if train.get("grad_cache") else
             "the batch as one mini-batch")
    out = [f"training {unit} per row: padded = every text at {data.get('query_max_length')}/"
           f"{data.get('passage_max_length')} tokens (the table's figure); at the texts' token lengths: batch = each "
           f"device batch padded to its longest text (the collator today), sorted = the batch sorted by length into "
           f"{chunk}, each padded to its longest, packed = real tokens only (a varlen kernel on CUDA); "
           f"* = the job's path",
           f"  {'row':<18} {'objective':<9} {'padded':>8} {'batch':>8} {'sorted':>8} {'packed':>8}  lengths"]
    for r in rows:
        kind = r.lengths.kind if r.lengths is not None else "none (padded only)"
        out.append(f"  {r.row:<18} {r.objective:<9} " + " ".join(_cell(r, p) for p in PATHS) + f"  {kind}")
    totals = {p: sum(r.hours[p] for r in rows) for p in PATHS if all(p in r.hours for r in rows)}
    out.append(f"  {'total':<18} {'':<9} " + " ".join(f"{totals[p]:>7.1f} " if p in totals else f"{'-':>8}"
                                                      for p in PATHS))
    out += _lengths_lines(rows)
    out += _objective_lines(rows)
    if totals:
        out.append(_verdict(totals, rows))
    return out


def _lengths_lines(rows: Sequence[RowHours]) -> list[str]:
    """Where the lengths come from (once per source), then each layout's figures (rows of one layout together)."""
    sources: dict[str, dict[str, list[str]]] = {}
    for r in rows:
        where = (r.lengths.source + (f"; {r.why}" if r.why else "")
                 if r.lengths is not None else f"none: {r.why}")
        stats = r.lengths.stats() if r.lengths is not None else "padded only"
        sources.setdefault(where, {}).setdefault(stats, []).append(r.row)
    out = []
    for where, by_stats in sources.items():
        out.append(f"  lengths ({where}):")
        out += [f"    {', '.join(names)}: {stats}" for stats, names in by_stats.items()]
    return out


def _objective_lines(rows: Sequence[RowHours]) -> list[str]:
    """GPU-hours per objective where rows differ; else the one objective, and what MaxSim's scores would add."""
    by = sorted({r.objective for r in rows})
    if len(by) < 2:
        extra = [r.maxsim_hours for r in rows if r.maxsim_hours is not None]
        span = f"{min(extra):.2g}" + (f"-{max(extra):.2g}" if extra and max(extra) > min(extra) else "") if extra else ""
        adds = (f" (objective maxsim would add its query x passage landmark score matrix to the same forward and "
                f"backward: {span} GPU-hours per landmark row)" if by == ["single"] and extra
                else " (its score matrix included in each path)" if by != ["single"] else "")
        return [f"  objective: {by[0]} for every row{adds}"]
    return [f"  objective {o}: " + ", ".join(f"{p} {sum(r.hours.get(p, 0.0) for r in rows if r.objective == o):.1f}"
                                             for p in PATHS) for o in by]


WHY_ABOVE = {"padded": "every text padded to its max length",
             "batch": "each device batch is padded to its longest text, several times the mean",
             "sorted": "the padding left inside each sorted mini-batch",
             "packed": "the real tokens themselves"}


def _verdict(totals: Mapping[str, float], rows: Sequence[RowHours]) -> str:
    """The job's path against TARGET_GPU_HOURS: within it, or what is left above and why, and which paths fit."""
    path = rows[0].path
    here = totals.get(path, totals["padded"])
    fits = ", ".join(f"{p} {totals[p]:.1f}" for p in PATHS if totals.get(p, float("inf")) <= TARGET_GPU_HOURS)
    same = "the same steps, batch, max lengths and loss: the paper's numbers unchanged"
    if here <= TARGET_GPU_HOURS:
        return f"  the job's path ({path}) totals {here:.1f}, within {TARGET_GPU_HOURS:.0f} GPU-hours ({same})"
    return (f"  the job's path ({path}) totals {here:.1f}: {here - TARGET_GPU_HOURS:.1f} above "
            f"{TARGET_GPU_HOURS:.0f} GPU-hours ({WHY_ABOVE[path]}); within it: {fits or 'no path'} ({same})")
