"""The per-landmark view of MaxSim (lmk.analysis.landmark_winners, lmk.eval.maxsim.maxsim_winners): which document
landmark wins a needle query's MaxSim, against the landmark of the chunk that holds the needle."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from lmk import analysis as an  # noqa: E402
from lmk.config import TrainSection, registry  # noqa: E402
from lmk.eval.maxsim import maxsim_scores, maxsim_winners  # noqa: E402
from lmk.model.embedding import EmbeddingModel  # noqa: E402

CONF = Path(__file__).resolve().parents[1] / "conf"


@pytest.fixture(scope="module")
def tiny() -> EmbeddingModel:
    return EmbeddingModel.build(OmegaConf.load(CONF / "encoder" / "tiny-modernbert.yaml"),
                                OmegaConf.load(CONF / "pooling" / "lmk-fixed.yaml")).eval()


def test_the_winners_maxima_add_up_to_the_maxsim_score() -> None:
    gen = torch.Generator().manual_seed(0)
    q, d = (torch.nn.functional.normalize(torch.randn(n, 8, generator=gen), dim=-1) for n in (3, 5))
    index, best = maxsim_winners(q, d)
    assert index.shape == (3,) and ((0 <= index) & (index < 5)).all()
    assert np.allclose(best, (q @ d.T).numpy()[np.arange(3), index])
    assert float(best.sum()) == pytest.approx(float(maxsim_scores([q], [d])[0, 0]), abs=1e-6)
    with pytest.raises(ValueError, match="at least one vector"):
        maxsim_winners(q, d[:0])


def test_the_needle_landmark_closes_the_chunk_that_holds_the_needle(tiny: EmbeddingModel) -> None:
    corpora = an.needle_corpora([512], 6, depths=[0.0, 0.3, 0.6, 1.0])
    found = 0
    for doc in corpora[512].corpus:
        index, n = an.needle_landmark(tiny, doc["text"], doc["offset"], doc["needle"], 512)
        feats = tiny.tokenize([doc["text"]], side="passage", max_length=512)
        pooled = np.flatnonzero(feats["pool_mask"][0].numpy())
        assert n == len(pooled)
        if index is None:  # the needle is cut away (or in the last, unclosed chunk)
            continue
        found += 1
        start = 0 if index == 0 else pooled[index - 1]
        chunk = tiny.tokenizer.decode(feats["input_ids"][0][start:pooled[index] + 1])
        key = doc["keys"][0].lower()
        # the chunk holds the needle's middle (the key is its 6th of 9 words, at most a few tokens off)
        assert "magic" in chunk or key in chunk, (chunk, doc["needle"])
    assert found >= 3
    # cut away by truncation: no landmark
    deep = next(d for d in corpora[512].corpus if d["target_depth"] == 1.0)
    assert an.needle_landmark(tiny, deep["text"], deep["offset"], deep["needle"], 64)[0] is None


def test_winning_landmarks_are_valid_indices_and_the_share_a_fraction(tiny: EmbeddingModel) -> None:
    cls = tiny.with_pooling(OmegaConf.load(CONF / "pooling" / "cls.yaml"))
    corpora = an.needle_corpora([256], 4, depths=[0.0, 0.5])
    frame = an.winning_landmarks({"lmk": tiny, "cls": cls}, corpora, max_length=256)
    assert set(frame["model"]) == {"lmk"} and len(frame) == 4  # CLS has no landmark states: skipped
    assert ((frame["winner"] >= 0) & (frame["winner"] < frame["n_landmarks"])).all()
    seen = frame.dropna(subset=["needle_landmark"])
    assert len(seen) == 4 and (seen["distance"] == seen["winner"] - seen["needle_landmark"]).all()
    share = an.near_needle_share(frame)["lmk"]
    assert 0.0 <= share <= 1.0
    assert share == pytest.approx(float((seen["distance"].abs() <= 1).mean()))
    fig = an.plot_winning_landmarks(frame, an.near_needle_share(frame))
    assert len(fig.axes) == 1


def test_the_frame_names_each_models_pooling_and_objective_and_the_two_trainings_go_side_by_side(
        tiny: EmbeddingModel) -> None:
    default = TrainSection.objective
    other = next(o for o in registry.declared_objectives() if o != default)
    runs = {"a": an.RunName("tiny/lmk-fixed", default), "b": an.RunName("tiny/lmk-fixed", other)}
    corpora = an.needle_corpora([256], 4, depths=[0.0, 0.5])
    frame = an.winning_landmarks({"b": tiny, "a": tiny, "c": tiny}, corpora, runs=runs, max_length=256)
    untrained = an.RunName("c").objective  # a model not in `runs`: its label, untrained
    assert frame.groupby("model")["objective"].unique().map(list).to_dict() == {
        "a": [default], "b": [other], "c": [untrained]}
    assert frame.groupby("model")["pooling"].first().to_dict() == {"a": "tiny/lmk-fixed", "b": "tiny/lmk-fixed",
                                                                   "c": "c"}
    assert untrained not in (default, other)
    assert an.objective_order(frame) == [default, other, untrained]  # the schema's default first
    # one model under two trainings: the same winners, so both columns of the table agree with near_needle_share
    table = an.winners_by_objective(frame)
    share = an.near_needle_share(frame)["a"]
    row = table.loc["tiny/lmk-fixed"]
    assert row[("within +/-1", an.objective_label(default))] == pytest.approx(share)
    assert row[("within +/-1", an.objective_label(other))] == pytest.approx(share)
    gap = float(frame[frame.model == "a"].dropna(subset=["needle_landmark"])["distance"].abs().mean())
    assert row[("mean |distance|", an.objective_label(other))] == pytest.approx(gap)
    fig = an.plot_winning_landmarks_by_objective(frame[frame.model != "c"])
    assert len(fig.axes) == 2  # one pooling, a panel per objective
    assert [ax.get_title().split("\n")[1].split(":")[0] for ax in fig.axes] == [
        an.objective_label(default), an.objective_label(other)]
    assert fig.axes[0].get_title().endswith(f"{100 * share:.0f}% within +/-1")
    # one objective only: the per-model figure
    assert len(an.plot_winning_landmarks_by_objective(frame[frame.model == "a"]).axes) == 1


def test_the_side_by_side_figure_and_table_on_a_known_frame() -> None:
    default = TrainSection.objective
    other = next(o for o in registry.declared_objectives() if o != default)
    rows = [  # pooling p: both trainings; pooling q: the default only
        ("p", other, 2, 2), ("p", other, 3, 6), ("p", default, 1, 4), ("p", default, 0, 0),
        ("q", default, 1, 2), ("q", default, np.nan, 5),
    ]
    frame = pd.DataFrame([{"model": f"{p} {o}", "pooling": p, "objective": o, "length": 256, "query_id": str(i),
                           "depth": 0.5, "n_landmarks": 8, "needle_landmark": n, "winner": w, "distance": w - n}
                          for i, (p, o, n, w) in enumerate(rows)])
    table = an.winners_by_objective(frame)
    assert list(table.index) == ["p", "q"]
    near, gap = table["within +/-1"], table["mean |distance|"]
    assert list(near.columns) == [an.objective_label(default), an.objective_label(other)]
    assert near.loc["p", an.objective_label(default)] == 0.5 and near.loc["p", an.objective_label(other)] == 0.5
    assert near.loc["q", an.objective_label(default)] == 1.0 and np.isnan(near.loc["q", an.objective_label(other)])
    assert gap.loc["p", an.objective_label(default)] == 1.5 and gap.loc["p", an.objective_label(other)] == 1.5
    assert gap.loc["q", an.objective_label(default)] == 1.0  # the needle cut away (NaN) is left out
    fig = an.plot_winning_landmarks_by_objective(frame, title="t")
    assert len(fig.axes) == 4 and fig.get_suptitle() == "t"  # poolings x objectives
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[0] == f"p\n{an.objective_label(default)}: 50% within +/-1"
    assert titles[3] == f"q: not trained with {an.objective_label(other)}" and not fig.axes[3].axison
    assert all(ax.axison for ax in fig.axes[:3])


def test_labels_of_runs_that_differ_only_in_objective_differ() -> None:
    default = TrainSection.objective
    others = [o for o in registry.declared_objectives() if o != default]
    assert others  # the schema declares a second objective
    assert an.RunName("enc/lmk-fixed-32", default).label == "enc/lmk-fixed-32"  # the default: as before
    assert an.RunName("enc/lmk-fixed-32").label == "enc/lmk-fixed-32"  # untrained
    labels = {an.RunName("enc/lmk-fixed-32", o).label for o in [default, *others]}
    assert len(labels) == 1 + len(others)
    for o in others:
        assert an.objective_label(o) in an.RunName("enc/lmk-fixed-32", o).label
