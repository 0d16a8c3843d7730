"""Which landmark wins the MaxSim: for each needle query, the document landmark its MaxSim picks against the landmark
of the chunk that holds the needle (the per-landmark view of `eval.scoring=maxsim`).

Documents and queries are their landmark states (`lmk.model.multi_vector.encode_states`, as MaxSim scoring encodes
them); `lmk.eval.maxsim.maxsim_winners` gives, per query vector, the document landmark that wins its max, and the
query's winning landmark is the one with the highest similarity to any of its vectors. The needle's landmark is the
one that closes the chunk holding the needle's middle token (the first landmark after it; with the authors'
placement, the one before it). A needle cut away by truncation, or in a last chunk that no landmark closes, has none:
its row keeps `needle_landmark` NaN and is left out of the share.

Each row also names the model's pooling row and the objective that trained it (`RunName`, from the sweep's
results.json: `ModelChoice.runs`), so the two trainings of one pooling (`train.objective`) can be put side by side:
`winners_by_objective` tabulates them, `lmk.analysis.plots.plot_winning_landmarks_by_objective` draws them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from lmk.analysis.common import RunName, _max_length, objective_label
from lmk.config import TrainSection
from lmk.data import ruler
from lmk.eval.maxsim import maxsim_winners
from lmk.model.landmark import vector_mask
from lmk.model.multi_vector import encode_states, no_landmarks

if TYPE_CHECKING:
    from lmk.data.retrieval import RetrievalCorpus
    from lmk.model.embedding import EmbeddingModel


def needle_corpora(lengths: list[int], n_docs: int, seed: int = 0, depths: Any = ruler.RULER_DEPTHS
                   ) -> dict[int, RetrievalCorpus]:
    """RULER NIAH single data over lmk's essays (every query asks for one needle whose offset the data record)."""
    return ruler.generate_ruler("single", lengths=tuple(lengths), n_docs=n_docs, n_queries=n_docs, seed=seed,
                                haystack="lmk-essays", depths=tuple(depths))


def needle_landmark(model: EmbeddingModel, text: str, offset: int, needle: str, max_length: int) -> tuple[int | None, int]:
    """(index among the document's landmark states of the one whose chunk holds the needle, or None; how many
    landmark states the document has), tokenized as `encode_states` tokenizes it at `max_length`."""
    feats = model.tokenize([text], side="passage", max_length=max_length)
    attention, pool = feats["attention_mask"][0].bool(), feats["pool_mask"][0].bool()
    kept = np.flatnonzero(vector_mask(feats["attention_mask"], feats["pool_mask"])[0].numpy())
    # content tokens: neither the leading token nor a pooled position nor padding
    content = np.flatnonzero((attention & ~pool).numpy())[1:]
    before = len(model.tokenizer(text[:offset].rstrip(), add_special_tokens=False, verbose=False)["input_ids"])
    upto = len(model.tokenizer(text[:offset + len(needle)], add_special_tokens=False, verbose=False)["input_ids"])
    middle = before + max(upto - before, 1) // 2
    if middle >= len(content) or not pool.any():
        return None, len(kept)
    position = content[middle]
    after = int(np.searchsorted(kept, position))  # the first landmark after the needle's middle token
    index = after - 1 if getattr(model.landmark_tokenizer, "placement", "after") == "authors" else after
    return (index if 0 <= index < len(kept) else None), len(kept)


COLUMNS = ["model", "pooling", "objective", "length", "query_id", "depth", "n_landmarks", "needle_landmark", "winner",
           "distance"]


def winning_landmarks(models: Mapping[str, EmbeddingModel], corpora: Mapping[int, RetrievalCorpus], *,
                      runs: Mapping[str, RunName] | None = None, max_length: int | None = None,
                      batch_size: int = 8) -> pd.DataFrame:
    """One row per (model, needle query) against the query's own document: model (its label), pooling and objective
    (from `runs[label]`, e.g. `ModelChoice.runs`; a model not in it: its label, untrained), length, query_id, depth,
    n_landmarks, needle_landmark (NaN: none), winner (index of the winning document landmark), distance (winner -
    needle_landmark). Models without landmark states (CLS, mean) are skipped."""
    rows = []
    for label, model in models.items():
        if no_landmarks(model) is not None:
            continue
        run = (runs or {}).get(label) or RunName(label)
        length_cap = _max_length(model, max_length)
        for length, rc in corpora.items():
            docs = {d["id"]: d for d in rc.corpus}
            gold = [docs[rc.relevant(q)[0]] for q in rc.queries["id"]]
            doc_states = encode_states(model, [d["text"] for d in gold], "passage", batch_size=batch_size,
                                       max_length=length_cap)
            query_vectors = encode_states(model, list(rc.queries["text"]), "query", batch_size=batch_size)
            for q, d, dv, qv in zip(rc.queries, gold, doc_states, query_vectors, strict=True):
                index, n = needle_landmark(model, d["text"], d["offset"], d["needle"], length_cap)
                winners, best = maxsim_winners(qv, dv)
                winner = int(winners[int(np.argmax(best))])
                rows.append({"model": label, "pooling": run.pooling, "objective": run.objective, "length": int(length), "query_id": q["id"], "depth": float(q["depth"]),
                             "n_landmarks": n, "needle_landmark": np.nan if index is None else index,
                             "winner": winner, "distance": np.nan if index is None else winner - index})
    return pd.DataFrame(rows, columns=COLUMNS)


def near_needle_share(frame: pd.DataFrame, within: int = 1) -> pd.Series:
    """Per model, the share of needle queries (with a needle landmark) whose winning landmark is within `within`
    chunks of the needle's."""
    seen = frame.dropna(subset=["needle_landmark"])
    return (seen["distance"].abs() <= within).groupby(seen["model"]).mean().rename(f"within_{within}")


def objective_order(frame: pd.DataFrame) -> list[str]:
    """The objectives of a `winning_landmarks` frame, the schema's default (`train.objective`) first, then as met."""
    return sorted(dict.fromkeys(frame["objective"]), key=lambda o: o != TrainSection.objective)


def winners_by_objective(frame: pd.DataFrame, within: int = 1) -> pd.DataFrame:
    """Pooling (rows) x objective (columns, by their card labels) of the share of needle queries whose winning
    landmark is within `within` chunks of the needle's, and of the mean |winner - needle landmark| (queries with a
    needle landmark only); NaN where a pooling was not trained with an objective."""
    seen = frame.dropna(subset=["needle_landmark"]).assign(
        near=lambda f: (f["distance"].abs() <= within).astype(float), gap=lambda f: f["distance"].abs().astype(float))
    objectives = objective_order(seen)
    table = seen.groupby(["pooling", "objective"], sort=False)[["near", "gap"]].mean().unstack("objective")
    table = table.reindex(columns=pd.MultiIndex.from_product([["near", "gap"], objectives]))
    table.columns = pd.MultiIndex.from_tuples(
        [(f"within +/-{within}" if metric == "near" else "mean |distance|", objective_label(o))
         for metric, o in table.columns], names=["", "objective"])
    return table
