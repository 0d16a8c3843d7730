"""The benchmark suite at its tiny size: every section runs, compared outputs are equal, reports are well formed.

No timing asserts: the figures themselves are only checked for shape and sanity (positive, finite).
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # benchmarks/ is a top-level folder, not part of the installed lmk package
    sys.path.insert(0, str(ROOT))

from benchmarks import common  # noqa: E402
from benchmarks.bench_tokenization import compare_features, python_landmark_baseline  # noqa: E402
from benchmarks.run import SECTIONS, main, parse_sections, run_benchmarks, to_markdown, write_report  # noqa: E402

FIGURE_KEYS = {"section", "name", "unit", "ours", "peer", "peer_name", "ratio", "ratio_def", "goal", "passed",
               "verdict", "ci", "status", "reason", "details"}


# 2 shared cores: a second torch thread competing with other processes stalls every op
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@contextlib.contextmanager
def _frozen_heap():
    """The benchmarks' timers run `gc.collect()` before every timed call (a collection inside the timed region would
    be noise): in a test process holding the suite's imports, each walks a million objects that are not the
    benchmarks' (about a second on these cores). Frozen, those are left out of the collections; what the benchmarks
    allocate is still collected."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@pytest.fixture(scope="module")
def report() -> dict:
    """One tiny run of every section, shared by the checks below."""
    with _frozen_heap():
        return run_benchmarks("tiny")


def _fig(report: dict, section: str, name: str) -> dict:
    found = [f for f in report["figures"] if f["section"] == section and f["name"] == name]
    assert found, f"no figure {section}/{name}; have {[(f['section'], f['name']) for f in report['figures']]}"
    return found[0]


# ------------------------------------------------------------------------------------- tokenization
@pytest.mark.parametrize("chunk_size,max_length", [(32, 512), (4, 40), (3, 7), (32, 16), (1, 9)])
def test_python_baseline_equals_landmark_tokenizer(minilm_tokenizer, chunk_size, max_length):
    from lmk.model.landmark.tokenization import LandmarkTokenizer

    texts = common.mixed_texts(12, 1, 300, seed=5) + [
        "",  # [CLS] [LMK]
        "word " * chunk_size,  # exactly whole chunks
        "x",
        "The grass is green. The sky is blue.",
    ]
    lmk = LandmarkTokenizer(minilm_tokenizer, strategy="fixed", chunk_size=chunk_size, max_length=max_length)
    ours = lmk(texts)
    base = python_landmark_baseline(minilm_tokenizer, texts, chunk_size, max_length)
    cmp = compare_features(ours, base)
    assert cmp["equal"], cmp
    assert bool(base["pool_mask"].any(dim=1).all())  # every row keeps >= 1 landmark
    assert int(base["attention_mask"].sum(dim=1).max()) <= max_length


def test_compare_features_detects_a_changed_id(minilm_tokenizer):
    base = python_landmark_baseline(minilm_tokenizer, ["one two three four five", "six"], 2, 16)
    other = {k: v.clone() for k, v in base.items()}
    other["input_ids"][1, 1] += 1
    assert compare_features(base, base)["equal"]
    assert compare_features(base, other) == {"equal": False, "first_diff_row": 1, "len_a": 3, "len_b": 3}


def test_tokenization_section(report):
    f = _fig(report, "tokenization", "landmark_vs_python_baseline")
    assert f["details"]["ids_equal"] is True
    plain = _fig(report, "tokenization", "landmark_vs_plain_tokenizer")
    assert plain["goal"] == "ratio <= 1.3" and plain["details"]["n_texts"] == 100


# ----------------------------------------------------------------------------------------- encode
def test_encode_equals_sentence_transformers(report):
    f = _fig(report, "encode", "mean_vs_sentence_transformers")
    assert f["details"]["max_abs_diff"] <= 1e-5
    assert f["details"]["equal_1e-5"] is True
    lmk = _fig(report, "encode", "lmk32_vs_mean")
    # landmarks add about 1/32 tokens (fewer where texts are short)
    assert 0 < lmk["details"]["token_overhead"] <= 1 / 32 + 1e-9 + 1 / lmk["details"]["n_texts"]


def test_encode_pipeline_figures_against_the_forward_alone(report):
    from benchmarks.bench_encode import PIPELINE_POOLINGS, SIZES

    lengths = SIZES["tiny"]["pipeline"]["lengths"]
    names = {f["name"] for f in report["figures"] if f["name"].startswith("pipeline_vs_forward_only_")}
    assert len(names) == len(lengths) * len(PIPELINE_POOLINGS)
    for name in names:
        d = _fig(report, "encode", name)["details"]
        assert d["end_to_end_tokens_per_s"] > 0 and d["forward_only_tokens_per_s"] > 0 and d["tokens"] > 0
    assert _fig(report, "encode", "lmk_sentence_vs_lmk_fixed")["ratio"] > 0


def test_max_abs_diff_rejects_shape_mismatch():
    import numpy as np

    from benchmarks.bench_encode import max_abs_diff

    with pytest.raises(ValueError, match="shapes differ"):
        max_abs_diff(np.zeros((2, 3)), np.zeros((3, 3)))


# ------------------------------------------------------------------------------------- train step
def test_lightning_and_raw_loop_losses_equal(report):
    d = _fig(report, "train_step", "lightning_vs_raw_loop")["details"]
    assert len(d["lightning_losses"]) == len(d["raw_losses"]) == d["steps"]
    assert d["lightning_losses"] == pytest.approx(d["raw_losses"], rel=1e-6, abs=1e-6)
    assert all(math.isfinite(x) and x > 0 for x in d["raw_losses"])
    # the model actually trained: the loss moved (same batches, non-zero lr)
    assert len(set(d["raw_losses"])) > 1


def test_token_budget_step_section(report):
    """Padded and token-budget grad-cache steps see the same real tokens; the token budget computes no more and
    starts from the same loss (identical weights, no dropout)."""
    f = _fig(report, "train_tokens", "token_budget_vs_padded_step")
    d = f["details"]
    assert f["ours"] > 0 and f["peer"] > 0 and len(d["ratio_samples"]) == len(d["padded_round_s"])
    assert 0 < d["fill_padded"] <= d["fill_tokens"] <= 1
    assert d["first_loss_diff"] <= 1e-5 and d["passage_tokens_max"] <= d["passage_len"]


# ------------------------------------------------------------------------------------ long inputs
def test_long_inputs_section(report):
    for length in (64, 128):
        f = _fig(report, "long_inputs", f"sdpa_vs_eager_{length}")
        assert f["details"]["max_abs_diff"] <= 1e-4  # same weights, two attention kernels
        assert f["details"]["sdpa_peak_mb"] >= 0 and f["details"]["eager_peak_mb"] >= 0
        _fig(report, "long_inputs", f"sdpa_vs_eager_memory_{length}")
    b = _fig(report, "long_inputs", "sorted_vs_naive_batches_128")["details"]
    assert b["max_abs_diff"] <= 1e-5  # length-sorted batches embed exactly like naive ones
    assert b["real_tokens"] <= b["ours_padded_tokens"] <= b["peer_padded_tokens"]


def test_attention_estimate_and_bad_impl():
    from benchmarks.bench_long_inputs import estimate_attention_mb, set_attention

    # a lone 32k document under SDPA needs no T x T buffer any more (lmk.model.long_attention): linear in T
    assert estimate_attention_mb(32768, 4, "eager") > 10_000 > 1000 > estimate_attention_mb(32768, 4, "sdpa")
    assert estimate_attention_mb(32768, 4, "sdpa") == pytest.approx(2 * estimate_attention_mb(16384, 4, "sdpa"))
    with pytest.raises(ValueError, match="allowed: sdpa, eager"):
        set_attention(None, "flash")


def test_token_budget_vs_fixed_batches(report):
    f = _fig(report, "long_inputs", "token_budget_vs_fixed_batches_128")
    d = f["details"]
    assert d["max_abs_diff"] <= 1e-5  # batching never changes an embedding
    assert d["ours_max_batch_tokens"] <= d["max_tokens_per_batch"] < d["peer_max_batch_tokens"]
    assert d["real_tokens"] <= d["ours_padded_tokens"] and d["ours_batches"] > d["peer_batches"]
    assert len(d["ratio_samples"]) == len(d["ours_times_s"]) == 2 and f["ci"] is not None
    assert f["ci"][0] <= f["ratio"] <= f["ci"][1] and f["verdict"] in ("PASS", "FAIL", "inconclusive")
    _fig(report, "long_inputs", "token_budget_vs_fixed_batches_memory_128")


# --------------------------------------------------------------------------------- roofline / gpu
def test_roofline_counts_flops(report):
    f = _fig(report, "roofline", "minilm-l6_forward_vs_matmul")
    d = f["details"]
    # torch's counter and the analytic count agree to within 20% (layer norms / softmax are not counted)
    assert d["flops_counted"] == pytest.approx(d["flops_analytic"], rel=0.2)
    assert f["ours"] > 0 and f["peer"] > 0 and f["passed"] is None


def test_gpu_section_skipped_without_cuda(report):
    import torch

    gpu = [f for f in report["figures"] if f["section"] == "gpu"]
    assert gpu
    if torch.cuda.is_available():
        assert all(f["status"] == "ok" for f in gpu)
    else:
        assert [f["status"] for f in gpu] == ["skipped", "skipped"]
        assert all("CUDA" in f["reason"] and f["passed"] is None and f["verdict"] == "skipped" for f in gpu)
        assert any(f["name"].startswith("token_budget_vs_fixed_batches") for f in gpu)


# ------------------------------------------------------------------------------------------ report
def test_refusal_section_times_each_refused_setting(report):
    """Each wrong setting was refused in one line (the section raises otherwise) and timed; its sample is the time
    over the 2 s goal (the peer, a refusal that needs Lightning's signature, runs at the full size only)."""
    from benchmarks.bench_refusal import GOAL_S, SETTINGS

    figs = {f["name"]: f for f in report["figures"] if f["section"] == "refusal"}
    assert set(figs) == {f"refused: {name}" for name in SETTINGS}
    for fig in figs.values():
        assert fig["status"] == "ok" and fig["ours"] > 0 and fig["peer"] is None
        assert fig["details"]["ratio_samples"] == [t / GOAL_S for t in fig["details"]["times_s"]]


def test_maxsim_section_compares_exact_and_compressed_search(report):
    """Queries/s of both searches from paired repeats, code bytes per document against float32, and the compressed
    top 10's recall of the exact one (a fraction)."""
    from benchmarks.bench_maxsim import SIZES

    p = SIZES["tiny"]
    speed = _fig(report, "maxsim", "MaxSim search (exact against compressed): queries/s")
    assert speed["ours"] > 0 and speed["peer"] > 0 and len(speed["details"]["ratio_samples"]) == p["repeats"]
    size = _fig(report, "maxsim", "MaxSim index: bytes per document (codes; codebook apart)")
    # 2-bit residuals of a 64-wide vector are 16 bytes, its id one byte (at most 256 centroids for 400 vectors)
    assert size["ours"] == p["per_doc"] * (p["dim"] * 2 // 8 + 1) and size["peer"] == p["per_doc"] * p["dim"] * 4
    assert size["passed"] is True
    recall = _fig(report, "maxsim", "compressed top 10: recall of the exact top 10")
    assert 0.0 <= recall["ours"] <= 1.0


def test_report_structure(report, tmp_path):
    assert report["size"] == "tiny" and set(report["sections"]) == set(SECTIONS)
    assert all(s["status"] == "ok" for s in report["sections"].values()), report["sections"]
    for f in report["figures"]:
        assert set(f) == FIGURE_KEYS
        if f["status"] == "ok" and f["peer"] is not None:
            assert f["ours"] > 0 and f["peer"] > 0 and math.isfinite(f["ratio"])
            assert f["passed"] in (True, False, None)
    js, md = write_report(report, tmp_path)
    loaded = json.loads(js.read_text())
    assert loaded["figures"][0]["name"] == report["figures"][0]["name"]
    text = md.read_text()
    assert "| section | figure | unit | ours | peer | ratio | ratio is | goal | pass |" in text
    assert text.count("\n| ") >= len(report["figures"]) + len(report["sections"])


def test_cli_writes_both_files_and_records_errors(tmp_path, monkeypatch, capsys):
    assert main(["--size", "tiny", "--out", str(tmp_path), "--only", "gpu"]) == 0
    data = json.loads((tmp_path / "bench.json").read_text())
    assert list(data["sections"]) == ["gpu"] and (tmp_path / "bench.md").is_file()
    # a section that cannot even be imported is reported, and the exit status says so
    monkeypatch.setitem(SECTIONS, "broken", "benchmarks.does_not_exist")
    assert main(["--size", "tiny", "--out", str(tmp_path / "b"), "--only", "broken,gpu"]) == 1
    data = json.loads((tmp_path / "b" / "bench.json").read_text())
    assert data["sections"]["broken"]["status"] == "error" and "ModuleNotFoundError" in data["sections"]["broken"]["error"]
    assert data["sections"]["gpu"]["status"] == "ok"
    assert "broken" in to_markdown(data)


def test_bad_arguments_name_the_allowed_values():
    with pytest.raises(ValueError, match="allowed: tokenization"):
        parse_sections("tokenization,nope")
    with pytest.raises(ValueError, match="allowed values: tiny, full"):
        common.check_size("huge")
    with pytest.raises(SystemExit):
        main(["--size", "huge"])
    with pytest.raises(ValueError, match="goal operator"):
        common.figure("s", "n", unit="s", ours=1.0, peer=1.0, peer_name="p", ratio_def="", goal=("<", 1.0))


# ------------------------------------------------------------------------------------------ helpers
def test_timed_figures_carry_paired_ratios(report):
    timed = [f for f in report["figures"] if f["status"] == "ok" and f["unit"] in ("s", "texts/s", "samples/s")
             and f["goal"] is not None]
    assert {f["name"] for f in timed} >= {"mean_vs_sentence_transformers", "lightning_vs_raw_loop"}
    for f in timed:
        samples = f["details"]["ratio_samples"]
        assert samples and all(x > 0 for x in samples), f["name"]
        assert f["ratio"] == pytest.approx(math.exp(sum(map(math.log, samples)) / len(samples)))
        # one repeat gives no interval, and no interval means no verdict
        assert (f["ci"] is None) == (len(samples) < 2) and (f["ci"] is not None or f["verdict"] == "inconclusive")


def test_ratio_interval_and_verdicts():
    tight = common.ratio_interval([1.10, 1.11, 1.09, 1.10, 1.12])
    assert tight["n"] == 5 and tight["ci"][0] < tight["ratio"] < tight["ci"][1]
    assert 1.0 < tight["ci"][0] and tight["ci"][1] < 1.2
    wide = common.ratio_interval([0.9, 1.2, 0.95, 1.15])
    assert wide["ci"][0] < 1.0 < wide["ci"][1]
    assert common.ratio_interval([1.3])["ci"] is None
    with pytest.raises(ValueError, match="positive and finite"):
        common.ratio_interval([1.0, 0.0])
    with pytest.raises(ValueError, match="as many repeats"):
        common.paired_ratios([1.0, 2.0], [1.0])
    assert common.paired_ratios([2.0, 3.0], [1.0, 6.0]) == [2.0, 0.5]
    v = common.verdict
    assert v((">=", 1.0), 1.1, tight["ci"], noisy=True) == "PASS"
    assert v(("<=", 1.0), 1.1, tight["ci"], noisy=True) == "FAIL"
    assert v((">=", 1.0), 1.04, wide["ci"], noisy=True) == "inconclusive"  # the point passes, the interval does not
    assert v(("<=", 1.0), 0.9, None, noisy=True) == "inconclusive"
    assert v(("<=", 1.0), 0.9, None, noisy=False) == "PASS"  # deterministic figures: judged on the value
    assert v(None, 0.9, None, noisy=False) == "info"
    # a goal with an interval bound ("ratio >= 0.9, interval above 0.85", as the encode pipeline's goal reads)
    assert v((">=", 0.9, 0.85), 0.92, (0.88, 0.96), noisy=True) == "PASS"
    assert v((">=", 0.9), 0.92, (0.88, 0.96), noisy=True) == "inconclusive"  # without the bound: whole interval
    assert v((">=", 0.9, 0.85), 0.89, (0.86, 0.92), noisy=True) == "inconclusive"  # the ratio misses the target
    assert v((">=", 0.9, 0.85), 0.92, (0.84, 1.0), noisy=True) == "inconclusive"  # the interval reaches below
    assert v((">=", 0.9, 0.85), 0.87, (0.86, 0.89), noisy=True) == "FAIL"
    assert v(("<=", 1.5, 1.6), 1.45, (1.3, 1.55), noisy=True) == "PASS"
    assert v(("<=", 1.5, 1.6), 1.55, (1.52, 1.58), noisy=True) == "FAIL"
    bounded = common.figure("s", "n", unit="x/s", ours=1.0, peer=1.0, peer_name="p", ratio_def="",
                            goal=(">=", 0.9, 0.85), ratio_samples=[0.92, 0.93, 0.91, 0.92])
    assert bounded["goal"] == "ratio >= 0.9, interval >= 0.85" and bounded["verdict"] == "PASS"
    with pytest.raises(ValueError, match="looser than the target"):
        common.figure("s", "n", unit="s", ours=1.0, peer=1.0, peer_name="p", ratio_def="", goal=(">=", 0.9, 0.95))
    f = common.figure("s", "n", unit="s", ours=1.0, peer=1.0, peer_name="p", ratio_def="ours_s / peer_s",
                      goal=(">=", 1.0), ratio_samples=[0.9, 1.2, 0.95, 1.15])
    assert f["verdict"] == "inconclusive" and f["passed"] is None and f["ci"] == pytest.approx(wide["ci"])
    assert f["ratio"] == pytest.approx(wide["ratio"]) and f["details"]["ratio_samples"] == [0.9, 1.2, 0.95, 1.15]
    from benchmarks.run import to_markdown as md

    text = md({"size": "tiny", "env": {}, "figures": [f], "sections": {}})
    assert f"[{f['ci'][0]:.3g}, {f['ci'][1]:.3g}]" in text and "| inconclusive |" in text


def test_figure_ratio_and_goal():
    f = common.figure("s", "n", unit="s", ours=2.0, peer=4.0, peer_name="p", ratio_def="ours/peer", goal=("<=", 1.0))
    assert f["ratio"] == 0.5 and f["passed"] is True
    f = common.figure("s", "n", unit="x/s", ours=2.0, peer=4.0, peer_name="p", ratio_def="", goal=(">=", 1.0))
    assert f["passed"] is False
    s = common.skipped("s", "n", "no CUDA")
    assert s["status"] == "skipped" and s["passed"] is None and s["ratio"] is None


def test_peak_memory_sees_a_large_allocation():
    import torch

    res = common.peak_memory_mb(lambda: float(torch.ones(64 * 2**20 // 4).sum()))  # 64 MiB float32
    assert res["peak_mb"] >= 48, res
    assert res["result"] == 64 * 2**20 // 4


@_frozen_heap()
def test_time_interleaved_runs_each_repeat():
    calls = []
    res = common.time_interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, repeats=3,
                                  warmup=1)
    assert calls == ["a", "b"] + ["a", "b", "b", "a", "a", "b"]  # warm-up, then the order rotates each repeat
    calls.clear()
    three = common.time_interleaved({k: (lambda k=k: calls.append(k)) for k in "abc"}, repeats=3, warmup=0)
    assert "".join(calls) == "abcbcacab" and all(len(v["times_s"]) == 3 for v in three.values())
    assert len(res["a"]["times_s"]) == 3 and res["b"]["median_s"] >= 0
    with pytest.raises(ValueError, match="repeats"):
        common.time_fn(lambda: None, repeats=0)


def test_mixed_texts_lengths_and_determinism():
    texts = common.mixed_texts(50, 20, 400, seed=7)
    assert texts == common.mixed_texts(50, 20, 400, seed=7)
    n = [len(t.split()) for t in texts]
    assert min(n) >= 20 and max(n) <= 400 and len(set(n)) > 10
    assert len(common.long_text(70_000).split()) == 70_000  # longer than the pool: it wraps
    with pytest.raises(ValueError, match="min_words"):
        common.mixed_texts(3, 10, 5)
