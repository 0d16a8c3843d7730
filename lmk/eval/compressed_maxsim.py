"""Compressed MaxSim (`eval.scoring=maxsim-compressed`): the documents' landmark vectors held as residual codes
(lmk.eval.residual_codes: a centroid id and `eval.maxsim_bits` bits per dimension each), searched in two stages:

1. candidates: every document scored by MaxSim with each of its vectors replaced by its centroid (PLAID's centroid
   interaction: one [query vectors, centroids] product, then a gather; no residual is decoded);
2. re-scoring: each query's top `eval.maxsim_rerank` candidates scored by exact MaxSim over their decoded vectors
   (centroid + quantized residual, normalised). The index stores only the codes, so "exact" is exact over what it
   stores: with rerank >= the number of documents the scores are exactly `maxsim_scores` of the decoded vectors.
   A candidate's final score is its re-scored one; the documents outside a query's candidates keep their stage-1
   order, shifted below its lowest candidate (a ranking never mixes the two stages' scales).

Queries stay float32 (they are encoded at search time, never stored). `LmkCompressedMaxSimEncoder` is the mteb side:
`LmkMaxSimEncoder`'s encoding, with the full-corpus search replaced by: encode the corpus in chunks, fit the codec on
the first vectors (up to `residual_codes.FIT_SAMPLE`, seeded), compress every chunk, then search the index.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from mteb._create_dataloaders import create_dataloader
from mteb.types import PromptType

from lmk.eval.maxsim import LmkMaxSimEncoder, maxsim_blocks
from lmk.eval.residual_codes import FIT_SAMPLE, ResidualCodec, id_bytes, residual_bytes
from lmk.eval.scorings import register_scoring

if TYPE_CHECKING:
    from lmk.config.eval import EvalConfig
    from lmk.model.embedding import EmbeddingModel

logger = logging.getLogger(__name__)


def _owners(lengths: Sequence[int], device: torch.device | str) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(list(lengths))).to(device)


def _segment_maxsim(sim: torch.Tensor, q_lengths: Sequence[int], d_lengths: Sequence[int]) -> torch.Tensor:
    """[query vectors, document vectors] similarities -> [queries, documents] MaxSim (max per document segment,
    summed per query)."""
    best = torch.full((sim.shape[0], len(d_lengths)), -torch.inf, device=sim.device)
    best.scatter_reduce_(1, _owners(d_lengths, sim.device).expand_as(sim), sim, reduce="amax")
    out = torch.zeros(len(q_lengths), len(d_lengths), device=sim.device)
    return out.index_add_(0, _owners(q_lengths, sim.device), best)


@dataclass
class CompressedIndex:
    """A corpus's landmark vectors as residual codes: ids [N], packed residuals [N, bytes], vectors per document."""

    codec: ResidualCodec
    codes: torch.Tensor
    residuals: torch.Tensor
    lengths: list[int]

    @classmethod
    def build(cls, documents: Sequence[Any], bits: int = 2, centroids: int | None = None, seed: int = 0,
              sample: int = FIT_SAMPLE) -> CompressedIndex:
        """The index of `documents` (each [n_i, dim] unit vectors, n_i >= 1), its codec fitted on their vectors."""
        docs = [torch.as_tensor(d, dtype=torch.float32) for d in documents]
        if not docs or any(len(d) == 0 for d in docs):
            raise ValueError("a compressed MaxSim index needs documents of at least one vector each")
        vectors = torch.cat(docs)
        codec = ResidualCodec.fit(vectors, bits, centroids, seed, sample)
        codes, residuals = codec.encode(vectors)
        return cls(codec, codes, residuals, [len(d) for d in docs])

    @property
    def offsets(self) -> list[int]:
        out = [0]
        for n in self.lengths:
            out.append(out[-1] + n)
        return out

    def vector_bytes(self) -> int:
        return residual_bytes(self.codec.dim, self.codec.bits) + id_bytes(len(self.codec.centroids))

    def nbytes(self) -> int:
        """Bytes the index holds: every vector's code and the shared codebook."""
        return len(self.codes) * self.vector_bytes() + self.codec.nbytes()

    def decode(self, docs: Sequence[int], device: torch.device | str = "cpu") -> list[torch.Tensor]:
        """The decoded vectors of documents `docs` (unit vectors, float32)."""
        off = self.offsets
        rows = torch.cat([torch.arange(off[i], off[i + 1]) for i in docs]) if docs else torch.zeros(0, dtype=torch.long)
        return list(self.codec.decode(self.codes[rows], self.residuals[rows], device).split(
            [self.lengths[i] for i in docs]))


def centroid_scores(queries: Sequence[torch.Tensor], index: CompressedIndex, block_mb: float = 256,
                    device: torch.device | str = "cpu") -> torch.Tensor:
    """Stage 1: MaxSim [Q, D] with every document vector replaced by its centroid, in `maxsim_blocks` blocks."""
    scores = torch.zeros(len(queries), len(index.lengths))
    q_lengths, off = [len(q) for q in queries], index.offsets
    centroids, codes = index.codec.centroids.to(device), index.codes.to(device).long()
    plan = maxsim_blocks(q_lengths, index.lengths, index.codec.dim, block_mb)
    for (q_start, q_end), (d_start, d_end) in plan:
        per_centroid = torch.cat(list(queries[q_start:q_end])).to(device) @ centroids.T  # [query vectors, k]
        sim = per_centroid[:, codes[off[d_start]:off[d_end]]]
        block = _segment_maxsim(sim, q_lengths[q_start:q_end], index.lengths[d_start:d_end])
        scores[q_start:q_end, d_start:d_end] = block.cpu()
    return scores


def _rescore(query: torch.Tensor, docs: Sequence[int], decoded: dict[int, torch.Tensor]) -> torch.Tensor:
    """Exact MaxSim of one query against the decoded documents `docs`."""
    vectors = torch.cat([decoded[i] for i in docs])
    return _segment_maxsim(query.to(vectors.device) @ vectors.T, [len(query)], [len(decoded[i]) for i in docs])[0]


def compressed_search(queries: Sequence[Any], index: CompressedIndex, top_k: int, rerank: int = 100,
                      block_mb: float = 256, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Each query's `top_k` documents: (scores [Q, k], document indices [Q, k]), k = min(top_k, documents), best
    first. Stage 1 ranks all documents by centroid MaxSim, stage 2 re-scores the top `rerank` exactly over their
    decoded vectors; the rest follow in stage-1 order below the lowest re-scored candidate."""
    qs = [torch.as_tensor(q, dtype=torch.float32) for q in queries]
    n_docs = len(index.lengths)
    k, r = min(top_k, n_docs), min(max(rerank, 1), n_docs)
    if not qs:
        return torch.zeros(0, k), torch.zeros(0, k, dtype=torch.long)
    approx = centroid_scores(qs, index, block_mb, device)
    candidates = approx.topk(r, dim=1).indices
    needed = sorted(set(candidates.flatten().tolist()))
    decoded = dict(zip(needed, index.decode(needed, device), strict=True))
    final = approx.clone()
    for i, q in enumerate(qs):
        docs = candidates[i].tolist()
        exact = _rescore(q, docs, decoded).cpu()
        others = torch.ones(n_docs, dtype=torch.bool)
        others[candidates[i]] = False
        if others.any():  # the non-candidates, in their stage-1 order, strictly below every candidate
            final[i, others] -= max(0.0, float(approx[i, others].max() - exact.min())) + 1.0
        final[i, candidates[i]] = exact
    values, indices = final.topk(k, dim=1)
    return values, indices


@register_scoring
class LmkCompressedMaxSimEncoder(LmkMaxSimEncoder):
    """`LmkMaxSimEncoder` whose full-corpus search builds a `CompressedIndex` of the corpus and searches it
    (`compressed_search`); its results.json index reports the compressed bytes per document."""

    name = "maxsim-compressed"  # its needs: lmk.config.scorings.DECLARED_SCORINGS["maxsim-compressed"]

    def __init__(self, model: EmbeddingModel, *args: Any, bits: int = 2, centroids: int | None = None,
                 rerank: int = 100, seed: int = 0, **kwargs: Any) -> None:
        self.bits, self.centroids, self.rerank, self.seed = bits, centroids, rerank, seed
        self.index_seconds = 0.0  # k-means and encoding into codes (beside search_seconds)
        self.compressed: dict[str, dict[str, Any]] = {}  # task -> the codec's figures (results.json "index")
        super().__init__(model, *args, **kwargs)

    @classmethod
    def options(cls, cfg: EvalConfig) -> dict[str, Any]:
        return {**super().options(cfg), "bits": cfg.maxsim_bits, "centroids": cfg.maxsim_centroids or None,
                "rerank": cfg.maxsim_rerank, "seed": cfg.seed}

    def record(self) -> dict[str, Any]:  # the index's settings and its build time (k-means, codes)
        return {**super().record(), "maxsim_bits": self.bits, "maxsim_centroids": self.centroids or 0,
                "maxsim_rerank": self.rerank, "maxsim_index_seconds": round(self.index_seconds, 3)}

    def _model_meta(self, tag: str | None) -> Any:
        meta = super()._model_meta(tag)
        # its own cache identity: compressed scores never mix with the exact ones (or another compression's)
        experiment = {**(meta.experiment_kwargs or {}), "scoring": self.name, "maxsim_bits": self.bits,
                      "maxsim_centroids": self.centroids or "auto", "maxsim_rerank": self.rerank}
        return meta.model_copy(update={"experiment_kwargs": experiment})

    def _encode_corpus(self, corpus: Any, **kw: Any) -> CompressedIndex:
        """Encode the corpus chunk by chunk; fit the codec once FIT_SAMPLE vectors (or the whole corpus) are held,
        then compress every chunk as it comes (float32 vectors held: at most the fit sample and one chunk)."""
        codec: ResidualCodec | None = None
        held: list[torch.Tensor] = []
        codes, residuals, lengths = [], [], []
        step = self.corpus_chunk_size
        for start in range(0, len(corpus), step):
            sub = corpus.select(range(start, min(start + step, len(corpus))))
            loader = create_dataloader(sub, task_metadata=kw["task_metadata"], prompt_type=PromptType.document,
                                       batch_size=kw["encode_kwargs"].get("batch_size", 32), num_proc=kw["num_proc"])
            states = [torch.as_tensor(s) for s in self._encode(
                loader, task_metadata=kw["task_metadata"], hf_split=kw["hf_split"], hf_subset=kw["hf_subset"],
                prompt_type=PromptType.document, **kw["encode_kwargs"])]
            lengths += [len(s) for s in states]
            held += states
            if codec is None and sum(len(s) for s in held) < FIT_SAMPLE and start + step < len(corpus):
                continue
            begin = time.perf_counter()
            vectors = torch.cat(held)
            codec = codec or ResidualCodec.fit(vectors, self.bits, self.centroids, self.seed)
            c, r = codec.encode(vectors)
            codes.append(c)
            residuals.append(r)
            held = []
            self.index_seconds += time.perf_counter() - begin
        assert codec is not None
        return CompressedIndex(codec, torch.cat(codes), torch.cat(residuals), lengths)

    def _full_corpus_search(self, *, query_idx_to_id: dict[int, str], query_embeddings: Any, top_k: int,
                            **kw: Any) -> dict[str, list[tuple[float, str]]]:
        if self.task_corpus is None:
            raise ValueError("Corpus must be indexed before searching.")
        ids = list(self.task_corpus["id"])
        index = self._encode_corpus(self.task_corpus, **kw)
        start = time.perf_counter()
        values, indices = compressed_search(query_embeddings, index, top_k, self.rerank, self.block_mb,
                                            self.model.device)
        self.search_seconds += time.perf_counter() - start
        self._record(kw["task_metadata"].name, index)
        return {query_idx_to_id[i]: [(float(v), ids[j]) for v, j in zip(values[i].tolist(), indices[i].tolist(),
                                                                         strict=True)]
                for i in range(len(values))}

    def _record(self, task: str, index: CompressedIndex) -> None:
        figures = self.compressed.setdefault(task, {"code_bytes": 0, "codebook_bytes": 0})
        figures["code_bytes"] += len(index.codes) * index.vector_bytes()
        figures["codebook_bytes"] += index.codec.nbytes()  # one codebook per split/subset searched
        figures.update(bits=self.bits, centroids=len(index.codec.centroids), rerank=self.rerank,
                       vector_bytes=index.vector_bytes())
        logger.info("eval %s: compressed index of %d documents, %d vectors: %d bytes per vector (%d centroids, "
                    "%d-bit residuals), %.0f bytes per document", task, len(index.lengths), len(index.codes),
                    index.vector_bytes(), len(index.codec.centroids), self.bits,
                    len(index.codes) * index.vector_bytes() / max(len(index.lengths), 1))

    def index_size(self, task: str) -> dict[str, Any] | None:
        """`LmkMaxSimEncoder.index_size` with the compressed bytes per document (codes; the codebook apart) and the
        float32 ones beside them."""
        size = super().index_size(task)
        figures = self.compressed.get(task)
        if size is None or figures is None:
            return size
        exact = size["bytes_per_doc"]
        per_doc = figures["code_bytes"] / size["documents"]
        return {**size, "bytes_per_doc": round(per_doc), "bytes_per_doc_float32": exact,
                "dtype": f"residual-{self.bits}bit", "compression": round(exact / per_doc, 2) if per_doc else None,
                **{k: figures[k] for k in ("centroids", "vector_bytes", "codebook_bytes", "rerank")}}
