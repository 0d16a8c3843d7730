"""The per-landmark view of MaxSim (lmk.analysis.landmark_winners, lmk.eval.maxsim.maxsim_winners): which document
landmark wins a needle query's MaxSim, against the landmark of the chunk that holds the needle."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from lmk import analysis as an  # noqa: E402
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
