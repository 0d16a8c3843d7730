"""Pinned tables: the numbers each scale of a table is known to give, so that none moves unseen.

`experiments/<table>/pinned.json` holds, per scale, each row's cells as the table prints them (and, where they
were measured with it, the two-decimal values of `table2.json`). The tests compare fresh sweeps with it (the tiny
table in `make test`, the mini rows and the rehearsal row in the slow suite), and the README's and
`docs/results.md`'s tables are checked against it, so the three read one source. A commit that moves a number
updates the file (`python -m lmk.sweep.pinned update ...`) and adds a line to the results history in
`docs/results.md` naming the pinned file's new fingerprint: what moved and why.

    python -m lmk.sweep.pinned check  experiments/table2/spec.yaml --scale tiny --out outputs/table2/tiny
    python -m lmk.sweep.pinned update experiments/table2/spec.yaml --scale tiny --out outputs/table2/tiny
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmk.sweep.spec import load_spec

PINNED_FILE = "pinned.json"
RESULTS_DOC = "docs/results.md"
HISTORY_HEADING = "## Results history"
BLOCK = "train"  # the fine-tuned block: the one the README and the paper show


@dataclass(frozen=True)
class Drift:
    """One cell that differs from its pinned value."""

    row: str
    column: str
    pinned: str | None
    measured: str | None

    def __str__(self) -> str:
        return f"{self.row} / {self.column}: pinned {self.pinned or '(none)'}, now {self.measured or '(none)'}"


def pinned_path(spec_path: str | Path) -> Path:
    """The pinned numbers of a table spec: `pinned.json` beside it."""
    return Path(spec_path).with_name(PINNED_FILE)


def load_pinned(spec_path: str | Path) -> dict[str, Any]:
    path = pinned_path(spec_path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: `python -m lmk.sweep.pinned update {spec_path} --scale S --out D`"
                                " writes it from a finished sweep")
    return json.loads(path.read_text(encoding="utf-8"))


def fingerprint(spec_path: str | Path) -> str:
    """12 hex digits over the pinned numbers (key order and whitespace do not count)."""
    data = load_pinned(spec_path)
    data.pop("_about", None)
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


def measured_rows(table_json: dict[str, Any], block: str = BLOCK) -> dict[str, dict[str, Any]]:
    """A sweep's `table2.json` as pinned rows: row id -> {label, cells: {column label: shown}, values}."""
    rows: dict[str, dict[str, Any]] = {}
    for rec in table_json["cells"]:
        if rec["block"] != block:
            continue
        row = rows.setdefault(rec["row"], {"label": rec["label"], "cells": {}, "values": {}})
        row["cells"][rec["column_label"]] = rec["shown"]
        row["values"][rec["column_label"]] = rec["value"]
    return rows


def compare(pinned: dict[str, dict[str, Any]], measured: dict[str, dict[str, Any]],
            rows: list[str] | None = None) -> list[Drift]:
    """Every cell of the pinned rows (or of `rows` only) that the measured table prints differently, or whose
    two-decimal value differs where one is pinned."""
    drifts = []
    for row in rows if rows is not None else sorted(set(pinned) | set(measured)):
        want, got = pinned.get(row, {}), measured.get(row, {})
        for column in sorted(set(want.get("cells", {})) | set(got.get("cells", {}))):
            old, new = want.get("cells", {}).get(column), got.get("cells", {}).get(column)
            old_v, new_v = want.get("values", {}).get(column), got.get("values", {}).get(column)
            if old != new:
                drifts.append(Drift(row, column, old, new))
            elif old_v is not None and old_v != new_v:
                drifts.append(Drift(row, column, f"{old} ({old_v})", f"{new} ({new_v})"))
    return drifts


def drift_message(drifts: list[Drift], spec_path: str | Path, scale: str, out: str | Path = "<sweep folder>") -> str:
    lines = [f"{len(drifts)} pinned number(s) of {Path(spec_path).parent.name} at scale {scale!r} moved:",
             *(f"  {d}" for d in drifts),
             f"If the change is intended: python -m lmk.sweep.pinned update {spec_path} --scale {scale} --out {out}",
             f"(rewrites {pinned_path(spec_path)}), then add a line under '{HISTORY_HEADING}' in {RESULTS_DOC}:",
             "the commit, what moved and why, with the fingerprint the update prints."]
    return "\n".join(lines)


def markdown_rows(text: str, header_start: str) -> dict[str, dict[str, str]]:
    """The Markdown table whose header line starts with `header_start`: row label -> {column label: cell},
    bold marks removed (the table's best-per-column mark is not a number)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(header_start)), None)
    if start is None:
        raise ValueError(f"no Markdown table whose header starts with {header_start!r}")
    header = [c.strip() for c in lines[start].strip().strip("|").split("|")]
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip().replace("**", "") for c in line.strip().strip("|").split("|")]
        rows[cells[0]] = dict(zip(header[1:], cells[1:], strict=True))
    return rows


def compare_markdown(pinned: dict[str, dict[str, Any]], shown: dict[str, dict[str, str]]) -> list[Drift]:
    """A printed Markdown table (by row label) against the pinned rows."""
    drifts = []
    for row, want in pinned.items():
        got = shown.get(want["label"], {})
        for column, value in want["cells"].items():
            if got.get(column) != value:
                drifts.append(Drift(row, column, value, got.get(column)))
    for label in set(shown) - {want["label"] for want in pinned.values()}:
        drifts.append(Drift(label, "*", None, "a row that is not pinned"))
    return drifts


def history_names(spec_path: str | Path, results_doc: str | Path) -> bool:
    """Whether the results history of `results_doc` names the pinned file's current fingerprint."""
    text = Path(results_doc).read_text(encoding="utf-8")
    _, _, history = text.partition(HISTORY_HEADING)
    return bool(history) and f"`{fingerprint(spec_path)}`" in history


def update(spec_path: str | Path, scale: str, table_json: dict[str, Any]) -> str:
    """Pin the measured rows of one scale; returns the new fingerprint."""
    path = pinned_path(spec_path)
    data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    data[scale] = measured_rows(table_json)
    path.write_text(json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    return fingerprint(spec_path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lmk.sweep.pinned", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["check", "update"])
    parser.add_argument("spec")
    parser.add_argument("--scale", required=True)
    parser.add_argument("--out", required=True, help="the sweep folder (holds table2.json)")
    args = parser.parse_args(argv)
    table_file = Path(args.out) / f"{load_spec(args.spec).name}.json"  # the name aggregate() writes under
    if not table_file.is_file():
        print(f"no {table_file}: run `make reproduce-table2 SCALE={args.scale} OUT=...` first", file=sys.stderr)
        return 2
    table = json.loads(table_file.read_text(encoding="utf-8"))
    if args.action == "update":
        print(f"pinned {args.scale} in {pinned_path(args.spec)}; fingerprint {update(args.spec, args.scale, table)}:"
              f" add a line naming it under '{HISTORY_HEADING}' in {RESULTS_DOC}")
        return 0
    drifts = compare(load_pinned(args.spec).get(args.scale, {}), measured_rows(table))
    if drifts:
        print(drift_message(drifts, args.spec, args.scale, args.out), file=sys.stderr)
        return 1
    print(f"{args.scale}: every pinned number of {table_file} is unchanged")
    return 0


if __name__ == "__main__":
    sys.exit(main())

