"""Pinned numbers: the README's and docs/results.md's tables read the pinned file, a moved number is named with its
old and new value and the file to update, and the results history names the pinned file's fingerprint. The fresh
sweeps are compared in test_commands.py (tiny), test_sweep.py (mini rows) and test_rehearsal.py (rehearsal row)."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import forked_cli
import pytest

from lmk.sweep import pinned

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "experiments" / "table2" / "spec.yaml"
MINI_HEADER = "| Pooling (fine-tuned) |"
REHEARSAL_HEADER = "| Pooling | MS MARCO dev |"


@pytest.fixture(scope="module")
def pins() -> dict:
    return pinned.load_pinned(SPEC)


def test_the_readme_table_is_the_pinned_mini_table(pins):
    shown = pinned.markdown_rows((ROOT / "README.md").read_text(encoding="utf-8"), MINI_HEADER)
    assert pinned.compare_markdown(pins["mini"], shown) == []


@pytest.mark.parametrize(("scale", "header"), [("mini", MINI_HEADER), ("rehearsal", REHEARSAL_HEADER)])
def test_the_results_page_shows_the_pinned_tables(pins, scale, header):
    shown = pinned.markdown_rows((ROOT / pinned.RESULTS_DOC).read_text(encoding="utf-8"), header)
    assert pinned.compare_markdown(pins[scale], shown) == []


def test_every_scale_of_the_spec_but_paper_is_pinned_with_every_row(pins):
    import yaml

    spec = yaml.safe_load(SPEC.read_text())
    required = [r["id"] for r in spec["rows"] if not r.get("optional")]
    trained = [r["id"] for r in spec["rows"] if not r.get("optional") and not r.get("scoring_of")]
    assert sorted(pins["tiny"]) == sorted(required)
    # the MaxSim rows (scoring_of) came later: at mini and rehearsal every trained row is pinned, a MaxSim row once
    # it has been measured there
    for scale in ("mini", "rehearsal"):
        assert set(trained) <= set(pins[scale]) <= set(required), scale


def test_the_results_history_names_the_pinned_fingerprint():
    assert pinned.history_names(SPEC, ROOT / pinned.RESULTS_DOC), (
        f"{pinned.pinned_path(SPEC)} changed (fingerprint {pinned.fingerprint(SPEC)}): add a line naming it under "
        f"'{pinned.HISTORY_HEADING}' in {pinned.RESULTS_DOC} (the commit, what moved, why)")


def test_a_history_without_the_new_fingerprint_fails(tmp_path, pins):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.read_text())
    moved = copy.deepcopy(pins)
    moved["tiny"]["cls"]["cells"]["Docstrings"] = "99.9"
    pinned.pinned_path(spec).write_text(json.dumps(moved))
    assert not pinned.history_names(spec, ROOT / pinned.RESULTS_DOC)


def _table_json(rows: dict) -> dict:
    """A sweep's table2.json holding `rows` (as pinned) in the fine-tuned block."""
    return {"cells": [{"block": "train", "row": row, "label": r["label"], "column_label": col, "shown": shown,
                       "value": r.get("values", {}).get(col)}
                      for row, r in rows.items() for col, shown in r["cells"].items()]}


def test_an_unchanged_table_has_no_drift(pins):
    assert pinned.compare(pins["tiny"], pinned.measured_rows(_table_json(pins["tiny"]))) == []


def test_a_moved_number_is_named_with_the_cell_both_values_and_the_file_to_update(pins):
    moved = copy.deepcopy(pins["tiny"])
    moved["mean"]["cells"]["Docstrings"] = "61.2"
    drifts = pinned.compare(pins["tiny"], pinned.measured_rows(_table_json(moved)))
    assert [(d.row, d.column) for d in drifts] == [("mean", "Docstrings")]
    message = pinned.drift_message(drifts, "experiments/table2/spec.yaml", "tiny")
    old = pins["tiny"]["mean"]["cells"]["Docstrings"]
    assert f"mean / Docstrings: pinned {old}, now 61.2" in message
    assert "experiments/table2/pinned.json" in message and "docs/results.md" in message


def test_a_value_that_moves_below_the_printed_decimal_is_caught(pins):
    moved = copy.deepcopy(pins["tiny"])
    column, value = next(iter(moved["cls"]["values"].items()))
    moved["cls"]["values"][column] = round(value + 0.01, 2)
    drifts = pinned.compare(pins["tiny"], pinned.measured_rows(_table_json(moved)))
    assert [(d.row, d.column) for d in drifts] == [("cls", column)]


def test_the_check_command_fails_on_a_moved_number_and_names_it(tmp_path, pins):
    moved = copy.deepcopy(pins["tiny"])
    moved["cls"]["cells"]["Passkey"] = "75.0"
    (tmp_path / "table2.json").write_text(json.dumps(_table_json(moved)))
    proc = forked_cli.run([sys.executable, "-m", "lmk.sweep.pinned", "check", str(SPEC), "--scale", "tiny",
                           "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 1
    assert f"cls / Passkey: pinned {pins['tiny']['cls']['cells']['Passkey']}, now 75.0" in proc.stderr
    assert "python -m lmk.sweep.pinned update" in proc.stderr
