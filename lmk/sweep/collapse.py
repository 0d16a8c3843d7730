"""Rows whose evaluation collapses: in a column, most eval documents keep a single landmark, so the row's landmark
pooling reads one vector per document there (what CLS-like pooling does), not what its name says. The table's
notes name each such row and column, from the landmark statistics each task recorded in results.json
(`eval.tasks.<task>.landmarks.<split>.passage`, lmk.data.landmarks).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

COLLAPSE_SHARE = 0.5  # a column collapses for a row when at least this share of its eval documents has one landmark
SIDE = "passage"  # the documents: queries are short and hold one landmark by design


def single_share(landmarks: Mapping[str, Any], tasks: Sequence[str]) -> float | None:
    """The share of `tasks`' eval documents (every split, weighted by its texts) with a single landmark; None where
    no task recorded one (a strategy without landmarks, or results from before the statistics)."""
    texts = single = 0.0
    for task in tasks:
        for split in (landmarks.get(task) or {}).values():
            figures = split.get(SIDE) or {}
            if figures.get("single_landmark_share") is None:
                continue
            texts += figures["texts"]
            single += figures["single_landmark_share"] * figures["texts"]
    return single / texts if texts else None


def collapsed_columns(landmarks: Mapping[str, Any], group_tasks: Mapping[str, Sequence[str]],
                      columns: Sequence[Any]) -> dict[str, float]:
    """Column label -> single-landmark share, for the `columns` (with `.group`, `.label`) that collapse."""
    out = {}
    for col in columns:
        share = single_share(landmarks, group_tasks.get(col.group, ()))
        if share is not None and share >= COLLAPSE_SHARE:
            out[col.label] = share
    return out


def collapse_notes(collapsed: Mapping[str, Mapping[str, float]]) -> list[str]:
    """The table's note lines for {row label: collapsed columns}; none when no row collapses."""
    marked = {row: cols for row, cols in collapsed.items() if cols}
    if not marked:
        return []
    rows = "; ".join(f"{row}: " + ", ".join(f"{col} {100 * share:.0f}%" for col, share in cols.items())
                     for row, cols in marked.items())
    return [f"Collapsed evaluation (at least {100 * COLLAPSE_SHARE:.0f}% of a column's eval documents keep a single "
            f"landmark, so the row pools one landmark per document there): {rows}."]
