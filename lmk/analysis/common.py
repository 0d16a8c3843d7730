"""Helpers the probes share: argument checks, bin centres, a model's device and max_length."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:  # imported lazily at run time: analysis sits above model / data in the layering
    from lmk.model.embedding import EmbeddingModel


def _check_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)



def bin_centers(n_bins: int) -> np.ndarray:
    """Relative position (0..1) of each bin's centre."""
    n_bins = _check_int("n_bins", n_bins)
    return (np.arange(n_bins) + 0.5) / n_bins


def _device(model: torch.nn.Module) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


def _max_length(model: EmbeddingModel, max_length: int | None) -> int:
    if max_length is None:
        return int(model.max_positions)
    return _check_int("max_length", max_length, minimum=3)

