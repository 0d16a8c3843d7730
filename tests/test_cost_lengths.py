"""The cost model at the texts' token lengths (lmk.sweep.cost.lengths, paths, measured): a training source's lengths
measured by the row's landmark tokenizer and cached, the shipped profile where the source is not on disk, and the
expected cost of each batching path (padded >= batch longest >= token-budget >= packed; all equal when every text
has the max length)."""

from __future__ import annotations

import numpy as np
import pytest

from lmk.data.pairs import load_pairs
from lmk.model.backbone import shipped_config
from lmk.model.landmark.tokenization import LandmarkTokenizer
from lmk.model.shape import EncoderShape
from lmk.sweep.cost import (
    job_path,
    laid_out,
    maxsim_flops,
    measure_source,
    objective,
    profile_lengths,
    side_flops,
    step_flops,
    token_budget,
)

BASE = EncoderShape.from_config(shipped_config("modernbert-base"))
ROWS = 40


def _cost(n: np.ndarray) -> np.ndarray:
    n = np.asarray(n, dtype=np.float64)
    return n * BASE.train_flops_per_token(1.0) + 4 * n * n * BASE.q_dim * BASE.layers  # linear + quadratic part


def test_measured_lengths_of_the_offline_set_are_the_tokenizers_and_are_cached(minilm_tokenizer, tmp_path,
                                                                               monkeypatch) -> None:
    tok = LandmarkTokenizer(minilm_tokenizer, strategy="fixed", chunk_size=8)
    key = {"source": "local:train", "tokenizer": "minilm", "pooling": {"strategy": "fixed", "chunk_size": 8}}
    first = measure_source({"path": "local"}, tok, key, 32, 128, group_size=4, rows=ROWS, cache_dir=tmp_path)
    # the same rows, one text at a time: tokens = attention mask of the row's own layout (landmarks counted)
    rows = []
    for row in load_pairs("local", streaming=True):
        if len(rows) == ROWS:
            break
        rows.append(row)
    want_q = [int(tok([r["query"]], train=True, max_length=32)["attention_mask"].sum()) for r in rows]
    texts = [p for r in rows for p in [*r["pos"][:1], *r["neg"][:3]]]
    want_p = [int(tok([t], train=True, max_length=128)["attention_mask"].sum()) for t in texts]
    assert first.kind == "measured" and not first.cached
    assert first.queries.tolist() == want_q and first.passages.tolist() == want_p
    assert first.passages.max() <= 128 and first.passages.mean() > first.queries.mean()
    # landmarks count: the same texts without them are shorter
    plain = measure_source({"path": "local"}, LandmarkTokenizer(minilm_tokenizer, strategy="none"),
                           {**key, "pooling": {"strategy": "none"}}, 32, 128, 4, rows=ROWS, cache_dir=tmp_path)
    assert plain.passages.sum() < first.passages.sum()

    def no_tokenizing(*args, **kwargs):
        raise AssertionError("a cached source is measured again")

    monkeypatch.setattr("lmk.sweep.cost.lengths.measure_rows", no_tokenizing)
    again = measure_source({"path": "local"}, tok, key, 32, 128, group_size=4, rows=ROWS, cache_dir=tmp_path)
    assert again.cached and sorted(again.queries) == sorted(want_q) and sorted(again.passages) == sorted(want_p)
    assert len(list((tmp_path / "token-lengths").glob("*.json"))) == 2


def test_the_profile_stands_in_for_msmarco_and_says_so() -> None:
    src = {"path": "cfli/bge-full-data", "data_files": "data/msmarco_passage-*.parquet"}
    prof = profile_lengths(src, {"strategy": "none"}, 128, 512)
    assert prof is not None and prof.kind == "profile" and "not a measurement" in prof.source and "mteb" in prof.source
    # mteb's MSMARCO statistics: 335.8 characters a passage, 33.3 a query, at 4 characters a token (+ CLS, SEP)
    assert prof.passages.mean() == pytest.approx(335.8 / 4 + 2, rel=0.05)
    assert prof.queries.mean() == pytest.approx(33.26 / 4 + 2, rel=0.1)
    assert profile_lengths({"path": "someone/else"}, {"strategy": "none"}, 128, 512) is None
    fixed = profile_lengths(src, {"strategy": "fixed", "chunk_size": 32}, 128, 512)
    assert fixed.passages.mean() > prof.passages.mean()  # landmarks are tokens too


def test_the_landmark_arithmetic_matches_the_tokenizer(minilm_tokenizer) -> None:
    for strategy, chunk in (("fixed", 32), ("none", 32), ("multi_cls", 16)):
        tok = LandmarkTokenizer(minilm_tokenizer, strategy=strategy, chunk_size=chunk)
        for n in (5, 40, 100):
            real = int(tok([" ".join(["word"] * n)], train=True, max_length=512)["attention_mask"].sum())
            assert laid_out(np.array([n]), {"strategy": strategy, "chunk_size": chunk}, 512)[0] == real


def test_sorted_mini_batches_cost_at_most_padding_and_the_same_when_every_length_is_equal() -> None:
    rng = np.random.default_rng(0)
    equal = side_flops(np.full(100, 512), 256, 512, _cost, 32, None, rng)
    assert equal["padded"] == pytest.approx(equal["batch"]) == pytest.approx(equal["sorted"])
    assert equal["packed"] == pytest.approx(equal["padded"])
    sample = rng.integers(20, 400, size=1000)
    for chunk, max_tokens in ((32, None), (None, 4096), (None, None)):
        paths = side_flops(sample, 256, 512, _cost, chunk, max_tokens, np.random.default_rng(1))
        assert paths["packed"] <= paths["sorted"] <= paths["batch"] < paths["padded"]


def test_the_jobs_path_objective_and_the_maxsim_score_cost() -> None:
    c = {"data": {"batch_size": 4, "group_size": 2, "query_max_length": 16, "passage_max_length": 64},
         "train": {"grad_cache": True, "grad_cache_chunk": 2}, "pooling": {"strategy": "fixed", "chunk_size": 8}}
    assert job_path(c) == "batch" and token_budget(c) is None and objective(c) == "single"
    limited = {**c, "train": {**c["train"], "grad_cache_tokens": 128}}
    assert job_path(limited) == "sorted" and token_budget(limited) == 128
    q, p = np.full(50, 10), np.full(50, 40)
    single = step_flops(c, BASE, lambda n: BASE.train_flops_per_token(n), q, p, gpus=2)
    maxsim = {**c, "train": {**c["train"], "objective": "maxsim", "gather_across_devices": True}}
    assert objective(maxsim) == "maxsim"
    extra = maxsim_flops(maxsim, q, p, 2, BASE.hidden)
    assert extra == pytest.approx(3 * 2 * BASE.hidden * 4 * (4 * 2 * 2) * 1 * 4)  # 1 query, 4 passage landmarks
    both = step_flops(maxsim, BASE, lambda n: BASE.train_flops_per_token(n), q, p, gpus=2)
    assert all(both[k] == pytest.approx(single[k] + extra) for k in single)
