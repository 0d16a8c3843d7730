"""Score against document length per pooling (the paper's Figure 1 view), from a sweep's per-query scores.

Nothing is re-encoded: every run of a Table 2 sweep already wrote `per_query.json` ({task: {split:
{query_id: score}}}, referenced from its results.json). The length tasks (passkey / needle, local or
LongEmbed's) split by document length, `test_<L>` (each query's "length" is L), so a split is a length
bucket; tasks without length splits (short retrieval, long documents) are left out.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from lmk.run.results import STATUS_DONE, Results

LENGTH_SPLIT = re.compile(r"(?:^|_)(\d+)$")  # test_256 -> 256 (a subset after "/" is ignored)
COLUMNS = ["block", "row", "pooling", "task", "length", "query_id", "score", "run_dir", "depth"]


def split_length(split: str) -> int | None:
    """The document length of a `test_<L>` split (`test_<L>/<subset>` too); None for other splits."""
    m = LENGTH_SPLIT.search(split.split("/", 1)[0])
    return int(m.group(1)) if m else None


def _pooling(config: dict) -> str | None:
    pool = config.get("pooling") or {}
    return pool.get("name")


def length_scores(sweep_dir: str | Path, blocks: tuple[str, ...] = ("train",)) -> pd.DataFrame:
    """One row per (run, length task, length, query) of a sweep folder's `<block>/<row>/` runs.

    Columns: block, row (the spec row id), pooling, task, length, query_id, score (the task's main
    metric on mteb's 0..1 scale), run_dir, depth (the query's needle depth where the task's results record it,
    as the RULER NIAH tasks do in `data.query_depths`; else NaN: score over depth x length needs nothing
    re-encoded). Runs that are not done or wrote no per-query file are skipped.
    """
    sweep = Path(sweep_dir)
    if not sweep.is_dir():
        raise ValueError(f"{str(sweep)!r} is not a sweep folder (expected <out>/train/<row>/results.json)")
    records = []
    for block in blocks:
        for results_file in sorted((sweep / block).glob("*/results.json")):
            results = Results.from_dict(json.loads(results_file.read_text()))
            ref = results.eval.per_query
            if results.status != STATUS_DONE or not ref or not (results_file.parent / ref).is_file():
                continue
            config = results.config
            row = results.row_id or results_file.parent.name
            per_query = json.loads((results_file.parent / ref).read_text())
            for task, splits in per_query.items():
                depths = ((results.eval.tasks.get(task) or {}).get("data") or {}).get("query_depths") or {}
                for split, scores in splits.items():
                    length = split_length(split)
                    if length is None:
                        continue
                    at = depths.get(split, {})
                    records += [(block, row, _pooling(config), task, length, str(qid), float(score),
                                 str(results_file.parent), float(at.get(qid, "nan"))) for qid, score in scores.items()]
    return pd.DataFrame.from_records(records, columns=COLUMNS)


def length_curves(scores: pd.DataFrame) -> pd.DataFrame:
    """Mean score, standard error and query count per (block, task, row, length), lengths ascending."""
    missing = {"block", "task", "row", "length", "score"} - set(scores.columns)
    if missing:
        raise ValueError(f"scores lacks columns {sorted(missing)}; build it with length_scores")
    g = scores.groupby(["block", "task", "row", "length"], sort=True)["score"]
    out = pd.DataFrame({"mean": g.mean(), "sem": g.sem(ddof=0), "count": g.size()})
    return out.reset_index()
