"""Named poolers: token embeddings [B, T, H] -> L2-normalised sentence embeddings [B, H].

Every pooler is a small `torch.nn.Module` with a `name` and a `config()`; `build_pooler(**config())`
rebuilds it (a trainable pooler's weights travel in the model's state dict). Inputs are never modified
in place, and means are computed in float32 so bf16 / fp16 backbones pool exactly; the output is float32.

Registry (`POOLERS`):
  - ``cls``: the first non-pad token (position 0 with right padding).
  - ``mean``: masked mean over all non-pad tokens ([CLS] and [SEP] included).
  - ``lmk``: mean over `pool_mask & attention_mask` (landmarks, or every-k / multi-CLS positions); a row
    with no pooled position falls back to the masked mean.
  - ``latent_attention``: the authors' trainable latent-attention pooler (tokens attend to learnable
    latents, GEGLU feed-forward, masked mean); needs `hidden_size`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmk.config.names import POOLER_NAMES


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
    """Latent-attention pooling in the LMK authors' design (their modeling.py, after NV-Embed).

    Every token attends to `num_latents` learnable vectors (queries from the tokens, keys and values from
    the latents, no mask: the latents are never padding), then a GEGLU feed-forward block; both blocks are
    pre-norm and residual (the latents get their own norm). The pooled vector is the masked mean of the
    result. Their sizes: 64 latents of the hidden size, hidden_size // 64 heads of head_dim = hidden_size
    each, bias-free projections, feed-forward width 4 x hidden_size; latents initialised N(0, 1).
    """

    name = "latent_attention"

    def __init__(
        self,
        hidden_size: int,
        num_latents: int = 64,
        num_heads: int | None = None,
        head_dim: int | None = None,
        ff_mult: int = 4,
    ) -> None:
        super().__init__()
        num_heads = hidden_size // num_latents if num_heads is None else num_heads
        head_dim = hidden_size if head_dim is None else head_dim
        for key, value in (
            ("hidden_size", hidden_size),
            ("num_latents", num_latents),
            ("num_heads", num_heads),
            ("head_dim", head_dim),
            ("ff_mult", ff_mult),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                hint = " (hidden_size // num_latents is 0: set num_heads)" if key == "num_heads" else ""
                raise ValueError(f"latent_attention {key} must be an integer >= 1, got {value!r}{hint}")
        self.hidden_size, self.num_latents, self.num_heads = hidden_size, num_latents, num_heads
        self.head_dim, self.ff_mult = head_dim, ff_mult
        inner = num_heads * head_dim
        self.latents = nn.Parameter(torch.randn(num_latents, hidden_size))
        self.attn_norm = nn.LayerNorm(hidden_size)
        self.latent_norm = nn.LayerNorm(hidden_size)
        self.to_q = nn.Linear(hidden_size, inner, bias=False)
        self.to_kv = nn.Linear(hidden_size, 2 * inner, bias=False)
        self.to_out = nn.Linear(inner, hidden_size, bias=False)
        self.ff_norm = nn.LayerNorm(hidden_size)
        self.ff_in = nn.Linear(hidden_size, 2 * ff_mult * hidden_size)
        self.ff_out = nn.Linear(ff_mult * hidden_size, hidden_size)

    def _heads(self, t: Tensor) -> Tensor:
        return t.unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)  # [B, heads, N, head_dim]

    def pool(self, token_embeddings: Tensor, attention_mask: Tensor, pool_mask: Tensor | None) -> Tensor:
        if token_embeddings.shape[-1] != self.hidden_size:
            raise ValueError(
                f"latent_attention was built for hidden_size {self.hidden_size}, got {token_embeddings.shape[-1]}"
            )
        # run in the pooler's own dtype (float32 params) so a bf16 backbone output works too
        x = token_embeddings.to(self.latents.dtype)
        latents = self.latent_norm(self.latents).unsqueeze(0).expand(x.shape[0], -1, -1)
        q = self._heads(self.to_q(self.attn_norm(x)))
        k, v = (self._heads(t) for t in self.to_kv(latents).chunk(2, dim=-1))
        attended = F.scaled_dot_product_attention(q, k, v)  # scale 1/sqrt(head_dim), as theirs
        x = x + self.to_out(attended.transpose(1, 2).flatten(2))
        value, gate = self.ff_in(self.ff_norm(x)).chunk(2, dim=-1)
        x = x + self.ff_out(value * F.gelu(gate))  # GEGLU
        return _masked_mean(x, attention_mask)

    def config(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "hidden_size": self.hidden_size,
            "num_latents": self.num_latents,
            "num_heads": self.num_heads,
            "head_dim": self.head_dim,
            "ff_mult": self.ff_mult,
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
    raise RuntimeError(f"lmk.config.names.POOLER_NAMES {POOLER_NAMES} is out of date: registry has {tuple(POOLERS)}")


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
