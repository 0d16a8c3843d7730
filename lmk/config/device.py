"""Inference device and precision specs: `auto|cpu|cuda|cuda:N` and `auto|bf16|fp16|fp32` (torch-free checks;
`lmk.model.device` turns them into torch objects). Configs validate on login nodes too: no CUDA check here."""

from __future__ import annotations

import re

DEVICES = ("auto", "cpu", "cuda", "cuda:N")
PRECISIONS = ("auto", "bf16", "fp16", "fp32")
_DEVICE_RE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def check_device(spec: str, key: str = "eval.device") -> str:
    """The spec itself when it is well formed (no CUDA check: configs validate on login nodes too)."""
    if not isinstance(spec, str) or not _DEVICE_RE.match(spec):
        raise ValueError(f"{key}={spec!r}: allowed values are {', '.join(DEVICES)} (N a GPU index)")
    return spec


def check_precision(spec: str, key: str = "eval.precision") -> str:
    if spec not in PRECISIONS:
        raise ValueError(f"{key}={spec!r}: allowed values are {', '.join(PRECISIONS)}")
    return spec
