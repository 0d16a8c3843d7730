"""Mini-batches of a training step ("chunks"): by rows, or by a token budget with each chunk padded to its own rows.

A training batch comes padded to its longest row (lmk.data.collator). Sliced by rows (`train.grad_cache_chunk`),
every chunk pays for the longest passage of the whole step. With a token budget (`train.grad_cache_tokens`) the rows
are sorted by real length, longest first, grouped greedily while rows x longest <= budget (a row longer than the
budget goes alone: lmk.model.batching.token_budget_batches, the plan inference uses), and each chunk is trimmed to its
own longest row on the side the batch is padded (right, or left as decoders pad). The chunks' embeddings come back in
that sorted order; `ChunkPlan.restore` puts them in the batch's order again (the loss groups passages per query).

Trimming removes padding columns only: attention never reads them and positions count from each row's first real
token (lmk.model.landmark.backbone_inputs), so every real token's state is the padded batch's up to float rounding.
`ChunkPlan.computed` (rows x width summed over chunks) against `real` (attention-mask tokens) is the step's fill.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from lmk.model.batching import token_budget_batches
from lmk.train.embeddings import Embedding

Features = Mapping[str, Tensor]


def split_features(features: Features, chunk_size: int) -> list[dict[str, Tensor]]:
    """Row chunks of a features dict (every tensor sliced on dim 0)."""
    if chunk_size < 1:
        raise ValueError(f"grad_cache_chunk must be >= 1, got {chunk_size}")
    n = next(iter(features.values())).shape[0]
    return [{k: v[i : i + chunk_size] for k, v in features.items()} for i in range(0, n, chunk_size)]


def take_rows(emb: Embedding, index: Tensor) -> Embedding:
    """Rows `index` of an embedding (a Tensor, or both tensors of a `(states, mask)` pair), differentiably."""
    if isinstance(emb, Tensor):
        return emb[index.to(emb.device)]
    return emb[0][index.to(emb[0].device)], emb[1][index.to(emb[1].device)]


@dataclass
class ChunkPlan:
    """The chunks of one side of a step, in embedding order, and how to undo their row order."""

    chunks: list[dict[str, Tensor]]
    order: Tensor | None  # the batch row of each planned row, in chunk order (None: the batch's own order)
    computed: int  # tokens the chunks compute: rows x width, summed over chunks
    real: Tensor  # real tokens (the attention mask's sum; a device tensor, read only when logged)

    def restore(self, emb: Embedding) -> Embedding:
        """The chunks' concatenated embedding with its rows back in the batch's order."""
        if self.order is None:
            return emb
        inverse = torch.empty_like(self.order)
        inverse[self.order] = torch.arange(len(self.order))
        return take_rows(emb, inverse)


def _pads_left(mask: Tensor) -> bool:
    """Whether the batch pads on the left (decoders) rather than the right, checked: every row's real tokens must be
    one run at the side its padding is not on (else trimming would cut real tokens)."""
    left = not bool(mask[:, 0].all())
    lengths = mask.sum(dim=1)
    width = mask.shape[1]
    cols = torch.arange(width, device=mask.device)[None, :]
    expected = cols >= (width - lengths)[:, None] if left else cols < lengths[:, None]
    if not torch.equal(mask.bool(), expected):
        raise ValueError("token-budget chunks need every row padded on one side (right, or left for decoders): "
                         "this batch's attention mask has padding inside a row or on both sides")
    return left


def _trim(features: Features, rows: Tensor, width: int, left: bool) -> dict[str, Tensor]:
    """Rows `rows` of the features, every per-token tensor cut to `width` columns (the right or left end)."""
    full = features["attention_mask"].shape[1]
    cols = slice(full - width, full) if left else slice(0, width)
    out = {}
    for key, value in features.items():
        value = value[rows.to(value.device)]
        out[key] = value[:, cols] if value.dim() >= 2 and value.shape[1] == full else value
    return out


def plan_chunks(features: Features, chunk_size: int | None = None, token_budget: int = 0) -> ChunkPlan:
    """The chunks of one side of a step. `token_budget` > 0: by tokens (module doc); else rows of `chunk_size`
    (None: the whole batch as one chunk), each as wide as the batch: exactly the batch-padded step."""
    mask = features["attention_mask"]
    real = mask.sum()
    if token_budget <= 0:
        chunks = [dict(features)] if chunk_size is None else split_features(features, chunk_size)
        return ChunkPlan(chunks, None, int(mask.numel()), real)
    left = _pads_left(mask)
    lengths = mask.sum(dim=1).tolist()
    chunks, order, computed = [], [], 0
    for rows in token_budget_batches(lengths, int(token_budget)):
        width = max(1, max(int(lengths[i]) for i in rows))
        index = torch.as_tensor(rows, dtype=torch.long)
        chunks.append(_trim(features, index, width, left))
        order.append(index)
        computed += len(rows) * width
    return ChunkPlan(chunks, torch.cat(order), computed, real)
