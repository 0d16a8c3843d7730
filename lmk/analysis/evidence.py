"""Evidence position: argmax-cosine Acc@1 against needle depth x context length (passkey / needle data).

An analysis view, NOT the leaderboard metric (mteb computes that).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from lmk.analysis.common import _check_int, _max_length
from lmk.data import longembed

if TYPE_CHECKING:  # imported lazily at run time: analysis sits above model / data in the layering
    from lmk.data.retrieval import RetrievalCorpus
    from lmk.model.embedding import EmbeddingModel

TASKS = ("passkey", "needle")


def synthetic_corpora(
    task: str = "passkey",
    lengths: Sequence[int] = (256, 512),
    n_docs: int = 20,
    n_queries: int = 20,
    seed: int = 0,
) -> dict[int, RetrievalCorpus]:
    """The regenerated LongEmbed passkey / needle data (lmk.data.longembed), per length."""
    if task not in TASKS:
        raise ValueError(f"unknown synthetic task {task!r}; allowed: {', '.join(TASKS)}")
    gen = longembed.generate_passkey if task == "passkey" else longembed.generate_needle
    return gen(lengths=tuple(lengths), n_docs=n_docs, n_queries=n_queries, seed=seed)


def long_texts(corpora: Mapping[int, RetrievalCorpus], n: int, length: int | None = None) -> list[str]:
    """The first `n` documents of the corpus at `length` (default the longest): inputs for the probes."""
    n = _check_int("n", n)
    if not corpora:
        raise ValueError("corpora is empty; build it with synthetic_corpora(...)")
    key = max(corpora) if length is None else length
    if key not in corpora:
        raise ValueError(f"no corpus at length {key}; available: {sorted(corpora)}")
    texts = list(corpora[key].corpus["text"])
    return texts[:n]


def _as_mapping(corpora: Mapping[int, RetrievalCorpus] | RetrievalCorpus) -> Mapping[int, RetrievalCorpus]:
    if isinstance(corpora, Mapping):
        return corpora
    return {-1: corpora}  # one corpus: its length comes from the "length" column


def evidence_position_sensitivity(
    model: EmbeddingModel,
    corpora: Mapping[int, RetrievalCorpus] | RetrievalCorpus,
    *,
    max_length: int | None = None,
    batch_size: int = 16,
) -> pd.DataFrame:
    """One row per query: where its evidence sits and how the gold document ranks.

    Columns: task, length, query_id, gold_id, depth, gold_rank (1 = top), gold_sim, best_sim,
    acc_at_1 (argmax-cosine Acc@1: an analysis view, not mteb's leaderboard score).
    Documents are encoded with `max_length` tokens (default the model's max_positions).
    """
    length_cap = _max_length(model, max_length)
    frames = []
    for key, rc in _as_mapping(corpora).items():
        doc_ids = [str(i) for i in rc.corpus["id"]]
        q_ids = [str(i) for i in rc.queries["id"]]
        if not doc_ids or not q_ids:
            raise ValueError(f"corpus {rc.name!r} at length {key} has no documents or no queries")
        pos = {d: i for i, d in enumerate(doc_ids)}
        docs = model.encode(
            list(rc.corpus["text"]), side="passage", batch_size=batch_size, max_length=length_cap
        )
        queries = model.encode(list(rc.queries["text"]), side="query", batch_size=batch_size)
        sims = np.asarray(queries, dtype=np.float32) @ np.asarray(docs, dtype=np.float32).T
        cols = rc.queries.column_names
        depth_by_doc = (
            dict(zip(doc_ids, rc.corpus["depth"], strict=True)) if "depth" in rc.corpus.column_names else {}
        )
        for qi, qid in enumerate(q_ids):
            golds = [d for d, rel in rc.qrels.get(qid, {}).items() if rel > 0 and d in pos]
            if not golds:
                raise ValueError(f"query {qid!r} of {rc.name!r} has no relevant document in the corpus")
            row = sims[qi]
            ranks = {g: 1 + int((row > row[pos[g]]).sum()) for g in golds}
            gold = min(ranks, key=ranks.get)
            if "depth" in cols:
                depth = float(rc.queries[qi]["depth"])
            elif gold in depth_by_doc:
                depth = float(depth_by_doc[gold])
            else:
                raise ValueError(
                    f"{rc.name!r} carries no 'depth' column (queries or corpus); use synthetic data"
                )
            length = int(rc.queries[qi]["length"]) if "length" in cols else int(key)
            frames.append(
                {
                    "task": rc.name,
                    "length": length,
                    "query_id": qid,
                    "gold_id": gold,
                    "depth": depth,
                    "gold_rank": ranks[gold],
                    "gold_sim": float(row[pos[gold]]),
                    "best_sim": float(row.max()),
                    "acc_at_1": float(ranks[gold] == 1),
                }
            )
    return pd.DataFrame(frames)


def depth_bins(depth: Sequence[float] | np.ndarray | pd.Series, n_bins: int = 5) -> np.ndarray:
    """Bin index 0..n_bins-1 of each depth in [0, 1] (equal-width bins; depth 1.0 is in the last)."""
    n_bins = _check_int("n_bins", n_bins)
    d = np.asarray(depth, dtype=float)
    if d.size and (np.nanmin(d) < 0 or np.nanmax(d) > 1):
        raise ValueError(f"depth must lie in [0, 1], got values in [{np.nanmin(d)}, {np.nanmax(d)}]")
    return np.minimum((d * n_bins).astype(int), n_bins - 1)


def _bin_labels(n_bins: int) -> list[str]:
    return [f"{i / n_bins:.2f}-{(i + 1) / n_bins:.2f}" for i in range(n_bins)]


def depth_length_table(
    per_query: pd.DataFrame, value: str = "acc_at_1", n_depth_bins: int = 5, agg: str = "mean"
) -> pd.DataFrame:
    """Depth bin (rows, all `n_depth_bins` kept, top = shallowest) x context length (columns).

    agg: "mean" (NaN where a cell has no query) or "count" (0 there). value: a column of
    `evidence_position_sensitivity` (acc_at_1, gold_rank, gold_sim...).
    """
    if agg not in ("mean", "count"):
        raise ValueError(f"unknown agg {agg!r}; allowed: mean, count")
    missing = {value, "depth", "length"} - set(per_query.columns)
    if missing:
        raise ValueError(
            f"per_query lacks columns {sorted(missing)}; build it with evidence_position_sensitivity"
        )
    labels = _bin_labels(n_depth_bins)
    df = per_query.assign(depth_bin=[labels[i] for i in depth_bins(per_query["depth"], n_depth_bins)])
    lengths = sorted(df["length"].unique())
    table = df.pivot_table(index="depth_bin", columns="length", values=value, aggfunc=agg)
    table = table.reindex(index=labels, columns=lengths)
    if agg == "count":
        table = table.fillna(0).astype(int)
    table.index.name = "depth"
    table.columns.name = "length"
    return table


def sensitivity_tables(
    models: Mapping[str, EmbeddingModel],
    corpora: Mapping[int, RetrievalCorpus],
    *,
    value: str = "acc_at_1",
    n_depth_bins: int = 5,
    **kwargs: Any,
) -> tuple[pd.DataFrame, dict[str, pd.DataFrame]]:
    """(all per-query rows with a 'model' column, {model: depth x length table of `value`})."""
    rows, tables = [], {}
    for name, m in models.items():
        pq = evidence_position_sensitivity(m, corpora, **kwargs).assign(model=name)
        rows.append(pq)
        tables[name] = depth_length_table(pq, value=value, n_depth_bins=n_depth_bins)
    return pd.concat(rows, ignore_index=True), tables
