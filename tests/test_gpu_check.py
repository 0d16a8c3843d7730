"""`make gpu-check` (benchmarks/gpu_check.py): the skip path without CUDA, the same code at tiny sizes on
the CPU (--cpu-smoke), and the real check on a GPU."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_check, gpu_packed, gpu_rehearsal, gpu_sections, wheelhouse


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
    names = [n for n in gpu_check.SECTIONS if n in ("train_step", "padded", "encode", "decoder_step", "rehearsal")]
    assert names == ["train_step", "padded", "encode", "decoder_step", "rehearsal"]  # others may sit among them
    with pytest.raises(ValueError, match="twice"):
        gpu_check.section("train_step")(gpu_check.check_train_step)


def test_cpu_smoke_runs_the_rehearsal_step_padded_batches_and_encode(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LMK_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    benchmark, env = torch.backends.cudnn.benchmark, dict(os.environ)
    args = ["--cpu-smoke", "--sections", "train_step,padded,encode", "--out", str(tmp_path / "gc")]
    assert gpu_check.main(args) == 0
    report = json.loads(capsys.readouterr().out)
    # a CPU run never writes where the estimate looks for a measurement
    assert report == json.loads((tmp_path / "gc" / "cpu_check.json").read_text())
    assert not (tmp_path / "gc" / "gpu_check.json").exists() and torch.get_num_threads() == threads
    assert torch.are_deterministic_algorithms_enabled() == deterministic  # the Trainer's global setting restored
    # Lightning's deterministic mode sets CUBLAS_WORKSPACE_CONFIG and cudnn.benchmark: neither outlives the section
    assert dict(os.environ) == env and torch.backends.cudnn.benchmark == benchmark
    # the scratch folder was a temporary one outside the report folder, removed afterwards
    assert sorted(p.name for p in (tmp_path / "gc").iterdir()) == ["cpu_check.json"]
    assert not Path(report["work"]).exists() and not Path(report["work"]).is_relative_to(tmp_path / "gc")
    step = report["train_step"]
    assert report["status"] == "ok" and step["status"] == "ok", step
    # the paper config's training settings at the rehearsal's sizes (its determinism setting included)
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
    assert padded["train"]["padded_rows_guarded"]  # the model the section built carries the guard
    assert padded["encode"]["embeddings_finite"] and min(padded["encode"]["lengths"]) < 32
    assert set(report["encode"]["sdpa"]) == {"64", "256"}
    tp = report["throughput"]
    assert tp["train_tokens_per_s"] == step["train_tokens_per_s"] and set(tp["encode_tokens_per_s"]) == {"64", "256"}
    assert tp["mode"] == "cpu-smoke" and tp["train_passes"] == 5


@pytest.mark.slow  # the decoder section of make gpu-check on the CPU; LoRA's frozen base and adapter-only optimiser are checked fast in tests/test_lora.py
def test_cpu_smoke_runs_the_decoder_step_with_lora_against_its_estimate(tmp_path, capsys, monkeypatch):
    """The decoder section's code path on the CPU: the decoder table's rehearsal config (the random 2-layer decoder,
    LoRA r 8 through peft, grad cache, bf16-mixed); on a GPU the same code runs decoder-paper on a 1B decoder."""
    monkeypatch.setenv("LMK_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    assert gpu_check.main(["--cpu-smoke", "--sections", "decoder_step", "--out", str(tmp_path / "gc")]) == 0
    report = json.loads(capsys.readouterr().out)
    step = report["decoder_step"]
    assert report["status"] == "ok" and step["status"] == "ok", step
    assert step["encoder"] == "tiny-decoder" and step["lora"]["r"] == 8 and step["lora"]["alpha"] == 16
    # only the adapters train: a frozen base and a few adapter weights, as the estimate counts them
    assert 0 < step["trainable_params"] < step["frozen_params"] / 5
    assert (step["queries"], step["group_size"], step["query_len"], step["passage_len"]) == (4, 4, 16, 64)
    # forward + a frozen base's one-forward backward + checkpoint recompute + grad cache's embedding pass
    assert step["grad_cache"] and step["gradient_checkpointing"] and step["passes"] == 4
    assert step["loss_finite"] and step["steps"] == 3 and step["train_tokens_per_s"] > 0
    assert step["estimated_memory_gib"]["total"] > 0 and step["peak_over_estimate"] is None  # no CUDA peak here


def test_each_section_leaves_the_next_one_the_checks_own_settings(tmp_path, monkeypatch):
    """A section that changes what Lightning changes (the environment, deterministic algorithms, cuDNN flags)
    hands the next section, and the rehearsal's jobs, the settings the check started with."""
    seen: dict[str, object] = {}

    def lightning_like(smoke, work):
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = not torch.backends.cudnn.benchmark
        return {}

    def reader(smoke, work):
        seen.update(cublas=os.environ.get("CUBLAS_WORKSPACE_CONFIG"), det=torch.are_deterministic_algorithms_enabled(),
                    report=json.loads((tmp_path / "gc" / "cpu_check.json").read_text()))
        return {}

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    deterministic = torch.are_deterministic_algorithms_enabled()
    for name, fn in (("lightning_like", lightning_like), ("reader", reader)):
        monkeypatch.setitem(gpu_check.SECTIONS, name, fn)
        monkeypatch.setitem(gpu_sections.NEEDS, name, "light")
    assert gpu_check.main(["--cpu-smoke", "--sections", "lightning_like,reader", "--out", str(tmp_path / "gc")]) == 0
    assert seen["cublas"] is None and seen["det"] == deterministic
    # the report was on disk, the first section's figures in it, before the second section started
    assert seen["report"]["status"] == "running" and seen["report"]["running"] == "reader"
    assert seen["report"]["lightning_like"]["status"] == "ok"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the section runs instead")
def test_the_packed_section_is_skipped_without_cuda_with_its_reason(tmp_path, capsys):
    assert gpu_check.main(["--cpu-smoke", "--sections", "packed", "--out", str(tmp_path / "gc")]) == 0
    report = json.loads(capsys.readouterr().out)
    section = report["packed"]
    assert section["status"] == "skipped" and section["reason"].startswith("needs CUDA: "), section
    assert "varlen_attn" in section["reason"] and report["skipped_sections"] == ["packed"]
    assert report["status"] == "ok"
    names = list(gpu_check.SECTIONS)
    assert names.index("encode_pipeline") < names.index("packed") < names.index("decoder_step")


def test_the_packed_sections_comparison_on_the_cpu_reference():
    """What the packed section records per backbone and length, measured here through the packed path's CPU
    reference attention (forced): both paths' tokens/s and their embeddings, equal in float32."""
    from tests.test_packed_attention import BACKBONES, build

    model = build(BACKBONES["modernbert"]())
    texts = gpu_packed.mixed_texts(12, 30, 0.7, 128, seed=1)
    out = gpu_packed.compare(model, texts, 128, "fp32", packed=True, repeats=1)
    assert out["texts"] == 12 and out["batches"] >= 1 and 0 < out["tokens"] <= out["padded_tokens"]
    assert out["padded"]["path"] == "padded (encoder.packed=false)" and out["packed"]["path"].startswith("packed")
    assert out["padded"]["tokens_per_s"] > 0 and out["packed"]["tokens_per_s"] > 0 and out["speedup"] > 0
    assert len(out["padded"]["seconds"]) == 1 and out["max_abs_diff"] <= 1e-5 and out["min_cosine"] > 0.9999
    assert model.encoder_cfg.packed == "auto"  # the model's own setting, restored
    json.dumps(out)  # what the report writes


def test_a_section_whose_packages_are_absent_is_skipped_naming_them(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(wheelhouse, "LIGHT", (*wheelhouse.LIGHT, "lmk-no-such-package"))
    assert gpu_check.main(["--cpu-smoke", "--sections", "encode", "--out", str(tmp_path / "gc")]) == 0
    report = json.loads(capsys.readouterr().out)
    section = report["encode"]
    assert section["status"] == "skipped" and section["needs"] == ["lmk-no-such-package"], section
    assert section["reason"].startswith("needs lmk-no-such-package") and report["skipped_sections"] == ["encode"]
    assert report["status"] == "ok"  # skipped is no failure: the node lacks a package, the code did not break


def test_the_rehearsals_jobs_are_killed_at_their_timeout_with_their_children(tmp_path):
    """A job that hangs costs its section, never the report: at the limit its whole process group is killed
    (Lightning's DDP ranks are children of the job)."""
    pid_file = tmp_path / "child.pid"
    out = gpu_rehearsal.run_job(["sh", "-c", f"sleep 120 & echo $! > {pid_file}; wait"], {}, timeout_s=3)
    assert out["timed_out"] and out["returncode"] is None and out["wall_s"] < 60 and out["timeout_s"] == 3
    status = Path(f"/proc/{pid_file.read_text().strip()}/status")
    for _ in range(50):  # SIGKILL lands at once; the kernel may take a moment to retire the process
        if not status.exists() or "State:\tZ" in status.read_text():
            break
        time.sleep(0.1)
    assert not status.exists() or "State:\tZ" in status.read_text(), "the job's child outlived its timeout"


def test_ddp_spans_every_rank_and_a_single_gpu_says_it_is_not_exercised(monkeypatch):
    world = gpu_rehearsal.ddp_world(smoke=True)  # the rehearsal's own 2 CPU ranks
    assert world == {"world_size": 2, "strategy": "ddp", "ddp_exercised": True}
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # the GPU node: one H200
    one = gpu_rehearsal.ddp_world(smoke=False)
    assert one["strategy"] == "auto" and not one["ddp_exercised"] and one["note"].startswith("single GPU: DDP not")


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
    assert report["padded"]["train"]["padded_rows_guarded"]
    pipeline = report["encode_pipeline"]["8192"]
    assert pipeline["windows"] >= 2 and pipeline["workers"] >= 1  # something for the workers to overlap
    packed = report["packed"]
    assert packed["status"] == "ok", packed
    for length, row in packed["modernbert-base-shape"].items():
        assert row["packed"]["path"] == "packed (varlen_attn)" and row["min_cosine"] >= gpu_packed.MIN_COSINE
        assert row["tokens"] < row["padded_tokens"] and row["packed"]["tokens_per_s"] > 0, length
    decoder = report["decoder_step"]
    assert decoder["status"] == "ok" and decoder["model_params"] > 900_000_000 and decoder["passage_len"] == 512
    assert decoder["peak_memory_gib"] < report["gpu_memory_gib"] and decoder["peak_over_estimate"] is not None
    row = report["rehearsal"]
    assert row["status"] == "ok" and row["run_status"] == "done"
    assert row["ddp_exercised"] == (report["gpu_count"] > 1) and row["world_size"] == report["gpu_count"]
    assert report["total_s"] < 420  # sized for under 7 minutes on one H100/H200 (benchmarks/gpu_check.py)
