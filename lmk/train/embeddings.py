"""What an objective embeds a batch into, handled alike by the grad cache and the cross-device gather.

An embedding is a Tensor [N, H] (a pooled vector per text) or a `(states, mask)` pair: [N, L, H] per-text vectors
padded to a common L, and the [N, L] bool mask of the real ones (multi-vector: landmark states). Padded positions
hold zeros and are never read (the mask says so). Only the first tensor carries gradients.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

Embedding = Tensor | tuple[Tensor, Tensor]


def values(emb: Embedding) -> Tensor:
    """The differentiable tensor of an embedding (the vectors, or the states of a pair)."""
    return emb if isinstance(emb, Tensor) else emb[0]


def rows(emb: Embedding) -> int:
    return int(values(emb).shape[0])


def pad_width(emb: Embedding, width: int) -> Embedding:
    """A pair padded (zeros, mask False) to `width` vectors per text; a Tensor as it is."""
    if isinstance(emb, Tensor):
        return emb
    states, mask = emb
    extra = width - states.shape[1]
    if extra < 0:
        raise ValueError(f"cannot pad {states.shape[1]} vectors per text to {width}")
    if extra == 0:
        return emb
    return F.pad(states, (0, 0, 0, extra)), F.pad(mask, (0, extra), value=False)


def concat(parts: Sequence[Embedding]) -> Embedding:
    """The rows of `parts` in order: Tensors concatenated; pairs padded to their widest, then concatenated."""
    if isinstance(parts[0], Tensor):
        return torch.cat(list(parts))
    width = max(p[0].shape[1] for p in parts)
    padded = [pad_width(p, width) for p in parts]
    return torch.cat([p[0] for p in padded]), torch.cat([p[1] for p in padded])


def as_leaf(emb: Embedding) -> Embedding:
    """A detached copy whose differentiable tensor is an autograd leaf (the grad cache's loss input)."""
    if isinstance(emb, Tensor):
        return emb.detach().requires_grad_()
    return emb[0].detach().requires_grad_(), emb[1].detach()


def grad_slice(grad: Tensor, start: int, emb: Embedding) -> Tensor:
    """The part of a cached gradient (of the concatenated embedding) that belongs to `emb`, the chunk whose rows
    begin at `start`: its rows, and for states its own width (the concatenation padded it to the widest chunk)."""
    g = grad[start : start + rows(emb)]
    return g if isinstance(emb, Tensor) else g[:, : emb[0].shape[1]]
