"""The paper's poolers: the first token (CLS), the masked mean, and the mean over landmarks (LMK)."""

from __future__ import annotations

import torch
from torch import Tensor

from lmk.model.pooling.base import Pooler, masked_mean, register_pooler


@register_pooler
class CLSPooling(Pooler):
    name = "cls"
    attention_rows = "cls"

    def pool(self, token_embeddings: Tensor, attention_mask: Tensor, pool_mask: Tensor | None) -> Tensor:
        # first non-pad token: position 0 with right padding, after the padding with left padding
        first = attention_mask.to(torch.int8).argmax(dim=1)
        rows = torch.arange(token_embeddings.shape[0], device=token_embeddings.device)
        return token_embeddings[rows, first]


@register_pooler
class MeanPooling(Pooler):
    name = "mean"
    attention_rows = "mean"

    def pool(self, token_embeddings: Tensor, attention_mask: Tensor, pool_mask: Tensor | None) -> Tensor:
        return masked_mean(token_embeddings, attention_mask)


@register_pooler
class LandmarkPooling(Pooler):
    name = "lmk"
    needs_pool_mask = True
    attention_rows = "lmk"

    def pool(self, token_embeddings: Tensor, attention_mask: Tensor, pool_mask: Tensor | None) -> Tensor:
        if pool_mask is None:
            raise ValueError(
                "the 'lmk' pooler needs a pool_mask (from LandmarkTokenizer); use pooler 'cls' or 'mean' "
                "for inputs without one"
            )
        mask = pool_mask & attention_mask  # padding is never pooled
        # a row with no pooled position falls back to the masked mean over its tokens
        has_any = mask.any(dim=1, keepdim=True)
        return masked_mean(token_embeddings, torch.where(has_any, mask, attention_mask))
