"""Contrastive losses on embeddings (pure functions: no model, no distributed calls).

`info_nce`: scores are q.p / tau over L2-normalised embeddings. `maxsim_info_nce`: each text is a set of
L2-normalised vectors (a padded [N, L, H] tensor and its [N, L] bool mask), and a score is MaxSim / tau: the sum over
the query's vectors of the max over the passage's vectors of their dot product (ColBERT's late interaction, as eval
MaxSim scores: lmk.eval.maxsim). Both share the cross-entropy / distillation step (`scores_loss`). Passages come in groups of `group_size` rows
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


# Elements of one [queries, passages, query vectors, passage vectors] similarity block (float32: 512 MiB)
MAXSIM_BLOCK_ELEMENTS = 2**27


def maxsim(q: Tensor, q_mask: Tensor, p: Tensor, p_mask: Tensor, block_elements: int = MAXSIM_BLOCK_ELEMENTS
           ) -> Tensor:
    """MaxSim [B, N] of queries q [B, Lq, H] (mask [B, Lq]) against passages p [N, Lp, H] (mask [N, Lp]): per pair,
    the sum over the query's real vectors of the max over the passage's real vectors of their dot product. Computed
    in query blocks of at most `block_elements` similarities (the block changes the values by float rounding only:
    a matrix product's summation order may differ with its shape)."""
    step = max(1, block_elements // max(1, p.shape[0] * p.shape[1] * q.shape[1]))
    outside = ~p_mask.bool()[None, :, None, :]  # [1, N, 1, Lp]
    out = []
    for start in range(0, q.shape[0], step):
        sim = torch.einsum("bih,njh->bnij", q[start : start + step], p)  # [b, N, Lq, Lp]
        best = sim.masked_fill(outside, float("-inf")).amax(dim=-1)  # [b, N, Lq]
        best = best.masked_fill(~q_mask.bool()[start : start + step, None, :], 0.0)
        out.append(best.sum(dim=-1))
    return torch.cat(out)


def _maxsim_groups(q: Tensor, q_mask: Tensor, p: Tensor, p_mask: Tensor, group_size: int) -> Tensor:
    """MaxSim [B, G] of each query against its own group of passages only."""
    b = q.shape[0]
    groups, masks = p[: b * group_size].unflatten(0, (b, group_size)), p_mask[: b * group_size].view(b, group_size, -1)
    sim = torch.einsum("bih,bgjh->bgij", q, groups).masked_fill(~masks.bool()[:, :, None, :], float("-inf"))
    return sim.amax(dim=-1).masked_fill(~q_mask.bool()[:, None, :], 0.0).sum(dim=-1)


def maxsim_info_nce(
    q: tuple[Tensor, Tensor],
    p: tuple[Tensor, Tensor],
    tau: float = 0.02,
    group_size: int = 1,
    in_batch: bool = True,
    teacher_scores: Tensor | None = None,
    offset: int = 0,
    teacher_temperature: float = 1.0,
) -> Tensor:
    """InfoNCE over MaxSim(q, p) / tau; the BGE-M3 distillation form when `teacher_scores` [B, G] is given.

    q: (states [B, Lq, H], mask [B, Lq]) of the local queries; p: (states [N, Lp, H], mask [N, Lp]) of the passages
    (local, or gathered from every rank with `offset`), the PairCollator layout as `info_nce`. The vectors are used
    as given (the model normalises them). Scores and loss in float32 outside autocast, as `info_nce`.
    """
    (qs, qm), (ps, pm) = q, p
    if qs.dim() != 3 or ps.dim() != 3 or qs.shape[2] != ps.shape[2]:
        raise ValueError(f"expected query states [B, Lq, H] and passage states [N, Lp, H] with equal H, got "
                         f"{tuple(qs.shape)} and {tuple(ps.shape)}")
    _check(qs[:, 0], ps[:, 0], group_size, offset, in_batch)
    with torch.autocast(device_type=qs.device.type, enabled=False):
        qs, ps = qs.float(), ps.float()
        if in_batch:
            scores = maxsim(qs, qm, ps, pm) / tau  # [B, N]
        else:
            scores = _maxsim_groups(qs, qm, ps, pm, group_size) / tau  # [B, G]
        return scores_loss(scores, group_size, in_batch, teacher_scores, offset, teacher_temperature)


def _info_nce_fp32(
    q: Tensor, p: Tensor, tau: float, group_size: int, in_batch: bool, teacher_scores: Tensor | None,
    offset: int, teacher_temperature: float,
) -> Tensor:
    b = q.shape[0]
    if in_batch:
        scores = q @ p.T / tau  # [B, N]
    else:
        groups = p[: b * group_size].view(b, group_size, -1)
        scores = torch.einsum("bd,bgd->bg", q, groups) / tau  # [B, G]
    return scores_loss(scores, group_size, in_batch, teacher_scores, offset, teacher_temperature)


def scores_loss(scores: Tensor, group_size: int, in_batch: bool, teacher_scores: Tensor | None = None,
                offset: int = 0, teacher_temperature: float = 1.0) -> Tensor:
    """The contrastive loss of float32 `scores` (already divided by the temperature): [B, N] against every passage
    (`in_batch`; each query's group starts at offset + b * group_size) or [B, G] against its own group; the BGE-M3
    distillation form when `teacher_scores` [B, G] is given. The mean over the B queries."""
    b = scores.shape[0]
    if in_batch:
        first = offset + torch.arange(b, device=scores.device) * group_size  # each query's positive
    else:
        first = torch.zeros(b, dtype=torch.long, device=scores.device)
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
    rows = torch.arange(b, device=scores.device)
    masked = torch.tensor(torch.finfo(scores.dtype).min, dtype=scores.dtype, device=scores.device)
    for j in range(group_size):
        target = first + j
        term = F.cross_entropy(scores + mask, target, reduction="none")
        loss = loss + (weights[:, j] * term).mean()
        mask = mask.index_put((rows, target), masked)
    return loss
