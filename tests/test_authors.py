"""The paper config matches the authors' scripts key by key (experiments/table2/authors.yaml, composed with
Hydra's compose API offline), and docs/method.md shows exactly that table."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmk.sweep import authors

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "experiments" / "table2" / "authors.yaml"


def test_paper_config_matches_the_authors_key_by_key() -> None:
    assert authors.check(SPEC) == []
    keys = {e.key for e in authors.load_entries(SPEC)}
    assert {"train.lr", "train.weight_decay", "train.warmup_shape", "trainer.gradient_clip_val",
            "effective_batch", "data.batch_size", "source_weights"} <= keys


def test_a_drifted_value_or_an_unexplained_deviation_is_reported(tmp_path: Path) -> None:
    text = SPEC.read_text()
    drifted = tmp_path / "a.yaml"
    drifted.write_text(text.replace("train.lr: {value: 2.0e-5", "train.lr: {value: 3.0e-5"))
    problems = authors.check(drifted)
    assert len(problems) == 1 and "train.lr = 2e-05" in problems[0] and "msmarco_distil.sh" in problems[0]
    same = tmp_path / "b.yaml"  # a "deviation" whose value equals theirs is not one
    same.write_text(text.replace("ours: warn", "ours: true"))
    assert any("marked a deviation but ours equals theirs" in p for p in authors.check(same))
    unexplained = tmp_path / "c.yaml"
    unexplained.write_text(text.replace("        reason: \"some attention backward", "        why: \"some attention"))
    with pytest.raises(ValueError, match="needs a `reason`"):
        authors.load_entries(unexplained)


def test_method_doc_shows_the_generated_table() -> None:
    doc = ROOT / "docs" / "method.md"
    assert authors.table_in(doc) == authors.render(SPEC), "regenerate: python -m lmk.sweep.authors --write docs/method.md"
    table = authors.render(SPEC)
    assert "| `train.weight_decay` | 0.0 | `config/ds_config.json`" in table
    assert "| `trainer.deterministic` | true |" in table and "**warn**" in table
