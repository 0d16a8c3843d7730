"""The (trained for, scored by) 2x2 the table prints: configurations found from the spec, cells read from the table."""

from __future__ import annotations

from pathlib import Path

import yaml

from lmk.sweep import quads, zeroshot_block
from lmk.sweep.spec import load_spec
from lmk.sweep.table_renderer import aggregate
from tests.test_tables import SPEC, write_run

ROOT = Path(__file__).resolve().parents[1]

QUAD_ROWS = [
    {"id": "lmk-maxsim", "label": "LMK-32 (MaxSim)", "scoring_of": "lmk", "overrides": ["eval.scoring=maxsim"]},
    {"id": "lmk-mt", "label": "LMK-32 (MaxSim-trained)",
     "overrides": ["pooling=lmk-fixed", "pooling.chunk_size=32", "train.objective=maxsim"]},
    {"id": "lmk-mt-maxsim", "label": "LMK-32 (MaxSim-trained, MaxSim)", "scoring_of": "lmk-mt",
     "overrides": ["eval.scoring=maxsim"]},
]


def test_every_lmk_row_of_both_tables_is_a_complete_2x2() -> None:
    for path, lmk_rows in [(ROOT / "experiments/table2/spec.yaml",
                            ["LMK-sentence", "LMK-fixed-32", "LMK-fixed-64", "LMK-fixed-128",
                             "LMK-variable (train {32..256}, infer 32)"]),
                           (ROOT / "experiments/decoder/spec.yaml",
                            ["LMK-fixed-64", "LMK-variable (train {32..256}, infer 32)",
                             "LMK-fixed-64, authors' placement (control)"])]:
        found = quads(load_spec(path))
        assert [q.label for q in found] == lmk_rows, path
        for q in found:
            assert sorted(q.cells) == [("maxsim", "maxsim"), ("maxsim", "single"), ("single", "maxsim"),
                                       ("single", "single")]


def test_a_row_without_its_four_cells_is_no_2x2(tmp_path: Path) -> None:
    spec = {**SPEC, "rows": [*SPEC["rows"], *QUAD_ROWS[:2]]}  # no MaxSim-trained, MaxSim-scored row
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    assert quads(load_spec(tmp_path / "spec.yaml")) == []


def test_the_table_prints_the_2x2_of_its_rows(tmp_path: Path) -> None:
    spec = {**SPEC, "rows": [*SPEC["rows"], *QUAD_ROWS]}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    out = tmp_path / "sweep"
    scores = {"cls": (0.2, 0.5), "mean": (0.6, 0.4), "lmk": (0.3, 0.7), "lmk-mt": (0.31, 0.72)}
    for row, (a, b) in scores.items():
        write_run(out / "train" / row, row, {"short-a": a, "long-b": b})
    for row, (a, b) in {"lmk-maxsim": (0.35, 0.75), "lmk-mt-maxsim": (0.4, 0.9)}.items():
        write_run(out / "rescore" / row, row, {"short-a": a, "long-b": b})
    _, paths = aggregate(tmp_path / "spec.yaml", "s", out)
    md = paths["md"].read_text()
    header = ("| Pooling | trained `single`, scored `single` | trained `single`, scored `maxsim` | "
              "trained `maxsim`, scored `single` | trained `maxsim`, scored `maxsim` |")
    assert md.count(header) == 2  # Avg long, then Avg short
    long_part = md[md.index("*trained for x scored by: Avg long*"):md.index("*trained for x scored by: Avg short*")]
    assert "| LMK-32 | 70.0 | 75.0 | 72.0 | 90.0 |" in long_part
    assert "| LMK-32 | 30.0 | 35.0 | 31.0 | 40.0 |" in md[md.index("*trained for x scored by: Avg short*"):]


def test_a_table_without_the_four_runs_prints_no_2x2(tmp_path: Path) -> None:
    spec = {**SPEC, "rows": [*SPEC["rows"], *QUAD_ROWS]}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    out = tmp_path / "sweep"
    for row in ("cls", "mean", "lmk", "lmk-mt"):
        write_run(out / "train" / row, row, {"short-a": 0.3, "long-b": 0.4})
    _, paths = aggregate(tmp_path / "spec.yaml", "s", out)
    assert "trained for x scored by" not in paths["md"].read_text()


def test_the_zero_shot_block_scores_each_untrained_model_once() -> None:
    """A MaxSim-trained row is its single-trained row untrained: the zero-shot block (lmk.evaluate jobs, no training
    settings) has neither it nor a train.* override."""

    spec = load_spec(ROOT / "experiments/table2/spec.yaml")
    scale = spec.scale("mini")
    block = zeroshot_block(scale, spec.rows_for(scale))
    assert not [r for r in block.rows if r.endswith(("-mt", "-mt-single"))]
    assert not [o for overrides in block.rows.values() for o in overrides if o.startswith("train.")]
    assert {"lmk-fixed-32", "lmk-fixed-32-maxsim"} <= set(block.rows)
