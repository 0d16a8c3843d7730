"""Which token states a multi-vector (MaxSim) model keeps: the landmark states the lmk pooler averages, or all tokens.

`vector_mask` is the one rule, shared by lmk's MaxSim scoring (lmk.model.multi_vector) and by `LandmarkVectorMask`, the
sentence-transformers module a multi-vector export carries: a `MultiVectorEncoder` keeps the token embeddings where
`attention_mask` is true, so this module sets it to the kept positions (documents: landmarks; queries: landmarks, or
every token with `queries="tokens"`), as sentence-transformers' own `MultiVectorMask` does with token ids. The option's
values are the one tuple `names.MAXSIM_QUERIES` (lmk's `eval.maxsim_query`; `queries` is the export's name for it).
"""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

import torch
from torch import Tensor

try:
    from sentence_transformers.base.modules import Module
except ImportError:  # sentence-transformers 5.x keeps its module classes in `models`
    from sentence_transformers.models import Module

from .names import MAXSIM_QUERIES

_OLD_NAMES = {"VECTORS": "MAXSIM_QUERIES"}  # old names kept working, each with a DeprecationWarning


def __getattr__(name: str) -> Any:
    if name in _OLD_NAMES:
        warnings.warn(f"{__name__}.{name} is deprecated: use {_OLD_NAMES[name]}", DeprecationWarning, stacklevel=2)
        return globals()[_OLD_NAMES[name]]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def vector_mask(attention_mask: Tensor, pool_mask: Tensor | None, maxsim_query: str = "landmarks", *,
                which: str | None = None) -> Tensor:
    """[B, T] bool: the positions whose states a text keeps (`maxsim_query`, one of MAXSIM_QUERIES). `landmarks`:
    `pool_mask & attention_mask`, and as the lmk pooler a row with no pooled position keeps all its tokens; `tokens`:
    every non-pad token. (`which=`: the old keyword name.)"""
    if which is not None:
        warnings.warn("vector_mask(which=...) is deprecated: use maxsim_query=", DeprecationWarning, stacklevel=2)
        maxsim_query = which
    if maxsim_query not in MAXSIM_QUERIES:
        raise ValueError(f"maxsim_query={maxsim_query!r}: allowed {list(MAXSIM_QUERIES)}")
    attention = attention_mask.bool()
    if maxsim_query == "tokens":
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
        if queries not in MAXSIM_QUERIES:
            raise ValueError(f"queries={queries!r}: allowed {list(MAXSIM_QUERIES)}")
        self.queries = queries

    def forward(self, features: dict[str, Any], task: str | None = None, **kwargs: Any) -> dict[str, Any]:
        kept = self.queries if task == "query" else "landmarks"
        features["attention_mask"] = vector_mask(features["attention_mask"], features.get("pool_mask"), kept)
        return features

    def save(self, output_path: str, *args: Any, safe_serialization: bool = True, **kwargs: Any) -> None:
        self.save_config(output_path)
