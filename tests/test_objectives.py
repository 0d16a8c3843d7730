"""The training objectives (train.objective): lmk's MaxSim InfoNCE equals sentence-transformers' multi-vector MNRL
(plain and cached) on the same vectors, loss and gradients; grad cache equals no cache with multi-vector embeddings
of chunk-dependent width; validation refuses a pooling without landmark states; the registry and the card line."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import BertConfig, BertModel

from lmk.config import (
    ConfigError,
    PoolingConfig,
    TrainSection,
    check_pooled_positions,
    describe_objective,
    registry,
)
from lmk.model.multi_vector import padded_states
from lmk.train.embeddings import concat
from lmk.train.gradcache import grad_cache_step, split_features
from lmk.train.losses import info_nce, maxsim, maxsim_info_nce
from lmk.train.objectives import OBJECTIVE_CLASSES, Objective, build_objective, register_objective

# float32 on the CPU: the two implementations sum the same products in other orders (einsum vs ST's padded bmm),
# so loss and gradients agree to float32 rounding, not bit for bit
ATOL, RTOL = 1e-5, 1e-4


def _vectors(b: int, g: int, lq: int, lp: int, h: int = 8, seed: int = 0):
    """Query / passage vectors (leaves) with masks: every row keeps a different number of its vectors."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, lq, h, generator=gen, requires_grad=True)
    p = torch.randn(b * g, lp, h, generator=gen, requires_grad=True)
    q_mask = torch.arange(lq)[None] < torch.randint(1, lq + 1, (b,), generator=gen)[:, None]
    p_mask = torch.arange(lp)[None] < torch.randint(1, lp + 1, (b * g,), generator=gen)[:, None]
    return q, q_mask, p, p_mask


class _GivenVectors(nn.Module):
    """A stand-in MultiVectorEncoder: `input_ids` [n, 1] are row ids into the given (query rows, then passage rows)
    vectors; it returns their L2-normalised token_embeddings and the scoring mask, as a MultiVectorMask would."""

    def __init__(self, q: torch.Tensor, q_mask: torch.Tensor, p: torch.Tensor, p_mask: torch.Tensor) -> None:
        super().__init__()
        self.q, self.p = nn.Parameter(q.detach().clone()), nn.Parameter(p.detach().clone())
        width = max(q.shape[1], p.shape[1])
        self.width = width
        self.masks = torch.cat([F.pad(q_mask, (0, width - q.shape[1])), F.pad(p_mask, (0, width - p.shape[1]))])

    def forward(self, features: dict, task: str | None = None, **kwargs) -> dict:
        table = torch.cat([F.pad(self.q, (0, 0, 0, self.width - self.q.shape[1])),
                           F.pad(self.p, (0, 0, 0, self.width - self.p.shape[1]))])
        ids = features["input_ids"][:, 0]
        return {"token_embeddings": F.normalize(table[ids], dim=-1), "attention_mask": self.masks[ids]}

    def similarity(self, a, b, **kwargs):
        from sentence_transformers.util.similarity import maxsim as st_maxsim

        return st_maxsim(a, b, **kwargs)


def _columns(b: int, g: int) -> list[dict]:
    """ST's columns (query, positive, negative 1..): column j holds passage rows b * g + j (lmk's layout)."""
    cols = [{"input_ids": torch.arange(b)[:, None], "attention_mask": torch.ones(b, 1, dtype=torch.long)}]
    for j in range(g):
        ids = b + torch.arange(b) * g + j
        cols.append({"input_ids": ids[:, None], "attention_mask": torch.ones(b, 1, dtype=torch.long)})
    return cols


@pytest.mark.parametrize("cached", [False, True])
def test_maxsim_objective_equals_sentence_transformers_multi_vector_mnrl(cached):
    from sentence_transformers.multi_vector_encoder.losses import (
        CachedMultiVectorMultipleNegativesRankingLoss,
        MultiVectorMultipleNegativesRankingLoss,
    )

    b, g, tau = 4, 3, 0.05  # a positive and two hard negatives per query
    q, q_mask, p, p_mask = _vectors(b, g, lq=3, lp=5)
    ours = maxsim_info_nce((F.normalize(q, dim=-1), q_mask), (F.normalize(p, dim=-1), p_mask), tau=tau, group_size=g)
    ours.backward()

    model = _GivenVectors(q, q_mask, p, p_mask)
    if cached:  # chunks of 3 rows: GradCache over ragged chunks on the ST side too
        loss_fn = CachedMultiVectorMultipleNegativesRankingLoss(model, scale=1 / tau, mini_batch_size=3)
    else:
        loss_fn = MultiVectorMultipleNegativesRankingLoss(model, scale=1 / tau)
    theirs = loss_fn(_columns(b, g))
    theirs.backward()
    torch.testing.assert_close(ours.detach(), theirs.detach(), atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(q.grad, model.q.grad, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(p.grad, model.p.grad, atol=ATOL, rtol=RTOL)
    assert q.grad.abs().sum() > 0 and p.grad[~p_mask].abs().sum() == 0  # padded vectors get no gradient


def test_maxsim_of_one_vector_per_text_is_info_nce():
    """With one vector per text MaxSim is the dot product: every option of info_nce (in-batch or not, the
    cross-device offset, teacher distillation) gives its loss and gradients."""
    gen = torch.Generator().manual_seed(1)
    q = F.normalize(torch.randn(3, 8, generator=gen), dim=-1).requires_grad_()
    p = F.normalize(torch.randn(12, 8, generator=gen), dim=-1).requires_grad_()
    teacher = torch.randn(3, 2, generator=gen)
    ones_q, ones_p = torch.ones(3, 1, dtype=torch.bool), torch.ones(12, 1, dtype=torch.bool)
    for kw in ({}, {"in_batch": False}, {"offset": 6}, {"teacher_scores": teacher}):
        want = info_nce(q, p, tau=0.05, group_size=2, **kw)
        got = maxsim_info_nce((q[:, None], ones_q), (p[:, None], ones_p), tau=0.05, group_size=2, **kw)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
        want_grads = torch.autograd.grad(want, [q, p])
        got_grads = torch.autograd.grad(got, [q, p])
        for a, b in zip(got_grads, want_grads, strict=True):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_maxsim_blocks_do_not_change_the_scores():
    q, q_mask, p, p_mask = _vectors(5, 2, lq=3, lp=4)
    whole = maxsim(q, q_mask, p, p_mask)
    torch.testing.assert_close(maxsim(q, q_mask, p, p_mask, block_elements=1), whole, atol=1e-6, rtol=1e-6)
    # by hand: the sum over the real query vectors of the max over the real passage vectors
    want = torch.tensor([[sum(max(float(q[i, a].detach() @ p[j, c].detach()) for c in range(4) if p_mask[j, c])
                              for a in range(3) if q_mask[i, a]) for j in range(10)] for i in range(5)])
    torch.testing.assert_close(whole.detach(), want, atol=1e-5, rtol=1e-5)


# ---- grad cache with multi-vector embeddings ------------------------------------------------------------------------
def _tiny_bert(dropout: float) -> BertModel:
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                     max_position_embeddings=32, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    return BertModel(cfg).train()


def _features(n: int, t: int, seed: int) -> dict[str, torch.Tensor]:
    """Rows with 1..3 pooled positions each (by fours: 1, 2, 3), some padded: chunks of them differ in width."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(n, t, dtype=torch.long)
    mask[::3, t // 2 :] = 0
    pool = torch.zeros(n, t, dtype=torch.long)
    for i in range(n):
        pool[i, torch.randperm(t // 2, generator=g)[: 1 + (i // 4) % 3]] = 1
    return {"input_ids": torch.randint(1, 64, (n, t), generator=g), "attention_mask": mask, "pool_mask": pool}


def _states(model, which: str = "landmarks"):
    def embed(f):
        h = model(input_ids=f["input_ids"], attention_mask=f["attention_mask"]).last_hidden_state
        return padded_states(h, f["attention_mask"], f["pool_mask"], which)
    return embed


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(("chunk", "which"), [(1, "landmarks"), (4, "landmarks"), (4, "tokens"), (32, "landmarks")])
def test_grad_cache_equals_no_cache_for_the_maxsim_objective(chunk, which):
    """Dropout on: the uncached reference embeds the same chunks in the same RNG order; each chunk's states have
    their own width, so the cache pads them for the loss and slices each chunk's gradient back."""
    q, p = _features(6, 10, 3), _features(12, 12, 4)
    teacher = torch.randn(6, 2, generator=torch.Generator().manual_seed(0))

    def loss(qe, pe):
        return maxsim_info_nce(qe, pe, tau=0.05, group_size=2, teacher_scores=teacher)

    model = _tiny_bert(0.3)
    q_embed, p_embed = _states(model, which), _states(model)
    widths = {int(p_embed(c)[0].shape[1]) for c in split_features(p, chunk)}
    assert chunk == 32 or len(widths) > 1, "the chunks should differ in width"
    torch.manual_seed(123)
    ref = loss(concat([q_embed(c) for c in split_features(q, chunk)]),
               concat([p_embed(c) for c in split_features(p, chunk)]))
    ref.backward()
    ref_grads = _grads(model)
    model.zero_grad()
    torch.manual_seed(123)
    got = grad_cache_step(q_embed, q, p, loss, chunk_size=chunk, passage_embed=p_embed)
    torch.testing.assert_close(got, ref.detach(), atol=1e-6, rtol=1e-5)
    assert ref_grads.keys() == _grads(model).keys() and ref_grads
    for k, v in _grads(model).items():
        torch.testing.assert_close(v, ref_grads[k], atol=1e-6, rtol=1e-4, msg=k)


def test_padded_states_are_the_states_eval_maxsim_scores():
    from lmk.model.multi_vector import pooled_states

    f = _features(5, 10, 7)
    hidden = torch.randn(5, 10, 16)
    for which in ("landmarks", "tokens"):
        states, mask = padded_states(hidden, f["attention_mask"], f["pool_mask"], which)
        for i, kept in enumerate(pooled_states(hidden, f["attention_mask"], f["pool_mask"], which)):
            assert int(mask[i].sum()) == len(kept) and not mask[i, len(kept):].any()
            torch.testing.assert_close(states[i, : len(kept)], F.normalize(kept, dim=-1))
            assert not states[i, len(kept):].any()


# ---- validation, registry, card line --------------------------------------------------------------------------------
def test_an_objective_that_needs_landmark_states_refuses_a_pooling_without_them():
    poolers, strategies = registry.declared_poolers(), registry.strategies()
    refused = [name for name, needs in poolers.items() if not needs["needs_pool_mask"]]
    assert refused
    for pooler in refused:
        pooling = PoolingConfig.coerce({"name": pooler, "strategy": "none", "pooler": pooler})
        with pytest.raises(ConfigError, match=r"train\.objective=maxsim: .* no pooled positions.*train\.objective="
                                              r"single"):
            check_pooled_positions("maxsim", pooling, poolers, strategies)
        check_pooled_positions("single", pooling, poolers, strategies)
    check_pooled_positions("maxsim", PoolingConfig(), poolers, strategies)  # lmk-fixed


def test_train_section_checks_the_objective_keys():
    assert TrainSection().objective == "single" and not {"objective", "maxsim_query", "maxsim_tau"} & set(
        TrainSection().to_dict())
    with pytest.raises(ConfigError, match=r"train\.objective='colbert' is not valid; allowed values: single, maxsim"):
        TrainSection.coerce({"objective": "colbert"})
    with pytest.raises(ConfigError, match=r"train\.maxsim_query='cls' is not valid; allowed values: landmarks, tokens"):
        TrainSection.coerce({"maxsim_query": "cls"})
    with pytest.raises(ConfigError, match=r"train\.maxsim_tau=0(\.0)? is not valid; allowed values: a number > 0"):
        TrainSection.coerce({"maxsim_tau": 0})
    # any other value is described (and hashed): a checkpoint's hyperparameters carry it
    assert set(TrainSection.coerce({"objective": "maxsim", "maxsim_query": "tokens"}).to_dict()) >= {
        "objective", "maxsim_query"}


def test_every_declared_objective_has_a_class_and_a_new_one_registers_once():
    assert set(OBJECTIVE_CLASSES) == set(registry.declared_objectives())
    assert build_objective(TrainSection(objective="maxsim", maxsim_tau=0.5)).tau == 0.5
    assert build_objective(TrainSection(tau=0.1)).tau == 0.1

    class Margin(Objective):
        name = "lmk_test_margin"
        temperature = "tau"

    try:
        register_objective(Margin)
        assert registry.declared_objectives()["lmk_test_margin"]["embedding"] == "pooled"
        assert TrainSection(objective="lmk_test_margin").objective == "lmk_test_margin"

        class Other(Objective):
            name = "lmk_test_margin"

        with pytest.raises(ValueError, match="registered twice"):
            register_objective(Other)
        assert registry.declared_objectives()["lmk_test_margin"]["module"] == __name__  # declared where it lives
    finally:
        from lmk.config import DECLARED_OBJECTIVES

        OBJECTIVE_CLASSES.pop("lmk_test_margin", None)
        DECLARED_OBJECTIVES.pop("lmk_test_margin", None)


def test_a_declared_objective_is_built_from_its_declared_module():
    from lmk.config import DECLARED_OBJECTIVES, declare_objective

    for name, declared in registry.declared_objectives().items():  # each declared module registers its class
        assert type(build_objective(TrainSection(objective=name))).__module__ == declared["module"]
    try:  # a module that registers no class under the name: refused naming where the class should register
        declare_objective("lmk_test_unbuilt", module="lmk.train.losses")
        assert TrainSection(objective="lmk_test_unbuilt").objective == "lmk_test_unbuilt"
        with pytest.raises(ValueError, match=r"train\.objective='lmk_test_unbuilt' has no registered class "
                                             r"\(@register_objective in lmk\.train\.losses\)"):
            build_objective(TrainSection(objective="lmk_test_unbuilt"))
    finally:
        DECLARED_OBJECTIVES.pop("lmk_test_unbuilt", None)


def test_the_card_line_names_the_objective():
    assert describe_objective({"tau": 0.02}) == "single-vector InfoNCE (tau 0.02)"  # a run from before the key
    assert describe_objective({"objective": "maxsim", "maxsim_query": "landmarks", "maxsim_tau": 0.05}) == (
        "MaxSim InfoNCE (query landmark states against passage landmark states, maxsim_tau 0.05)")


# ---- cross-device: the module's gather of multi-vector passages, on two emulated ranks ----------------------------
class _Ranks:
    """Lightning's `all_gather` for rank `rank` of two: each call returns the [2, ...] stack of what both ranks pass
    (the other rank's tensors given in call order), with gradients to this rank's own part."""

    def __init__(self, rank: int, other_calls: list[torch.Tensor]) -> None:
        self.rank, self.other, self.seen = rank, list(other_calls), []

    def __call__(self, t: torch.Tensor, sync_grads: bool = False) -> torch.Tensor:
        self.seen.append(t.detach().clone())
        other = self.other.pop(0)
        return torch.stack([t, other] if self.rank == 0 else [other, t])


def test_the_gather_pads_each_rank_to_the_widest_and_equals_one_process():
    """Two ranks whose passage states differ in width (2 and 5 vectors): each rank's loss over the gathered passages
    (padded to 5, mask beside, this rank's offset) averages to the loss of one process over the whole batch, and
    so do the gradients (the states are leaves; with sync_grads the other rank's part would get its own)."""
    from lmk.train.embeddings import pad_width
    from lmk.train.module import ContrastiveModule

    b, g = 2, 2
    q, q_mask, p, p_mask = _vectors(2 * b, g, lq=3, lp=5, seed=3)
    p_mask[: b * g, 2:] = False  # rank 0's passages keep at most 2 vectors: its states are 2 wide
    qn, pn = F.normalize(q, dim=-1), F.normalize(p, dim=-1)
    local = [((qn[r * b:(r + 1) * b], q_mask[r * b:(r + 1) * b]),
              (pn[r * b * g:(r + 1) * b * g, : 2 if r == 0 else 5], p_mask[r * b * g:(r + 1) * b * g, : 2 if r == 0 else 5]))
             for r in range(2)]
    whole = maxsim_info_nce((qn, q_mask), (pn, p_mask), tau=0.05, group_size=g)
    want = torch.autograd.grad(whole, [q, p], retain_graph=True)

    class OnRank(ContrastiveModule):
        rank = 0
        global_rank = property(lambda self: self.rank)

        def _world(self) -> int:
            return 2

    module = OnRank(nn.Identity(), tau=0.05, objective="maxsim", maxsim_tau=0.05)
    total = 0.0
    for r in range(2):
        other_states, other_mask = pad_width(local[1 - r][1], 5)
        module.rank = r
        module.all_gather = _Ranks(r, [torch.tensor(local[1 - r][1][0].shape[1]), other_states,
                                       other_mask.to(torch.uint8)])
        total = total + module.compute_loss(*local[r]) / 2
        assert module.all_gather.seen[1].shape[1] == 5  # padded to the widest rank before the gather
    torch.testing.assert_close(total, whole, atol=1e-6, rtol=1e-6)
    got = torch.autograd.grad(total, [q, p])
    for a, w in zip(got, want, strict=True):
        torch.testing.assert_close(a, w, atol=1e-6, rtol=1e-5)


# ---- the command ---------------------------------------------------------------------------------------------------
def _train(tmp_path, *overrides: str):
    import os
    import subprocess
    import sys
    from pathlib import Path

    import forked_cli

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "lmk.train", "experiment=table2-tiny", f"hydra.run.dir={tmp_path / 'run'}", *overrides]
    root = Path(__file__).resolve().parents[1]
    proc = forked_cli.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert isinstance(proc, subprocess.CompletedProcess)
    return proc


def test_a_tiny_run_trains_with_the_maxsim_objective_and_records_it(tmp_path):
    import json

    proc = _train(tmp_path, "pooling=lmk-fixed", "train.objective=maxsim", "++row=maxsim")
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((tmp_path / "run" / "results.json").read_text())
    assert res["status"] == "done" and res["metrics"]["global_step"] == 2
    assert res["config"]["train"]["objective"] == "maxsim" and res["config"]["train"]["maxsim_query"] == "landmarks"
    assert describe_objective(res["config"]["train"]).startswith("MaxSim InfoNCE (query landmark states")


def test_validation_refuses_the_maxsim_objective_with_a_pooling_without_landmarks(tmp_path):
    import time

    start = time.perf_counter()
    proc = _train(tmp_path, "pooling=cls", "train.objective=maxsim")
    assert proc.returncode != 0
    assert "train.objective=maxsim: pooling 'cls'" in proc.stderr and "train.objective=single" in proc.stderr
    assert not (tmp_path / "run" / "checkpoints").exists() and time.perf_counter() - start < 60
