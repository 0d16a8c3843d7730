"""Multi-vector encoding: a text as the hidden states of its pooled positions, kept apart instead of averaged.

The `lmk` pooler averages the last hidden states at `pool_mask & attention_mask` (the landmarks; every-k / multi-CLS
positions for those controls) and L2-normalises the mean. `pooled_states` selects exactly those states, with the
pooler's own fallback (a row with no pooled position: all its tokens), so the single vector of a text is the
normalised mean of its `pooled_states` and MaxSim scoring (lmk.eval.maxsim) keeps the same states apart.
`maxsim_query="tokens"` gives every non-pad token's state instead (a MaxSim query as ColBERT encodes it). The rule is
`lmk.model.landmark.vector_mask`, the one a multi-vector export's mask module applies too. `padded_states` is the
training form of the same states (with gradients, padded per batch): what the MaxSim objective trains
(lmk.train.objectives).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from lmk.config.registry import no_landmarks_message
from lmk.model.batching import fixed_batches, token_budget_batches
from lmk.model.device import resolve_precision
from lmk.model.landmark import STRATEGY_TRAITS, vector_mask
from lmk.model.pipeline import NonFiniteEmbeddingError


def no_landmarks(model: Any, scoring: str = "maxsim") -> str | None:
    """Why `model` (an EmbeddingModel) has no landmark states for `scoring` (MaxSim) to score (one line); None when
    it has: its pooler declares `needs_pool_mask` (lmk.model.landmark.names) and its strategy marks pooled
    positions."""
    pooler = getattr(model, "pooler", None)
    tokenizer = getattr(model, "landmark_tokenizer", None)
    marks = tokenizer is None or STRATEGY_TRAITS[tokenizer.strategy]["marks_pooled"]
    if getattr(pooler, "needs_pool_mask", False) and marks:
        return None
    name = getattr(pooler, "name", type(pooler).__name__)
    label = model.pooling_cfg.label if getattr(model, "pooling_cfg", None) is not None else getattr(model, "name", "")
    return no_landmarks_message(label, name, scoring)


def _old_which(which: str | None, maxsim_query: str, owner: str) -> str:
    if which is None:
        return maxsim_query
    warnings.warn(f"{owner}(which=...) is deprecated: use maxsim_query=", DeprecationWarning, stacklevel=3)
    return which


def pooled_states(hidden: torch.Tensor, attention_mask: torch.Tensor, pool_mask: torch.Tensor | None,
                  maxsim_query: str = "landmarks", *, which: str | None = None) -> list[torch.Tensor]:
    """Per row of [B, T, H] hidden states, the [n_i, H] states of its pooled positions (float32, unnormalised), or
    of all its tokens (`maxsim_query="tokens"`)."""
    keep = vector_mask(attention_mask, pool_mask, _old_which(which, maxsim_query, "pooled_states"))
    hidden = hidden.float()
    return [hidden[i, keep[i]] for i in range(hidden.shape[0])]


def padded_states(hidden: torch.Tensor, attention_mask: torch.Tensor, pool_mask: torch.Tensor | None,
                  which: str = "landmarks") -> tuple[torch.Tensor, torch.Tensor]:
    """The states `pooled_states` gives, each L2-normalised, as one padded float32 [B, L, H] tensor (L: the most
    any row keeps; padding zeros) and its [B, L] bool mask, differentiable (no per-row loop). Rows keep their
    positions' order; padding is filled with zeros before normalising, so a non-finite state at a position a row
    does not keep (a padded row's) never reaches the output or its gradient."""
    keep = vector_mask(attention_mask, pool_mask, which)
    counts = keep.sum(dim=1)
    width = max(int(counts.max()), 1)
    # the kept positions first, in their order (a stable sort of "not kept"), then any others
    order = torch.sort((~keep).to(torch.uint8), dim=1, stable=True).indices[:, :width]
    mask = torch.arange(width, device=keep.device)[None, :] < counts[:, None]
    with torch.autocast(device_type=hidden.device.type, enabled=False):
        states = hidden.float().gather(1, order[..., None].expand(-1, -1, hidden.shape[-1]))
        states = torch.where(mask[..., None], states, 0.0)
        return F.normalize(states, p=2, dim=-1), mask


@torch.inference_mode()
def encode_states(model: Any, texts: Sequence[str], side: str = "passage", *, maxsim_query: str = "landmarks",
                  which: str | None = None, normalize: bool = True, batch_size: int = 32, max_length: int | None = None,
                  max_tokens_per_batch: int | None = None, precision: str = "fp32") -> list[np.ndarray]:
    """float32 [n_i, H] states of each text in input order (`maxsim_query`: its landmarks or all its tokens), each vector
    L2-normalised unless `normalize=False`. Batches as `EmbeddingModel.encode` plans them (length-sorted, by rows or
    by a token budget); tokenization runs in this thread. Sets `model.truncation_count` as `encode` does."""
    if isinstance(texts, str):
        raise TypeError("encode_states() takes a list of texts; wrap a single text as [text]")
    texts = list(texts)
    maxsim_query = _old_which(which, maxsim_query, "encode_states")
    max_length = model._max_length(side, max_length)
    device = model.device
    precision = resolve_precision(precision, device, key="precision")
    if max_tokens_per_batch is None:
        plan = fixed_batches([len(t) for t in texts], batch_size)
    else:
        plan = token_budget_batches(model.token_lengths(texts, side, max_length), max_tokens_per_batch)
    out: list[np.ndarray] = [np.empty((0, model.hidden_size), dtype=np.float32)] * len(texts)
    truncated = 0
    was_training = model.training
    model.eval()
    try:
        for idx in plan:
            feats = model.landmark_tokenizer([texts[i] for i in idx], train=False, max_length=max_length)
            truncated += int((feats["attention_mask"].sum(dim=1) >= max_length).sum())
            feats = {k: v.to(device) for k, v in feats.items()}
            hidden = model.hidden_states(feats, precision)
            for i, states in zip(idx.tolist(), pooled_states(hidden, feats["attention_mask"], feats.get("pool_mask"),
                                                             maxsim_query), strict=True):
                if normalize:
                    states = F.normalize(states, p=2, dim=-1)
                arr = states.cpu().numpy()
                if not np.isfinite(arr).all():
                    raise NonFiniteEmbeddingError(i, f"the states of text {i} hold NaN or inf; check the weights, "
                                                     "or encode in fp32 (eval.precision=fp32)")
                out[i] = arr
    finally:
        model.train(was_training)
    model.truncation_count = truncated
    return out
