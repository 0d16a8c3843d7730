"""`make gpu-check` (benchmarks/gpu_check.py): the skip path without CUDA, the same code at tiny sizes on
the CPU (--cpu-smoke), and the real check on a GPU."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import gpu_check


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the check runs instead")
def test_skips_cleanly_without_cuda(tmp_path, capsys):
    assert gpu_check.main(["--out", str(tmp_path / "gc")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["status"] == "skipped" and "CUDA is not available" in report["reason"]
    assert "--cpu-smoke" in report["reason"] and not (tmp_path / "gc").exists()


def test_unknown_section_is_refused(capsys):
    with pytest.raises(SystemExit):
        gpu_check.main(["--sections", "train_step,bogus"])
    assert "bogus" in capsys.readouterr().err


def test_cpu_smoke_runs_the_paper_shaped_step_and_encode(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LMK_CACHE", str(tmp_path / "cache"))
    assert gpu_check.main(["--cpu-smoke", "--sections", "train_step,encode", "--out", str(tmp_path / "gc")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report == json.loads((tmp_path / "gc" / "gpu_check.json").read_text())
    step = report["train_step"]
    assert report["status"] == "ok" and step["status"] == "ok", step
    # the paper config's own training settings, at tiny sizes
    assert step["precision"] == "bf16-mixed" and step["grad_cache"] and step["gradient_checkpointing"]
    assert step["teacher_scores"] and step["loss_finite"] and step["steps"] == 2
    assert step["tokens_per_step"] > 0 and step["train_tokens_per_s"] > 0
    assert step["estimated_memory_gib"]["total"] > 0
    assert set(report["encode"]["sdpa"]) == {"64", "256"}
    tp = report["throughput"]
    assert tp["train_tokens_per_s"] == step["train_tokens_per_s"] and set(tp["encode_tokens_per_s"]) == {"64", "256"}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_check_on_a_gpu(tmp_path, capsys):
    assert gpu_check.main(["--out", str(tmp_path / "gc")]) == 0
    report = json.loads(capsys.readouterr().out)
    step = report["train_step"]
    assert step["queries"] == 256 and step["group_size"] == 8 and step["passage_len"] == 512
    assert step["model_params"] > 140_000_000 and step["peak_memory_gib"] < report["gpu_memory_gib"]
    assert report["rehearsal"]["status"] == "ok" and report["rehearsal"]["run_status"] == "done"
    assert report["total_s"] < 480


@pytest.mark.slow
def test_cpu_smoke_runs_the_rehearsal_row(tmp_path, capsys):
    assert gpu_check.main(["--cpu-smoke", "--sections", "rehearsal", "--out", str(tmp_path / "gc")]) == 0
    row = json.loads(capsys.readouterr().out)["rehearsal"]
    assert row["status"] == "ok" and row["run_status"] == "done" and row["global_step"] == 3, row
    assert set(row["groups"]) >= {"msmarco-dev", "longembed6"}
