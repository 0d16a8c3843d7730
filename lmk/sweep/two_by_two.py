"""The (trained for, scored by) 2x2 of a table's landmark rows: one vector or MaxSim in training (`train.objective`),
one vector or MaxSim at evaluation (`eval.scoring`), four cells per model configuration.

The spec says it: a trained row's objective is its `train.objective=` override (the schema's default without one), a
row's scoring its `eval.scoring=` override (or that of the row it is `scoring_of`); rows whose trained overrides are
equal once those two settings are left out are one configuration. A configuration with all four cells finished is
shown, its cells read from the table already built (so the values and their marks are the table's own).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

from lmk.config import EvalConfig, TrainSection
from lmk.sweep.spec import Row, TableSpec

OBJECTIVE_KEY, SCORING_KEY = "train.objective", "eval.scoring"


def _default(cls: type, name: str) -> str:
    return str(next(f.default for f in fields(cls) if f.name == name))


def _setting(overrides: Sequence[str], key: str) -> str | None:
    for o in overrides:
        k, _, value = o.lstrip("+~").partition("=")
        if k == key:
            return value
    return None


@dataclass(frozen=True)
class Quad:
    """One model configuration's four rows: {(objective, scoring): row id}, labelled by its first row's label."""

    label: str
    cells: dict[tuple[str, str], str]


def quads(spec: TableSpec, rows: Sequence[Row] | None = None) -> list[Quad]:
    """The configurations of `rows` (default: the spec's) that have a row for each (objective, scoring) pair of the
    two values the rows use, in row order; a configuration with fewer rows is not a 2x2."""
    rows = list(spec.rows if rows is None else rows)
    by_id = {r.id: r for r in rows}
    objective0, scoring0 = _default(TrainSection, "objective"), _default(EvalConfig, "scoring")
    groups: dict[tuple[str, ...], dict[tuple[str, str], str]] = {}
    labels: dict[tuple[str, ...], str] = {}
    for row in rows:
        trained = by_id.get(row.scoring_of) if row.scoring_of else row
        if trained is None:
            continue
        key = tuple(o for o in trained.overrides if not o.lstrip("+~").startswith(("train.objective=", "eval.")))
        objective = _setting(trained.overrides, OBJECTIVE_KEY) or objective0
        scoring = _setting(row.overrides, SCORING_KEY) or _setting(trained.overrides, SCORING_KEY) or scoring0
        groups.setdefault(key, {}).setdefault((objective, scoring), row.id)
        labels.setdefault(key, trained.label)
    out = []
    for key, cells in groups.items():
        objectives = sorted({o for o, _ in cells}, key=lambda o: o != objective0)
        scorings = sorted({s for _, s in cells}, key=lambda s: s != scoring0)
        if len(objectives) == 2 and len(scorings) == 2 and len(cells) == 4:
            out.append(Quad(labels[key], cells))
    return out


def axes(quad: Quad) -> tuple[list[str], list[str]]:
    """(objectives, scorings) of a quad, each the schema's default first."""
    objective0, scoring0 = _default(TrainSection, "objective"), _default(EvalConfig, "scoring")
    objectives = sorted({o for o, _ in quad.cells}, key=lambda o: o != objective0)
    scorings = sorted({s for _, s in quad.cells}, key=lambda s: s != scoring0)
    return objectives, scorings


def markdown(quad_list: Sequence[Quad], block: dict[str, dict], column_keys: Sequence[tuple[str, str]],
             fmt: Callable[[object], str]) -> list[str]:
    """Markdown lines of the 2x2s of the fine-tuned block (`block`: row id -> column key -> Cell, as the table built
    them): one table per average column (long first), a row per configuration, a column per (trained, scored) cell
    as `fmt` prints a cell, for the configurations whose four cells are finished (nothing when none is)."""
    averages = sorted([(k, label) for k, label in column_keys if k.startswith("avg-")], key=lambda kl: kl[0] != "avg-long")
    lines = []
    for key, label in averages:
        shown = [q for q in quad_list if all(getattr(block.get(r, {}).get(key), "value", None) is not None
                                             for r in q.cells.values())]  # all four cells finished
        if not shown:
            continue
        objectives, scorings = axes(shown[0])
        pairs = [(o, s) for o in objectives for s in scorings]
        lines += [f"*trained for x scored by: {label}* (the rows above, regrouped: `train.objective` x `eval.scoring`)",
                  "", "| Pooling | " + " | ".join(f"trained `{o}`, scored `{s}`" for o, s in pairs) + " |",
                  "|---|" + "---:|" * len(pairs)]
        for quad in shown:
            lines.append(f"| {quad.label} | " + " | ".join(fmt(block[quad.cells[p]].get(key)) if p in quad.cells else "-"
                                                        for p in pairs) + " |")
        lines.append("")
    return lines
