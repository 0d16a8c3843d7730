"""A corrupt evaluation cache file: said, moved aside, and its task recomputed (any overwrite)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from lmk.config.eval import EvalConfig
from lmk.data.retrieval import RetrievalCorpus
from lmk.eval.runner import run_suite
from lmk.eval.tasks import LocalShort
from lmk.model.embedding import EmbeddingModel

CONF = Path(__file__).resolve().parents[1] / "conf"
TEXTS = ["the cat sat on the warm mat", "stock markets fell after the rate rise", "a recipe for apple pie",
         "the rocket launched into orbit", "volcanic ash closed airports", "the violinist practised scales"]


@pytest.fixture(scope="module")
def model() -> EmbeddingModel:
    enc = OmegaConf.load(CONF / "encoder" / "tiny-modernbert.yaml")
    enc.config_overrides.update(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=32)
    return EmbeddingModel.build(enc, OmegaConf.load(CONF / "pooling" / "lmk-fixed.yaml"))


def _task() -> LocalShort:
    rc = RetrievalCorpus.from_records("planted", "test", [{"id": f"d{i}", "text": t} for i, t in enumerate(TEXTS)],
                                      [{"id": f"q{i}", "text": t[:12]} for i, t in enumerate(TEXTS)],
                                      {f"q{i}": {f"d{i}": 1} for i in range(len(TEXTS))})
    return LocalShort({"test": rc})


def _file(cache: Path, kind: str) -> Path:
    if kind == "mteb-result":
        (path,) = [p for p in cache.rglob("LocalShort.json") if "per_query" not in p.parts]
    elif kind == "per-query":
        (path,) = (cache / "per_query").rglob("LocalShort.json")
    else:
        (path,) = (cache / "per_query").rglob("LocalShort.fingerprints.json")
    return path


@pytest.mark.parametrize("overwrite", ["only-missing", "always"])
@pytest.mark.parametrize("kind", ["mteb-result", "per-query", "fingerprints"])
def test_corrupt_cache_file_is_moved_aside_and_the_task_recomputed(
        model: EmbeddingModel, tmp_path: Path, kind: str, overwrite: str, caplog: pytest.LogCaptureFixture) -> None:
    cfg = EvalConfig(name="t", tasks=["LocalShort"], query_max_length=32, passage_max_length=32, batch_size=8,
                     show_progress=False, overwrite=overwrite)
    cache = tmp_path / "mteb_cache"
    first = run_suite(model, cfg, cache, tasks=[_task()])
    path = _file(cache, kind)
    path.write_text('{"scores": {"test": [{"ndcg_at_10": 0.5')  # a write cut short
    with caplog.at_level("WARNING"):
        again = run_suite(model, cfg, cache, tasks=[_task()])
    assert again["tasks"] == first["tasks"]
    assert again["n_encoded"] > 0  # recomputed, not read from the cache
    moved = list(path.parent.glob(f"{path.name}.corrupt-*"))
    assert len(moved) == 1 and moved[0].read_text().startswith('{"scores"')
    assert str(path) in caplog.text and "corrupt" in caplog.text
    assert json.loads(_file(cache, kind).read_text())  # rewritten, valid
    per_query = json.loads((tmp_path / "per_query.json").read_text())
    assert set(per_query["LocalShort"]["test"]) == {f"q{i}" for i in range(len(TEXTS))}
    # a third run reads the repaired cache: nothing recomputed
    if overwrite == "only-missing":
        assert run_suite(model, cfg, cache, tasks=[_task()])["n_encoded"] == 0
