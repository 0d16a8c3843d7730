"""What the cost estimate divides by: FLOP/s of one device, each figure with its source.

Measured figures come only from a CUDA gpu-check (`read_gpu_check`: mode "gpu", status "ok") at the default
path; a CPU measurement (`python -m benchmarks.gpu_check --cpu-smoke`) only when given explicitly
(`--throughput FILE`) for a scale that trains on the CPU. Without one: a published bf16 dense peak of the GPU
(`GPU_PEAK_TFLOPS`, `LMK_GPU` picks the GPU) x an assumed utilisation.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmk.model.shape import EncoderShape

GPU_CHECK_JSON = "outputs/gpu_check/gpu_check.json"  # where `make gpu-check` writes its report
GPU_PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0}  # bf16 dense, vendor sheets
# float32 without tensor cores (vendor sheets): MaxSim's exact search multiplies float32 vectors (lmk.eval.maxsim)
GPU_FP32_TFLOPS = {"H100": 67.0, "H200": 67.0, "A100": 19.5, "L40S": 91.6}
ASSUMED_UTILISATION = 0.35
TOKENIZE_TOKENS_PER_S = 0.76e6  # one fast-tokenizer pass on one CPU core (a bench measurement): assumed
SEARCH_FLOPS_PER_S = 2.0e11  # exact dense search (mteb: float32 matmul + top-k on the CPU): assumed
JOB_OVERHEAD_S = 120.0  # start-up, model build, data, checkpoints of one job when nothing measured it: assumed


@dataclass
class Throughput:
    """FLOP/s of one device: a GPU, or one rank's share of a CPU machine's cores (kind "cpu")."""

    flops_per_s: float
    source: str
    kind: str = "gpu"
    measured: bool = False


@dataclass
class Rates:
    """What the estimate divides by, each figure with its source."""

    train: Throughput
    encode: dict[int, Throughput]  # per measured length; one entry at length 0 when not per length
    encode_includes_tokenization: bool
    job_overhead_s: float
    job_overhead_source: str
    tokenize_tokens_per_s: float = TOKENIZE_TOKENS_PER_S
    search_flops_per_s: float = SEARCH_FLOPS_PER_S
    maxsim: Throughput | None = None  # MaxSim's search on the eval device (set where a row scores by MaxSim)

    def encode_at(self, length: float) -> Throughput:
        """The encode figure measured at the length nearest `length` (on a log scale)."""
        return self.encode[min(self.encode, key=lambda n: abs(math.log(max(n, 1) / max(length, 1))))]

    def sources(self) -> list[str]:
        enc = "; ".join(f"{tp.source}" for tp in self.encode.values())
        out = [f"train throughput: {self.train.source}", f"encode throughput: {enc}"]
        if not self.encode_includes_tokenization:
            out.append(f"tokenization: {self.tokenize_tokens_per_s / 1e6:.2f}M tokens/s on the CPU, in turn with "
                       "the model (assumed: one fast-tokenizer pass on one core)")
        out.append(f"search: exact, {self.search_flops_per_s / 1e9:.0f} GFLOP/s on the CPU (assumed)")
        if self.maxsim is not None:
            out.append(f"MaxSim search: {self.maxsim.source}")
        out.append(f"job overhead: {self.job_overhead_s:.0f} s per job ({self.job_overhead_source})")
        return out


def read_gpu_check(path: str | os.PathLike = GPU_CHECK_JSON, modes: tuple[str, ...] = ("gpu",)
                   ) -> dict[str, Any] | None:
    """The throughput a gpu-check report measured (its "throughput" section, plus the per-length figures of
    its `encode_pipeline` section when present), or None: no file, an unreadable one, a check that did not
    finish "ok", or a mode not in `modes`. The default takes only a CUDA run: a `--cpu-smoke` report
    measures the CPU and must never pass for a GPU measurement."""
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            report = json.load(fh)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(report, dict) or report.get("status") != "ok" or report.get("mode") not in modes:
        return None
    tp = dict(report.get("throughput") or {})
    if not tp:
        return None
    tp.setdefault("mode", report.get("mode"))
    tp.setdefault("device", report.get("device"))
    pipeline = report.get("encode_pipeline")
    if isinstance(pipeline, dict) and pipeline.get("status", "ok") == "ok":
        figures = {str(k): v for k, v in pipeline.items()
                   if isinstance(v, dict) and isinstance(v.get("end_to_end_tokens_per_s"), int | float)}
        if figures:
            tp["encode_pipeline"] = figures
    return tp


def peak_throughput(gpu: str = "H100", utilisation: float = ASSUMED_UTILISATION) -> Throughput:
    if gpu not in GPU_PEAK_TFLOPS:
        raise ValueError(f"GPU {gpu!r} has no published peak here; set LMK_GPU to one of {', '.join(GPU_PEAK_TFLOPS)}")
    return Throughput(GPU_PEAK_TFLOPS[gpu] * 1e12 * utilisation,
                      f"published {gpu} bf16 dense peak {GPU_PEAK_TFLOPS[gpu]:.0f} TFLOP/s x {utilisation:.0%} "
                      "assumed utilisation (no measured gpu-check)")


def maxsim_throughput(rates: Rates, gpu: str | None = None) -> Throughput:
    """MaxSim's exact search rate: float32 on the eval job's GPU (its published float32 peak x the assumed
    utilisation; the GPU a measurement names, else `gpu` / LMK_GPU), or the CPU search rate on a CPU scale."""
    if rates.train.kind == "cpu":
        return Throughput(rates.search_flops_per_s, f"exact, float32, {rates.search_flops_per_s / 1e9:.0f} GFLOP/s "
                          "on the CPU (assumed)", "cpu")
    name = gpu or os.environ.get("LMK_GPU", "H100")
    measured = rates.train.source
    name = next((g for g in GPU_FP32_TFLOPS if g in measured), name) if rates.train.measured else name
    if name not in GPU_FP32_TFLOPS:
        raise ValueError(f"GPU {name!r} has no published float32 peak here; set LMK_GPU to one of "
                         f"{', '.join(GPU_FP32_TFLOPS)}")
    return Throughput(GPU_FP32_TFLOPS[name] * 1e12 * ASSUMED_UTILISATION,
                      f"exact, float32 on the eval GPU: published {name} float32 peak {GPU_FP32_TFLOPS[name]:g} "
                      f"TFLOP/s x {ASSUMED_UTILISATION:.0%} assumed utilisation")


def measured_rates(tp: Mapping[str, Any], path: Path | str, shape: EncoderShape) -> Rates:
    """Rates from a gpu-check "throughput" section (`read_gpu_check`)."""
    kind = "gpu" if tp.get("mode") == "gpu" else "cpu"
    where = f"measured ({tp.get('mode')}, {tp.get('device')}) in {path}"
    if not tp.get("train_flops_per_s"):
        raise ValueError(f"{path} has no training throughput (its train_step section failed or did not run); "
                         "rerun the check with its train_step section")
    train = Throughput(float(tp["train_flops_per_s"]), f"{where}: train_step {tp.get('train_tokens_per_s'):,} tokens/s "
                       f"= {float(tp['train_flops_per_s']) / 1e12:.3g} TFLOP/s at {tp.get('train_passes')} passes",
                       kind, True)
    pipeline = tp.get("encode_pipeline") or {}
    per_len, e2e = {}, bool(pipeline)
    for length, fig in (pipeline or tp.get("encode_tokens_per_s") or {}).items():
        rate = float(fig["end_to_end_tokens_per_s"] if e2e else fig)
        what = (f"end to end (tokenization included; forward-only {fig.get('forward_only_tokens_per_s'):,} "
                f"tokens/s, ratio {fig.get('ratio')})") if e2e else "forward only"
        per_len[int(length)] = Throughput(rate * shape.forward_flops_per_token(int(length)),
                                          f"{where}: {rate:,.0f} tokens/s at {length} tokens, {what}", kind, True)
    if not per_len:  # a check run without its encode section
        per_len[0] = Throughput(train.flops_per_s, f"{where}: no encode section, the training FLOP/s stands in "
                                "(assumed)", kind)
    overhead = tp.get("job_overhead_s")
    return Rates(train, per_len, e2e, float(overhead if overhead is not None else JOB_OVERHEAD_S),
                 f"{where}: the rehearsal row's training wall time less its steps" if overhead is not None
                 else "assumed")


def choose_rates(on_cpu: bool, shape: EncoderShape, throughput_file: Path | str | None = None,
                 gpu_check: Path | str = GPU_CHECK_JSON, gpu: str | None = None) -> Rates:
    """The measured rates when a usable measurement exists, else the published peak. A file given
    explicitly must be readable and measured on the kind of device the jobs train on (`on_cpu`)."""
    if throughput_file is not None:
        tp = read_gpu_check(throughput_file, modes=("gpu", "cpu-smoke"))
        if tp is None:
            raise ValueError(f"--throughput {throughput_file}: not a finished gpu-check report (status ok); write one "
                             "with `make gpu-check` (GPU) or `python -m benchmarks.gpu_check --cpu-smoke` (CPU)")
        if (tp.get("mode") != "gpu") != on_cpu:
            raise ValueError(f"--throughput {throughput_file} was measured in mode {tp.get('mode')!r} but this scale "
                             f"trains on the {'CPU' if on_cpu else 'GPU'}; give a report measured on that device")
        return measured_rates(tp, throughput_file, shape)
    tp = None if on_cpu else read_gpu_check(gpu_check)
    if tp is not None:
        return measured_rates(tp, gpu_check, shape)
    if on_cpu:
        raise ValueError("a CPU scale has no published throughput; measure this machine with `python -m "
                         "benchmarks.gpu_check --cpu-smoke` and pass --throughput outputs/gpu_check/cpu_check.json")
    peak = peak_throughput(gpu or os.environ.get("LMK_GPU", "H100"))
    return Rates(peak, {0: peak}, False, JOB_OVERHEAD_S, "assumed")
