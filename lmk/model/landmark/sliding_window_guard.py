"""Padded batches over sliding-window layers: no query row without a key (this file travels inside every export).

A padded position further than the half window from the last real token has no valid key in a sliding-window layer.
CPU SDPA returns 0 for such a row; CUDA's memory-efficient kernel has returned NaN (pytorch#110213), and the next
global layer spreads it to every token (softmax weight 0 x NaN value = NaN). transformers 5 no longer unmasks such
rows. `no_empty_rows` lets each of them attend to its own position: real rows are unchanged, padded rows become
finite, and nothing reads them (the poolers skip padding). `guard_padded_rows` applies it to a backbone; every
model lmk builds or loads is guarded, and so is an export loaded by sentence-transformers alone.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.masking_utils import create_bidirectional_mask, create_bidirectional_sliding_window_mask


def has_sliding_window(backbone: Any) -> bool:
    cfg = getattr(backbone, "config", None)
    return "sliding_attention" in (getattr(cfg, "layer_types", None) or ())


def no_empty_rows(mask: Any) -> Any:
    """A boolean [B, 1, Q, K] mask whose fully masked query rows attend to their own position; else `mask`."""
    if not (torch.is_tensor(mask) and mask.dtype == torch.bool and mask.dim() == 4 and mask.shape[-1] == mask.shape[-2]):
        return mask  # None (no padding), an additive float mask (finite: eager is safe), or a flash/flex mask
    empty = ~mask.any(dim=-1, keepdim=True)  # computed every time: no host sync to ask whether any row is empty
    eye = torch.eye(mask.shape[-1], dtype=torch.bool, device=mask.device)
    return mask | (empty & eye)


def _safe_masks(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any] | None:
    mask = kwargs.get("attention_mask")
    ids = kwargs.get("input_ids", args[0] if args else None)
    if not torch.is_tensor(mask) or mask.dim() != 2 or not torch.is_tensor(ids):
        return None  # no mask (lean unpadded inference), a prepared mapping, or inputs_embeds: left alone
    weight = module.get_input_embeddings().weight
    ref = torch.empty((*ids.shape, 1), dtype=weight.dtype, device=weight.device)  # shape/dtype/device only
    common = {"config": module.config, "inputs_embeds": ref, "attention_mask": mask}
    kwargs["attention_mask"] = {"full_attention": create_bidirectional_mask(**common),
                                "sliding_attention": no_empty_rows(create_bidirectional_sliding_window_mask(**common))}
    return args, kwargs


def guard_padded_rows(backbone: Any) -> bool:
    """Build the attention masks of a sliding-window backbone (ModernBERT) with `no_empty_rows` from now on;
    returns whether it applies (other backbones are left alone). Idempotent."""
    if not isinstance(backbone, torch.nn.Module) or not has_sliding_window(backbone):
        return False
    if getattr(backbone, "_lmk_padded_rows_guarded", False):
        return True
    backbone.register_forward_pre_hook(_safe_masks, with_kwargs=True)
    backbone._lmk_padded_rows_guarded = True
    return True
