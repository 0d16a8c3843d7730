"""The CPU kernels a pinned run computes with: one instruction set on every x86-64 CPU that has it.

PyTorch (ATen's vectorised kernels), MKL (matmuls) and oneDNN each pick their kernels by the CPU they find, and a
few-step random model amplifies the rounding: the rehearsal's CLS row moved in all nine cells between an AVX-512
and an AVX2 machine, and came out as the AVX2 machine's with these switches set on the AVX-512 one. A pinned scale
names a set here (`cpu_kernels: avx2` in a table spec); the sweep sets its switches in every job's environment
before the job's interpreter starts (each library reads its switch once, at its first use), and results.json
records what a run computed with (`in_use`). Unset (the paper scale, GPUs), nothing is changed or slowed.
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["KERNEL_SETS", "SWITCHES", "in_use", "switches"]

# name -> the libraries' own environment switches; each library reads its own once, when it first runs a kernel
KERNEL_SETS: dict[str, dict[str, str]] = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
}
SWITCHES: tuple[str, ...] = tuple(sorted({k for s in KERNEL_SETS.values() for k in s}))


def switches(name: str | None) -> dict[str, str]:
    """The environment of kernel set `name` ({} for None); ValueError names the sets."""
    if name is None:
        return {}
    if name not in KERNEL_SETS:
        raise ValueError(f"cpu_kernels: {name!r} is not a kernel set; choose one of {sorted(KERNEL_SETS)} or leave "
                         "it out (the CPU's own kernels)")
    return dict(KERNEL_SETS[name])


def in_use() -> dict[str, Any]:
    """The switches set in this process and, once torch is loaded, the kernels ATen picked and its thread count
    (the other thing that decides a CPU run's floats)."""
    out: dict[str, Any] = {"switches": {k: os.environ[k] for k in SWITCHES if k in os.environ}}
    torch = sys.modules.get("torch")  # not imported here: the run layer's writers stay light
    if torch is not None and hasattr(torch, "backends"):
        out["capability"] = torch.backends.cpu.get_cpu_capability()
        out["threads"] = torch.get_num_threads()
    return out
