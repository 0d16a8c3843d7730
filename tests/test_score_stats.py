"""Score statistics on hand-made scores: LongEmbed averaging, groups, per-query measures, paired t-test."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lmk.eval.score_stats import (
    LONGEMBED6,
    group_scores,
    longembed6_score,
    paired_ttest,
    per_query_scores,
    pytrec_measure,
    summarize_scores,
)


def _entry(value: float, subset: str = "default") -> dict:
    return {"hf_subset": subset, "main_score": value, "ndcg_at_1": value, "languages": ["eng-Latn"]}


def test_passkey_score_is_the_mean_over_length_splits() -> None:
    lengths = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
    acc = [1.0, 0.9, 0.8, 0.6, 0.5, 0.3, 0.2, 0.1]
    scores = {f"test_{n}": [_entry(a)] for n, a in zip(lengths, acc, strict=True)}
    out = summarize_scores(scores, "ndcg_at_1")
    assert out["metric"] == "ndcg_at_1"
    assert out["main_score"] == pytest.approx(sum(acc) / 8)
    assert out["splits"]["test_4096"] == 0.5
    # only the requested splits count (a cache may hold more)
    assert summarize_scores(scores, "ndcg_at_1", splits=["test_256", "test_512"])["main_score"] == pytest.approx(0.95)


def test_multilingual_splits_average_subsets_and_name_them() -> None:
    scores = {"test": [_entry(0.2, "en"), _entry(0.4, "de"), _entry(0.9, "zh")]}
    out = summarize_scores(scores, "ndcg_at_10", subsets=["en", "de"])
    assert out["main_score"] == pytest.approx(0.3)
    assert out["splits"] == {"test/en": 0.2, "test/de": 0.4}


def test_longembed6_is_the_mean_of_six() -> None:
    # LongEmbed Table 2, E5-Base row (x100): passkey 38.0 needle 28.5 NQA 25.3 QMSum 23.8 SFD 74.7 2WmQA 55.8 -> 41.0
    values = dict(zip(LONGEMBED6, [0.380, 0.285, 0.253, 0.238, 0.747, 0.558], strict=True))
    assert round(100 * longembed6_score(values), 1) == 41.0
    with pytest.raises(KeyError, match="LEMBWikimQARetrieval"):
        longembed6_score({k: v for k, v in values.items() if k != "LEMBWikimQARetrieval"})


def test_group_scores_never_average_a_partial_group() -> None:
    out = group_scores({"A": 0.2, "B": 0.6}, {"ab": ["A", "B"], "abc": ["A", "B", "C"], "a": ["A"]})
    assert out["ab"] == pytest.approx(0.4)
    assert out["a"] == pytest.approx(0.2)
    assert out["abc"] is None


def test_pytrec_measure_names() -> None:
    assert pytrec_measure("ndcg_at_10") == "ndcg_cut_10"
    assert pytrec_measure("ndcg_at_1") == "ndcg_cut_1"
    assert pytrec_measure("recall_at_100") == "recall_100"
    with pytest.raises(ValueError, match="no pytrec_eval per-query measure"):
        pytrec_measure("mrr_at_10")
    assert per_query_scores({"q1": {"ndcg_cut_10": 0.5, "P_1": 1.0}}, "ndcg_at_10") == {"q1": 0.5}


def test_paired_ttest_matches_the_formula() -> None:
    a = {"T": {"test": {"q1": 1.0, "q2": 0.0, "q3": 1.0, "q4": 1.0, "q5": 0.5}}}
    b = {"T": {"test": {"q1": 0.0, "q2": 0.0, "q3": 1.0, "q4": 0.0, "q5": 0.0, "only_b": 1.0}}}
    res = paired_ttest(a, b)
    d = np.array([1.0, 0.0, 0.0, 1.0, 0.5])
    t = d.mean() / (d.std(ddof=1) / math.sqrt(len(d)))
    assert res["n"] == 5  # only shared queries are paired
    assert res["t"] == pytest.approx(t)
    assert 0.0 < res["p"] < 1.0
    assert res["mean_diff"] == pytest.approx(d.mean())
    same = paired_ttest(a, a)
    assert same["t"] == 0.0 and same["p"] == 1.0
    with pytest.raises(ValueError, match="same suite"):
        paired_ttest(a, {"Other": {"test": {"q1": 1.0}}})


def test_the_old_module_path_still_imports_with_a_deprecation(monkeypatch) -> None:
    """`lmk.eval.scoring` (the module's old name, beside the `eval.scoring` setting) is the same module, with a
    DeprecationWarning naming the new one."""
    import importlib
    import sys

    monkeypatch.delitem(sys.modules, "lmk.eval.scoring", raising=False)
    with pytest.warns(DeprecationWarning, match="lmk.eval.score_stats"):
        old = importlib.import_module("lmk.eval.scoring")
    assert old.__name__ == "lmk.eval.score_stats" and old.paired_ttest is paired_ttest
