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


def test_sections_are_a_registry_in_run_order() -> None:
    names = [n for n in gpu_check.SECTIONS if n in ("train_step", "padded", "encode", "rehearsal")]
    assert names == ["train_step", "padded", "encode", "rehearsal"]  # other sections may sit among them
    with pytest.raises(ValueError, match="twice"):
        gpu_check.section("train_step")(gpu_check.check_train_step)


def test_cpu_smoke_runs_the_rehearsal_step_padded_batches_and_encode(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LMK_CACHE", str(tmp_path / "cache"))
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    args = ["--cpu-smoke", "--sections", "train_step,padded,encode", "--out", str(tmp_path / "gc")]
    assert gpu_check.main(args) == 0
    report = json.loads(capsys.readouterr().out)
    # a CPU run never writes where the estimate looks for a measurement (issue 20.11)
    assert report == json.loads((tmp_path / "gc" / "cpu_check.json").read_text())
    assert not (tmp_path / "gc" / "gpu_check.json").exists() and torch.get_num_threads() == threads
    assert torch.are_deterministic_algorithms_enabled() == deterministic  # the Trainer's global setting restored
    step = report["train_step"]
    assert report["status"] == "ok" and step["status"] == "ok", step
    # the paper config's training settings at the rehearsal's sizes (issue 20.15: its determinism setting)
    assert step["precision"] == "bf16-mixed" and step["grad_cache"] and step["gradient_checkpointing"]
    assert step["deterministic"] == "warn" and step["passes"] == 5
    assert (step["queries"], step["group_size"], step["query_len"], step["passage_len"]) == (4, 4, 16, 64)
    assert step["teacher_scores"] and step["loss_finite"] and step["steps"] == 4
    assert step["tokens_per_step"] > 0 and step["train_tokens_per_s"] > 0
    assert step["estimated_memory_gib"]["total"] > 0 and "peak_reserved_gib" in step
    # one rank's share of the cores, as each of the rehearsal's 2 DDP ranks gets
    assert step["torch_threads"] == max(1, gpu_check.cpu_cores() // 2)
    padded = report["padded"]
    assert padded["status"] == "ok", padded
    assert len(set(padded["train"]["lengths"])) == 3 and padded["train"]["padded_to"] == max(padded["train"]["lengths"])
    assert padded["train"]["grads_finite"] and padded["train"]["valid_hidden_finite"]
    assert padded["encode"]["embeddings_finite"] and min(padded["encode"]["lengths"]) < 32
    assert set(report["encode"]["sdpa"]) == {"64", "256"}
    tp = report["throughput"]
    assert tp["train_tokens_per_s"] == step["train_tokens_per_s"] and set(tp["encode_tokens_per_s"]) == {"64", "256"}
    assert tp["mode"] == "cpu-smoke" and tp["train_passes"] == 5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_check_on_a_gpu(tmp_path, capsys):
    assert gpu_check.main(["--out", str(tmp_path / "gc")]) == 0
    report = json.loads(capsys.readouterr().out)
    step = report["train_step"]
    assert step["queries"] == 256 and step["group_size"] == 8 and step["passage_len"] == 512
    assert step["model_params"] > 140_000_000 and step["peak_memory_gib"] < report["gpu_memory_gib"]
    assert step["peak_memory_gib"] <= step["peak_reserved_gib"] and step["deterministic"] == "warn"
    assert report["padded"]["status"] == "ok" and report["padded"]["encode"]["padded_to"] == 8192
    assert report["rehearsal"]["status"] == "ok" and report["rehearsal"]["run_status"] == "done"
    assert report["total_s"] < 480


@pytest.mark.slow
def test_cpu_smoke_runs_the_rehearsal_row_and_reruns(tmp_path, capsys):
    """Issue 20.7: the second run reused the finished rehearsal folder and was refused."""
    for run in (1, 2):
        assert gpu_check.main(["--cpu-smoke", "--sections", "rehearsal", "--out", str(tmp_path / "gc")]) == 0, run
        row = json.loads(capsys.readouterr().out)["rehearsal"]
        assert row["status"] == "ok" and row["run_status"] == "done" and row["global_step"] == 3, row
        assert set(row["groups"]) >= {"msmarco-dev", "longembed6"} and "overwrite=true" in row["command"]
