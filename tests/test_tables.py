"""The Table-2 aggregator on hand-written results files, and spec validation."""

from __future__ import annotations

import csv
import json
import struct
from pathlib import Path

import pytest
import wandb
import yaml
from wandb.proto import wandb_internal_pb2

from lmk.run.results import update_results
from lmk.sweep.spec import SpecError, load_spec, validate_spec
from lmk.sweep.table_renderer import MixedResultsError, aggregate, table_commits
from lmk.sweep.wandb_table import log_row_summaries, log_table, sweep_wandb

SPEC = {
    "name": "t2", "title": "Test table", "baseline": "cls", "alpha": 0.05,
    "rows": [
        {"id": "cls", "label": "CLS", "overrides": ["pooling=cls"]},
        {"id": "mean", "label": "Mean", "overrides": ["pooling=mean"]},
        {"id": "lmk", "label": "LMK-32", "overrides": ["pooling=lmk-fixed", "pooling.chunk_size=32"]},
    ],
    "scales": {"s": {"train_overrides": [], "columns": [
        {"group": "short-a", "label": "A", "context": "short"},
        {"group": "long-b", "label": "B", "context": "long"},
    ]}},
}


def write_run(folder: Path, row: str, groups: dict[str, float], per_query: dict | None = None,
              config_hash: str = "h", status: str = "done", commit: str = "abc123def456789",
              tasks: dict | None = None, **extra) -> Path:
    ev = {"suite": "x", "groups": groups, "group_tasks": {"short-a": ["TaskA"], "long-b": ["TaskB"]},
          **({"tasks": tasks} if tasks else {})}
    if per_query is not None:
        (folder).mkdir(parents=True, exist_ok=True)
        (folder / "per_query.json").write_text(json.dumps(per_query))
        ev["per_query"] = "per_query.json"
    update_results(folder, row=row, status=status, config_hash=f"{config_hash}-{row}",
                   git_commit=commit, eval=ev, **extra)
    return folder


@pytest.fixture()
def spec_path(tmp_path: Path) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(SPEC))
    return path


def per_query(a: list[float], b: list[float]) -> dict:
    return {"TaskA": {"test": {f"q{i}": v for i, v in enumerate(a)}},
            "TaskB": {"test": {f"q{i}": v for i, v in enumerate(b)}}}


def test_aggregate_bold_significance_and_provenance(spec_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    n = 30
    # mean is far better than cls on A, identical on B -> dagger on A only.
    write_run(out / "train" / "cls", "cls", {"short-a": 0.20, "long-b": 0.50},
              per_query([0.2 + 0.01 * (i % 3) for i in range(n)], [0.5] * n))
    write_run(out / "train" / "mean", "mean", {"short-a": 0.60, "long-b": 0.40},
              per_query([0.6 + 0.01 * (i % 2) for i in range(n)], [0.5] * n))
    write_run(out / "train" / "lmk", "lmk", {"short-a": 0.30, "long-b": 0.70})
    table, paths = aggregate(spec_path, "s", out)
    md = paths["md"].read_text()
    lines = {line.split("|")[1].strip(): line for line in md.splitlines() if line.startswith("| ")}
    assert "| Pooling | A | B | Avg short | Avg long | Avg |" in md
    # best per column in bold; dagger only where the paired test says so
    assert lines["Mean"].split("|")[2].strip() == "**60.0\u2020**"
    assert lines["Mean"].split("|")[3].strip() == "40.0"       # p = 1 on identical B scores
    assert lines["LMK-32"].split("|")[3].strip() == "**70.0**"  # no per-query file: no mark
    assert lines["CLS"].split("|")[2].strip() == "20.0"
    assert lines["LMK-32"].split("|")[6].strip() == "**50.0**"  # overall avg (0.3 + 0.7) / 2
    assert "commit `abc123def456`" in md and "hash `h-lmk`" in md and str(out / "train" / "lmk") in md
    tex = paths["tex"].read_text()
    assert "\\textbf{60.0$^\\dagger$}" in tex and "\\textbf{70.0}" in tex and "\\toprule" in tex
    with open(paths["csv"]) as fh:
        cells = list(csv.DictReader(fh))
    cell = next(c for c in cells if c["row"] == "mean" and c["column"] == "short-a")
    assert cell["value"] == "60.0" and cell["best"] == "True" and cell["significant"] == "True"
    assert cell["run_dir"] == str(out / "train" / "mean") and cell["config_hash"] == "h-mean"
    assert float(cell["p_value"]) < 0.05
    assert paths["png"].stat().st_size > 0
    assert table.blocks["train"]["cls"]["short-a"].p_value is None  # the baseline is not tested


def _documents(*splits: tuple[int, float]) -> dict:
    """A task's landmark statistics: per split (texts, single-landmark share) of its documents; queries all single."""
    return {f"test_{i}": {"passage": {"texts": n, "single_landmark_share": share},
                          "query": {"texts": 5, "single_landmark_share": 1.0}} for i, (n, share) in enumerate(splits)}


def test_a_row_whose_eval_documents_keep_one_landmark_is_noted(spec_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    write_run(out / "train" / "cls", "cls", {"short-a": 0.2, "long-b": 0.5},  # no landmarks: never noted
              tasks={"TaskA": {"main_score": 0.2, "landmarks": {"test": {"passage": {"texts": 9, "landmarks": None}}}}})
    write_run(out / "train" / "mean", "mean", {"short-a": 0.6, "long-b": 0.4})  # results without the statistics
    # A: 10 of 20 documents single (the threshold, 50%: noted); B: 4 of 10 (40%: not noted)
    write_run(out / "train" / "lmk", "lmk", {"short-a": 0.3, "long-b": 0.7},
              tasks={"TaskA": {"main_score": 0.3, "landmarks": _documents((10, 1.0), (10, 0.0))},
                     "TaskB": {"main_score": 0.7, "landmarks": _documents((10, 0.4))}})
    table, paths = aggregate(spec_path, "s", out)
    (note,) = [line for line in paths["md"].read_text().splitlines() if line.startswith("Collapsed evaluation")]
    assert note.endswith("there): LMK-32: A 50%.") and "at least 50%" in note
    assert json.loads(paths["json"].read_text())["notes"] == [note] == table.notes
    write_run(out / "train" / "lmk", "lmk", {"short-a": 0.3, "long-b": 0.7},
              tasks={"TaskA": {"main_score": 0.3, "landmarks": _documents((10, 1.0), (11, 0.0))}})
    assert aggregate(spec_path, "s", out)[0].notes == []  # 10 of 21: under the threshold


def test_bold_follows_the_printed_values(spec_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    # 0.4531 and 0.4529 both print as 45.3: both are the best of column A; 9.5 vs 45.3 compares as numbers.
    write_run(out / "train" / "cls", "cls", {"short-a": 0.4531, "long-b": 0.095})
    write_run(out / "train" / "mean", "mean", {"short-a": 0.4529, "long-b": 0.453})
    write_run(out / "train" / "lmk", "lmk", {"short-a": 0.30, "long-b": 0.20})
    table, _ = aggregate(spec_path, "s", out)
    cells = table.blocks["train"]
    assert cells["cls"]["short-a"].best and cells["mean"]["short-a"].best and not cells["lmk"]["short-a"].best
    assert cells["mean"]["long-b"].best and not cells["cls"]["long-b"].best


def test_the_json_and_the_model_card_show_each_cell_as_the_markdown_prints_it(spec_path: Path, tmp_path: Path) -> None:
    """0.33449 prints as 33.4; its JSON value is 33.45, which a reader rounding again would show as 33.5."""
    from lmk.sharing.card import TableRow, card_row

    out = tmp_path / "sweep"
    write_run(out / "train" / "cls", "cls", {"short-a": 0.33449, "long-b": 0.2})
    write_run(out / "train" / "mean", "mean", {"short-a": 0.1, "long-b": 0.1})
    write_run(out / "train" / "lmk", "lmk", {"short-a": 0.1, "long-b": 0.1})
    aggregate(spec_path, "s", out)
    cell = next(c for c in json.loads((out / "t2.json").read_text())["cells"]
                if c["row"] == "cls" and c["column"] == "short-a")
    assert cell["value"] == 33.45 and cell["shown"] == "33.4"
    assert "| **33.4** |" in (out / "t2.md").read_text()
    cells = [c for c in json.loads((out / "t2.json").read_text())["cells"] if c["row"] == "cls"]
    card = card_row(TableRow(out / "t2.json", "spec.yaml", "s", "cls", "CLS", cells))
    assert "| 33.4 |" in card and "33.5" not in card


def test_missing_row_and_failed_row_show_dash(spec_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    write_run(out / "train" / "cls", "cls", {"short-a": 0.2, "long-b": 0.5})
    write_run(out / "train" / "mean", "mean", {}, status="failed")
    _, paths = aggregate(spec_path, "s", out)
    md = paths["md"].read_text()
    mean_line = next(line for line in md.splitlines() if line.startswith("| Mean"))
    assert mean_line.count("| -") == 5
    assert "| LMK-32 | - | - | - | - | - |" in md


def test_failed_row_keeps_its_commit_and_hash_in_the_provenance(spec_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    write_run(out / "train" / "cls", "cls", {"short-a": 0.2, "long-b": 0.5})
    write_run(out / "train" / "mean", "mean", {}, status="failed")
    _, paths = aggregate(spec_path, "s", out)
    md = paths["md"].read_text()
    line = next(line for line in md.splitlines() if line.startswith("- train/mean:"))
    assert "commit `abc123def456`" in line and "hash `h-mean`" in line, line
    assert "`?`" not in line and "None" not in line
    cells = json.loads(paths["json"].read_text())["cells"]
    failed = next(c for c in cells if c["row"] == "mean" and c["column"] == "short-a")
    assert failed["value"] is None and failed["config_hash"] == "h-mean" and failed["git_commit"] == "abc123def456789"


def test_mixed_results_folder_is_refused(spec_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    write_run(out / "train" / "cls", "cls", {"short-a": 0.2, "long-b": 0.5}, config_hash="one")
    write_run(out / "train" / "old-cls", "cls", {"short-a": 0.3, "long-b": 0.5}, config_hash="two")
    with pytest.raises(MixedResultsError) as err:
        aggregate(spec_path, "s", out)
    assert str(out / "train" / "cls" / "results.json") in str(err.value)
    assert str(out / "train" / "old-cls" / "results.json") in str(err.value)


def test_no_results_names_the_command(spec_path: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="make reproduce-table2"):
        aggregate(spec_path, "s", tmp_path / "empty")


def test_real_spec_validates_at_every_scale() -> None:
    spec = load_spec("experiments/table2/spec.yaml")
    for scale in spec.scales:
        validate_spec(spec, scale)
    assert [r.id for r in spec.rows_for(spec.scale("mini"))][:3] == ["cls", "mean", "lmk-sentence"]
    assert {"every-k", "multi-cls"} <= {r.id for r in spec.rows_for(spec.scale("paper"))}


def test_unknown_pooling_and_group_fail_with_valid_names(tmp_path: Path) -> None:
    bad = json.loads(json.dumps(SPEC))
    bad["rows"][1]["overrides"] = ["pooling=meen"]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(SpecError, match=r"unknown pooling 'meen' \(did you mean mean"):
        validate_spec(load_spec(path), "s")
    spec = load_spec("experiments/table2/spec.yaml")
    spec.scales["mini"].columns[0] = type(spec.scales["mini"].columns[0])("local-shrt", "x", "short")
    with pytest.raises(SpecError, match="not an eval group.*did you mean local-short"):
        validate_spec(spec, "mini")


def test_seeds_give_mean_std_and_a_test_over_seeds(spec_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    n = 30
    for seed in (0, 1, 2):
        # mean beats cls by about 0.3 on A in every seed (also per query); on B the two tie within noise.
        for row, a, b in (("cls", 0.20, 0.50), ("mean", 0.50, 0.50), ("lmk", 0.30, 0.70)):
            folder = write_run(out / "train" / row / f"seed{seed}", row,
                               {"short-a": a + 0.01 * seed, "long-b": b + 0.01 * ((seed + (row == "mean")) % 3)},
                               per_query([a + 0.01 * ((i + seed) % 3) for i in range(n)], [b] * n),
                               config_hash=f"s{seed}")
            update_results(folder, config={"seed": seed})
    table, paths = aggregate(spec_path, "s", out)
    mean_a = table.blocks["train"]["mean"]["short-a"]
    assert mean_a.n_seeds == 3 and abs(mean_a.value - 0.51) < 1e-9 and abs(mean_a.std - 0.01) < 1e-9
    assert mean_a.significant and mean_a.significant_seeds and mean_a.p_value_seeds < 0.05
    mean_b = table.blocks["train"]["mean"]["long-b"]
    assert not mean_b.significant_seeds and mean_b.p_value_seeds > 0.05
    assert table.blocks["train"]["lmk"]["avg"].n_seeds == 3 and table.blocks["train"]["lmk"]["avg"].std is not None
    md = paths["md"].read_text()
    mean_line = next(line for line in md.splitlines() if line.startswith("| Mean"))
    assert mean_line.split("|")[2].strip() == "**51.0 \u00b1 1.0\u2020\u2021**"
    assert "std over up to 3 seeds" in md and str(out / "train" / "mean") in md
    assert "$\\pm$" in paths["tex"].read_text() and "$^\\ddagger$" in paths["tex"].read_text()
    with open(paths["csv"]) as fh:
        cell = next(c for c in csv.DictReader(fh) if c["row"] == "mean" and c["column"] == "short-a")
    assert cell["n_seeds"] == "3" and cell["std"] == "1.0" and cell["significant_seeds"] == "True"


def test_one_seed_twice_with_two_configs_is_still_refused(spec_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    for name, digest in (("seed0", "one"), ("seed0-old", "two")):
        update_results(write_run(out / "train" / "cls" / name, "cls", {"short-a": 0.2, "long-b": 0.5},
                                 config_hash=digest), config={"seed": 0})
    with pytest.raises(MixedResultsError):
        aggregate(spec_path, "s", out)


def test_a_dirty_tree_shows_as_dirty_in_table_caption_and_provenance(spec_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    write_run(out / "train" / "cls", "cls", {"short-a": 0.2, "long-b": 0.5}, commit="f99b5e6938ff0123-dirty")
    write_run(out / "train" / "mean", "mean", {"short-a": 0.3, "long-b": 0.4}, commit="f99b5e6938ff0123-dirty")
    table, paths = aggregate(spec_path, "s", out)
    md = paths["md"].read_text()
    assert "commit `f99b5e6938ff-dirty`" in md  # provenance lines (before: the clean-looking `f99b5e6938ff`)
    assert "Code: commit `f99b5e6938ff-dirty` (uncommitted changes" in md  # the caption
    assert "f99b5e6938ff-dirty" in paths["tex"].read_text()
    assert table_commits(table) == ["f99b5e6938ff-dirty"]


def test_the_table_lands_in_an_offline_wandb_run_of_the_sweeps_group(spec_path: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "sweep"
    wandb_info = {"mode": "offline", "project": "lmk-test", "group": "t2-s-train", "id": "x"}
    n = 30
    write_run(out / "train" / "cls", "cls", {"short-a": 0.20, "long-b": 0.50},
              per_query([0.2 + 0.01 * (i % 3) for i in range(n)], [0.5] * n), wandb=wandb_info)
    write_run(out / "train" / "mean", "mean", {"short-a": 0.60, "long-b": 0.40},
              per_query([0.6 + 0.01 * (i % 2) for i in range(n)], [0.5] * n), wandb=wandb_info)
    table, paths = aggregate(spec_path, "s", out)
    info = sweep_wandb(out)
    assert info == {"mode": "offline", "project": "lmk-test", "group": "t2-s-train"}
    run_dir = Path(log_table(table, "t2", out, info))
    assert run_dir.parent == out / "wandb" and run_dir.name.startswith("offline-run-")
    (table_file,) = (run_dir / "files" / "media" / "table").glob("t2_*.table.json")
    logged = json.loads(table_file.read_text())
    assert logged["columns"][:5] == ["block", "row", "pooling", "A", "B"]
    rows = {r[1]: dict(zip(logged["columns"], r)) for r in logged["data"]}
    assert rows["mean"]["A"] == "**60.0\u2020**" and rows["cls"]["A"] == "20.0"  # the Markdown's cells and daggers
    assert rows["mean"]["git_commit"] == "abc123def456" and rows["mean"]["config_hash"] == "h-mean"
    # The run's record file (what `wandb sync` uploads) holds its group and the cells in its summary.
    (records,) = run_dir.glob("run-*.wandb")
    data = records.read_bytes()
    assert b"t2-s-train" in data and b"train/mean/A" in data and b"Code: commit abc123def456" in data
    assert sweep_wandb(tmp_path / "nothing") is None


def wandb_records(path: Path):
    """The records of a W&B run file (`run-<id>.wandb`, what `wandb sync` uploads): wandb's leveldb-style log of
    protobuf records (a 7-byte file header, 32 KiB blocks, 7-byte chunk headers: crc, length, type)."""
    data, pos, buf = path.read_bytes(), 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        buf += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(buf)
            buf = b""
            yield record


def wandb_summary(folder: Path, run_id: str) -> tuple[dict, set]:
    """The summary of W&B run `run_id` over all its offline segments under `folder`, and the runs' groups."""
    summary, groups = {}, set()
    for path in sorted((folder / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")):
        for record in wandb_records(path):
            if record.WhichOneof("record_type") == "run":
                groups.add((record.run.run_id, record.run.run_group))
            elif record.WhichOneof("record_type") == "summary":
                summary.update({item.key or ".".join(item.nested_key): json.loads(item.value_json)
                                for item in record.summary.update})
    return summary, groups


def offline_training_run(folder: Path, run_id: str) -> dict:
    """A real offline W&B run in a row folder, as lmk.train leaves it; returns its results.json "wandb" section."""
    run = wandb.init(id=run_id, dir=str(folder), project="lmk-test", group="t2-s-train", name=f"row-{run_id}",
                     mode="offline", reinit="finish_previous", settings=wandb.Settings(quiet=True))
    run.log({"train/loss": 1.0})
    run.finish()
    # trained earlier than the table: its segment's folder (named by the start second) is not the new one's
    (segment,) = (folder / "wandb").glob(f"offline-run-*-{run_id}")
    segment.rename(segment.with_name(f"offline-run-20260101_000000-{run_id}"))
    (folder / "wandb_run_id").write_text(run_id)
    return {"mode": "offline", "id": run_id, "name": f"row-{run_id}", "project": "lmk-test", "group": "t2-s-train"}


def test_each_rows_wandb_run_summary_holds_its_table_scores(spec_path: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "sweep"
    # a results.json naming a run W&B refuses (an id with '/'): one warning, the other rows still get theirs
    write_run(out / "train" / "cls", "cls", {"short-a": 0.20, "long-b": 0.50},
              wandb={"mode": "offline", "id": "bad/id", "project": "lmk-test"})
    mean = out / "train" / "mean"
    mean.mkdir(parents=True)
    write_run(mean, "mean", {"short-a": 0.60, "long-b": 0.40}, wandb=offline_training_run(mean, "meanrun1"))
    for seed in (0, 1):  # two seeds: two W&B runs of one row; one keeps its id only in wandb_run_id
        folder = out / "train" / "lmk" / f"seed{seed}"
        folder.mkdir(parents=True)
        info = offline_training_run(folder, f"lmkseed{seed}")
        write_run(folder, "lmk", {"short-a": 0.30 + 0.02 * seed, "long-b": 0.70},
                  wandb={k: v for k, v in info.items() if seed == 0 or k != "id"}, config={"seed": seed})
    table, _ = aggregate(spec_path, "s", out)
    with pytest.warns(UserWarning, match=r"^W&B summary of row cls not written \(.*\); the table files are") as seen:
        assert log_row_summaries(table, "t2") == 3
    assert len([w for w in seen if "W&B" in str(w.message)]) == 1
    for folder, run_id, row in ((mean, "meanrun1", "mean"), (out / "train" / "lmk" / "seed0", "lmkseed0", "lmk"),
                                (out / "train" / "lmk" / "seed1", "lmkseed1", "lmk")):
        summary, groups = wandb_summary(folder, run_id)
        assert groups == {(run_id, "t2-s-train")}  # the same run (a new offline segment of its id), same group
        assert len(list((folder / "wandb").glob(f"offline-run-*-{run_id}"))) == 2
        cells = table.blocks["train"][row]
        assert {k: summary[f"t2/{label}"] for k, label in table.column_keys()} == \
            {k: round(100 * cells[k].value, 2) for k, _ in table.column_keys()}  # the table's own cells
        assert summary["t2/row"] == table.labels[row] and summary["t2/block"] == "train"
        assert summary["train/loss"] == 1.0  # the training segment's summary is still there
    assert wandb_summary(mean, "meanrun1")[0]["t2/A"] == 60.0
    assert wandb_summary(out / "train" / "lmk" / "seed1", "lmkseed1")[0]["t2/A"] == 31.0  # the mean over seeds
