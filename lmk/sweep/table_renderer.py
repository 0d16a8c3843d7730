"""Build a paper table from run folders' `results.json` (and W&B when online).

`python -m lmk.tables experiments/table2/spec.yaml --scale mini --out outputs/table2/mini`
writes table2.{md,tex,csv,json,png} into the sweep folder and prints the Markdown. Every cell keeps
its provenance (run folder, git commit, config hash); with per-query scores present, cells that differ
significantly from the baseline row (paired t-test) are marked. A row run with several seeds
(`lmk.sweep --seeds`) shows mean +- std over seeds, and is also tested over seeds (paired by seed).
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from statistics import stdev
from typing import Any

import wandb
from scipy.stats import ttest_rel

from lmk.config.schema import UserError
from lmk.run.results import STATUS_DONE, Results
from lmk.run.umask_files import write_json
from lmk.sweep.collapse import collapse_notes, collapsed_columns
from lmk.sweep.provenance import provenance_lines
from lmk.sweep.spec import RESCORE, Column, Row, TableSpec, load_spec
from lmk.sweep.table_plot import plot_averages
from lmk.sweep.two_by_two import Quad, markdown, quads

log = logging.getLogger(__name__)
BLOCKS = ("train", "zeroshot")  # sub-folders of a sweep folder: fine-tuned rows, untrained rows
BLOCK_TITLES = {"train": "fine-tuned", "zeroshot": "zero-shot (untrained encoder)"}
SIG_MARK, SEED_MARK = "\u2020", "\u2021"  # dagger: over queries; double dagger: over seeds


class MixedResultsError(UserError, ValueError):
    """Two results files claim one row with different configs."""


class NoResultsError(UserError, FileNotFoundError):
    """A sweep folder without any results.json (the sweep has not run there)."""


@dataclass
class RunRecord:
    row: str
    run_dir: Path
    config_hash: str | None
    git_commit: str | None
    status: str
    groups: dict[str, float]
    per_query: dict[str, Any] | None = None
    group_tasks: dict[str, list[str]] = field(default_factory=dict)
    seed: int | None = None
    # seed -> group scores of each finished seed run (several only for a row run with --seeds)
    seed_groups: dict[int, dict[str, float]] = field(default_factory=dict)
    landmarks: dict[str, Any] = field(default_factory=dict)  # task -> its eval landmark statistics per split
    index: dict[str, Any] = field(default_factory=dict)  # task -> its MaxSim index (documents, vectors, bytes)


@dataclass
class Cell:
    value: float | None
    run_dir: str | None = None
    git_commit: str | None = None
    config_hash: str | None = None
    p_value: float | None = None
    significant: bool = False
    best: bool = False
    std: float | None = None  # over seeds (None with a single seed)
    n_seeds: int = 1
    p_value_seeds: float | None = None
    significant_seeds: bool = False


@dataclass
class Table:
    title: str
    columns: list[Column]
    # block -> row id -> column key -> Cell (column keys: groups + "avg-short", "avg-long", "avg")
    blocks: dict[str, dict[str, dict[str, Cell]]]
    labels: dict[str, str]
    baseline: str
    alpha: float
    notes: list[str] = field(default_factory=list)  # rows whose evaluation collapses (lmk.sweep.collapse)
    # block -> row id -> its index per document as printed (MaxSim rows: landmark vectors and bytes per document)
    index: dict[str, dict[str, str]] = field(default_factory=dict)
    quads: list[Quad] = field(default_factory=list)  # the (trained for, scored by) 2x2s among the rows

    def index_cell(self, block: str, row: str) -> str:
        return self.index.get(block, {}).get(row, "-")

    def column_keys(self) -> list[tuple[str, str]]:
        keys = [(c.group, c.label) for c in self.columns]
        contexts = {c.context for c in self.columns if c.average}
        for ctx in ("short", "long"):
            if ctx in contexts:
                keys.append((f"avg-{ctx}", f"Avg {ctx}"))
        if len(contexts) > 1:
            keys.append(("avg", "Avg"))
        return keys


def collect_runs(folder: Path) -> dict[str, RunRecord]:
    """Every row's run under `folder` (recursively), its seeds merged. Refuses two configs for one row and seed."""
    records: dict[tuple[str, Any], RunRecord] = {}
    for path in sorted(folder.rglob("results.json")):
        results = Results.read(path.parent)
        row = results.row_id
        if row is None:
            continue
        ev = results.eval
        per_query = None
        if ev.per_query:
            pq_path = path.parent / ev.per_query
            if pq_path.exists():
                per_query = json.loads(pq_path.read_text())
        rec = RunRecord(row=row, run_dir=path.parent, config_hash=results.config_hash,
                        git_commit=results.git_commit, status=results.status or "unknown",
                        groups={k: float(v) for k, v in ev.groups.items() if v is not None},
                        per_query=per_query,
                        group_tasks=ev.group_tasks or results.section("eval").get("groups") or {},
                        seed=results.config.get("seed"),
                        landmarks={t: e["landmarks"] for t, e in ev.tasks.items() if e.get("landmarks")},
                        index={t: e["index"] for t, e in ev.tasks.items() if e.get("index")})
        key = (row, rec.seed)
        if key in records:
            other = records[key]
            if other.config_hash != rec.config_hash:
                raise MixedResultsError(
                    f"row {row!r} has results with two config hashes: {other.run_dir / 'results.json'} "
                    f"({other.config_hash}) and {path} ({rec.config_hash}); move one away or rerun with FORCE=1"
                )
            if other.status == STATUS_DONE and rec.status != STATUS_DONE:
                continue
        records[key] = rec
    by_row: dict[str, list[RunRecord]] = {}
    for (row, _), rec in sorted(records.items(), key=lambda kv: (kv[0][0], kv[0][1] is None, kv[0][1] or 0)):
        by_row.setdefault(row, []).append(rec)
    return {row: recs[0] if len(recs) == 1 else merge_seeds(recs) for row, recs in by_row.items()}


def merge_seeds(recs: list[RunRecord]) -> RunRecord:
    """One record for a row run with several seeds: group scores and per-query scores averaged over
    the finished seeds; each seed's scores kept for the std and the test over seeds."""
    done = [r for r in recs if r.status == STATUS_DONE]
    if not done:
        return recs[0]
    groups = {g: sum(r.groups[g] for r in done) / len(done) for g in done[0].groups if all(g in r.groups for r in done)}
    per_query = None
    if all(r.per_query for r in done):
        per_query = {}
        for task, splits in done[0].per_query.items():
            for split, scores in splits.items():
                common = [q for q in scores if all(q in ((r.per_query.get(task) or {}).get(split) or {}) for r in done)]
                per_query.setdefault(task, {})[split] = {
                    q: sum(float(r.per_query[task][split][q]) for r in done) / len(done) for q in common}
    first = done[0]
    return RunRecord(row=first.row, run_dir=first.run_dir.parent, config_hash=first.config_hash,
                     git_commit=first.git_commit, status=STATUS_DONE, groups=groups, per_query=per_query,
                     group_tasks=first.group_tasks, seed=None, landmarks=first.landmarks,
                     seed_groups={int(r.seed if r.seed is not None else i): r.groups for i, r in enumerate(done)})


def fetch_wandb_runs(project: str, group: str, entity: str | None = None) -> dict[str, RunRecord]:
    """Rows of a sweep from its W&B group (online only). Files on disk take precedence."""
    api = wandb.Api(timeout=20)
    path = f"{entity}/{project}" if entity else project
    records: dict[str, RunRecord] = {}
    for run in api.runs(path, filters={"group": group}):
        row = run.config.get("row")
        if not row:
            continue
        prefix = "eval/group/"
        groups = {k[len(prefix):]: float(v) for k, v in run.summary.items()
                  if k.startswith(prefix) and isinstance(v, (int, float))}
        records[row] = RunRecord(row=row, run_dir=Path(run.url), config_hash=run.config.get("config_hash"),
                                 git_commit=(run.commit if hasattr(run, "commit") else None),
                                 status=STATUS_DONE if run.state == "finished" else run.state, groups=groups)
    return records


def _per_query_vector(rec: RunRecord, group: str) -> dict[tuple[str, str, str], float]:
    if not rec.per_query:
        return {}
    tasks = rec.group_tasks.get(group)
    if tasks is None:  # which tasks make up the group is unknown: nothing to pair
        return {}
    return {(task, split, qid): float(score) for task, splits in rec.per_query.items() if task in tasks
            for split, scores in splits.items() for qid, score in scores.items()}


def paired_p_value(a: dict[Any, float], b: dict[Any, float]) -> float | None:
    """Paired t-test over the queries both runs scored; None when there is nothing to pair."""
    keys = sorted(set(a) & set(b))
    if len(keys) < 2:
        return None
    xs, ys = [a[k] for k in keys], [b[k] for k in keys]
    if all(x == y for x, y in zip(xs, ys)):
        return 1.0
    p = float(ttest_rel(xs, ys).pvalue)
    return None if math.isnan(p) else p


def _seed_vector(rec: RunRecord, groups: list[str]) -> dict[int, float]:
    """seed -> the mean of `groups` in that seed's run (seeds missing a group are left out)."""
    return {s: sum(g[k] for k in groups) / len(groups) for s, g in rec.seed_groups.items() if all(k in g for k in groups)}


def _seed_stats(cell: Cell, rec: RunRecord, base: RunRecord | None, groups: list[str], alpha: float,
                test: bool) -> None:
    """Fill the std over seeds and the paired test over seeds (seed k of the row vs seed k of the baseline)."""
    mine = _seed_vector(rec, groups)
    cell.n_seeds = max(len(mine), 1)
    if len(mine) >= 2:
        cell.std = stdev(mine.values())
    if test and base is not None:
        cell.p_value_seeds = paired_p_value(mine, _seed_vector(base, groups))
        cell.significant_seeds = cell.p_value_seeds is not None and cell.p_value_seeds < alpha


INDEX_LABEL = "Index / doc"


def index_size(rec: RunRecord, columns: list[Column]) -> str | None:
    """A MaxSim row's index per document over the tasks of `columns`: landmark vectors per document and their
    float32 KiB (None for a row without a recorded index, e.g. single-vector scoring, and for one whose index is
    known for only some of the tasks: a task scored from the eval cache encoded nothing, and an average over the
    others would not be this table's index)."""
    tasks = {t for c in columns for t in rec.group_tasks.get(c.group, [])}
    if any(t not in rec.index for t in tasks):
        return None
    entries = [rec.index[t] for t in sorted(tasks)]
    docs = sum(int(e["documents"]) for e in entries)
    if not docs:
        return None
    vectors = sum(int(e["vectors"]) for e in entries) / docs
    kib = sum(float(e["bytes_per_doc"]) * int(e["documents"]) for e in entries) / docs / 1024
    return f"{vectors:.1f} ({kib:.1f} KiB)"


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals and len(vals) == len(values) else None


def build_table(spec: TableSpec, scale_name: str, runs: dict[str, dict[str, RunRecord]],
                rows: list[Row] | None = None) -> Table:
    scale = spec.scale(scale_name)
    rows = rows if rows is not None else spec.rows_for(scale)
    blocks: dict[str, dict[str, dict[str, Cell]]] = {}
    collapsed: dict[str, dict[str, float]] = {}  # row label -> columns whose eval documents keep one landmark
    index: dict[str, dict[str, str]] = {}
    for block, records in runs.items():
        if not records:
            continue
        base = records.get(spec.baseline)
        table_rows: dict[str, dict[str, Cell]] = {}
        for row in rows:
            rec = records.get(row.id)
            if rec is None and block != BLOCKS[0]:
                continue  # a secondary block (zero-shot) runs a subset of rows; the main block shows gaps
            cells: dict[str, Cell] = {}
            if rec is not None and rec.status == STATUS_DONE:
                label = row.label if block == BLOCKS[0] else f"{row.label} ({block})"
                collapsed[label] = collapsed_columns(rec.landmarks, rec.group_tasks, scale.columns)
                size = index_size(rec, scale.columns)
                if size is not None:
                    index.setdefault(block, {})[row.id] = size
            for col in scale.columns:
                if rec is None or rec.status != STATUS_DONE:
                    # a failed row keeps its provenance: its results.json names the commit and config hash
                    cells[col.group] = Cell(None, str(rec.run_dir), rec.git_commit, rec.config_hash) if rec \
                        else Cell(None)
                    continue
                cell = Cell(rec.groups.get(col.group), str(rec.run_dir), rec.git_commit, rec.config_hash)
                test = base is not None and row.id != spec.baseline and base.status == STATUS_DONE
                if test:
                    p = paired_p_value(_per_query_vector(rec, col.group), _per_query_vector(base, col.group))
                    cell.p_value = p
                    cell.significant = p is not None and p < spec.alpha
                _seed_stats(cell, rec, base, [col.group], spec.alpha, test)
                cells[col.group] = cell
            prov = {k: getattr(cells[scale.columns[0].group], k) for k in ("run_dir", "git_commit", "config_hash")}
            averaged = [c for c in scale.columns if c.average]
            averages = {f"avg-{ctx}": [c.group for c in averaged if c.context == ctx] for ctx in ("short", "long")}
            averages["avg"] = [c.group for c in averaged]
            for key, groups in averages.items():
                if groups:
                    cells[key] = Cell(_mean([cells[g].value for g in groups]), **prov)
                    if rec is not None and rec.status == STATUS_DONE:
                        test = base is not None and row.id != spec.baseline and base.status == STATUS_DONE
                        _seed_stats(cells[key], rec, base, groups, spec.alpha, test)
            table_rows[row.id] = cells
        blocks[block] = table_rows
    table = Table(title=spec.title, columns=scale.columns, blocks=blocks,
                  labels={r.id: r.label for r in rows}, baseline=spec.baseline, alpha=spec.alpha,
                  notes=collapse_notes(collapsed), index=index, quads=quads(spec, rows))
    for block_rows in table.blocks.values():
        for key, _ in table.column_keys():
            # Compare the printed values (x100, 1 decimal): two cells that read the same are both bold.
            shown = {row: float(_shown(cells[key].value)) for row, cells in block_rows.items()
                     if cells.get(key) and cells[key].value is not None}
            if shown:
                top = max(shown.values())
                for row, value in shown.items():
                    block_rows[row][key].best = value == top
    return table


# -- rendering ------------------------------------------------------------------------------------
def _shown(value: float) -> str:
    return f"{100 * value:.1f}"


def _fmt(cell: Cell | None, bold: tuple[str, str], mark: bool = True) -> str:
    if cell is None or cell.value is None:
        return "-"
    text = _shown(cell.value)
    if cell.std is not None:
        text += f" \u00b1 {100 * cell.std:.1f}"
    if mark and cell.significant:
        text += SIG_MARK
    if mark and cell.significant_seeds:
        text += SEED_MARK
    return f"{bold[0]}{text}{bold[1]}" if cell.best else text


def short_commit(commit: str | None) -> str:
    """A commit as tables show it: 12 hex digits, keeping the `-dirty` mark of a run from an uncommitted tree."""
    if not commit:
        return "?"
    sha, dirty = (commit[:-6], True) if commit.endswith("-dirty") else (commit, False)
    return sha[:12] + ("-dirty" if dirty else "")


def table_commits(table: Table) -> list[str]:
    """The distinct commits (short form) the table's runs were made from, in row order."""
    seen: dict[str, None] = {}
    for rows in table.blocks.values():
        for cells in rows.values():
            cell = cells.get("avg") or next(iter(cells.values()), None)
            if cell is not None and cell.git_commit:
                seen.setdefault(short_commit(cell.git_commit), None)
    return list(seen)


def caption(table: Table) -> str:
    """One line naming the code the table's runs came from (`-dirty`: uncommitted changes)."""
    commits = table_commits(table)
    dirty = " (uncommitted changes: not reproducible from the commit alone)" if any(
        c.endswith("-dirty") for c in commits) else ""
    return f"Code: commit {', '.join(f'`{c}`' for c in commits) or '?'}{dirty}."


def to_markdown(table: Table) -> str:
    keys = table.column_keys()
    lines = [f"**{table.title}**", ""] if table.title else []
    for block, rows in table.blocks.items():
        lines.append(f"*{BLOCK_TITLES.get(block, block)}*")
        lines.append("")
        extra = [INDEX_LABEL] if table.index else []  # only a table with MaxSim rows has an index column
        lines.append("| Pooling | " + " | ".join([label for _, label in keys] + extra) + " |")
        lines.append("|---|" + "---:|" * (len(keys) + len(extra)))
        for row_id, cells in rows.items():
            vals = [_fmt(cells.get(k), ("**", "**")) for k, _ in keys]
            vals += [table.index_cell(block, row_id)] if extra else []
            lines.append(f"| {table.labels.get(row_id, row_id)} | " + " | ".join(vals) + " |")
        lines.append("")
    lines += markdown(table.quads, table.blocks.get(BLOCKS[0], {}), keys, lambda c: _fmt(c, ("", ""), mark=False))
    lines.append(f"Bold: best per column. {SIG_MARK}: differs from {table.baseline!r} "
                 f"(paired t-test over per-query scores, p < {table.alpha}). Scores x100.")
    seeds = max((c.n_seeds for rows in table.blocks.values() for cells in rows.values() for c in cells.values()),
                default=1)
    if seeds > 1:
        lines.append(f"Mean \u00b1 std over up to {seeds} seeds; {SEED_MARK}: differs from {table.baseline!r} "
                     f"over seeds (paired t-test, seed k vs seed k, p < {table.alpha}).")
    apart = [c.label for c in table.columns if not c.average]
    if apart:
        lines.append(f"Not in the averages: {', '.join(apart)} (added after the averages were pinned; spec: "
                     "`average: false`).")
    if table.index:
        lines.append(f"{INDEX_LABEL}: a MaxSim row's index, landmark vectors per document and their float32 KiB, "
                     "over the documents of the table's tasks (a single-vector row keeps one vector per document).")
    lines.extend(table.notes)
    lines.append(caption(table))
    lines.append("")
    lines.append("Provenance (row: run folder, git commit, config hash):")
    for block, rows in table.blocks.items():
        for row_id, cells in rows.items():
            cell = cells.get("avg")
            if cell and cell.run_dir:
                seeds = f" ({cell.n_seeds} seeds in seed*/)" if cell.n_seeds > 1 else ""
                lines.append(f"- {block}/{row_id}: `{cell.run_dir}` commit `{short_commit(cell.git_commit)}` "
                             f"hash `{cell.config_hash}`{seeds}")
    return "\n".join(lines) + "\n"


def to_latex(table: Table) -> str:
    keys = table.column_keys()
    extra = [INDEX_LABEL] if table.index else []
    out = ["\\begin{tabular}{l" + "r" * (len(keys) + len(extra)) + "}", "\\toprule",
           "Pooling & " + " & ".join([label for _, label in keys] + extra) + " \\\\"]
    for block, rows in table.blocks.items():
        out += ["\\midrule", f"\\multicolumn{{{len(keys) + len(extra) + 1}}}{{l}}{{\\emph{{{BLOCK_TITLES.get(block, block)}}}}} \\\\"]
        for row_id, cells in rows.items():
            vals = [_fmt(cells.get(k), ("\\textbf{", "}")).replace(SIG_MARK, "$^\\dagger$")
                    .replace(SEED_MARK, "$^\\ddagger$").replace("\u00b1", "$\\pm$") for k, _ in keys]
            vals += [table.index_cell(block, row_id)] if extra else []
            label = table.labels.get(row_id, row_id).replace("{", "\\{").replace("}", "\\}")
            out.append(f"{label} & " + " & ".join(vals) + " \\\\")
    out += ["\\bottomrule", "\\end{tabular}", f"% {caption(table).replace('`', '')}"]
    return "\n".join(out) + "\n"


def to_rows(table: Table) -> list[dict[str, Any]]:
    """Flat records (one per cell) with provenance: the CSV and JSON outputs."""
    records = []
    for block, rows in table.blocks.items():
        for row_id, cells in rows.items():
            for key, label in table.column_keys():
                cell = cells.get(key)
                if cell is None:
                    continue
                records.append({"block": block, "row": row_id, "label": table.labels.get(row_id, row_id),
                                "column": key, "column_label": label,
                                "value": None if cell.value is None else round(100 * cell.value, 2),
                                # the Markdown cell as printed (x100, one decimal, marks, no bold): readers show
                                # this, since rounding `value` again can differ (33.449 -> 33.45 -> 33.5)
                                "shown": _fmt(cell, ("", "")),
                                "best": cell.best, "significant": cell.significant, "p_value": cell.p_value,
                                "run_dir": cell.run_dir, "git_commit": cell.git_commit,
                                "config_hash": cell.config_hash, "n_seeds": cell.n_seeds,
                                "std": None if cell.std is None else round(100 * cell.std, 2),
                                "p_value_seeds": cell.p_value_seeds, "significant_seeds": cell.significant_seeds})
            if row_id in table.index.get(block, {}):
                records.append({"block": block, "row": row_id, "label": table.labels.get(row_id, row_id),
                                "column": "index", "column_label": INDEX_LABEL, "value": None,
                                "shown": table.index[block][row_id]})
    return records


def aggregate(spec_path: str | Path, scale: str, out: str | Path, with_optional: bool | None = None,
              wandb_group: str | None = None, wandb_project: str | None = None) -> tuple[Table, dict[str, Path]]:
    """Collect the sweep folder's runs, build the table, write every format; returns the file paths."""
    spec = load_spec(spec_path)
    out = Path(out)
    runs = {block: collect_runs(out / block) if (out / block).exists() else {} for block in BLOCKS}
    if (out / RESCORE).exists():  # rows scored from a trained row's model (scoring_of): fine-tuned rows too
        runs[BLOCKS[0]].update(collect_runs(out / RESCORE))
    if wandb_group and wandb_project and os.environ.get("WANDB_API_KEY") and \
            os.environ.get("WANDB_MODE", "online") not in ("offline", "disabled"):
        try:
            for row, rec in fetch_wandb_runs(wandb_project, wandb_group).items():
                runs["train"].setdefault(row, rec)
        except Exception as exc:  # W&B is a bonus source: never fail the table on it
            log.warning("could not read W&B group %s: %s", wandb_group, exc)
    if not any(runs.values()):
        raise NoResultsError(f"no results.json under {out}; run `make reproduce-table2 SCALE={scale}` first")
    table = build_table(spec, scale, runs, spec.rows_for(spec.scale(scale), with_optional))
    stem = out / spec.name
    paths = {"md": stem.with_suffix(".md"), "tex": stem.with_suffix(".tex"), "csv": stem.with_suffix(".csv"),
             "json": stem.with_suffix(".json"), "png": stem.with_suffix(".png")}
    provenance = provenance_lines(out)  # the lock and data fingerprints the rows were computed with
    paths["md"].write_text(to_markdown(table) + "".join(f"{line}\n" for line in provenance))
    paths["tex"].write_text(to_latex(table))
    records = to_rows(table)
    with open(paths["csv"], "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(records[0]) if records else ["row"])
        writer.writeheader()
        writer.writerows(records)
    write_json(paths["json"], {"spec": str(spec_path), "scale": scale, "cells": records, "notes": table.notes,
                               "provenance": provenance})
    plot_averages(table, paths["png"], BLOCK_TITLES, caption(table))
    return table, paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lmk.tables", description=__doc__.splitlines()[0])
    parser.add_argument("spec")
    parser.add_argument("--scale", default="mini")
    parser.add_argument("--out", required=True, help="the sweep folder (holds train/ and zeroshot/)")
    parser.add_argument("--with-optional", action="store_true", default=None)
    parser.add_argument("--wandb-project")
    parser.add_argument("--wandb-group")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    table, paths = aggregate(args.spec, args.scale, args.out, args.with_optional,
                             args.wandb_group, args.wandb_project)
    print(paths["md"].read_text())
    print(f"table written to {paths['md']} (also .tex, .csv, .json, .png)")


if __name__ == "__main__":
    main()
