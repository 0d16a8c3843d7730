"""What a MaxSim row's evaluation adds (`eval.scoring=maxsim`, lmk.eval.maxsim): per task, the index (landmark vectors
per document, bytes per document and per task) and the exact search (FLOPs and time), beside the encode time the
single-vector path already costs (the states come from the same forward pass, so the encode is the same).

Vectors per text, from the task's token counts (mteb's statistics, truncated at the suite's max lengths, as
`lmk.sweep.cost.evaluation` reads them): a landmark after every `chunk_size` content tokens and after the last chunk
(fixed / variable, which infers at `chunk_size`; a text cut at the max length keeps its leading token and whole
chunks), one per sentence for the sentence strategy (at an assumed
TOKENS_PER_SENTENCE), every token for a query when `eval.maxsim_query=tokens`. A vector is the model's hidden size in
float32 (what lmk.eval.maxsim holds). The search is exact: 2 x dim FLOPs per (query vector, document vector) pair over
every query and document, run on the eval job's device in float32 (`Rates.maxsim_flops_per_s`).

The compressed index (`eval.scoring=maxsim-compressed`, lmk.eval.compressed_maxsim) holds each vector as a centroid
id and `eval.maxsim_bits` bits per dimension (`compressed_index_bytes`: PLAID's centroid count per task, from its
vectors, and its float32 codebook); it is printed beside the float32 index of every MaxSim row (at 2 bits where the
row scores exactly). Its search is costed as the exact one (an upper bound: its candidates stage multiplies by the
centroids, not by every document vector).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lmk.config.registry import declared_scorings
from lmk.eval.residual_sizes import auto_centroids, codebook_bytes, vector_bytes
from lmk.model.landmark.capacity import TOKENS_PER_SENTENCE, expected_landmarks
from lmk.model.landmark.names import STRATEGY_TRAITS
from lmk.sweep.cost.stage import hours

VECTOR_BYTES = 4  # float32: the vectors lmk.eval.maxsim scores


@dataclass(frozen=True)
class Layout:
    """How a MaxSim row's texts become vectors (its pooling and `eval.maxsim_query`), at the model's width."""

    strategy: str
    chunk_size: int
    maxsim_query: str  # landmarks | tokens
    dim: int
    bits: int = 2  # the compressed index's residual bits (the scoring's declared `code_bits` key)
    compressed: bool = False  # the row's scoring stores residual codes

    @property
    def query_states(self) -> str:  # deprecated alias
        """The old name of `maxsim_query`."""
        warnings.warn("Layout.query_states is deprecated: use maxsim_query", DeprecationWarning, stacklevel=2)
        return self.maxsim_query

    @classmethod
    def of(cls, c: Mapping[str, Any], dim: int) -> Layout | None:
        """The layout of a composed job config whose evaluation scores by several vectors per text (a scoring declared
        `multi_vector`, lmk.config.scorings); None for single-vector scoring."""
        ev, pooling = c.get("eval") or {}, c.get("pooling") or {}
        declared = declared_scorings().get(str(ev.get("scoring", "single")), {})
        if not declared.get("multi_vector"):
            return None
        bits_key = declared.get("code_bits") or ""
        return cls(str(pooling.get("strategy")), int(pooling.get("chunk_size") or 1),
                   str(ev.get("maxsim_query", "landmarks")), dim, int(ev.get(bits_key, 2)) if bits_key else 2,
                   bool(bits_key))

    def landmarks(self, tokens: float, max_length: int) -> float:
        """Landmark vectors of a text of `tokens` content tokens cut at `max_length` (landmarks included)."""
        return expected_landmarks(self.strategy, self.chunk_size, tokens, max_length)

    def describe(self) -> str:
        docs = (f"a landmark every {self.chunk_size} tokens" if STRATEGY_TRAITS[self.strategy]["chunked"]
                else f"one landmark per sentence (~{TOKENS_PER_SENTENCE:g} tokens each, assumed)")
        stored = (f"{self.dim}-wide vectors as {self.bits}-bit residual codes" if self.compressed
                  else f"{self.dim} x float32 per vector")
        return f"{docs}, {stored}, queries as their {self.maxsim_query}"


@dataclass(frozen=True)
class TaskIndex:
    """One task's MaxSim index and search, every split/subset of it together."""

    task: str
    documents: float
    vectors_per_doc: float  # the mean over the task's splits, weighted by documents
    bytes_per_doc: float
    index_bytes: float
    queries: float
    vectors_per_query: float
    search_flops: float
    search_s: float
    encode_s: float

    def line(self) -> str:
        return (f"{self.task}: {self.documents:,.0f} docs x {self.vectors_per_doc:.1f} vectors = "
                f"{_size(self.bytes_per_doc)}/doc, {_size(self.index_bytes)}; {self.queries:,.0f} queries x "
                f"{self.vectors_per_query:.1f} vectors; search {self.search_flops:.2g} FLOP, {hours(self.search_s)} "
                f"(encode {hours(self.encode_s)})")


def compressed_index_bytes(index: TaskIndex, layout: Layout) -> float:
    """Bytes of `index`'s documents as residual codes at `layout.bits` (lmk.eval.residual_codes): per vector its
    packed residual and centroid id, at the centroid count eval.maxsim_centroids=0 picks from the task's vectors,
    plus the task's float32 codebook."""
    vectors = index.documents * index.vectors_per_doc
    k = auto_centroids(round(vectors))
    return vectors * vector_bytes(layout.dim, layout.bits, k) + codebook_bytes(layout.dim, layout.bits, k)


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def task_index(task: str, parts: Sequence[tuple[float, float]], layout: Layout, query_max_length: int,
               passage_max_length: int, flops_per_s: float, encode_s: float) -> TaskIndex:
    """The index and search of one task from its (documents, tokens each), (queries, tokens each) pairs
    (`lmk.sweep.cost.evaluation.task_tokens`: documents first in every pair)."""
    docs = doc_vectors = queries = query_vectors = flops = 0.0
    for (n_d, t_d), (n_q, t_q) in zip(parts[::2], parts[1::2], strict=True):
        per_doc = layout.landmarks(t_d, passage_max_length)
        per_query = max(1.0, t_q) if layout.maxsim_query == "tokens" else layout.landmarks(t_q, query_max_length)
        docs, doc_vectors = docs + n_d, doc_vectors + n_d * per_doc
        queries, query_vectors = queries + n_q, query_vectors + n_q * per_query
        flops += 2.0 * layout.dim * (n_q * per_query) * (n_d * per_doc)  # every query vector x document vector
    per_doc = doc_vectors / docs if docs else 0.0
    return TaskIndex(task, docs, per_doc, per_doc * layout.dim * VECTOR_BYTES, doc_vectors * layout.dim * VECTOR_BYTES,
                     queries, query_vectors / queries if queries else 0.0, flops, flops / flops_per_s, encode_s)
