"""Cost estimate before launch (issue 13.4): tokens and GPU-hours per stage from configs and mteb's task stats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from lmk.config.eval import EvalConfig
from lmk.sweep.estimate import (
    CHARS_PER_TOKEN,
    encoder_shape,
    eval_cost,
    format_estimate,
    peak_throughput,
    sweep_estimate,
    training_cost,
    training_time_report,
)

ROOT = Path(__file__).resolve().parent.parent
SPEC = str(ROOT / "experiments" / "table2" / "spec.yaml")


def test_training_tokens_follow_the_config() -> None:
    cfg = OmegaConf.create({
        "encoder": OmegaConf.load(ROOT / "conf" / "encoder" / "modernbert-base.yaml"),
        "data": {"batch_size": 256, "group_size": 8, "query_max_length": 128, "passage_max_length": 512},
        "trainer": {"max_steps": 5000}})
    cost = training_cost(cfg, n_jobs=2, gpus_per_job=24)
    assert cost.tokens == 2 * 5000 * 256 * 24 * (128 + 8 * 512)
    shape = encoder_shape(cfg.encoder)  # the shipped ModernBERT-base config.json (lmk.sweep.cost)
    assert shape.params() == 149_014_272
    per_query = 128 * shape.forward_flops_per_token(128) + 8 * 512 * shape.forward_flops_per_token(512)
    assert cost.flops == pytest.approx(2 * 5000 * 256 * 24 * per_query * 4)  # checkpointing: 4 forwards
    cfg.train = {"grad_cache": True}  # issue 20.11: grad cache's no-grad embedding pass is a 5th forward
    assert training_cost(cfg, n_jobs=2, gpus_per_job=24).flops == pytest.approx(cost.flops * 5 / 4)
    assert "5 passes" in training_cost(cfg, 2, 24).notes[0]
    cfg.trainer.max_steps = -1
    with pytest.raises(ValueError, match="max_steps"):
        training_cost(cfg, 1, 1)


def test_eval_tokens_come_from_mteb_task_statistics() -> None:
    suite = EvalConfig(name="s", tasks=["SciFact"], query_max_length=64, passage_max_length=256)
    shape = encoder_shape({"model_id": "answerdotai/ModernBERT-base"})
    cost = eval_cost(suite, n_rows=3, n_shards=1, shape=shape)
    # SciFact test: 5183 documents of 1499.4 characters on average (truncated at 256), 300 queries of 90.3
    docs, queries = 5183 * min(1499.41173065792 / CHARS_PER_TOKEN, 256), 300 * min(90.34666666666666 / CHARS_PER_TOKEN, 64)
    assert cost.tokens == pytest.approx(3 * (docs + queries))
    assert cost.jobs == 3
    longer = eval_cost(EvalConfig(name="s", tasks=["SciFact"], query_max_length=64, passage_max_length=8192),
                       1, 1, shape)
    assert longer.tokens > cost.tokens / 3  # truncation at 256 tokens counted


def _report(mode: str, train_flops: float = 2.0e14, **extra: object) -> str:
    tp = {"mode": mode, "device": "NVIDIA H200" if mode == "gpu" else "cpu", "train_tokens_per_s": 5.0e4,
          "train_flops_per_s": train_flops, "train_passes": 5, "encode_tokens_per_s": {"512": 2.5e5, "8192": 9.0e4},
          "job_overhead_s": 30.0}
    return json.dumps({"status": "ok", "mode": mode, "device": tp["device"], "throughput": tp, **extra})


def test_a_cpu_smoke_report_at_the_default_path_is_never_measured(tmp_path: Path) -> None:
    """Issue 20.11: a --cpu-smoke JSON where gpu-check writes was read as measured (2.7M GPU-hours)."""
    path = tmp_path / "gpu_check.json"
    path.write_text(_report("cpu-smoke", train_flops=1.5e8))
    _, rates = sweep_estimate(SPEC, "paper", ["cls"], gpu="H100", gpu_check=path)
    assert not rates.train.measured and "published H100" in rates.train.source


def test_training_uses_the_measured_training_throughput_and_eval_the_encode_pipeline(tmp_path: Path) -> None:
    pipeline = {"512": {"end_to_end_tokens_per_s": 2.0e5, "forward_only_tokens_per_s": 2.5e5, "ratio": 0.8},
                "8192": {"end_to_end_tokens_per_s": 8.0e4, "forward_only_tokens_per_s": 9.0e4, "ratio": 0.89}}
    path = tmp_path / "gpu_check.json"
    path.write_text(_report("gpu", encode_pipeline={"status": "ok", **pipeline}))
    (train, ev), rates = sweep_estimate(SPEC, "paper", ["cls"], gpu_check=path)
    assert rates.train.measured and rates.train.flops_per_s == 2.0e14  # the train step, not an encode figure
    assert train.device_s == pytest.approx(train.flops / 2.0e14 + 30.0 * 20)  # 20 GPUs x the measured overhead
    shape = encoder_shape({"model_id": "answerdotai/ModernBERT-base"})  # the paper's encoder
    assert rates.encode_includes_tokenization and ev.device_s > 0
    # a 6000-token text is encoded at the figure measured at 8192 (the nearest length)
    assert rates.encode_at(6000).flops_per_s == pytest.approx(8.0e4 * shape.forward_flops_per_token(8192))
    text = format_estimate([train, ev], rates)
    for line in ("train throughput: measured (gpu, NVIDIA H200)", "end to end (tokenization included",
                 "search: exact", "job overhead: 30 s"):
        assert line in text, text
    assert "tokenization: " not in text  # counted in the end-to-end figure, not twice


def test_a_cpu_measurement_is_taken_only_when_given_for_a_cpu_scale(tmp_path: Path) -> None:
    cpu = tmp_path / "cpu_check.json"
    cpu.write_text(_report("cpu-smoke", train_flops=1.5e8))
    with pytest.raises(ValueError, match="trains on the GPU"):
        sweep_estimate(SPEC, "paper", ["cls"], throughput_file=cpu)
    with pytest.raises(ValueError, match="--cpu-smoke"):
        sweep_estimate(SPEC, "rehearsal", ["cls"], gpu_check=cpu)  # a CPU scale never reads the default path
    (train,), rates = sweep_estimate(SPEC, "rehearsal", ["cls"], throughput_file=cpu)
    assert rates.train.kind == "cpu" and train.parallel == 1 and "eval not estimated" in train.notes[-1]
    # 3 steps x 2 ranks x 4 queries x (16 + 4 x 64) tokens, each rank at the measured rate, + the overhead
    assert train.tokens == 3 * 2 * 4 * (16 + 4 * 64)
    assert train.job_wall_s == pytest.approx(train.flops / (1.5e8 * 2) + 30.0)


def test_predicted_training_time_is_printed_beside_the_measured_one(tmp_path: Path) -> None:
    cpu = tmp_path / "cpu_check.json"
    cpu.write_text(_report("cpu-smoke", train_flops=1.5e8))
    out = tmp_path / "sweep"
    (out / "train").mkdir(parents=True)
    (out / "train" / "sweep_status.json").write_text(json.dumps(
        {"cls": {"status": "completed", "seconds": 40.0}, "mean": {"status": "completed", "seconds": 50.0},
         "lmk-sentence": {"status": "failed", "seconds": 3.0}, "lmk-fixed-32": {"status": "skipped"}}))
    (train,), _ = sweep_estimate(SPEC, "rehearsal", ["cls"], throughput_file=cpu)
    text = training_time_report(SPEC, "rehearsal", out, cpu)
    assert text is not None and "measured 1.5 min for 2 rows" in text
    assert f"predicted {2 * train.job_wall_s / 60:.1f} min" in text and "cpu_check.json" in text
    assert training_time_report(SPEC, "rehearsal", tmp_path / "nothing", cpu) is None


def test_paper_sweep_estimate_has_both_stages(tmp_path: Path) -> None:
    rows = ["cls", "mean", "lmk-fixed-32"]
    stages, rates = sweep_estimate(SPEC, "paper", rows, gpu="H100", gpu_check=tmp_path / "absent.json")
    train, ev = stages
    assert train.stage == "train" and train.jobs == 3 and ev.stage == "eval" and ev.jobs == 3 * 6
    assert train.tokens == 3 * 5000 * 256 * 20 * (128 + 8 * 512)  # 5 nodes x 4 GPUs
    assert ev.tokens > 1e9 and "published H100" in rates.train.source
    assert 0 < ev.gpu_hours() and 0 < train.gpu_hours()
    # the GPU-hours count grad cache's 5th pass: the same tokens at 4 passes would be 4/5 of the compute
    compute_s = train.device_s - 3 * 20 * rates.job_overhead_s
    assert compute_s == pytest.approx(train.flops / rates.train.flops_per_s)
    assert "5 passes" in train.notes[0] and "grad-cache embedding pass" in train.notes[0]
    peak = peak_throughput("A100")
    assert peak.flops_per_s == pytest.approx(312e12 * 0.35) and "assumed utilisation" in peak.source
    with pytest.raises(ValueError, match="H100"):
        peak_throughput("TPUv9")
