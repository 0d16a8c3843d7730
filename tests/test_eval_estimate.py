"""Cost estimate before launch (issue 13.4): tokens and GPU-hours per stage from configs and mteb's task stats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from lmk.config.eval import EvalConfig
from lmk.sweep.estimate import (
    CHARS_PER_TOKEN,
    KNOWN_SHAPES,
    Shape,
    StageCost,
    encoder_shape,
    eval_cost,
    format_estimate,
    measured_throughput,
    peak_throughput,
    sweep_estimate,
    training_cost,
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


def test_throughput_measured_when_a_gpu_check_exists(tmp_path: Path) -> None:
    shape = Shape(*KNOWN_SHAPES["answerdotai/ModernBERT-base"])
    assert measured_throughput(tmp_path / "none.json") is None
    path = tmp_path / "gpu_check.json"
    path.write_text(json.dumps({"gpu": "NVIDIA H200", "encode": {"sdpa": {"512": {"tokens_per_s": 250000.0},
                                                                           "8192": {"tokens_per_s": 90000.0}}},
                                "train_step": {"peak_memory_gb": 60.1}}))
    tp = measured_throughput(path, shape)
    assert tp is not None and "measured" in tp.source and "8192" in tp.source
    assert tp.flops_per_s == pytest.approx(90000.0 * shape.forward_flops_per_token(8192))
    path.write_text(json.dumps({"gpu": "H200", "note": "no throughput here"}))
    assert measured_throughput(path, shape) is None
    peak = peak_throughput("A100")
    assert peak.flops_per_s == pytest.approx(312e12 * 0.35) and "assumed utilisation" in peak.source
    with pytest.raises(ValueError, match="H100"):
        peak_throughput("TPUv9")
    text = format_estimate([StageCost("train", 2, 1e9, peak.flops_per_s * 3600 * 10),
                            StageCost("eval", 4, 1e8, peak.flops_per_s * 3600 * 2)], peak)
    assert "train" in text and "10.0" in text and "total" in text and "12.0" in text


def test_paper_sweep_estimate_has_both_stages(tmp_path: Path) -> None:
    rows = ["cls", "mean", "lmk-fixed-32"]
    stages, tp = sweep_estimate(SPEC, "paper", rows, gpu="H100", gpu_check=tmp_path / "absent.json")
    train, ev = stages
    assert train.stage == "train" and train.jobs == 3 and ev.stage == "eval" and ev.jobs == 3 * 6
    assert train.tokens == 3 * 5000 * 256 * 20 * (128 + 8 * 512)  # 5 nodes x 4 GPUs
    assert ev.tokens > 1e9 and "published H100" in tp.source
    assert 0 < ev.gpu_hours(tp) and 0 < train.gpu_hours(tp)
