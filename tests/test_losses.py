"""info_nce: plain InfoNCE, in-batch vs group-only, BGE-M3 distillation, cross-device offset."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lmk.train.losses import info_nce


def _emb(n: int, d: int = 8, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(n, d, generator=g), dim=-1)


def _reference(q, p, tau, group, offset=0):
    """Loop form: -log softmax(q_i . p / tau)[positive_i], averaged."""
    total = 0.0
    for i in range(q.shape[0]):
        logits = [float(q[i] @ p[j]) / tau for j in range(p.shape[0])]
        m = max(logits)
        lse = m + math.log(sum(math.exp(x - m) for x in logits))
        total += lse - logits[offset + i * group]
    return total / q.shape[0]


@pytest.mark.parametrize("group", [1, 3])
def test_plain_infonce_matches_loop(group):
    q, p = _emb(4), _emb(4 * group, seed=1)
    assert info_nce(q, p, tau=0.05, group_size=group).item() == pytest.approx(_reference(q, p, 0.05, group), rel=1e-5)


def test_offset_selects_local_groups_in_gathered_passages():
    # Rank 1 of 2: its 3 queries' groups start after rank 0's 3*2 passages.
    q, p = _emb(3), _emb(12, seed=2)
    got = info_nce(q, p, tau=0.1, group_size=2, offset=6).item()
    assert got == pytest.approx(_reference(q, p, 0.1, 2, offset=6), rel=1e-5)
    assert got != pytest.approx(info_nce(q, p, tau=0.1, group_size=2, offset=0).item(), rel=1e-3)


def test_no_in_batch_uses_only_own_group():
    q, p = _emb(3), _emb(6, seed=3)
    expect = sum(_reference(q[i : i + 1], p[2 * i : 2 * i + 2], 0.1, 2) for i in range(3)) / 3
    assert info_nce(q, p, tau=0.1, group_size=2, in_batch=False).item() == pytest.approx(expect, rel=1e-5)


def test_perfect_embeddings_give_near_zero_loss():
    q = torch.eye(4)
    assert info_nce(q, q.clone(), tau=0.02).item() < 1e-6


def test_one_hot_teacher_equals_plain_infonce():
    q, p = _emb(4), _emb(12, seed=4)
    teacher = torch.tensor([[50.0, -50.0, -50.0]]).repeat(4, 1)  # softmax ~ one-hot on the positive
    plain = info_nce(q, p, tau=0.05, group_size=3)
    assert info_nce(q, p, tau=0.05, group_size=3, teacher_scores=teacher).item() == pytest.approx(plain.item(), rel=1e-5)


def test_distillation_is_weighted_sum_of_masked_terms():
    q, p = _emb(2), _emb(4, seed=5)
    teacher = torch.tensor([[1.0, 0.0], [0.3, 0.7]])
    w = torch.softmax(teacher, dim=-1)
    scores = q @ p.T / 0.1
    expect = 0.0
    for i in range(2):
        pos, neg = 2 * i, 2 * i + 1
        t0 = -torch.log_softmax(scores[i], -1)[pos]
        masked = scores[i].clone()
        masked[pos] = -1e30  # member 0 is masked out of member 1's term
        t1 = -torch.log_softmax(masked, -1)[neg]
        expect += float(w[i, 0] * t0 + w[i, 1] * t1) / 2
    got = info_nce(q, p, tau=0.1, group_size=2, teacher_scores=teacher).item()
    assert got == pytest.approx(expect, rel=1e-5)


def test_bad_shapes_name_the_fix():
    with pytest.raises(ValueError, match="group_size"):
        info_nce(_emb(4), _emb(6), group_size=2)
    with pytest.raises(ValueError, match="teacher_scores"):
        info_nce(_emb(2), _emb(4), group_size=2, teacher_scores=torch.zeros(2, 3))
    with pytest.raises(ValueError, match="group_size must be >= 1"):
        info_nce(_emb(2), _emb(4), group_size=0)


def test_bf16_inputs_are_scored_in_float32():
    q, p = _emb(4), _emb(4, seed=6)
    ref = info_nce(q, p, tau=0.02).item()
    assert info_nce(q.bfloat16(), p.bfloat16(), tau=0.02).dtype == torch.float32
    assert info_nce(q.bfloat16(), p.bfloat16(), tau=0.02).item() == pytest.approx(ref, rel=0.1)


@pytest.mark.parametrize("in_batch", [True, False])
def test_distillation_under_bf16_autocast_is_float32(in_batch):
    """Under autocast `q.float() @ p.float().T` is bf16: the old mask index_put raised a dtype mismatch."""
    q, p = _emb(4).requires_grad_(), _emb(8, seed=3).requires_grad_()
    teacher = torch.randn(4, 2, generator=torch.Generator().manual_seed(1))
    ref = info_nce(q, p, tau=0.02, group_size=2, in_batch=in_batch, teacher_scores=teacher)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = info_nce(q, p, tau=0.02, group_size=2, in_batch=in_batch, teacher_scores=teacher)
    assert loss.dtype == torch.float32
    # scored in float32, the loss equals the autocast-free one (bf16 logits at 1/0.02 would not)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)
    loss.backward()
    assert q.grad is not None and q.grad.dtype == torch.float32 and torch.isfinite(q.grad).all()


def test_bf16_embeddings_under_autocast_get_gradients():
    q = _emb(4).bfloat16().requires_grad_()
    p = _emb(8, seed=3).bfloat16().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = info_nce(q, p, group_size=2, teacher_scores=torch.zeros(4, 2))
    loss.backward()
    assert loss.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.bfloat16
