"""Inference device and precision: `auto|cpu|cuda|cuda:N` and `auto|bf16|fp16|fp32` -> torch objects.

Evaluation runs outside Lightning's training-step autocast, so it sets its own: `autocast(device,
precision)` around the forward pass (weights stay as loaded; outputs are cast back to float32).
`auto` means the accelerator when there is one, and bf16 there (fp16 on GPUs without bf16); fp32 on CPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from lmk.config.device import check_device, check_precision


def resolve_device(spec: str = "auto", key: str = "eval.device") -> torch.device:
    """`auto` -> cuda when available, else cpu; an explicit cuda request without CUDA fails naming `key`."""
    check_device(spec, key)
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(spec)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(
                f"{key}={spec!r} but CUDA is not available on this machine (torch.cuda.is_available() is False); "
                f"set {key}=auto or {key}=cpu"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise RuntimeError(
                f"{key}={spec!r} but this machine has {torch.cuda.device_count()} GPU(s) "
                f"(indices 0..{torch.cuda.device_count() - 1}); set {key}=cuda or {key}=auto"
            )
    return device


def resolve_precision(spec: str, device: torch.device | str, key: str = "eval.precision") -> str:
    """`auto` -> bf16 on GPUs that support it (fp16 on older ones), fp32 on CPU; else the spec."""
    check_precision(spec, key)
    device = torch.device(device)
    if spec != "auto":
        return spec
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "fp32"


@contextlib.contextmanager
def autocast(device: torch.device | str, precision: str) -> Iterator[None]:
    """torch.autocast for bf16/fp16 on `device`; nothing for fp32 (`auto` must be resolved first)."""
    check_precision(precision)
    if precision == "auto":
        raise ValueError("autocast needs a resolved precision (bf16, fp16 or fp32); call resolve_precision first")
    if precision == "fp32":
        yield
        return
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    with torch.autocast(device_type=torch.device(device).type, dtype=dtype):
        yield
