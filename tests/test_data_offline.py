"""Offline default training set (docstrings), its cache, the held-out short task, the long-doc task, hub."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from lmk.data import offline_pairs as op  # noqa: E402

MAX_ROWS = 400


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("lmk_cache")


def test_build_small_set(cache):
    train = op.load_offline_pairs("train", max_rows=MAX_ROWS, cache_dir=cache)
    test = op.load_offline_pairs("test", max_rows=MAX_ROWS, cache_dir=cache)
    assert train.num_rows + test.num_rows == MAX_ROWS and test.num_rows > 0 and train.num_rows > test.num_rows
    for r in train.select(range(50)):
        assert len(r["query"].split()) >= 4 and len(r["pos"][0].split()) >= 20
        assert len(r["neg"]) == op.N_NEGATIVES and r["pos"][0] not in r["neg"]
    # no test passage or query leaks into training
    train_texts = set(train["query"]) | {p for ps in train["pos"] for p in ps} | {n for ns in train["neg"] for n in ns}
    assert not (set(test["query"]) | {p for ps in test["pos"] for p in ps}) & train_texts
    assert len(set(train["query"])) == train.num_rows  # deduplicated
    report = op.offline_report(cache_dir=cache, max_rows=MAX_ROWS)
    assert report["rows"] == {"train": train.num_rows, "test": test.num_rows} and report["build_s"] > 0


def test_corrupt_cache_is_rebuilt(cache):
    folder = op.ensure_offline_pairs(cache, max_rows=MAX_ROWS)
    shard = folder / "data" / "train-00000-of-00001.parquet"
    good = shard.read_bytes()
    stamp = (folder / "meta.json").stat().st_mtime_ns
    time.sleep(0.01)
    assert op.ensure_offline_pairs(cache, max_rows=MAX_ROWS) == folder
    assert (folder / "meta.json").stat().st_mtime_ns == stamp  # intact: not rebuilt
    shard.write_bytes(good[: len(good) // 2])  # truncated
    assert op.check_cache(folder, op.offline_fingerprint(max_rows=MAX_ROWS)) == (
        "data/train-00000-of-00001.parquet truncated or modified")
    ds = op.load_offline_pairs("train", max_rows=MAX_ROWS, cache_dir=cache)
    meta = json.loads((folder / "meta.json").read_text())
    assert shard.read_bytes() == good and ds.num_rows == meta["files"]["data/train-00000-of-00001.parquet"]["rows"]
    meta = json.loads((folder / "meta.json").read_text())
    meta["fingerprint"] = "0" * 16
    (folder / "meta.json").write_text(json.dumps(meta))
    assert op.check_cache(folder, op.offline_fingerprint(max_rows=MAX_ROWS)) == "fingerprint mismatch"
    op.load_offline_pairs("test", max_rows=MAX_ROWS, cache_dir=cache)
    assert op.check_cache(folder, op.offline_fingerprint(max_rows=MAX_ROWS)) is None


def test_short_corpus_held_out(cache):
    c = op.offline_short_corpus(n_queries=20, seed=0, cache_dir=cache, max_rows=MAX_ROWS)
    train = op.load_offline_pairs("train", max_rows=MAX_ROWS, cache_dir=cache)
    assert c.queries.num_rows == 20 and c.split == "test"
    assert not set(c.corpus["text"]) & {p for ps in train["pos"] for p in ps}
    assert not set(c.queries["text"]) & set(train["query"])
    for q in c.queries:
        assert len(c.relevant(q["id"])) == 1
    again = op.offline_short_corpus(n_queries=20, seed=0, cache_dir=cache, max_rows=MAX_ROWS)
    assert again.queries["text"] == c.queries["text"]


def test_local_source_in_datamodule(cache):
    from lmk.data.pairs import load_pairs

    ds = load_pairs({"path": "local"}, cache_dir=str(cache), max_rows=MAX_ROWS)
    assert ds["query"] == op.load_offline_pairs("train", max_rows=MAX_ROWS, cache_dir=cache)["query"]
    assert set(ds.column_names) >= {"query", "pos", "neg", "pos_scores", "neg_scores"}


def test_split_docstring():
    assert op.split_docstring("Short.\n\nBody " * 3) is None  # summary too short
    s = op.split_docstring("Return the sum of the squares of a list.\n\n" + "Body text goes here. " * 10)
    assert s is not None and s[0] == "Return the sum of the squares of a list."


def test_longdoc_corpus():
    from lmk.data.longdocs import build_longdoc_corpus

    c = build_longdoc_corpus(n_docs=12, seed=1)
    assert c.corpus.num_rows == 12 and 1 <= c.queries.num_rows <= 12
    texts = dict(zip(c.corpus["id"], c.corpus["text"], strict=True))
    norm = {d: " ".join(t.lower().split()) for d, t in texts.items()}
    for q in c.queries:
        (doc,) = c.relevant(q["id"])
        s = " ".join(q["text"].lower().split())
        assert [d for d, t in norm.items() if s in t] == [doc]  # the summary is in its file only
    assert build_longdoc_corpus(n_docs=12, seed=1).queries["text"] == c.queries["text"]


def test_hub_loaders_offline_error_is_clear(monkeypatch):
    from lmk.data import hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(hub.HubUnavailableError, match="generate_passkey"):
        hub.load_longembed("passkey")
    with pytest.raises(hub.HubUnavailableError, match="build_longdoc_corpus"):
        hub.load_mldr("en")
    with pytest.raises(ValueError, match="allowed values"):
        hub.load_longembed("nope")


def test_prose_corpus_is_deterministic_long_and_each_answer_is_in_its_document_only():
    from lmk.data import prose

    c = prose.build_prose_corpus(n_docs=20, seed=1)
    again = prose.build_prose_corpus(n_docs=20, seed=1)
    assert c.corpus["id"] == again.corpus["id"] and c.queries["text"] == again.queries["text"]
    assert prose.build_prose_corpus(n_docs=20, seed=2).corpus["id"] != c.corpus["id"]  # the seed picks the sample
    assert c.corpus.num_rows == 20 and c.queries.num_rows == 20
    assert min(len(t) for t in c.corpus["text"]) >= 2_000  # longer than the mini suite's 512 tokens
    norm = {d: " ".join(t.lower().split()) for d, t in zip(c.corpus["id"], c.corpus["text"], strict=True)}
    for q in c.queries:
        (doc,) = c.relevant(q["id"])
        s = " ".join(q["text"].lower().split())
        assert [d for d, t in norm.items() if s in t] == [doc]  # a local span of its document, of no other
    with pytest.raises(ValueError, match="allowed values: 1.."):
        prose.build_prose_corpus(n_docs=10_000)


def test_top_hits_orders_by_score_and_gives_a_tie_to_the_lower_index():
    scores = np.array([0.5, 2.0, 0.5, 3.0, 2.0, 0.5, 0.0], dtype=np.float32)
    assert op.top_hits(scores, 4).tolist() == [3, 1, 4, 0]
    assert op.top_hits(scores, 6).tolist() == [3, 1, 4, 0, 2, 5]
    assert op.top_hits(scores, 99).tolist() == [3, 1, 4, 0, 2, 5, 6]
    assert op.top_hits(np.zeros(5, dtype=np.float32), 3).tolist() == [0, 1, 2]


_TIED = ([f"topic {i % 7} retrieval" for i in range(40)],
         [f"topic {i % 7} shared words here about retrieval" + " extra" * (i % 3) for i in range(400)])
_MINE = f"import json; from lmk.data import offline_pairs as op; print(json.dumps(op.mine_negatives(*{_TIED!r}, 4, 0)))"


def test_mined_negatives_are_the_same_on_every_simd_target_numpy_dispatches_to():
    """Scores with many ties (400 documents in 7 near-duplicate groups): the negatives mined in this process and in
    one whose numpy may use no AVX-512 (`NPY_DISABLE_CPU_FEATURES`) are the same. bm25s's own top-k gave other
    negatives on the two (an AVX2 and an AVX-512 machine trained other tables from the same code)."""
    from numpy._core import _multiarray_umath as umath  # the targets this CPU has beyond the baseline

    wide = [f for f in ("X86_V4", "AVX512_ICL", "AVX512_SPR") if umath.__cpu_features__.get(f)]
    here = op.mine_negatives(*_TIED, 4, 0)
    assert all(len(negs) == 4 and i not in negs for i, negs in enumerate(here))
    if not wide:
        pytest.skip("this CPU has no AVX-512: numpy has one sort kernel here, nothing to compare")
    env = {**os.environ, "NPY_DISABLE_CPU_FEATURES": " ".join(wide)}
    proc = subprocess.run([sys.executable, "-c", _MINE], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == here
