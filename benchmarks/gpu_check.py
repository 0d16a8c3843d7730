"""`make gpu-check`: does the paper scale run on this GPU, how fast, in how much memory? One JSON report.

Sections (benchmarks.gpu_sections.SECTIONS, run in that order; each timed, each in the report even when it fails):
  train_step   a paper-shaped training step: ModernBERT-base-shaped random weights (the shipped config,
               149M parameters), the paper config's batch (256 queries x 8 passages at 128/512 tokens,
               teacher scores), bf16-mixed, gradient checkpointing, grad cache and `deterministic: warn` as
               table2-paper sets them, through the same ContrastiveModule and Lightning Trainer as
               `lmk.train`; step time, training tokens/s and FLOP/s (passes counted as the code runs them),
               peak memory allocated and reserved next to lmk.train.memory's estimate.
  padded       what only a GPU kernel can get wrong: texts of mixed lengths (20 / 150 / 512 tokens) padded
               to 512, forward and backward under bf16 autocast with SDPA, and mixed lengths padded to 8192
               through `EmbeddingModel.encode`; every embedding, valid hidden state and gradient finite.
  encode       inference tokens/s at 512 and 8192 tokens, SDPA (and flash_attention_2 when installed).
  encode_pipeline  lmk.evaluate's encode end to end (tokenization workers, bf16 autocast, 32768-token batches) vs
               the forward alone on the same pre-tokenized batches, tokens/s at 512 (512 texts) and 8192 (160
               texts: two tokenization windows, workers); with several GPUs, an encode on the last one.
  packed       padded against packed (unpadded, varlen_attn) inference encoding (benchmarks/gpu_packed.py): texts of
               a paper-like mixed length distribution in lmk.evaluate's 32768-token batches, real tokens/s of both
               paths and their embeddings compared, for the ModernBERT-base shape at 512 and 8192 tokens and the 1B
               decoder shape at 512; skipped without CUDA (varlen_attn is CUDA only).
  decoder_step the decoder table's paper step (16 queries x 8 passages at 128/512, grad-cache mini-batch 8, bf16)
               on a random-weight 1B-class decoder (decoder-1b-shape) frozen in bf16 with the authors' LoRA through
               peft (benchmarks/gpu_decoder.py): tokens/s, FLOP/s, trainable and frozen parameters, peak memory
               against lmk.train.memory's estimate of the same job (the model of the dry run's 8B rows).
  rehearsal    the rehearsal scale's first row (experiment=table2-rehearsal) through `lmk.train` and `lmk.evaluate`,
               DDP over every visible GPU ("single GPU: DDP not exercised" otherwise), each job under a timeout.
Needs no network and nothing outside the repository: every model is built from its config. The model sections
need only hydra-core, omegaconf, antlr4, the sentence splitters, platformdirs and peft beyond a GPU node's own
torch stack (`make wheelhouse GROUP=light`); the rehearsal needs the evaluation stack too. A section whose packages
are absent is reported "skipped: needs X". `--wheelhouse ARCHIVE` (`make gpu-check WHEELHOUSE=...`) unpacks a
`make wheelhouse` archive into a temporary folder on the path: nothing is installed.

Size on one H100/H200 (bf16 dense ~790 TFLOP/s peak; about a third of it reached by a BERT-base step), by its
own sizes: train_step ~1.08M tokens a step (256 x 128 + 2048 x 512) x ~1.4 GFLOP a token (5 passes of the 149M
model, attention included) = 1.5 PFLOP, ~6 s a step, 3 steps plus the model and first-step warm-up: ~40 s;
padded and encode: ~64K tokens a call, well under a second each, ~15 s with the model builds; encode_pipeline:
512 x 512 + 160 x 8192 = 1.6M tokens at ~0.5 GFLOP a token forward = 0.8 PFLOP a pass, 8 passes (warm-up + 3
repeats of both sides) plus tokenizing 1.6M tokens twice on the workers: ~40 s; packed: ~320K tokens a pass,
8 passes, seconds, plus the 1B decoder's random init on the CPU: ~40 s (benchmarks/gpu_packed.py); decoder_step:
~40 s (its arithmetic in benchmarks/gpu_decoder.py); rehearsal: its eval replicas
written on the CPU (68 s on this project's loaded 2-core machine: ~40 s), then two jobs of mostly start-up,
~60 s each, each killed at 180 s. About 6 minutes in all (not yet measured on a GPU), inside 7.

    python -m benchmarks.gpu_check [--out outputs/gpu_check] [--sections train_step,padded,...] [--wheelhouse X]
    python -m benchmarks.gpu_check --cpu-smoke      # the same code on the CPU at the rehearsal's sizes

Without CUDA (and without --cpu-smoke) it prints a "skipped" report, writes nothing and exits 0. A GPU run
writes <out>/gpu_check.json after every section (status "running" until the last), whose "throughput" section
the cost estimate reads as measured (`lmk.sweep.cost.read_gpu_check`: mode "gpu", status "ok" only). A
--cpu-smoke run writes <out>/cpu_check.json instead: this machine's throughput at the rehearsal's sizes, which
the estimate takes only when given explicitly for a CPU scale (`--throughput <out>/cpu_check.json`). Scratch
(the jobs' run folders) goes to a temporary folder (`--work` to choose one), never into <out>.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

# importing gpu_packed and gpu_decoder registers their sections: after the model sections, before the rehearsal
from benchmarks.gpu_packed import check_packed as check_packed  # isort: skip
from benchmarks.gpu_decoder import check_decoder_step as check_decoder_step  # isort: skip

from benchmarks import gpu_rehearsal, wheelhouse
from benchmarks.gpu_sections import NEEDS, SECTIONS, Section, cpu_cores, missing_packages, section
from benchmarks.gpu_sections import check_train_step as check_train_step

__all__ = ["SECTIONS", "check_decoder_step", "check_packed", "check_train_step", "cpu_cores", "main", "run", "section", "throughput"]

DEFAULT_OUT = "outputs/gpu_check"
REPORT_FILE = {"gpu": "gpu_check.json", "cpu-smoke": "cpu_check.json"}  # only the first counts as measured


@contextlib.contextmanager
def process_settings() -> Iterator[None]:
    """What a section may change process-wide, restored after it: the environment (Lightning's deterministic mode
    sets CUBLAS_WORKSPACE_CONFIG, seed_everything PL_GLOBAL_SEED), torch's deterministic algorithms, cuDNN's
    benchmark and deterministic flags, float32 matmul precision and torch's threads. The next section and the
    rehearsal's jobs start from the check's own settings."""
    env = dict(os.environ)
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic,
             torch.get_float32_matmul_precision(), torch.get_num_threads())
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(env)
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = saved[2], saved[3]
        torch.set_float32_matmul_precision(saved[4])
        torch.set_num_threads(saved[5])


def run_section(name: str, fn: Section, smoke: bool, work: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    missing = missing_packages(name)
    if missing:
        return {"status": "skipped", "reason": f"needs {', '.join(missing)} (not installed here; `make wheelhouse` "
                f"packs them: docs/gpu-node.md)", "needs": missing, "group": NEEDS[name], "section_s": 0.0}
    try:
        with process_settings():
            out = {"status": "ok", **fn(smoke, work)}
    except Exception as exc:  # noqa: BLE001 - one failed section must not hide the others' figures
        out = {"status": "failed", "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=8)}
    if out["status"] == "ok" and (out.get("returncode") not in (None, 0) or out.get("run_status") not in (None, "done")
                                  or out.get("timed_out")):
        out["status"] = "failed"
    out["section_s"] = round(time.perf_counter() - t0, 1)
    return out


def job_overhead_s(report: dict[str, Any]) -> float | None:
    """Seconds of a training job that are not its steps (start-up, DDP, setup, data, checkpoints, export): the
    rehearsal row's training wall time less its steps at the train_step section's step time (both run the
    rehearsal's step in smoke mode; on a GPU the rehearsal's tiny steps are not the paper's and are not
    subtracted: an upper bound of the fixed cost)."""
    train, row = report.get("train_step") or {}, report.get("rehearsal") or {}
    if train.get("status") != "ok" or row.get("status") != "ok" or not row.get("global_step"):
        return None
    step_s = train["step_s_median"] if report.get("mode") == "cpu-smoke" else 0.0
    return round(max(row["wall_s"] - row["global_step"] * step_s, 0.0), 1)


def throughput(report: dict[str, Any]) -> dict[str, Any]:
    """The figures the cost estimate reads (tokens/s and FLOP/s measured on this device), with the shape
    they were measured at. Training: the train_step section (FLOPs counted with the passes the code runs);
    evaluation: forward-only encode tokens/s per length (the `encode_pipeline` section, when present, adds
    end-to-end figures that include tokenization; the estimate reads it from the report)."""
    train, enc = report.get("train_step", {}), report.get("encode", {})
    sdpa = enc.get("sdpa") or {}
    ok = train.get("status") == "ok"
    return {"device": report.get("device"), "mode": report.get("mode"),
            "model": "modernbert-base-shape" if report.get("mode") == "gpu" else "table2-rehearsal",
            "train_tokens_per_s": train.get("train_tokens_per_s") if ok else None,
            "train_flops_per_s": train.get("train_flops_per_s") if ok else None,
            "train_passes": train.get("passes") if ok else None,
            "train_shape": {k: train.get(k) for k in ("queries", "group_size", "query_len", "passage_len")} if ok
            else None,
            "torch_threads": train.get("torch_threads"),
            "encode_tokens_per_s": {k: v["tokens_per_s"] for k, v in sdpa.items() if isinstance(v, dict)}
            if enc.get("status") == "ok" else {},
            "job_overhead_s": job_overhead_s(report)}


def write_report(path: Path, report: dict[str, Any]) -> None:
    """Atomic (a kill mid-write leaves the previous report); stdlib only, so it works before lmk's needs do."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def _header(smoke: bool) -> dict[str, Any]:
    report: dict[str, Any] = {"check": "gpu_check", "mode": "cpu-smoke" if smoke else "gpu",
                              "python": platform.python_version(), "torch": torch.__version__,
                              "device": "cpu" if smoke else torch.cuda.get_device_name(0)}
    if not smoke:
        report["gpu_count"] = torch.cuda.device_count()
        report["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 1024**3, 1)
        report["flash_attn_installed"] = importlib.util.find_spec("flash_attn") is not None
        if report["gpu_count"] == 1:
            report["ddp"] = "single GPU: DDP not exercised"
    return report


def run(smoke: bool, sections: list[str], out: Path, work: Path | None = None, **header: Any) -> dict[str, Any]:
    """Run `sections`, writing the report under `out` after each; scratch in `work` (default: a temporary folder,
    removed afterwards); `header` adds fields to the report."""
    if not smoke and not torch.cuda.is_available():
        return {"check": "gpu_check", "mode": "gpu", "python": platform.python_version(), "torch": torch.__version__,
                "status": "skipped", "reason": "CUDA is not available on this machine: nothing to check, nothing "
                "written. Run `make gpu-check` on a GPU node (or `python -m benchmarks.gpu_check --cpu-smoke` "
                "for the code path at the rehearsal's sizes on the CPU)."}
    report = {**_header(smoke), **header}
    path = out / REPORT_FILE[report["mode"]]
    scratch = Path(tempfile.mkdtemp(prefix="lmk-gpu-check-")) if work is None else work.resolve()
    report.update(status="running", work=str(scratch), work_kept=work is not None)
    t0 = time.perf_counter()
    try:
        for name in sections:
            write_report(path, {**report, "running": name})
            report[name] = run_section(name, SECTIONS[name], smoke, scratch)
            report["total_s"] = round(time.perf_counter() - t0, 1)
            report["throughput"] = throughput(report)
            write_report(path, report)
    finally:
        if work is None:
            shutil.rmtree(scratch, ignore_errors=True)
    failed = [s for s in sections if report[s]["status"] == "failed"]
    skipped = [s for s in sections if report[s]["status"] == "skipped"]
    report["status"] = "failed" if failed else "ok"
    if failed:
        report["failed_sections"] = failed
    if skipped:
        report["skipped_sections"] = skipped
    write_report(path, report)
    return report


@contextlib.contextmanager
def unpacked(archive: str | None) -> Iterator[None]:
    """A `make wheelhouse` archive unpacked into a temporary folder on sys.path and PYTHONPATH (for the jobs),
    removed afterwards; nothing is installed."""
    if not archive:
        yield
        return
    site = Path(tempfile.mkdtemp(prefix="lmk-wheelhouse-"))
    try:
        wheelhouse.unpack(Path(archive), site)
        sys.path.insert(0, str(site))
        os.environ["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
        importlib.invalidate_caches()
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(str(site))
        shutil.rmtree(site, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help="folder of gpu_check.json (default %(default)s)")
    parser.add_argument("--cpu-smoke", action="store_true", help="the same code at tiny sizes on the CPU")
    parser.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated: " + ", ".join(SECTIONS))
    parser.add_argument("--wheelhouse", help="a `make wheelhouse` archive: its packages on the path for this run")
    parser.add_argument("--work", type=Path, help="scratch folder, kept (default: a temporary one, removed)")
    parser.add_argument("--job-timeout-s", type=float, help="the rehearsal's per-job limit (default: "
                        + ", ".join(f"{k} {v} s" for k, v in gpu_rehearsal.JOB_TIMEOUT_S.items()) + ")")
    args = parser.parse_args(argv)
    sections = [s for s in args.sections.split(",") if s]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown sections {unknown}; choose from {', '.join(SECTIONS)}")
    if args.job_timeout_s:
        gpu_rehearsal.JOB_TIMEOUT_S.update(dict.fromkeys(gpu_rehearsal.JOB_TIMEOUT_S, args.job_timeout_s))
    env = dict(os.environ)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is built from configs in the repository
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ["WANDB_MODE"] = "disabled"  # no W&B run, no service binary, from any section
    try:
        with unpacked(args.wheelhouse):
            report = run(args.cpu_smoke, sections, Path(args.out), args.work,
                         **({"wheelhouse": args.wheelhouse} if args.wheelhouse else {}))
    finally:  # the caller's environment as it was (the check also runs inside tests)
        os.environ.clear()
        os.environ.update(env)
    print(json.dumps(report, indent=2, default=str))
    return 1 if report["status"] == "failed" else 0


if __name__ == "__main__":
    sys.exit(main())
