"""Rows scored from another row's checkpoint (`scoring_of`): Table 2's MaxSim block evaluates each LMK row's trained
model by MaxSim, nothing trained twice, and the table shows it with the index each document takes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import forked_cli
import pytest
import yaml

from lmk.config.eval import EvalConfig
from lmk.run.results import read_results, update_results
from lmk.sweep.jobs import compose_config, plan, rescore_block, train_block, zeroshot_block
from lmk.sweep.spec import SpecError, load_spec, validate_spec
from lmk.sweep.table_renderer import aggregate

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "experiments" / "table2" / "spec.yaml"


def test_every_lmk_row_of_table2_has_a_row_scoring_its_checkpoint_the_other_way() -> None:
    """Each LMK row trained for one vector has a MaxSim row of its checkpoint; each MaxSim-trained row (scored by
    MaxSim) a one-vector row of its checkpoint."""
    spec = load_spec(SPEC)
    required = [r for r in spec.rows if not r.optional]
    lmk_rows = [r for r in required if r.scoring_of is None and r.pooling and r.pooling.startswith("lmk-")]
    other = {r.scoring_of: r for r in required if r.scoring_of is not None}
    assert sorted(other) == sorted(r.id for r in lmk_rows) and "cls" not in other and "mean" not in other
    for trained in lmk_rows:
        maxsim_trained = "train.objective=maxsim" in trained.overrides
        assert ("eval.scoring=maxsim" in trained.overrides) == maxsim_trained  # scored as it was trained
        row = other[trained.id]
        if maxsim_trained:
            assert row.overrides == ("eval.scoring=single",) and "one vector" in row.label
        else:
            assert row.overrides == ("eval.scoring=maxsim",) and "(MaxSim" in row.label


@pytest.mark.parametrize("scale", list(load_spec(SPEC).scales))
def test_scoring_rows_train_nothing_and_evaluate_their_rows_model(scale: str, tmp_path: Path) -> None:
    spec = load_spec(SPEC)
    validate_spec(spec, scale)
    scale_ = spec.scale(scale)
    rows = spec.rows_for(scale_, with_optional=True)
    assert not [r for r in train_block(scale_, rows).rows if r.endswith("-maxsim")]  # no second training
    block = rescore_block(scale_, rows, tmp_path / "train", fingerprints={"lmk-fixed-32": "fp32"})
    (job,) = block.jobs()  # only rows whose trained model exists (a fingerprint) are scored
    assert job.row == "lmk-fixed-32-maxsim"
    assert f"model={tmp_path / 'train' / 'lmk-fixed-32'}" in job.overrides
    assert "++model_fingerprint='fp32'" in job.overrides and "eval.scoring=maxsim" in job.overrides
    suite = EvalConfig.from_cfg(job.compose().eval)  # the suite the trained rows are evaluated on
    assert suite.scoring == "maxsim" and set(suite.groups) >= {c.group for c in scale_.columns}


@pytest.mark.parametrize("fingerprint", ["0716311804438561", "1716311804438561", "12e4567890123456", "ab12cd34ef56ab78"])
def test_a_fingerprint_of_digits_reaches_the_job_as_the_string_the_stage_compares(fingerprint: str,
                                                                                  tmp_path: Path) -> None:
    """A model fingerprint is 16 hex digits; one of decimal digits only (or digits around one `e`) was read by
    Hydra as a number, so the eval stage found the row's finished shards stale and reported them not done."""
    spec = load_spec(SPEC)
    tiny, rehearsal = spec.scale("tiny"), spec.scale("rehearsal")
    (rescore,) = rescore_block(tiny, spec.rows_for(tiny), tmp_path / "train",
                               fingerprints={"lmk-fixed-32": fingerprint}).jobs()
    stage = next(b for b in plan(rehearsal, spec.rows_for(rehearsal), tmp_path, fingerprints={"cls": fingerprint})
                 if b is not None and b.name == "eval")
    shard = stage.jobs()[0]
    assert shard.row.startswith("cls")
    for job in (shard, rescore):
        assert compose_config("lmk.evaluate", job.overrides).model_fingerprint == fingerprint


def test_the_zero_shot_block_scores_each_untrained_lmk_row_by_maxsim_too() -> None:
    spec = load_spec(SPEC)
    block = zeroshot_block(spec.scale("mini"), spec.rows_for(spec.scale("mini")))
    assert block.rows["lmk-fixed-64-maxsim"] == ["pooling=lmk-fixed", "pooling.chunk_size=64", "eval.scoring=maxsim"]
    assert "lmk-variable-maxsim" not in block.rows  # untrained, lmk-variable is lmk-fixed-32


@pytest.mark.parametrize(("row", "match"), [
    ({"id": "x", "scoring_of": "nope", "overrides": ["eval.scoring=maxsim"]}, "not a trained row"),
    ({"id": "x", "scoring_of": "lmk", "overrides": ["pooling.chunk_size=64"]}, r"evaluation settings \(eval\.\*\) only"),
    ({"id": "x", "scoring_of": "cls", "overrides": ["eval.scoring=maxsim"]}, "has none"),
])
def test_a_bad_scoring_row_fails_before_anything_runs(tmp_path: Path, row: dict, match: str) -> None:
    raw = {"name": "t", "baseline": "cls", "rows": [
        {"id": "cls", "overrides": ["pooling=cls"]}, {"id": "lmk", "overrides": ["pooling=lmk-fixed"]}, row],
        "scales": {"s": {"columns": [{"group": "local-short"}]}}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(SpecError, match=match):
        validate_spec(load_spec(path), "s")


def _run(folder: Path, row: str, score: float, scores: list[float], index: dict | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "per_query.json").write_text(json.dumps({"TaskA": {"test": {f"q{i}": s for i, s in enumerate(scores)}}}))
    task = {"main_score": score, **({"index": index} if index else {})}
    update_results(folder, row=row, status="done", config_hash=f"h-{row}", git_commit="abc",
                   eval={"groups": {"a": score}, "group_tasks": {"a": ["TaskA"]}, "tasks": {"TaskA": task},
                         "per_query": "per_query.json"})


def test_the_table_shows_the_maxsim_rows_with_daggers_and_their_index(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"name": "t", "title": "T", "baseline": "cls", "rows": [
        {"id": "cls", "label": "CLS", "overrides": ["pooling=cls"]},
        {"id": "lmk", "label": "LMK", "overrides": ["pooling=lmk-fixed"]},
        {"id": "lmk-maxsim", "label": "LMK (MaxSim)", "scoring_of": "lmk", "overrides": ["eval.scoring=maxsim"]}],
        "scales": {"s": {"columns": [{"group": "a", "label": "A", "context": "long"}]}}}))
    out = tmp_path / "sweep"
    n = 30
    _run(out / "train" / "cls", "cls", 0.2, [0.2 + 0.01 * (i % 3) for i in range(n)])
    _run(out / "train" / "lmk", "lmk", 0.25, [0.2 + 0.01 * (i % 3) for i in range(n)])
    _run(out / "rescore" / "lmk-maxsim", "lmk-maxsim", 0.6, [0.6 + 0.01 * (i % 2) for i in range(n)],
         {"documents": 100, "vectors": 1500, "vectors_per_doc": 15.0, "bytes_per_doc": 23040})
    _, paths = aggregate(spec, "s", out)
    md = paths["md"].read_text()
    assert "| Pooling | A | Avg long | Index / doc |" in md
    assert "| LMK (MaxSim) | **60.0\u2020** | **60.0** | 15.0 (22.5 KiB) |" in md  # compared with CLS, as every row
    assert "| LMK | 25.0 | 25.0 | - |" in md
    cells = json.loads(paths["json"].read_text())["cells"]
    assert [c["shown"] for c in cells if c["column"] == "index"] == ["15.0 (22.5 KiB)"]
    assert "Index / doc" in paths["tex"].read_text()


def test_a_table_without_maxsim_rows_has_no_index_column(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"name": "t", "baseline": "cls", "rows": [
        {"id": "cls", "label": "CLS", "overrides": ["pooling=cls"]}],
        "scales": {"s": {"columns": [{"group": "a", "label": "A", "context": "long"}]}}}))
    _run(tmp_path / "sweep" / "train" / "cls", "cls", 0.2, [0.2, 0.3])
    _, paths = aggregate(spec, "s", tmp_path / "sweep")
    assert "Index" not in paths["md"].read_text()


@pytest.mark.slow  # one tiny training and two evaluations: about 2 minutes on 2 busy cores
@pytest.mark.timeout(1200)
def test_a_maxsim_row_is_scored_from_its_rows_checkpoint_without_training_again(tmp_path: Path) -> None:
    from lmk.sweep.eval_stage import trained_fingerprint

    out = tmp_path / "tiny"
    args = [sys.executable, "-m", "lmk.sweep", str(SPEC), "--scale", "tiny", "--rows", "lmk-fixed-32,lmk-fixed-32-maxsim",
            "--no-zero-shot", "--out", str(out)]
    proc = forked_cli.run(args, cwd=ROOT, capture_output=True, text=True, timeout=1100)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    trained = [p.name for p in (out / "train").iterdir() if p.is_dir()]
    assert trained == ["lmk-fixed-32"]  # one training run: the MaxSim row has none of its own
    status = json.loads((out / "train" / "sweep_status.json").read_text())
    assert list(status) == ["lmk-fixed-32"]
    res = read_results(out / "rescore" / "lmk-fixed-32-maxsim")
    assert res["status"] == "done" and res["command"] == "evaluate"
    assert res["config"]["model"] == str(out / "train" / "lmk-fixed-32")
    assert res["config"]["model_fingerprint"] == trained_fingerprint(out / "train" / "lmk-fixed-32")
    assert res["eval"]["scoring"] == "maxsim"
    index = res["eval"]["tasks"]["LocalShort"]["index"]
    assert index["documents"] == 24 and index["vectors_per_doc"] > 1  # landmark vectors, one per chunk
    trained_cfg = read_results(out / "train" / "lmk-fixed-32")["config"]
    hidden = trained_cfg["encoder"]["config_overrides"]["hidden_size"]  # table2-tiny's encoder width
    assert index["bytes_per_doc"] == round(index["vectors"] / index["documents"] * hidden * 4)  # float32
    md = (out / "table2.md").read_text()
    assert "| LMK-fixed-32 (MaxSim) |" in md and "Index / doc" in md
    again = forked_cli.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and (again.stdout + again.stderr).count("skip (done, same config)") == 2


def test_a_column_out_of_the_averages_leaves_them_as_they_were(tmp_path: Path) -> None:
    """Table 2's prose column came after the mini table was pinned: `average: false` keeps every earlier cell."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"name": "t", "baseline": "cls", "rows": [
        {"id": "cls", "label": "CLS", "overrides": ["pooling=cls"]}],
        "scales": {"s": {"columns": [{"group": "a", "label": "A", "context": "long"},
                                     {"group": "b", "label": "B", "context": "long", "average": False}]}}}))
    folder = tmp_path / "sweep" / "train" / "cls"
    update_results(folder, row="cls", status="done", config_hash="h", git_commit="abc",
                   eval={"groups": {"a": 0.2, "b": 0.9}, "group_tasks": {"a": ["TaskA"], "b": ["TaskB"]}})
    _, paths = aggregate(spec, "s", tmp_path / "sweep")
    md = paths["md"].read_text()
    assert "| Pooling | A | B | Avg long |" in md and "| CLS | **20.0** | **90.0** | **20.0** |" in md
    assert "Not in the averages: B" in md


def test_the_index_column_is_blank_unless_every_task_of_the_row_has_its_index() -> None:
    from lmk.sweep.spec import Column
    from lmk.sweep.table_renderer import RunRecord, index_size

    columns = [Column(group="a", label="A", context="short"), Column(group="b", label="B", context="long")]
    entry = {"documents": 10, "vectors": 40, "bytes_per_doc": 4 * 384 * 4}
    rec = RunRecord(row="r", run_dir=Path("."), config_hash=None, git_commit=None, status="done", groups={},
                    group_tasks={"a": ["TaskA"], "b": ["TaskB"]}, index={"TaskA": entry, "TaskB": entry})
    assert index_size(rec, columns) == "4.0 (6.0 KiB)"
    del rec.index["TaskB"]  # TaskB scored from the eval cache: nothing encoded, no index recorded
    assert index_size(rec, columns) is None  # not an average over the other tasks
