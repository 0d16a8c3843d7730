"""lmk.analysis on a Table 2 sweep folder: the latest sweep's trained runs (checkpoints), the untrained
fallback, and score vs document length from the per-query files (the paper's Figure 1 view)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from omegaconf import OmegaConf

from lmk import analysis as an
from lmk.config import TrainSection, group_file, registry

ROOT = Path(__file__).resolve().parents[1]
TINY = {"num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 256}


def _configs(pooling: str) -> tuple[dict, dict]:
    # as a run's results.json holds them: each group option composed with its `_base` defaults
    enc = OmegaConf.to_container(group_file("encoder", "tiny-modernbert", ROOT / "conf"))
    enc["config_overrides"], enc["max_positions"] = dict(TINY), 256
    pool = OmegaConf.to_container(group_file("pooling", pooling, ROOT / "conf"))
    return enc, pool


def write_run(run_dir: Path, row: str, pooling: str, per_query: dict, status: str = "done", seed: int = 0,
              train: dict | None = None):
    """A sweep row as lmk.train leaves it at tiny scale: .hydra config, last.ckpt (no export), results (with a
    `train` section when given)."""
    from lmk.model.embedding import EmbeddingModel

    enc, pool = _configs(pooling)
    model = EmbeddingModel.build(enc, pool, seed=seed)
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml({"encoder": enc, "pooling": pool, "row": row}))
    (run_dir / "checkpoints").mkdir()
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}},
               run_dir / "checkpoints" / "last.ckpt")
    (run_dir / "per_query.json").write_text(json.dumps(per_query))
    (run_dir / "results.json").write_text(json.dumps({
        "status": status, "config": {"encoder": enc, "pooling": pool, "row": row, **({"train": train} if train else {})},
        "eval": {"per_query": "per_query.json"}}))
    return model


PER_QUERY = {
    "cls": {"LocalPasskey": {"test_256": {"q0": 1, "q1": 0, "q2": 1, "q3": 1}, "test_512": {"q0": 0, "q1": 0}},
            "LocalShort": {"test": {"s0": 0.5}}},
    "lmk-fixed-32": {"LocalPasskey": {"test_256": {"q0": 1, "q1": 1, "q2": 1, "q3": 1},
                                      "test_512": {"q0": 1, "q1": 0}},
                     "LocalShort": {"test": {"s0": 0.7}}},
}


@pytest.fixture()
def sweeps(tmp_path: Path) -> tuple[Path, dict]:
    root = tmp_path / "table2"
    built = {}
    for row, pooling in (("cls", "cls"), ("lmk-fixed-32", "lmk-fixed")):
        built[row] = write_run(root / "mini" / "train" / row, row, pooling, PER_QUERY[row])
    old = write_run(root / "tiny" / "train" / "cls", "cls", "cls", PER_QUERY["cls"], seed=1)
    # an older finished scale, and a newer run that never finished: neither is "the latest sweep"
    os.utime(root / "tiny" / "train" / "cls" / "results.json", (1, 1))
    write_run(root / "paper" / "train" / "cls", "cls", "cls", PER_QUERY["cls"], status="running")
    built["old"] = old
    return root, built


def test_latest_sweep_is_the_newest_scale_with_finished_runs(sweeps) -> None:
    root, _ = sweeps
    assert an.latest_table2_sweep(root) == root / "mini"
    assert [p.name for p in an.trained_runs(root / "mini")] == ["cls", "lmk-fixed-32"]
    assert an.trained_runs(root / "paper") == []
    assert an.latest_table2_sweep(root / "nothing-here") is None


def test_choose_models_loads_the_trained_checkpoints_and_says_so(sweeps) -> None:
    root, built = sweeps
    choice = an.choose_models(table2_root=root)
    assert choice.source == "trained" and choice.sweep_dir == root / "mini"
    assert list(choice.models) == ["tiny-modernbert/cls", "tiny-modernbert/lmk-fixed-32"]
    assert str(root / "mini" / "train" / "lmk-fixed-32") in str(choice)
    texts = ["a long text about rivers and the moon " * 5, "short"]
    np.testing.assert_allclose(choice.models["tiny-modernbert/cls"].encode(texts), built["cls"].encode(texts),
                               atol=1e-5)
    assert an.pooling_kind(choice.models["tiny-modernbert/lmk-fixed-32"]) == "lmk"


def test_two_trainings_of_one_pooling_get_two_labels_and_say_their_objective(tmp_path: Path) -> None:
    default = TrainSection.objective
    other = next(o for o in registry.declared_objectives() if o != default)
    sweep = tmp_path / "table2" / "mini"
    write_run(sweep / "train" / "lmk-fixed-32", "lmk-fixed-32", "lmk-fixed", PER_QUERY["lmk-fixed-32"])  # no train.*
    write_run(sweep / "train" / "lmk-fixed-32-mt", "lmk-fixed-32-mt", "lmk-fixed", PER_QUERY["lmk-fixed-32"],
              seed=1, train={"objective": other})
    write_run(sweep / "train" / "lmk-fixed-32-st", "lmk-fixed-32-st", "lmk-fixed", PER_QUERY["lmk-fixed-32"],
              seed=2, train={"objective": default})  # the default named: the same label, told apart by its folder
    choice = an.choose_models(table2_root=tmp_path / "table2")
    pooling = "tiny-modernbert/lmk-fixed-32"
    mt = f"{pooling} (trained with {an.objective_label(other)})"
    assert list(choice.models) == [pooling, mt, f"{pooling} (lmk-fixed-32-st)"]
    assert choice.runs[pooling] == an.RunName(pooling, default)
    assert choice.runs[mt] == an.RunName(pooling, other) and choice.runs[mt].label == mt
    assert all(run.label == label for label, run in choice.runs.items())
    untrained = an.choose_models(table2_root=tmp_path / "empty", encoders=["tiny-modernbert"], poolings=["cls"])
    assert untrained.runs == {"tiny-modernbert/cls": an.RunName("tiny-modernbert/cls")}


def test_choose_models_falls_back_to_untrained_encoders(tmp_path: Path) -> None:
    choice = an.choose_models(table2_root=tmp_path / "empty", encoders=["tiny-modernbert"], poolings=["cls"])
    assert choice.source == "untrained" and choice.sweep_dir is None
    assert list(choice.models) == ["tiny-modernbert/cls"]
    assert "untrained fallback" in str(choice) and str(tmp_path / "empty") in str(choice)
    off = an.choose_models(prefer_trained=False, encoders=["tiny-modernbert"], poolings=["cls"])
    assert off.source == "untrained"


def test_split_length() -> None:
    assert an.split_length("test_256") == 256 and an.split_length("test_32768/en") == 32768
    assert an.split_length("test") is None and an.split_length("dev") is None


def test_length_scores_and_curves_known_values(sweeps) -> None:
    root, _ = sweeps
    scores = an.length_scores(root / "mini")
    assert set(scores["task"]) == {"LocalPasskey"}  # LocalShort has no length splits
    assert len(scores) == 12 and set(scores["row"]) == {"cls", "lmk-fixed-32"}
    assert set(scores["pooling"]) == {"cls", "lmk-fixed"}
    curves = an.length_curves(scores).set_index(["row", "length"])
    assert curves.loc[("cls", 256), "mean"] == pytest.approx(0.75)
    assert curves.loc[("cls", 512), "mean"] == pytest.approx(0.0)
    assert curves.loc[("lmk-fixed-32", 256), "count"] == 4
    assert curves.loc[("lmk-fixed-32", 512), "mean"] == pytest.approx(0.5)
    assert an.length_scores(root / "paper").empty  # unfinished runs are skipped
    fig = an.plot_length_scores(an.length_curves(scores))
    assert isinstance(fig, Figure)
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["cls", "lmk-fixed-32"]
    assert fig.axes[0].get_title() == "LocalPasskey"
    with pytest.raises(ValueError, match="empty"):
        an.plot_length_scores(an.length_curves(an.length_scores(root / "paper")))
    with pytest.raises(ValueError, match="not a sweep folder"):
        an.length_scores(root / "missing")


@pytest.mark.slow  # executes the notebook (about a minute on 2 cores)
def test_notebook_uses_the_latest_sweep_and_plots_score_vs_length(sweeps, tmp_path, monkeypatch) -> None:
    from lmk.analysis import notebooks as nbr

    root, _ = sweeps
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "nb"
    params = {"table2_root": str(root), "lengths": [64, 96], "n_docs": 3, "n_queries": 3, "n_inputs": 2,
              "n_bins": 5, "n_depth_bins": 2, "chunk_words": 12, "max_length": 96}
    argv = ["--out", str(out)] + [a for k, v in params.items() for a in ("--param", f"{k}={v!r}")]
    notebook = ROOT / "notebooks" / "attention_position_bias.ipynb"
    assert nbr.main([*argv, str(notebook)]) == 0
    executed = nbr.read(out / notebook.name)
    text = "".join(o.get("text", "") for c in executed.cells if c.cell_type == "code" for o in c.outputs)
    assert "Using the mini sweep, 2 trained runs: scale 'mini'" in text and str(root / "mini") in text
    figs = sorted(p.name for p in (out / f"{notebook.stem}_figures").glob("*.png"))
    assert {"score_vs_length.png", "winning_landmark.png"} <= set(figs) and len(figs) == 6


def _fake_run(sweep: Path, row: str, mtime: float, status: str = "done") -> None:
    """A run folder as the sweep picker sees it (results.json + a checkpoint file); nothing is loaded."""
    run = sweep / "train" / row
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.ckpt").write_bytes(b"")
    (run / "results.json").write_text(json.dumps({"status": status, "config": {"row": row}}))
    os.utime(run / "results.json", (mtime, mtime))


def test_notebook_picks_the_most_meaningful_scale_not_the_latest(tmp_path: Path) -> None:
    root = tmp_path / "table2"
    _fake_run(root / "mini", "cls", mtime=1_000)
    _fake_run(root / "rehearsal", "cls", mtime=2_000)   # newer, but random weights: its numbers mean nothing
    _fake_run(root / "tiny", "cls", mtime=3_000)
    _fake_run(root / "paper", "cls", mtime=4_000, status="running")  # unfinished: not a candidate
    assert an.pick_table2_sweep(root) == root / "mini"
    assert an.pick_table2_sweep(root, scale="rehearsal") == root / "rehearsal"
    _fake_run(root / "mini-seeds", "cls", mtime=1_500)  # a second mini sweep, newer: newest within the scale
    assert an.sweep_scale(root / "mini-seeds") == "mini" and an.pick_table2_sweep(root) == root / "mini-seeds"
    with pytest.raises(ValueError, match="SCALE=paper"):
        an.pick_table2_sweep(root, scale="paper")
    assert an.pick_table2_sweep(tmp_path / "none") is None


def test_choice_names_its_scale_and_runs_in_every_title(sweeps) -> None:
    root, _ = sweeps
    write_run(root / "rehearsal" / "train" / "cls", "cls", "cls", PER_QUERY["cls"])  # newest: still not chosen
    choice = an.choose_models(table2_root=root)
    assert choice.scale == "mini" and str(choice).startswith("scale 'mini'")
    assert choice.title("attention") == "attention [mini sweep, 2 trained runs]"
    named = an.choose_models(table2_root=root, scale="rehearsal")
    assert named.sweep_dir == root / "rehearsal" and "named by `scale`" in str(named)


def test_make_notebooks_passes_scale_only_when_named() -> None:
    env = {k: v for k, v in os.environ.items() if k != "SCALE"}
    named = subprocess.run(["make", "-n", "notebooks", "SCALE=rehearsal"], cwd=ROOT, env=env, capture_output=True,
                           text=True, check=True).stdout
    default = subprocess.run(["make", "-n", "notebooks"], cwd=ROOT, env=env, capture_output=True, text=True,
                             check=True).stdout
    assert "--param scale=rehearsal" in named and "--param scale" not in default


def test_length_scores_carry_the_needle_depth_a_task_records(tmp_path: Path) -> None:
    run = tmp_path / "sweep" / "train" / "lmk"
    run.mkdir(parents=True)
    (run / "per_query.json").write_text(json.dumps({"RulerNiahSingle": {"test_512": {"512_q000": 1, "512_q001": 0}},
                                                    "LocalPasskey": {"test_256": {"q0": 1}}}))
    depths = {"test_512": {"512_q000": 0.0, "512_q001": 0.5}}
    (run / "results.json").write_text(json.dumps({"status": "done", "config": {"pooling": {"name": "lmk-fixed"}},
                                                  "eval": {"per_query": "per_query.json", "tasks": {
                                                      "RulerNiahSingle": {"data": {"query_depths": depths}}}}}))
    scores = an.length_scores(tmp_path / "sweep").set_index(["task", "query_id"])
    assert scores.loc[("RulerNiahSingle", "512_q001"), "depth"] == 0.5
    assert scores.loc[("RulerNiahSingle", "512_q000"), ["length", "score"]].tolist() == [512, 1.0]
    assert np.isnan(scores.loc[("LocalPasskey", "q0"), "depth"])  # a task that records no depth
