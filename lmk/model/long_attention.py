"""Sliding-window attention without a dense T x T mask, for long unpadded inputs at inference.

With `attn_implementation="sdpa"`, transformers skips the global layers' mask when nothing is padded,
but a ModernBERT sliding-window layer still gets a dense [B, 1, T, T] band mask, and SDPA with a mask
on CPU falls back to the math kernel, which materialises [B, heads, T, T] float scores: 1 GiB at 8192
tokens, 16 GiB at 32,768. `lean_attention(backbone)` switches such a backbone, for the duration of a
`with` block, to an implementation registered here ("lmk_sdpa") that

- builds exactly the masks `sdpa` builds, except a sliding-window mask for an unpadded batch (None);
- computes an unmasked sliding-window layer block by block (queries of one block against the keys
  within the window of it), so memory grows linearly with T; everything else is `sdpa` itself.

The result equals `sdpa`'s (same band |i - j| <= config.sliding_window); padded batches are unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from lmk.model.landmark.sliding_window_guard import guard_padded_rows, has_sliding_window, no_empty_rows

__all__ = ["banded_attention", "guard_padded_rows", "has_sliding_window", "lean_attention", "no_empty_rows",
           "register"]

LEAN_SDPA = "lmk_sdpa"
BLOCK = 512  # queries per block: big enough for efficient matmuls, small enough to bound memory
_registered = False


def _lean_mask(**kwargs: Any) -> torch.Tensor | None:
    padding = kwargs.get("attention_mask")
    if (kwargs.get("local_size") is not None and kwargs.get("allow_is_bidirectional_skip", False)
            and (padding is None or bool(padding.all()))):
        return None  # the attention function applies the band itself
    return sdpa_mask(**kwargs)


def banded_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, half_window: int,
                     scaling: float | None = None, block: int = BLOCK) -> torch.Tensor:
    """softmax(q k^T) v restricted to |i - j| <= half_window, for [B, H, T, D] inputs; returns [B, H, T, D]."""
    t = query.shape[2]
    out = torch.empty_like(query)
    for start in range(0, t, block):
        end = min(start + block, t)
        k0, k1 = max(0, start - half_window), min(t, end + half_window + 1)
        qi = torch.arange(start, end, device=query.device)[:, None]
        kj = torch.arange(k0, k1, device=query.device)[None, :]
        band = (qi - kj).abs() <= half_window
        out[:, :, start:end] = F.scaled_dot_product_attention(
            query[:, :, start:end], key[:, :, k0:k1], value[:, :, k0:k1], attn_mask=band, scale=scaling
        )
    return out


def _lean_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                    sliding_window: int | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    half = getattr(getattr(module, "config", None), "sliding_window", None)
    if attention_mask is None and sliding_window is not None and half is not None and dropout == 0.0:
        out = banded_attention(query, key, value, int(half), scaling)
        return out.transpose(1, 2).contiguous(), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  sliding_window=sliding_window, **kwargs)


def register() -> None:
    """Register "lmk_sdpa" with transformers' attention and mask interfaces (idempotent)."""
    global _registered
    if _registered:
        return
    AttentionInterface.register(LEAN_SDPA, _lean_attention)
    AttentionMaskInterface.register(LEAN_SDPA, _lean_mask)
    _registered = True


@contextlib.contextmanager
def lean_attention(backbone: Any) -> Iterator[bool]:
    """Within the block, an `sdpa` backbone with sliding-window layers uses "lmk_sdpa"; yields whether it does.

    Other backbones (no sliding window, eager, flash attention) are left as they are.
    """
    cfg = getattr(backbone, "config", None)
    if cfg is None or getattr(cfg, "_attn_implementation", None) != "sdpa" or not has_sliding_window(backbone):
        yield False
        return
    register()
    cfg._attn_implementation = LEAN_SDPA
    try:
        yield True
    finally:
        cfg._attn_implementation = "sdpa"
