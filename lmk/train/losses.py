"""Contrastive losses on embeddings (pure functions: no model, no distributed calls).

Scores are q.p / tau over L2-normalised embeddings. Passages come in groups of `group_size` rows
per query, the positive first: `[q0 pos, q0 neg1..negG-1, q1 pos, ...]` (the PairCollator layout).
In the cross-device case the caller gathers the passages of every rank and passes `offset`, the
index of this rank's first passage in the gathered tensor, so each local query still finds its
own group.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def _check(q: Tensor, p: Tensor, group_size: int, offset: int, in_batch: bool) -> None:
    if q.dim() != 2 or p.dim() != 2 or q.shape[1] != p.shape[1]:
        raise ValueError(f"expected q [B, d] and p [N, d] with equal d, got {tuple(q.shape)} and {tuple(p.shape)}")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1 (1 positive + n-1 negatives), got {group_size}")
    need = offset + q.shape[0] * group_size
    if p.shape[0] < need:
        raise ValueError(
            f"{q.shape[0]} queries x group_size {group_size} at offset {offset} need {need} passages, "
            f"got {p.shape[0]}: check group_size / the collator's passage layout"
        )
    if not in_batch and offset != 0:
        raise ValueError("offset only applies with in_batch=True (cross-device negatives)")


def info_nce(
    q: Tensor,
    p: Tensor,
    tau: float = 0.02,
    group_size: int = 1,
    in_batch: bool = True,
    teacher_scores: Tensor | None = None,
    offset: int = 0,
    teacher_temperature: float = 1.0,
) -> Tensor:
    """InfoNCE over q.p / tau; the BGE-M3 distillation form when `teacher_scores` [B, G] is given.

    q: [B, d] local queries; p: [N, d] passages (local, or gathered from every rank with `offset` =
    rank * local passages). With `in_batch` every query scores against all N passages (in-batch and
    hard negatives); without it only against its own group. Returns the mean over the B queries.
    """
    _check(q, p, group_size, offset, in_batch)
    # float32 scores and loss under ANY autocast: inside an autocast region `q.float() @ p.float().T`
    # still runs in bf16/fp16, and a 1/0.02 scale on bf16 logits loses most of their precision (and
    # the distillation mask would be bf16). Casting inside a disabled region keeps the graph: the
    # gradient flows back to the (possibly bf16) embeddings through the casts.
    with torch.autocast(device_type=q.device.type, enabled=False):
        return _info_nce_fp32(q.float(), p.float(), tau, group_size, in_batch, teacher_scores, offset,
                              teacher_temperature)


def _info_nce_fp32(
    q: Tensor, p: Tensor, tau: float, group_size: int, in_batch: bool, teacher_scores: Tensor | None,
    offset: int, teacher_temperature: float,
) -> Tensor:
    b = q.shape[0]
    if in_batch:
        scores = q @ p.T / tau  # [B, N]
        first = offset + torch.arange(b, device=q.device) * group_size  # each query's positive
    else:
        groups = p[: b * group_size].view(b, group_size, -1)
        scores = torch.einsum("bd,bgd->bg", q, groups) / tau  # [B, G]
        first = torch.zeros(b, dtype=torch.long, device=q.device)
    if teacher_scores is None:
        return F.cross_entropy(scores, first)
    if teacher_scores.shape != (b, group_size):
        raise ValueError(f"teacher_scores must be [B, G] = [{b}, {group_size}], got {tuple(teacher_scores.shape)}")
    weights = torch.softmax(teacher_scores.float() / teacher_temperature, dim=-1)  # [B, G]
    # BGE-M3 form: one cross-entropy term per group member j (target = that member), weighted by the
    # teacher's softmax; members already used as targets are masked out of later terms, so with
    # one-hot weights on the positive this is exactly plain InfoNCE.
    loss = scores.new_zeros(())
    mask = torch.zeros_like(scores)
    rows = torch.arange(b, device=q.device)
    masked = torch.tensor(torch.finfo(scores.dtype).min, dtype=scores.dtype, device=q.device)
    for j in range(group_size):
        target = first + j
        term = F.cross_entropy(scores + mask, target, reduction="none")
        loss = loss + (weights[:, j] * term).mean()
        mask = mask.index_put((rows, target), masked)
    return loss
