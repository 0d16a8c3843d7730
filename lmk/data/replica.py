"""A local replica of ``cfli/bge-full-data`` in its real layout, made offline from the offline pairs.

The paper trains on ``cfli/bge-full-data`` (subsets exposed as splits, files
``data/<subset>-NNNNN-of-NNNNN.parquet``, columns `lmk.data.hub.BGE_COLUMNS`). The replica has the same
layout, columns and README.md card (its ``configs:`` block declares one split per subset), so
``datasets.load_dataset(<replica folder>, data_files="data/msmarco_passage-*.parquet", split="train")``
reads it exactly as it reads the hub repo: a config differs from the paper's only by its ``path``.

Content: rows of the offline training split (`lmk.data.offline_pairs`, docstring summary -> body with
BM25-mined negatives), shuffled with `seed` and dealt out to the subsets without overlap. Teacher scores
(``pos_scores`` / ``neg_scores``) come from a deterministic lexical teacher: Okapi BM25 (bm25s, its defaults
k1=1.5, b=0.75, English stopwords) of the query against each listed passage, the index built over every
passage of the subset. The real set's scores come from a cross-encoder; BM25 only stands in for them.

Built once into ``$LMK_CACHE/replicas/bge-full-data/`` (source path ``replica:bge-full-data``) or any folder
(``python -m lmk.data.replica --out <folder>``); fingerprinted and rebuilt when a file is missing or changed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import bm25s
import numpy as np

from lmk.data.hub import BGE_FULL_DATA_ID, ensure_built_folder
from lmk.data.offline_pairs import bm25_scores, load_offline_pairs, offline_fingerprint
from lmk.run.umask_files import cache_root

REPLICA_VERSION = 1
# Subset -> parquet shards; the first two are cut in two as the hub repo cuts its large subsets.
SUBSETS: dict[str, int] = {"msmarco_passage": 2, "msmarco_document": 2, "nq": 1, "hotpotqa": 1}
# The retrieval instructions of those subsets (the `prompt` column; training does not read it).
PROMPTS = {
    "msmarco_passage": "Given a web search query, retrieve relevant passages that answer the query.",
    "msmarco_document": "Given a web search query, retrieve relevant documents that answer the query.",
    "nq": "Given a question, retrieve Wikipedia passages that answer the question.",
    "hotpotqa": "Given a multi-hop question, retrieve documents that can help answer the question.",
}
ROWS_PER_SUBSET = 256
OFFLINE_ROWS = 2000  # docstrings the offline build extracts (about 1,800 training rows): enough for 4 x 256
_CARD = f"""# Local replica of {BGE_FULL_DATA_ID} (lmk)

Same layout, columns and split names as the hub repo; rows from lmk's offline docstring pairs, teacher scores
from BM25 (bm25s). Built by `lmk.data.replica`. Not the real data: for offline rehearsals of the paper's path.
"""


def replica_fingerprint(rows_per_subset: int | None = None, seed: int = 0, offline_rows: int | None = -1) -> str:
    """What a replica is built from: this code's version, its knobs and the offline set's fingerprint
    (rows_per_subset None / offline_rows -1: the defaults of the named replica)."""
    rows_per_subset = ROWS_PER_SUBSET if rows_per_subset is None else rows_per_subset
    offline_rows = OFFLINE_ROWS if offline_rows == -1 else offline_rows
    payload = {"v": REPLICA_VERSION, "subsets": SUBSETS, "rows": rows_per_subset, "seed": seed,
               "offline": offline_fingerprint(max_rows=offline_rows)}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def bm25_teacher_scores(queries: Sequence[str], passages: Sequence[Sequence[str]]) -> list[list[float]]:
    """BM25 score of each query against each of its passages; the index holds all passages given."""
    pool = sorted({p for ps in passages for p in ps})
    where = {p: i for i, p in enumerate(pool)}
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(pool, stopwords="en", show_progress=False), show_progress=False)
    tokens = bm25s.tokenize(list(queries), stopwords="en", return_ids=False, show_progress=False)
    out = []
    for toks, ps in zip(tokens, passages, strict=True):
        scores = bm25_scores(retriever, toks, len(pool))
        out.append([round(float(scores[where[p]]), 4) for p in ps])
    return out


def _build(rows_per_subset: int, seed: int, offline_rows: int | None, cache_dir: str | os.PathLike | None) -> tuple:
    train = load_offline_pairs("train", max_rows=offline_rows, cache_dir=cache_dir)
    need = rows_per_subset * len(SUBSETS)
    if train.num_rows < need:
        raise ValueError(
            f"the offline training split has {train.num_rows} rows, fewer than {len(SUBSETS)} subsets x "
            f"rows_per_subset={rows_per_subset}; lower rows_per_subset or raise offline_rows (None = all)"
        )
    order = np.random.default_rng(seed).permutation(train.num_rows)[:need]
    splits: dict[str, list[dict[str, Any]]] = {}
    for k, subset in enumerate(SUBSETS):
        rows = train.select(sorted(int(i) for i in order[k * rows_per_subset : (k + 1) * rows_per_subset]))
        queries, pos, neg = rows["query"], rows["pos"], rows["neg"]
        scores = bm25_teacher_scores(queries, [p + n for p, n in zip(pos, neg, strict=True)])
        splits[subset] = [
            {"query": q, "pos": p, "neg": n, "category": "retrieval", "type": "normal", "prompt": PROMPTS[subset],
             "pos_scores": s[: len(p)], "neg_scores": s[len(p) :]}
            for q, p, n, s in zip(queries, pos, neg, scores, strict=True)
        ]
    report = {"rows": {s: len(v) for s, v in splits.items()}, "teacher": "bm25s (k1=1.5, b=0.75, stopwords en)",
              "seed": seed, "offline_rows": offline_rows}
    return splits, SUBSETS, _CARD, report


def build_bge_full_data_replica(
    folder: str | os.PathLike,
    rows_per_subset: int = ROWS_PER_SUBSET,
    seed: int = 0,
    offline_rows: int | None = OFFLINE_ROWS,
    cache_dir: str | os.PathLike | None = None,
    rebuild: bool = False,
) -> Path:
    """Build (or find intact) the replica in `folder`; returns the folder. Idempotent: a folder whose
    fingerprint and file hashes match is kept, a corrupt or outdated one rebuilt. `cache_dir` is where the
    offline pairs it is made from are cached."""
    if isinstance(rows_per_subset, bool) or not isinstance(rows_per_subset, int) or rows_per_subset < 1:
        raise ValueError(f"rows_per_subset={rows_per_subset!r} is not valid; allowed values: an integer >= 1")
    fp = replica_fingerprint(rows_per_subset, seed, offline_rows)
    return ensure_built_folder(folder, fp, lambda: _build(rows_per_subset, seed, offline_rows, cache_dir), rebuild,
                               f"{BGE_FULL_DATA_ID} replica")


def replica_folder(name: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """The cache folder of the named replica (``replica:<name>``), built with the defaults when needed."""
    if name != "bge-full-data":
        raise ValueError(f"replica {name!r} is not known; allowed values: bge-full-data")
    return build_bge_full_data_replica(cache_root(cache_dir) / "replicas" / name, ROWS_PER_SUBSET, 0, OFFLINE_ROWS,
                                       cache_dir=cache_dir)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lmk.data.replica", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder to build the replica in (kept when intact)")
    parser.add_argument("--rows-per-subset", type=int, default=ROWS_PER_SUBSET)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--offline-rows", type=int, default=OFFLINE_ROWS, help="docstrings to extract (0 = all)")
    parser.add_argument("--rebuild", action="store_true")
    args = parser.parse_args(argv)
    folder = build_bge_full_data_replica(args.out, args.rows_per_subset, args.seed, args.offline_rows or None,
                                         rebuild=args.rebuild)
    meta = json.loads((folder / "meta.json").read_text())
    print(f"{folder}: {meta['report']['rows']} ({meta['report']['teacher']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
