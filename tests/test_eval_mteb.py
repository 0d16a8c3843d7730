"""The adapter on real models (minilm-l6, tiny-modernbert) through real `mteb.evaluate` on local tasks."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from lmk.config.eval import EvalConfig  # noqa: E402
from lmk.data.retrieval import RetrievalCorpus  # noqa: E402
from lmk.eval.encoder import LmkEncoder  # noqa: E402
from lmk.eval.runner import run_suite  # noqa: E402
from lmk.eval.score_stats import load_per_query, paired_ttest  # noqa: E402
from lmk.eval.tasks import LocalNeedle, LocalPasskey, LocalShort, build_local_task  # noqa: E402
from lmk.model.embedding import EmbeddingModel  # noqa: E402

CONF = Path(__file__).resolve().parents[1] / "conf"
TEXTS = [
    "the cat sat on the warm mat near the kitchen door",
    "stock markets fell sharply after the central bank raised interest rates",
    "a recipe for apple pie with cinnamon, butter and a crisp crust",
    "the rocket launched into orbit carrying two weather satellites",
    "volcanic ash closed airports across northern europe for a week",
    "the violinist practised scales every morning before breakfast",
]


def build(encoder: str, pooling: str = "lmk-fixed") -> EmbeddingModel:
    return EmbeddingModel.build(OmegaConf.load(CONF / "encoder" / f"{encoder}.yaml"),
                                OmegaConf.load(CONF / "pooling" / f"{pooling}.yaml"))


@pytest.fixture(scope="module")
def minilm() -> EmbeddingModel:
    return build("minilm-l6")


@pytest.fixture(scope="module")
def tiny() -> EmbeddingModel:
    return build("tiny-modernbert")


def corpus(queries: list[str], docs: list[str], name: str = "planted", split: str = "test") -> RetrievalCorpus:
    return RetrievalCorpus.from_records(
        name, split,
        [{"id": f"d{i}", "text": t} for i, t in enumerate(docs)],
        [{"id": f"q{i}", "text": t} for i, t in enumerate(queries)],
        {f"q{i}": {f"d{i}": 1} for i in range(len(queries))},
    )


def cfg(**kw) -> EvalConfig:
    base = {"name": "test", "tasks": ["LocalShort"], "query_max_length": 128, "passage_max_length": 128,
            "batch_size": 8, "show_progress": False}
    base.update(kw)
    return EvalConfig(**base)


def test_identical_query_and_document_scores_one(minilm: EmbeddingModel, tmp_path: Path) -> None:
    rc = corpus(TEXTS, TEXTS)
    section = run_suite(minilm, cfg(), tmp_path / "mteb_cache", tasks=[LocalShort({"test": rc})])
    entry = dict(section["tasks"]["LocalShort"])
    landmarks = entry.pop("landmarks")
    assert entry == {"main_score": pytest.approx(1.0), "metric": "ndcg_at_10", "splits": {"test": pytest.approx(1.0)}}
    # each text is under 32 tokens: one chunk, one landmark, on both sides (the texts the task encoded)
    for side in ("query", "passage"):
        assert landmarks["test"][side] == {"texts": 6, "landmarks": {"mean": 1.0, "median": 1.0, "min": 1, "max": 1},
                                           "single_landmark_share": 1.0, "truncated_share": 0.0}
    per_query = json.loads((tmp_path / "per_query.json").read_text())
    assert per_query["LocalShort"]["test"] == {f"q{i}": pytest.approx(1.0) for i in range(len(TEXTS))}
    assert section["model"].startswith("lmk/minilm-l6__lmk-fixed-32__")


def test_indistinguishable_documents_score_chance(minilm: EmbeddingModel, tmp_path: Path) -> None:
    # Every document (and query) is the same text: one shared ranking, so the N relevant documents
    # occupy ranks 1..N once each -> Acc@1 = 1/N and nDCG@10 = mean(1/log2(r+1)), the random-ranking value.
    n = 6
    same = "an ordinary sentence about nothing in particular"
    emb = minilm.encode([same] * n)
    assert np.unique(emb, axis=0).shape[0] == 1  # the premise: the embeddings are constant
    rc = corpus([same] * n, [same] * n, split="test_256")
    section = run_suite(minilm, cfg(tasks=["LocalPasskey", "LocalShort"]), tmp_path / "mteb_cache",
                        tasks=[LocalPasskey({"test_256": rc}), LocalShort({"test": rc})])
    assert section["tasks"]["LocalPasskey"]["main_score"] == pytest.approx(1 / n, abs=1e-4)  # mteb rounds to 5 dp
    expected = np.mean([1 / math.log2(r + 1) for r in range(1, n + 1)])
    assert section["tasks"]["LocalShort"]["main_score"] == pytest.approx(expected, abs=1e-4)


def test_resume_from_cache_encodes_nothing(minilm: EmbeddingModel, tmp_path: Path) -> None:
    rc = corpus(TEXTS[:4], TEXTS[2:] + TEXTS[:2])  # a shuffled corpus: not all 1.0
    cache = tmp_path / "mteb_cache"

    def tasks(lengths: list[int]) -> list:
        return [LocalShort({"test": rc}), LocalNeedle({f"test_{n}": rc for n in lengths})]

    c = cfg(tasks=["LocalShort", "LocalNeedle"], lengths=[256, 512], groups={"all": ["LocalShort", "LocalNeedle"]})
    first = run_suite(minilm, c, cache, tasks=tasks([256]))  # a "crash" after one length split
    assert first["n_encoded"] > 0
    second = run_suite(minilm, c, cache, tasks=tasks([256, 512]))
    # only the missing split was computed: 4 queries + 6 documents
    assert second["n_encoded"] == 10
    third = run_suite(minilm, c, cache, tasks=tasks([256, 512]))
    assert third["n_encoded"] == 0  # everything from the cache
    assert third["tasks"] == second["tasks"] and third["groups"] == second["groups"]
    # the landmark statistics of tasks read back from the cache are the ones recorded when they were encoded
    assert set(third["tasks"]["LocalNeedle"]["landmarks"]) == {"test_256", "test_512"}
    assert set(third["tasks"]["LocalNeedle"]["splits"]) == {"test_256", "test_512"}
    # per-query scores survive the resume
    pq = load_per_query(tmp_path)
    assert set(pq["LocalNeedle"]) == {"test_256", "test_512"} and len(pq["LocalShort"]["test"]) == 4
    # a variant (other max length) never shares the cache
    other = run_suite(minilm, cfg(tasks=["LocalShort"], passage_max_length=64), cache, tasks=[LocalShort({"test": rc})])
    assert other["n_encoded"] > 0


def test_regenerated_data_is_never_scored_from_a_stale_cache(minilm: EmbeddingModel, tmp_path: Path) -> None:
    cache = tmp_path / "mteb_cache"
    good = run_suite(minilm, cfg(), cache, tasks=[LocalShort({"test": corpus(TEXTS, TEXTS)})])
    assert good["tasks"]["LocalShort"]["main_score"] == pytest.approx(1.0)
    # same task name, other data (queries point at the wrong documents): must be recomputed
    wrong = corpus(TEXTS, TEXTS[1:] + TEXTS[:1])
    again = run_suite(minilm, cfg(), cache, tasks=[LocalShort({"test": wrong})])
    assert again["n_encoded"] > 0
    assert again["tasks"]["LocalShort"]["main_score"] < 0.9


def test_adapter_metadata_and_sides(tiny: EmbeddingModel) -> None:
    enc = LmkEncoder(tiny, query_max_length=64, passage_max_length=8192)
    meta = enc.mteb_model_meta
    assert meta.name == f"lmk/tiny-modernbert__lmk-fixed-32__{tiny.fingerprint()}"
    assert meta.revision == tiny.fingerprint()
    assert meta.embed_dim == tiny.hidden_size and meta.max_tokens == 8192
    assert meta.experiment_kwargs == {"qlen": 64, "plen": 8192}
    assert enc.side("query") == "query" and enc.side("document") == "passage" and enc.side(None) == "passage"
    assert enc.max_length("query") == 64 and enc.max_length("document") == 8192
    mean = LmkEncoder(tiny.with_pooling(OmegaConf.load(CONF / "pooling" / "mean.yaml")))
    assert mean.mteb_model_meta.name != meta.name  # two poolings never share a cache entry
    with pytest.raises(ValueError, match="batch_size"):
        LmkEncoder(tiny, batch_size=0)


def test_generated_passkey_needle_on_tiny_modernbert_and_truncation(tiny: EmbeddingModel, minilm: EmbeddingModel,
                                                                    tmp_path: Path) -> None:
    c = cfg(tasks=["LocalPasskey", "LocalNeedle"], lengths=[256, 512], n_docs=4, n_queries=2,
            query_max_length=64, passage_max_length=128,
            groups={"local-longembed": ["LocalPasskey", "LocalNeedle"]})
    tasks = [build_local_task("LocalPasskey", c), build_local_task("LocalNeedle", c)]
    assert list(tasks[0].eval_splits) == ["test_256", "test_512"]
    assert tasks[0].metadata.main_score == "ndcg_at_1"
    section = run_suite(tiny, c, tmp_path / "tiny" / "mteb_cache", tasks=tasks)
    for name in ("LocalPasskey", "LocalNeedle"):
        entry = section["tasks"][name]
        assert set(entry["splits"]) == {"test_256", "test_512"}
        assert 0.0 <= entry["main_score"] <= 1.0
        assert entry["main_score"] == pytest.approx(np.mean(list(entry["splits"].values())), abs=1e-4)
    assert section["groups"]["local-longembed"] == pytest.approx(
        np.mean([section["tasks"][t]["main_score"] for t in ("LocalPasskey", "LocalNeedle")]), abs=1e-4)
    # 256-word documents do not fit 128 tokens: truncated and counted, never a crash
    assert section["n_truncated"] >= 8
    # two models on the same queries -> a paired t-test over their per-query scores
    other = run_suite(minilm, c, tmp_path / "minilm" / "mteb_cache", tasks=tasks)
    res = paired_ttest(load_per_query(tmp_path / "tiny"), load_per_query(tmp_path / "minilm"))
    assert res["n"] == 8  # 2 tasks x 2 lengths x 2 queries
    assert res["mean_a"] == pytest.approx(np.mean([section["tasks"][t]["main_score"] for t in section["tasks"]]), abs=1e-4)
    assert other["tasks"].keys() == section["tasks"].keys()
