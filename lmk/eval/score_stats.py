"""Scores as the paper reports them, computed from what mteb (and its pytrec_eval) returns.

- A task's score is its mteb main score (nDCG@10; Acc@1 = nDCG@1 for passkey / needle), averaged
  over its evaluated splits (the 8 length splits of passkey / needle) and subsets (MLDR languages).
- A group score is the plain mean of its tasks' scores; LongEmbed-6 is the mean of the six tasks.
- Per-query scores are mteb's own pytrec_eval per-query values of the main metric; two runs are
  compared with a paired t-test over the queries they share (scipy.stats.ttest_rel).

Nothing here re-implements a retrieval metric: only averaging and the significance test.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

LONGEMBED6: tuple[str, ...] = (
    "LEMBPasskeyRetrieval",
    "LEMBNeedleRetrieval",
    "LEMBNarrativeQARetrieval",
    "LEMBQMSumRetrieval",
    "LEMBSummScreenFDRetrieval",
    "LEMBWikimQARetrieval",
)

# mteb main-score name -> pytrec_eval per-query key (mteb computes these measures with pytrec_eval).
_PYTREC_PREFIX = {"ndcg_at_": "ndcg_cut_", "map_at_": "map_cut_", "recall_at_": "recall_", "precision_at_": "P_",
                  "hit_rate_at_": "success_"}


def split_key(split: str, subset: str) -> str:
    """`test_256` for single-subset tasks, `test/en` when a task has several subsets (languages)."""
    return split if subset == "default" else f"{split}/{subset}"


def summarize_scores(
    scores: Mapping[str, Sequence[Mapping[str, Any]]],
    main_score: str,
    splits: Sequence[str] | None = None,
    subsets: Sequence[str] | None = None,
) -> dict[str, Any]:
    """mteb `TaskResult.scores` ({split: [{hf_subset, main_score, ...}]}) -> the task's results entry.

    Only the requested splits / subsets count (a cache may hold more). The task score is the mean of
    the per-split scores, each the mean over its subsets: for passkey / needle the LongEmbed protocol
    (Acc@1 per length, then the mean over lengths).
    """
    splits = list(scores) if splits is None else list(splits)
    out_splits: dict[str, float] = {}
    per_split_means = []
    for split in splits:
        if split not in scores:
            raise KeyError(f"split {split!r} missing from scores (have {sorted(scores)})")
        entries = [e for e in scores[split] if subsets is None or e.get("hf_subset", "default") in subsets]
        if not entries:
            raise KeyError(f"split {split!r}: no scores for subsets {subsets}")
        values = []
        for entry in entries:
            value = float(entry["main_score"])
            out_splits[split_key(split, entry.get("hf_subset", "default"))] = value
            values.append(value)
        per_split_means.append(float(np.mean(values)))
    return {"main_score": float(np.mean(per_split_means)), "metric": main_score, "splits": out_splits}


def mean_score(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("mean of no scores")
    return float(np.mean([float(v) for v in values]))


def group_scores(
    task_scores: Mapping[str, float], groups: Mapping[str, Sequence[str]]
) -> dict[str, float | None]:
    """Mean main score per group; None (and no silent partial mean) when a member task has no score."""
    out: dict[str, float | None] = {}
    for group, members in groups.items():
        values = [task_scores.get(t) for t in members]
        out[group] = None if any(v is None for v in values) else mean_score(values)  # type: ignore[arg-type]
    return out


def longembed6_score(task_scores: Mapping[str, float], names: Sequence[str] = LONGEMBED6) -> float:
    """LongEmbed-6: the plain mean of the six task scores (passkey / needle already length-averaged)."""
    missing = [n for n in names if n not in task_scores]
    if missing:
        raise KeyError(f"LongEmbed-6 needs all six tasks; missing {missing}")
    return mean_score([task_scores[n] for n in names])


def pytrec_measure(main_score: str) -> str:
    """The pytrec_eval per-query key of an mteb main score, e.g. ndcg_at_10 -> ndcg_cut_10."""
    for prefix, pytrec in _PYTREC_PREFIX.items():
        if main_score.startswith(prefix) and main_score[len(prefix):].isdigit():
            return pytrec + main_score[len(prefix):]
    raise ValueError(
        f"main score {main_score!r} has no pytrec_eval per-query measure; supported: "
        f"{[p + 'k' for p in _PYTREC_PREFIX]}"
    )


def per_query_scores(all_scores: Mapping[str, Mapping[str, float]], main_score: str) -> dict[str, float]:
    """mteb's per-query pytrec_eval dict ({qid: {measure: value}}) -> {qid: main-metric value}."""
    measure = pytrec_measure(main_score)
    return {str(qid): float(m[measure]) for qid, m in all_scores.items()}


# ------------------------------------------------------------------------------- significance
def _flatten(per_query: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], float]:
    flat: dict[tuple[str, ...], float] = {}
    for key, value in per_query.items():
        if isinstance(value, Mapping):
            flat.update(_flatten(value, (*prefix, str(key))))
        else:
            flat[(*prefix, str(key))] = float(value)
    return flat


def load_per_query(path: str | os.PathLike) -> dict[str, Any]:
    """A per_query.json ({task: {split: {qid: score}}}); a run dir or results.json also works."""
    path = Path(path)
    if path.is_dir():
        path = path / "per_query.json"
    elif path.name == "results.json":
        ref = json.loads(path.read_text()).get("eval", {}).get("per_query", "per_query.json")
        path = path.parent / ref
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no per-query scores (written by lmk.eval.runner.run_suite)")
    return json.loads(path.read_text())


def paired_ttest(
    a: Mapping[str, Any],
    b: Mapping[str, Any],
    task: str | None = None,
    split: str | None = None,
) -> dict[str, float | int]:
    """Paired t-test of run a vs run b over the queries both scored (optionally one task / split).

    `a`, `b`: per_query dicts {task: {split: {qid: score}}}. Returns t, p (two-sided), n, mean_a,
    mean_b, mean_diff (a - b). p is NaN when the differences are all equal (t undefined).
    """
    def select(pq: Mapping[str, Any]) -> dict[tuple[str, ...], float]:
        if task is not None:
            if task not in pq:
                raise KeyError(f"task {task!r} not in per-query scores (have {sorted(pq)})")
            pq = {task: pq[task]}
        flat = _flatten(pq)
        if split is not None:
            flat = {k: v for k, v in flat.items() if len(k) >= 2 and k[1] == split}
        return flat

    fa, fb = select(a), select(b)
    common = sorted(set(fa) & set(fb))
    if len(common) < 2:
        raise ValueError(
            f"paired t-test needs >= 2 queries scored by both runs; found {len(common)} "
            "(compare runs evaluated on the same suite)"
        )
    xa = np.array([fa[k] for k in common])
    xb = np.array([fb[k] for k in common])
    diff = xa - xb
    if np.allclose(diff, diff[0]):
        t, p = (0.0, 1.0) if diff[0] == 0 else (math.copysign(math.inf, diff[0]), float("nan"))
    else:
        res = stats.ttest_rel(xa, xb)
        t, p = float(res.statistic), float(res.pvalue)
    return {"t": t, "p": p, "n": len(common), "mean_a": float(xa.mean()), "mean_b": float(xb.mean()),
            "mean_diff": float(diff.mean())}


_SAFE = re.compile(r"[^A-Za-z0-9_.=-]+")


def metric_key(*parts: str) -> str:
    """Logger key from parts, e.g. eval/LocalPasskey/test_256 (W&B panel per task and length)."""
    return "/".join(_SAFE.sub("-", p) for p in parts)
