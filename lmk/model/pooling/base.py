"""The pooler contract and its registry: token embeddings [B, T, H] -> L2-normalised sentence embeddings [B, H].

A pooler is a small `torch.nn.Module` subclass of `Pooler` with a `name`, the needs it declares (class
attributes) and a `config()`; `@register_pooler` adds the class to `POOLERS` (a duplicate name is an error) and
`build_pooler(name, hidden_size, **kwargs)` builds one. Inputs are never modified in place, and means are
computed in float32 so bf16 / fp16 backbones pool exactly; the output is float32. `forward` runs with autocast
off: under Lightning's bf16-mixed autocast an einsum or a linear layer would otherwise run (and return) bf16.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def masked_mean(x: Tensor, weights: Tensor) -> Tensor:
    """Mean of x [B, T, H] over T with 0/1 weights [B, T], in float32; an all-zero row gives zeros.

    Positions of weight 0 are never read: a non-finite value there (a padded row that attended to no key) would
    otherwise turn the sum into NaN (0 x NaN = NaN)."""
    w = weights.to(torch.float32)
    x = torch.where(w[..., None] > 0, x.to(torch.float32), 0.0)
    total = torch.einsum("bt,bth->bh", w, x)
    return total / w.sum(dim=1, keepdim=True).clamp(min=1.0)


def _check_inputs(token_embeddings: Tensor, attention_mask: Tensor, pool_mask: Tensor | None) -> None:
    if token_embeddings.dim() != 3:
        raise ValueError(
            f"token_embeddings must be [batch, tokens, hidden], got shape {tuple(token_embeddings.shape)}"
        )
    expected = tuple(token_embeddings.shape[:2])
    if tuple(attention_mask.shape) != expected:
        raise ValueError(
            f"attention_mask shape {tuple(attention_mask.shape)} != token_embeddings [B, T] {expected}"
        )
    if pool_mask is not None and tuple(pool_mask.shape) != expected:
        raise ValueError(f"pool_mask shape {tuple(pool_mask.shape)} != token_embeddings [B, T] {expected}")


class Pooler(nn.Module):
    """Base class: subclasses implement `pool` (unnormalised [B, H]); `forward` checks and normalises."""

    name: ClassVar[str] = ""
    # What the pooler needs (read by other modules instead of testing its name; lmk.config reads them from this
    # source, torch-free: keep them literals).
    needs_pool_mask: ClassVar[bool] = False  # pools positions the strategy marks (pool_mask)
    needs_hidden_size: ClassVar[bool] = False  # built with the backbone's hidden size
    trainable: ClassVar[bool] = False  # has weights (saved with the model, pooler.safetensors in exports)
    # whose attention rows the position-bias probe reads (lmk.analysis.attention): "cls" (the first token),
    # "mean" (every token), "lmk" (the pooled positions); None: the probe does not apply to this pooler
    attention_rows: ClassVar[str | None] = None

    def forward(
        self, token_embeddings: Tensor, attention_mask: Tensor, pool_mask: Tensor | None = None
    ) -> Tensor:
        _check_inputs(token_embeddings, attention_mask, pool_mask)
        with torch.autocast(token_embeddings.device.type, enabled=False):  # fp32 pooling under bf16-mixed too
            pooled = self.pool(
                token_embeddings, attention_mask.bool(), None if pool_mask is None else pool_mask.bool()
            )
            return F.normalize(pooled.to(torch.float32), p=2, dim=-1)

    def pool(self, token_embeddings: Tensor, attention_mask: Tensor, pool_mask: Tensor | None) -> Tensor:
        raise NotImplementedError

    def config(self) -> dict[str, Any]:
        """JSON-able; `build_pooler(**config)` rebuilds this pooler."""
        return {"name": self.name}

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.config().items() if k != "name")


POOLERS: dict[str, type[Pooler]] = {}


def register_pooler(cls: type[Pooler]) -> type[Pooler]:
    """Class decorator: add a pooler to `POOLERS` under its `name` (config validation reads the same classes)."""
    if not cls.name:
        raise ValueError(f"pooler class {cls.__qualname__} has no `name`")
    if cls.name in POOLERS and POOLERS[cls.name] is not cls:
        raise ValueError(f"pooler name {cls.name!r} is registered twice ({POOLERS[cls.name].__qualname__} and "
                         f"{cls.__qualname__}); give each pooler its own name")
    POOLERS[cls.name] = cls
    return cls


def build_pooler(name: str, hidden_size: int | None = None, **kwargs: Any) -> Pooler:
    """Build a pooler by registry name; `hidden_size` is passed only to poolers that need it."""
    if name not in POOLERS:
        raise ValueError(f"unknown pooler {name!r}; allowed: {', '.join(POOLERS)}")
    if POOLERS[name].needs_hidden_size:
        if hidden_size is None:
            raise ValueError(
                f"pooler {name!r} is trainable and needs hidden_size (the backbone's hidden size)"
            )
        return POOLERS[name](hidden_size=hidden_size, **kwargs)
    if kwargs:
        raise ValueError(f"pooler {name!r} takes no options, got {sorted(kwargs)}")
    return POOLERS[name]()
