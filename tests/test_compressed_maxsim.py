"""eval.scoring=maxsim-compressed: residual codes whose round-trip error falls with the bits, the same codes on every
run, exact re-scoring over the decoded vectors, index bytes per document, and a real (tiny) model's nDCG@10 near
the exact MaxSim one on an offline task."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from lmk.config.eval import EvalConfig, EvalConfigError  # noqa: E402
from lmk.data.retrieval import RetrievalCorpus  # noqa: E402
from lmk.eval.compressed_maxsim import (  # noqa: E402
    CompressedIndex,
    LmkCompressedMaxSimEncoder,
    centroid_scores,
    compressed_search,
)
from lmk.eval.maxsim import maxsim_scores  # noqa: E402
from lmk.eval.residual_codes import ResidualCodec, auto_centroids, vector_bytes  # noqa: E402
from lmk.eval.runner import build_encoder, run_suite  # noqa: E402
from lmk.eval.tasks import LocalShort  # noqa: E402
from lmk.model.embedding import EmbeddingModel  # noqa: E402
from lmk.run.results import config_hash_of  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CONF = Path(__file__).resolve().parents[1] / "conf"


def clustered(n_docs: int, per_doc: int, dim: int = 32, seed: int = 0) -> list[torch.Tensor]:
    """Unit vectors around a few topic directions (landmark states cluster by topic), `per_doc` to a document."""
    gen = torch.Generator().manual_seed(seed)
    topics = F.normalize(torch.randn(16, dim, generator=gen), dim=1)
    out = []
    for _ in range(n_docs):
        centre = topics[torch.randint(0, 16, (per_doc,), generator=gen)]
        out.append(F.normalize(centre + 0.3 * torch.randn(per_doc, dim, generator=gen), dim=1))
    return out


def test_round_trip_error_is_bounded_and_falls_with_the_bits() -> None:
    vectors = torch.cat(clustered(300, 4))
    errors = {}
    for bits in (1, 2, 4, 8):
        codec = ResidualCodec.fit(vectors, bits, centroids=32)
        codes, packed = codec.encode(vectors)
        assert packed.dtype == torch.uint8 and packed.shape == (len(vectors), 32 * bits // 8)
        decoded = codec.decode(codes, packed)
        torch.testing.assert_close(decoded.norm(dim=1), torch.ones(len(vectors)))  # unit vectors, as MaxSim scores
        errors[bits] = float((decoded - vectors).norm(dim=1).mean())
    assert errors[1] > errors[2] > errors[4] > errors[8]
    # dim 32, 32 centroids (measured 0.58, 0.35, 0.13, 0.015): of unit vectors, whose distance goes up to 2
    assert errors[1] < 0.65 and errors[2] < 0.4 and errors[4] < 0.15 and errors[8] < 0.02
    # the centroid alone is worse than any residual code
    codec = ResidualCodec.fit(vectors, 1, centroids=32)
    centroid_only = F.normalize(codec.centroids[codec.encode(vectors)[0].long()], dim=1)
    assert float((centroid_only - vectors).norm(dim=1).mean()) > errors[1]


def test_the_same_vectors_give_the_same_codes() -> None:
    docs = clustered(200, 3)
    a, b = CompressedIndex.build(docs, bits=2, seed=0), CompressedIndex.build(docs, bits=2, seed=0)
    assert torch.equal(a.codes, b.codes) and torch.equal(a.residuals, b.residuals)
    assert torch.equal(a.codec.centroids, b.codec.centroids)
    # a fit on a sample (a corpus larger than the sample) is seeded too
    c1 = ResidualCodec.fit(torch.cat(docs), 2, centroids=16, sample=100)
    c2 = ResidualCodec.fit(torch.cat(docs), 2, centroids=16, sample=100)
    assert torch.equal(c1.centroids, c2.centroids) and torch.equal(c1.cutoffs, c2.cutoffs)


def test_rescoring_every_document_is_exact_maxsim_over_the_decoded_vectors() -> None:
    docs = clustered(60, 5, seed=1)
    queries = clustered(7, 3, seed=2)
    index = CompressedIndex.build(docs, bits=2, centroids=16)
    decoded = index.decode(list(range(len(docs))))
    exact = maxsim_scores(queries, decoded)
    values, indices = compressed_search(queries, index, top_k=len(docs), rerank=len(docs))
    torch.testing.assert_close(values, exact.gather(1, indices), atol=1e-5, rtol=0)
    torch.testing.assert_close(values, exact.sort(dim=1, descending=True).values, atol=1e-5, rtol=0)
    # stage 1 is MaxSim with each document vector replaced by its centroid
    as_centroids = [index.codec.centroids[index.codes[o:o + n].long()] for o, n in zip(index.offsets, index.lengths)]
    torch.testing.assert_close(centroid_scores(queries, index, block_mb=0.01), maxsim_scores(queries, as_centroids),
                               atol=1e-5, rtol=0)


def test_a_partial_rerank_ranks_its_candidates_first_and_8_bits_scores_near_exact() -> None:
    docs = clustered(80, 4, seed=3)
    queries = clustered(5, 2, seed=4)
    index = CompressedIndex.build(docs, bits=8, centroids=16)
    values, indices = compressed_search(queries, index, top_k=30, rerank=10)
    assert values.shape == (5, 30) and bool((values[:, :-1] >= values[:, 1:]).all())
    candidates = centroid_scores(queries, index).topk(10, dim=1).indices
    for i in range(5):
        assert set(indices[i, :10].tolist()) == set(candidates[i].tolist())  # the re-scored candidates come first
    exact = maxsim_scores(queries, docs)
    scores, every = compressed_search(queries, index, top_k=10, rerank=len(docs))
    # 8-bit residuals (2 query vectors, each decoded document vector within ~0.015 of its own): every score within
    # 0.05 of the float32 one, so the top 10 is the exact one up to near ties
    assert float((scores - exact.gather(1, every)).abs().max()) < 0.05
    found = exact.gather(1, every).sort(dim=1, descending=True).values
    torch.testing.assert_close(found, exact.topk(10, dim=1).values, atol=0.05, rtol=0)


def test_bytes_per_document() -> None:
    docs = clustered(50, 6, dim=768 // 8) + clustered(50, 2, dim=768 // 8)
    index = CompressedIndex.build(docs, bits=2, centroids=64)
    assert index.vector_bytes() == 96 * 2 // 8 + 1  # 24 bytes of 2-bit residuals and a one-byte id (64 centroids)
    assert index.nbytes() == 400 * 25 + 4 * (64 * 96 + 2 * 4 - 1)
    # the paper's width: 2 bits is 192 bytes and a 4-byte id against 3,072 float32 bytes (15.7x)
    assert vector_bytes(768, 2, 2**17) == 196 and vector_bytes(768, 4, 2**16) == 386
    assert auto_centroids(16_000) == 2**10 and auto_centroids(200_000_000) == 2**17 and auto_centroids(10) == 10


def test_settings_are_validated_and_hash_only_when_not_default() -> None:
    base = {"name": "t", "tasks": ["LocalShort"], "scoring": "maxsim-compressed"}
    with pytest.raises(EvalConfigError, match="eval.maxsim_bits=3"):
        EvalConfig(**base, maxsim_bits=3)
    with pytest.raises(EvalConfigError, match="maxsim_rerank"):
        EvalConfig(**base, maxsim_rerank=0)
    absent = OmegaConf.create({"eval": {"name": "t"}})
    defaults = OmegaConf.create({"eval": {"name": "t", "maxsim_bits": 2, "maxsim_centroids": 0, "maxsim_rerank": 100}})
    assert config_hash_of(defaults) == config_hash_of(absent)
    assert config_hash_of(OmegaConf.merge(defaults, {"eval": {"maxsim_bits": 4}})) != config_hash_of(absent)


@pytest.fixture(scope="module")
def lmk_model() -> EmbeddingModel:
    pool = OmegaConf.merge(OmegaConf.load(CONF / "pooling" / "lmk-fixed.yaml"), {"chunk_size": 4})
    return EmbeddingModel.build(OmegaConf.load(CONF / "encoder" / "tiny-modernbert.yaml"), pool,
                                query_max_length=64, passage_max_length=64, seed=0)


def _corpus() -> RetrievalCorpus:
    """Documents of a few sentences each; a query is one of its document's sentences (the tiny model's landmark
    states find their own text), so exact MaxSim ranks well and a poor compression would not."""
    words = ["river", "engine", "garden", "violin", "glacier", "market", "comet", "harbor", "desert", "lantern"]
    docs, queries, qrels = [], [], {}
    for i in range(40):
        sentences = [" ".join(words[(i * 3 + j * 7 + k) % 10] + str((i + j + k) % 13) for k in range(5))
                     for j in range(3)]
        docs.append({"id": f"d{i}", "text": ". ".join(sentences)})
        queries.append({"id": f"q{i}", "text": sentences[i % 3]})
        qrels[f"q{i}"] = {f"d{i}": 1}
    return RetrievalCorpus.from_records("compressed", "test", docs, queries, qrels)


def test_compressed_ndcg_is_near_exact_on_a_real_model(lmk_model: EmbeddingModel, tmp_path: Path) -> None:
    base = {"name": "test", "tasks": ["LocalShort"], "query_max_length": 64, "passage_max_length": 64,
            "batch_size": 8, "show_progress": False}

    def ndcg(folder: str, **kw: object) -> dict:
        return run_suite(lmk_model, EvalConfig(**base, **kw), tmp_path / folder, tasks=[LocalShort({"test": _corpus()})])

    # 16 centroids for 320 vectors (auto would give 256, nearly one per vector): the residuals carry the detail
    settings = {"scoring": "maxsim-compressed", "maxsim_centroids": 16, "maxsim_rerank": 10}
    assert isinstance(build_encoder(lmk_model, EvalConfig(**base, **settings)), LmkCompressedMaxSimEncoder)
    exact, compressed = ndcg("exact", scoring="maxsim"), ndcg("compressed", **settings)
    crude = ndcg("crude", **{**settings, "maxsim_bits": 1, "maxsim_centroids": 4, "maxsim_rerank": 1})
    e, c = exact["tasks"]["LocalShort"], compressed["tasks"]["LocalShort"]
    assert e["main_score"] > 0.5  # exact MaxSim finds the documents: a score a bad compression loses
    # measured 0.638 exact, 0.599 compressed, 0.336 crude (this tiny random-weight model, not the mini scale's goal)
    assert abs(c["main_score"] - e["main_score"]) <= 0.05
    assert crude["tasks"]["LocalShort"]["main_score"] < e["main_score"] - 0.1
    assert compressed["scoring"] == "maxsim-compressed" and compressed["maxsim_bits"] == 2
    index = c["index"]
    assert index["bytes_per_doc_float32"] == e["index"]["bytes_per_doc"]
    vectors_per_doc = index["vectors"] / index["documents"]
    assert index["bytes_per_doc"] == round(vectors_per_doc * (256 * 2 // 8 + 1))  # tiny-modernbert: 256 wide
    assert index["compression"] > 10 and index["dtype"] == "residual-2bit" and index["centroids"] == 16
