"""MaxSim scoring (`eval.scoring=maxsim`): a query and a document are sets of L2-normalised vectors, and
score(q, d) = sum over q's vectors of the max over d's vectors of their dot product (late interaction, ColBERT's
MaxSim). Documents are their landmark states, queries their landmark states or all their token states
(`eval.maxsim_query`); the states come from `lmk.model.multi_vector`. `LmkMaxSimEncoder` is the class of the
`maxsim` scoring (lmk.eval.scorings; its needs are declared in lmk.config.scorings).

`maxsim_scores` is exact: every query is scored against every document, in blocks whose working memory (the
similarity matrix, its per-document maxima and the block's vectors) stays within `eval.maxsim_block_mb`. No vector
is padded: a block's document vectors are concatenated and the max is taken per document segment, so the block
size decides only which products are computed together, not their values.

`LmkMaxSimEncoder` is the mteb side: mteb's own multi-vector search mixin (`MultiVectorSearchEncoderWrapper`: index
the corpus, encode it in chunks, keep each query's top-k) over lmk's encoder, with this module's exact MaxSim as its
similarity, so mteb's retrieval metrics and per-query scores are computed as for single-vector rows. The corpus
chunk (the documents' vectors held at once) is sized to the same memory limit, from the most landmarks a document can
have. The states are tokenized in the model's thread (no eval.workers processes on this path).
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from mteb.models.model_meta import ScoringFunction
from mteb.models.sentence_transformer_wrapper import MultiVectorSearchEncoderWrapper
from mteb.types import PromptType

from lmk.eval.encoder import LmkEncoder
from lmk.eval.scorings import register_scoring
from lmk.model.multi_vector import encode_states, no_landmarks
from lmk.model.pipeline import NonFiniteEmbeddingError

if TYPE_CHECKING:
    from mteb.abstasks.task_metadata import TaskMetadata
    from torch.utils.data import DataLoader

    from lmk.config.eval import EvalConfig
    from lmk.model.embedding import EmbeddingModel

logger = logging.getLogger(__name__)

_BYTES = 4  # float32 similarities and vectors


class NoLandmarksError(ValueError):
    """eval.scoring=maxsim on a model whose pooling has no landmark states (CLS, mean, latent attention)."""


def _as_tensors(vectors: Sequence[Any]) -> list[torch.Tensor]:
    return [torch.as_tensor(v, dtype=torch.float32) for v in vectors]


def _cost(q: int, d: int, n: int, dim: int) -> int:
    """Bytes of one block: q x d similarities, q x n maxima and the (q + d) vectors."""
    return _BYTES * (q * d + q * n + (q + d) * dim)


def _query_chunks(lengths: Sequence[int], longest_doc: int, dim: int, limit_bytes: int) -> list[tuple[int, int]]:
    """Consecutive query ranges that each fit the memory limit beside the longest document (queries are never split)."""
    chunks, start, vectors = [], 0, 0
    for i, n in enumerate(lengths):
        if _cost(n, longest_doc, 1, dim) > limit_bytes:
            need = _cost(n, longest_doc, 1, dim) / 2**20
            raise ValueError(f"eval.maxsim_block_mb={limit_bytes / 2**20:g}: one query ({n} vectors) against the longest "
                             f"document ({longest_doc} vectors) needs {need:.2f} MiB; raise eval.maxsim_block_mb")
        if i > start and _cost(vectors + n, longest_doc, 1, dim) > limit_bytes:
            chunks.append((start, i))
            start, vectors = i, 0
        vectors += n
    chunks.append((start, len(lengths)))
    return chunks


def _doc_blocks(lengths: Sequence[int], q: int, dim: int, limit_bytes: int) -> list[tuple[int, int]]:
    """Consecutive document ranges whose block with `q` query vectors fits the memory limit."""
    blocks, start, vectors = [], 0, 0
    for i, n in enumerate(lengths):
        if i > start and _cost(q, vectors + n, i - start + 1, dim) > limit_bytes:
            blocks.append((start, i))
            start, vectors = i, 0
        vectors += n
    blocks.append((start, len(lengths)))
    return blocks


def maxsim_blocks(query_lengths: Sequence[int], doc_lengths: Sequence[int], dim: int, block_mb: float
                  ) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """The blocks `maxsim_scores` computes: ((query start, end), (document start, end)) pairs covering every
    query-document pair once, each within `block_mb` MiB (queries and documents are never split)."""
    limit_bytes = int(block_mb * 2**20)
    plan = []
    for q_start, q_end in _query_chunks(query_lengths, max(doc_lengths), dim, limit_bytes):
        q = sum(query_lengths[q_start:q_end])
        plan += [((q_start, q_end), docs) for docs in _doc_blocks(doc_lengths, q, dim, limit_bytes)]
    return plan


def _owners(lengths: Sequence[int], device: torch.device | str) -> torch.Tensor:
    """For concatenated vectors, the index of the text each belongs to."""
    return torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(list(lengths))).to(device)


def maxsim_scores(queries: Sequence[Any], documents: Sequence[Any], block_mb: float = 256,
                  device: torch.device | str = "cpu") -> torch.Tensor:
    """Exact MaxSim [Q, D] (float32, on the CPU) of queries against documents, each a [n_i, H] array of vectors
    (normalised by the caller), computed on `device` in blocks of at most `block_mb` MiB of working memory."""
    qs, ds = _as_tensors(queries), _as_tensors(documents)
    scores = torch.zeros(len(qs), len(ds), dtype=torch.float32)
    if not qs or not ds:
        return scores
    empty = [i for i, d in enumerate(ds) if len(d) == 0] + [i for i, q in enumerate(qs) if len(q) == 0]
    if empty:
        raise ValueError(f"MaxSim needs at least one vector per text; {len(empty)} texts have none")
    q_lengths, d_lengths = [len(q) for q in qs], [len(d) for d in ds]
    for (q_start, q_end), (d_start, d_end) in maxsim_blocks(q_lengths, d_lengths, int(qs[0].shape[1]), block_mb):
        q_vectors = torch.cat(qs[q_start:q_end]).to(device)
        d_vectors = torch.cat(ds[d_start:d_end]).to(device)
        sim = q_vectors @ d_vectors.T  # [query vectors, document vectors]
        best = torch.full((len(q_vectors), d_end - d_start), -torch.inf, device=device)
        # the max over each document's segment of columns, then the sum over each query's rows
        best.scatter_reduce_(1, _owners(d_lengths[d_start:d_end], device).expand_as(sim), sim, reduce="amax")
        del sim
        block = torch.zeros(q_end - q_start, d_end - d_start, device=device)
        block.index_add_(0, _owners(q_lengths[q_start:q_end], device), best)
        scores[q_start:q_end, d_start:d_end] = block.cpu()
    return scores


def maxsim_winners(query: Any, document: Any) -> tuple[np.ndarray, np.ndarray]:
    """For one query against one document (each [n, H], normalised by the caller): per query vector, the index of the
    document vector that wins its max and that max. Their sum is the pair's `maxsim_scores` entry: which landmark
    of a document each query vector scores against (the notebook's per-landmark view)."""
    (q,), (d,) = _as_tensors([query]), _as_tensors([document])
    if len(q) == 0 or len(d) == 0:
        raise ValueError("MaxSim needs at least one vector per text; a text has none")
    best, index = (q @ d.T).max(dim=1)
    return index.numpy(), best.numpy()


@register_scoring
class LmkMaxSimEncoder(MultiVectorSearchEncoderWrapper, LmkEncoder):
    """lmk's encoder as an mteb multi-vector search model, the `maxsim` scoring: `_encode` gives each text's normalised
    states (documents: landmarks; queries: `maxsim_query`), `similarity` is the exact blocked `maxsim_scores`."""

    name = "maxsim"  # eval.scoring=maxsim; its needs: lmk.config.scorings.DECLARED_SCORINGS["maxsim"]

    def __init__(self, model: EmbeddingModel, *args: Any, maxsim_query: str = "landmarks", block_mb: int = 256,
                 **kwargs: Any) -> None:
        if "query_states" in kwargs:  # its old name
            warnings.warn("LmkMaxSimEncoder(query_states=...) is deprecated: use maxsim_query=", DeprecationWarning,
                          stacklevel=2)
            maxsim_query = kwargs.pop("query_states")
        why = no_landmarks(model, self.name)
        if why is not None:
            raise NoLandmarksError(why)
        self.maxsim_query, self.block_mb = maxsim_query, block_mb
        self.search_seconds = 0.0  # MaxSim scoring time (the dry run's search cost beside the encode cost)
        # the index a task's documents make: task -> [documents, landmark vectors] encoded (results.json "index")
        self.index_counts: dict[str, list[int]] = {}
        super().__init__(model, *args, **kwargs)
        # the documents encoded and held at once (mteb's corpus chunk): as many as fit the same memory limit at the most
        # landmarks a document can have, not mteb's 50,000
        self.corpus_chunk_size = max(1, int(block_mb * 2**20) // (self.max_vectors() * model.hidden_size * _BYTES))

    @property
    def query_states(self) -> str:  # deprecated alias
        """The old name of `maxsim_query`."""
        warnings.warn("LmkMaxSimEncoder.query_states is deprecated: use maxsim_query", DeprecationWarning, stacklevel=2)
        return self.maxsim_query

    @classmethod
    def options(cls, cfg: EvalConfig) -> dict[str, Any]:
        return {"maxsim_query": cfg.maxsim_query, "block_mb": cfg.maxsim_block_mb}

    def record(self) -> dict[str, Any]:
        return {"maxsim_query": self.maxsim_query, "maxsim_search_seconds": round(self.search_seconds, 3)}

    def max_vectors(self) -> int:
        """The most landmark states a document can have at the passage length (lmk.model.landmark.capacity)."""
        return self.model.landmark_tokenizer.max_landmarks(min(self.passage_max_length, self.model.max_positions))

    def _model_meta(self, tag: str | None) -> Any:
        meta = super()._model_meta(tag)
        # its own cache identity: MaxSim scores never mix with the single-vector ones of the same weights
        experiment = {**(meta.experiment_kwargs or {}), "scoring": "maxsim"}
        if self.maxsim_query != "landmarks":
            experiment["maxsim_query"] = self.maxsim_query
        return meta.model_copy(update={"experiment_kwargs": experiment, "similarity_fn_name": ScoringFunction.MAX_SIM,
                                       "model_type": ["late-interaction"]})

    def _encode(self, inputs: DataLoader[Mapping[str, Any]], *, task_metadata: TaskMetadata, hf_split: str,
                hf_subset: str, prompt_type: PromptType | None = None, **kwargs: Any) -> list[np.ndarray]:
        texts: list[str] = []
        for batch in inputs:
            texts.extend(batch["text"])
        side = self.side(prompt_type)
        kept = self.maxsim_query if side == "query" else "landmarks"
        start = time.perf_counter()
        try:
            states = encode_states(self.model, texts, side, maxsim_query=kept, batch_size=self.batch_size,
                                   max_length=self.max_length(prompt_type),
                                   max_tokens_per_batch=self.max_tokens_per_batch, precision=self.precision)
        except NonFiniteEmbeddingError as err:
            raise NonFiniteEmbeddingError(err.index, f"eval {task_metadata.name} [{hf_split}/{hf_subset}] {side} "
                                          f"{err.index}: {err}") from None
        self.n_encode_calls += 1
        self.n_texts += len(texts)
        self.n_truncated += int(getattr(self.model, "truncation_count", 0))
        vectors = sum(len(s) for s in states)
        if side == "passage":
            counts = self.index_counts.setdefault(task_metadata.name, [0, 0])
            counts[0] += len(texts)
            counts[1] += vectors
        logger.info("eval %s [%s/%s] %s: %d texts -> %d %s vectors (%.1f per text, %.0f bytes per text) in %.1fs",
                    task_metadata.name, hf_split, hf_subset, side, len(texts), vectors, kept,
                    vectors / max(len(texts), 1), vectors * self.model.hidden_size * _BYTES / max(len(texts), 1),
                    time.perf_counter() - start)
        return states

    def index_size(self, task: str) -> dict[str, Any] | None:
        """The index of `task`'s documents as encoded here: documents, landmark vectors per document and float32 bytes
        per document (None when none were encoded, e.g. scores read from the cache)."""
        docs, vectors = self.index_counts.get(task, (0, 0))
        if not docs:
            return None
        per_doc = vectors / docs
        return {"documents": docs, "vectors": vectors, "vectors_per_doc": round(per_doc, 2),
                "bytes_per_doc": round(per_doc * self.model.hidden_size * _BYTES), "dtype": "float32"}

    def similarity(self, embeddings1: Any, embeddings2: Any) -> torch.Tensor:
        start = time.perf_counter()
        scores = maxsim_scores(embeddings1, embeddings2, self.block_mb, self.model.device)
        self.search_seconds += time.perf_counter() - start
        return scores
