"""Multi-vector encoding: a text as the hidden states of its pooled positions, kept apart instead of averaged.

The `lmk` pooler averages the last hidden states at `pool_mask & attention_mask` (the landmarks; every-k / multi-CLS
positions for those controls) and L2-normalises the mean. `pooled_states` selects exactly those states, with the
pooler's own fallback (a row with no pooled position: all its tokens), so the single vector of a text is the
normalised mean of its `pooled_states` and MaxSim scoring (lmk.eval.maxsim) keeps the same states apart.
`which="tokens"` gives every non-pad token's state instead (a MaxSim query as ColBERT encodes it). The rule is
`lmk.model.landmark.vector_mask`, the one a multi-vector export's mask module applies too. `padded_states` is the
training form of the same states (with gradients, padded per batch): what the MaxSim objective trains
(lmk.train.objectives).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from lmk.config.eval import no_landmarks_message
from lmk.model.batching import fixed_batches, token_budget_batches
from lmk.model.device import resolve_precision
from lmk.model.landmark import vector_mask
from lmk.model.pipeline import NonFiniteEmbeddingError


def no_landmarks(model: Any) -> str | None:
    """Why `model` (an EmbeddingModel) has no landmark states to score by MaxSim (one line); None when it has."""
    pooler = getattr(model, "pooler", None)
    name = getattr(pooler, "name", type(pooler).__name__)
    if name == "lmk":
        return None
    label = model.pooling_cfg.label if getattr(model, "pooling_cfg", None) is not None else getattr(model, "name", "")
    return no_landmarks_message(label, name)


def pooled_states(hidden: torch.Tensor, attention_mask: torch.Tensor, pool_mask: torch.Tensor | None,
                  which: str = "landmarks") -> list[torch.Tensor]:
    """Per row of [B, T, H] hidden states, the [n_i, H] states of its pooled positions (float32, unnormalised)."""
    keep = vector_mask(attention_mask, pool_mask, which)
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
def encode_states(model: Any, texts: Sequence[str], side: str = "passage", *, which: str = "landmarks",
                  normalize: bool = True, batch_size: int = 32, max_length: int | None = None,
                  max_tokens_per_batch: int | None = None, precision: str = "fp32") -> list[np.ndarray]:
    """float32 [n_i, H] states of each text in input order (`which`: its landmarks or all its tokens), each vector
    L2-normalised unless `normalize=False`. Batches as `EmbeddingModel.encode` plans them (length-sorted, by rows or
    by a token budget); tokenization runs in this thread. Sets `model.truncation_count` as `encode` does."""
    if isinstance(texts, str):
        raise TypeError("encode_states() takes a list of texts; wrap a single text as [text]")
    texts = list(texts)
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
                                                             which), strict=True):
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
