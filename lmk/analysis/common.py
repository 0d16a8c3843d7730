"""Helpers the probes share: argument checks, bin centres, a model's device and max_length, and what a compared
model is (`RunName`: its pooling row and the objective it was trained with)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from lmk.config import TrainSection, registry

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


UNTRAINED = "untrained"  # the objective column of a model no objective trained (the untrained fallback)


def objective_label(objective: str) -> str:
    """How figures and tables name a training objective: its declared card label (lmk.config.objectives, e.g.
    "MaxSim InfoNCE"), else its name; `UNTRAINED` as is."""
    return registry.declared_objectives().get(objective, {}).get("label") or objective


@dataclass(frozen=True)
class RunName:
    """What one compared model is: its pooling row ("encoder/pooling", as Table 2 labels it) and the objective that
    trained it (`train.objective`; `UNTRAINED` for an untrained encoder). Its `label` names the objective only where
    it is not the schema's default, so the two trainings of one pooling get two labels."""

    pooling: str
    objective: str = UNTRAINED

    @property
    def label(self) -> str:
        if self.objective in (UNTRAINED, TrainSection.objective):
            return self.pooling
        return f"{self.pooling} (trained with {objective_label(self.objective)})"

