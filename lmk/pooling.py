"""Named poolers: token embeddings [B, T, H] -> L2-normalised sentence embeddings [B, H].

Every pooler is a small `torch.nn.Module` with a `name` and a `config()`; `build_pooler(**config())`
rebuilds it (a trainable pooler's weights travel in the model's state dict). Inputs are never modified
in place, and means are computed in float32 so bf16 / fp16 backbones pool exactly; the output is float32.

Registry (`POOLERS`):
  - ``cls``: the first non-pad token (position 0 with right padding).
  - ``mean``: masked mean over all non-pad tokens ([CLS] and [SEP] included).
  - ``lmk``: mean over `pool_mask & attention_mask` (landmarks, or every-k / multi-CLS positions); a row
    with no pooled position falls back to the masked mean.
  - ``latent_attention``: NV-Embed-style trainable pooler (cross-attention to learnable latents, MLP,
    masked mean); needs `hidden_size`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmk.names import POOLER_NAMES


def _masked_mean(x: Tensor, weights: Tensor) -> Tensor:
    """Mean of x [B, T, H] over T with 0/1 weights [B, T], in float32; an all-zero row gives zeros."""
    w = weights.to(torch.float32)
    total = torch.einsum("bt,bth->bh", w, x.to(torch.float32))
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

    def forward(
        self, token_embeddings: Tensor, attention_mask: Tensor, pool_mask: Tensor | None = None
    ) -> Tensor:
        _check_inputs(token_embeddings, attention_mask, pool_mask)
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


class CLSPooling(Pooler):
    name = "cls"

    def pool(self, token_embeddings: Tensor, attention_mask: Tensor, pool_mask: Tensor | None) -> Tensor:
        # first non-pad token: position 0 with right padding, after the padding with left padding
        first = attention_mask.to(torch.int8).argmax(dim=1)
        rows = torch.arange(token_embeddings.shape[0], device=token_embeddings.device)
        return token_embeddings[rows, first]


class MeanPooling(Pooler):
    name = "mean"

    def pool(self, token_embeddings: Tensor, attention_mask: Tensor, pool_mask: Tensor | None) -> Tensor:
        return _masked_mean(token_embeddings, attention_mask)


class LandmarkPooling(Pooler):
    name = "lmk"

    def pool(self, token_embeddings: Tensor, attention_mask: Tensor, pool_mask: Tensor | None) -> Tensor:
        if pool_mask is None:
            raise ValueError(
                "the 'lmk' pooler needs a pool_mask (from LandmarkTokenizer); use pooler 'cls' or 'mean' "
                "for inputs without one"
            )
        mask = pool_mask & attention_mask  # padding is never pooled
        # a row with no pooled position falls back to the masked mean over its tokens
        has_any = mask.any(dim=1, keepdim=True)
        return _masked_mean(token_embeddings, torch.where(has_any, mask, attention_mask))


class LatentAttentionPooling(Pooler):
    """NV-Embed latent-attention pooling: tokens attend to `num_latents` learnable vectors, then an MLP
    (both pre-norm residual blocks), then the masked mean over non-pad tokens."""

    name = "latent_attention"

    def __init__(
        self, hidden_size: int, num_latents: int = 512, num_heads: int = 8, mlp_ratio: int = 4
    ) -> None:
        super().__init__()
        for key, value in (
            ("hidden_size", hidden_size),
            ("num_latents", num_latents),
            ("num_heads", num_heads),
            ("mlp_ratio", mlp_ratio),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"latent_attention {key} must be an integer >= 1, got {value!r}")
        if hidden_size % num_heads:
            raise ValueError(
                f"latent_attention hidden_size {hidden_size} must be divisible by num_heads {num_heads}"
            )
        self.hidden_size, self.num_latents, self.num_heads, self.mlp_ratio = (
            hidden_size,
            num_latents,
            num_heads,
            mlp_ratio,
        )
        self.latents = nn.Parameter(torch.randn(num_latents, hidden_size) * hidden_size**-0.5)
        self.attn_norm = nn.LayerNorm(hidden_size)
        self.attn = nn.MultiheadAttention(hidden_size, num_heads, batch_first=True)
        self.mlp_norm = nn.LayerNorm(hidden_size)
        self.mlp = nn.Sequential(
            nn.Linear(hidden_size, mlp_ratio * hidden_size),
            nn.GELU(),
            nn.Linear(mlp_ratio * hidden_size, hidden_size),
        )

    def pool(self, token_embeddings: Tensor, attention_mask: Tensor, pool_mask: Tensor | None) -> Tensor:
        if token_embeddings.shape[-1] != self.hidden_size:
            raise ValueError(
                f"latent_attention was built for hidden_size {self.hidden_size}, got {token_embeddings.shape[-1]}"
            )
        # run in the pooler's own dtype (float32 params) so a bf16 backbone output works too
        x = token_embeddings.to(self.latents.dtype)
        latents = self.latents.unsqueeze(0).expand(x.shape[0], -1, -1)
        x = x + self.attn(self.attn_norm(x), latents, latents, need_weights=False)[0]
        x = x + self.mlp(self.mlp_norm(x))
        return _masked_mean(x, attention_mask)

    def config(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "hidden_size": self.hidden_size,
            "num_latents": self.num_latents,
            "num_heads": self.num_heads,
            "mlp_ratio": self.mlp_ratio,
        }


# name -> class; a new pooler registers here (and needs `name`, `config()`)
POOLERS: dict[str, type[Pooler]] = {
    CLSPooling.name: CLSPooling,
    MeanPooling.name: MeanPooling,
    LandmarkPooling.name: LandmarkPooling,
    LatentAttentionPooling.name: LatentAttentionPooling,
}
# poolers whose constructor needs the backbone's hidden size
NEEDS_HIDDEN_SIZE = frozenset({LatentAttentionPooling.name})


# The torch-free name list (config validation) must name exactly these poolers.
if tuple(POOLERS) != POOLER_NAMES:
    raise RuntimeError(f"lmk.names.POOLER_NAMES {POOLER_NAMES} is out of date: registry has {tuple(POOLERS)}")


def build_pooler(name: str, hidden_size: int | None = None, **kwargs: Any) -> Pooler:
    """Build a pooler by registry name; `hidden_size` is passed only to poolers that need it."""
    if name not in POOLERS:
        raise ValueError(f"unknown pooler {name!r}; allowed: {', '.join(POOLERS)}")
    if name in NEEDS_HIDDEN_SIZE:
        if hidden_size is None:
            raise ValueError(
                f"pooler {name!r} is trainable and needs hidden_size (the backbone's hidden size)"
            )
        return POOLERS[name](hidden_size=hidden_size, **kwargs)
    if kwargs:
        raise ValueError(f"pooler {name!r} takes no options, got {sorted(kwargs)}")
    return POOLERS[name]()
