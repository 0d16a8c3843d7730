"""Which token states a multi-vector (MaxSim) model keeps: the landmark states the lmk pooler averages, or all tokens.

`vector_mask` is the one rule, shared by lmk's MaxSim scoring (lmk.model.multi_vector) and by `LandmarkVectorMask`, the
sentence-transformers module a multi-vector export carries: a `MultiVectorEncoder` keeps the token embeddings where
`attention_mask` is true, so this module sets it to the kept positions (documents: landmarks; queries: landmarks, or
every token with `queries="tokens"`), as sentence-transformers' own `MultiVectorMask` does with token ids.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

try:
    from sentence_transformers.base.modules import Module
except ImportError:  # sentence-transformers 5.x keeps its module classes in `models`
    from sentence_transformers.models import Module

VECTORS = ("landmarks", "tokens")


def vector_mask(attention_mask: Tensor, pool_mask: Tensor | None, which: str = "landmarks") -> Tensor:
    """[B, T] bool: the positions whose states a text keeps. `landmarks`: `pool_mask & attention_mask`, and as the
    lmk pooler a row with no pooled position keeps all its tokens; `tokens`: every non-pad token."""
    if which not in VECTORS:
        raise ValueError(f"which={which!r}: allowed {list(VECTORS)}")
    attention = attention_mask.bool()
    if which == "tokens":
        return attention
    if pool_mask is None:
        raise ValueError("landmark states need the pool_mask of a LandmarkTokenizer (an lmk pooling)")
    keep = pool_mask.bool() & attention
    return torch.where(keep.any(dim=1, keepdim=True), keep, attention)


class LandmarkVectorMask(Module):
    """sentence-transformers module (after LandmarkTransformer in a MultiVectorEncoder): `attention_mask` becomes the
    positions MaxSim scores, the landmarks of a document, and of a query unless `queries="tokens"`."""

    config_keys: ClassVar[list[str]] = ["queries"]
    forward_kwargs: ClassVar[set[str]] = {"task"}

    def __init__(self, queries: str = "landmarks") -> None:
        super().__init__()
        if queries not in VECTORS:
            raise ValueError(f"queries={queries!r}: allowed {list(VECTORS)}")
        self.queries = queries

    def forward(self, features: dict[str, Any], task: str | None = None, **kwargs: Any) -> dict[str, Any]:
        which = self.queries if task == "query" else "landmarks"
        features["attention_mask"] = vector_mask(features["attention_mask"], features.get("pool_mask"), which)
        return features

    def save(self, output_path: str, *args: Any, safe_serialization: bool = True, **kwargs: Any) -> None:
        self.save_config(output_path)
