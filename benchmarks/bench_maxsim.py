"""MaxSim search, exact against compressed: queries per second and bytes per document.

A synthetic corpus shaped like landmark states: documents of a few unit vectors each, drawn around a document's
topics (landmark states of one text cluster), queries of a few vectors drawn near one document's vectors (each has a
relevant document). Ours is `eval.scoring=maxsim-compressed` (lmk.eval.compressed_maxsim: residual codes at 2 bits,
auto centroids, the top 100 re-scored over their decoded vectors); the peer is the exact float32 search
(lmk.eval.maxsim.maxsim_scores and a top-k), both on the CPU, timed interleaved. The compressed index is built once
outside the timing (its build time is in the details). Figures: queries/s (ratio: compressed over exact, from the
paired repeats), code bytes per document (goal: at most a tenth of float32; the shared codebook's share, large at
this corpus size and about 1% at the paper's, in the details), and the compressed top 10's recall of the exact top 10.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.common import check_size, figure, paired_ratios, time_pair
from lmk.eval.compressed_maxsim import CompressedIndex, compressed_search
from lmk.eval.maxsim import maxsim_scores

SECTION = "maxsim"
SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"docs": 100, "per_doc": 4, "dim": 64, "queries": 10, "per_query": 4, "repeats": 2},
    "full": {"docs": 2000, "per_doc": 8, "dim": 384, "queries": 200, "per_query": 8, "repeats": 7},
}
BITS, RERANK, TOP_K = 2, 100, 10


def synthetic(docs: int, per_doc: int, dim: int, queries: int, per_query: int, seed: int = 0
              ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(documents, queries) of unit vectors: each document around 3 of 256 topics, each query near one document."""
    gen = torch.Generator().manual_seed(seed)
    topics = F.normalize(torch.randn(256, dim, generator=gen), dim=1)
    noise = 0.8 / dim**0.5  # a vector's noise of norm ~0.8 beside its unit topic

    def around(centres: torch.Tensor, n: int) -> torch.Tensor:
        picked = centres[torch.randint(0, len(centres), (n,), generator=gen)]
        return F.normalize(picked + noise * torch.randn(n, dim, generator=gen), dim=1)

    documents = [around(topics[torch.randint(0, 256, (3,), generator=gen)], per_doc) for _ in range(docs)]
    targets = torch.randint(0, docs, (queries,), generator=gen).tolist()
    return documents, [around(documents[t], per_query) for t in targets]


def run(size: str = "tiny") -> list[dict[str, Any]]:
    p = SIZES[check_size(size)]
    docs, queries = synthetic(p["docs"], p["per_doc"], p["dim"], p["queries"], p["per_query"])
    start = time.perf_counter()
    index = CompressedIndex.build(docs, bits=BITS)
    build_s = time.perf_counter() - start
    k = min(TOP_K, len(docs))

    def exact() -> torch.Tensor:
        return maxsim_scores(queries, docs).topk(k, dim=1).indices

    def compressed() -> torch.Tensor:
        return compressed_search(queries, index, k, RERANK)[1]

    ours, peer = time_pair(compressed, exact, repeats=p["repeats"])
    n = len(queries)
    recall = sum(len(set(a.tolist()) & set(b.tolist())) for a, b in zip(ours["result"], peer["result"], strict=True))
    shape = {"documents": len(docs), "vectors_per_doc": p["per_doc"], "dim": p["dim"], "queries": n,
             "vectors_per_query": p["per_query"], "bits": BITS, "centroids": len(index.codec.centroids),
             "rerank": RERANK}
    float32 = p["per_doc"] * p["dim"] * 4
    # the codes grow with the corpus; the codebook (float32 centroids) is shared, its share per document falls with
    # the corpus's size (about 1% of the paper's index, lmk.sweep.cost.index): in the details
    code_bytes = index.vector_bytes() * p["per_doc"]
    return [
        figure(SECTION, "MaxSim search (exact against compressed): queries/s", unit="queries/s",
               ours=n / ours["median_s"], peer=n / peer["median_s"], peer_name="exact float32 MaxSim",
               ratio_def="compressed / exact queries/s",
               ratio_samples=paired_ratios(peer["times_s"], ours["times_s"]),
               details={**shape, "ours_s": ours["times_s"], "peer_s": peer["times_s"], "index_build_s": build_s}),
        figure(SECTION, "MaxSim index: bytes per document (codes; codebook apart)", unit="bytes",
               ours=float(code_bytes), peer=float(float32), peer_name="float32 landmark vectors",
               ratio_def="compressed / float32 bytes", goal=("<=", 0.1),
               details={**shape, "vector_bytes": index.vector_bytes(), "codebook_bytes": index.codec.nbytes(),
                        "codebook_bytes_per_doc": index.codec.nbytes() / len(docs)}),
        figure(SECTION, "compressed top 10: recall of the exact top 10", unit="fraction", ours=recall / (n * k),
               peer=1.0, peer_name="exact float32 MaxSim", ratio_def="recall", details=shape),
    ]
