"""Token-budget mini-batches (train.grad_cache_tokens, lmk.train.chunks): the planner keeps every row once, restores
the batch's order, respects the budget and pads each chunk to its own longest row; the step it plans gives the
batch-padded step's loss and parameter gradients (both objectives, an encoder padded right and a decoder padded left),
and with dropout on the cached step replays each chunk's masks.

Tolerance (float32 on the CPU): trimming padding columns changes which products the attention and matmul kernels sum,
not which are kept, so the loss agrees to a relative 1e-6 and the parameter gradients, as one vector, to a relative
L2 error of 1e-5 (seen: about 3e-7), each tensor to 1e-4."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_decoder import enc, pool  # noqa: E402

from lmk.data.collator import PairCollator  # noqa: E402
from lmk.model.embedding import EmbeddingModel  # noqa: E402
from lmk.train.chunks import plan_chunks  # noqa: E402
from lmk.train.gradcache import grad_cache_step, split_features  # noqa: E402
from lmk.train.module import ContrastiveModule  # noqa: E402

LOSS_RTOL, GRAD_RTOL, TENSOR_RTOL = 1e-6, 1e-5, 1e-4
BUDGET = 60
WORDS = "alpha beta gamma delta river moon coffee tcp violin bee tax forms".split()


def _features(lengths: list[int], width: int, left: bool = False, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    n = len(lengths)
    cols = torch.arange(width)[None, :]
    lens = torch.tensor(lengths)[:, None]
    mask = (cols >= width - lens) if left else (cols < lens)
    ids = torch.randint(1, 99, (n, width), generator=g) * mask
    pool_mask = (torch.rand(n, width, generator=g) < 0.3) & mask
    return {"input_ids": ids, "attention_mask": mask.long(), "pool_mask": pool_mask,
            "row": torch.arange(n)}  # a per-row tensor: sliced by rows only


# ---- the planner ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("budget", [1, 40, 64, 10_000])
def test_plan_keeps_every_row_once_within_the_budget_each_chunk_as_wide_as_its_longest_row(left, budget):
    lengths = [5, 23, 40, 58, 64, 5, 23, 1, 17, 64, 30, 2]
    f = _features(lengths, 64, left)
    plan = plan_chunks(f, 4, budget)
    assert sorted(plan.order.tolist()) == list(range(len(lengths)))  # every row exactly once
    start = 0
    for chunk in plan.chunks:
        rows = plan.order[start : start + len(chunk["row"])]
        start += len(chunk["row"])
        assert torch.equal(chunk["row"], rows)
        width = max(lengths[i] for i in rows.tolist())
        assert all(v.shape[1] == width for k, v in chunk.items() if k != "row")  # its own longest row
        assert len(rows) == 1 or len(rows) * width <= budget  # a row over the budget goes alone
        for j, i in enumerate(rows.tolist()):  # the real tokens and their flags kept, at the same side
            real = f["attention_mask"][i].bool()
            kept = chunk["attention_mask"][j].bool()
            assert torch.equal(chunk["input_ids"][j][kept], f["input_ids"][i][real])
            assert torch.equal(chunk["pool_mask"][j][kept], f["pool_mask"][i][real])
            assert bool(kept[-1] if left else kept[0])
    assert plan.computed == sum(v.shape[0] * v.shape[1] for v in (c["input_ids"] for c in plan.chunks))
    assert int(plan.real) == sum(lengths) and plan.computed <= len(lengths) * 64
    assert plan.computed < len(lengths) * 64 or len(plan.chunks) == 1  # chunks of several widths pad less
    # restore: embeddings in chunk order come back in the batch's order (vectors, and states with their mask)
    emb = torch.cat([c["row"].float()[:, None] for c in plan.chunks])
    assert plan.restore(emb)[:, 0].tolist() == list(range(len(lengths)))
    states, mask = plan.restore((emb[:, None, :].expand(-1, 3, -1), emb[:, :1] > -1))
    assert states[:, 0, 0].tolist() == list(range(len(lengths))) and mask.shape == (len(lengths), 1)


def test_plan_without_a_budget_is_the_padded_batch():
    f = _features([5, 23, 64, 7, 9], 64)
    rows = plan_chunks(f, 2)
    assert rows.order is None and rows.computed == 5 * 64 and int(rows.real) == 108
    assert all(torch.equal(a[k], b[k]) for a, b in zip(rows.chunks, split_features(f, 2), strict=True) for k in f)
    whole = plan_chunks(f, None)
    assert len(whole.chunks) == 1 and whole.chunks[0]["input_ids"] is f["input_ids"]


def test_plan_refuses_padding_inside_a_row():
    f = _features([5, 8, 3], 8)
    f["attention_mask"][1, 4] = 0
    with pytest.raises(ValueError, match="padded on one side"):
        plan_chunks(f, None, 16)


# ---- the step -------------------------------------------------------------------------------------------------------
def _model(name: str, dropout: float) -> EmbeddingModel:
    cfg = enc(name)
    over = dict(cfg.get("config_overrides") or {})
    # a spread-out random init: at the default (0.02) tiny ModernBERT embeds every text alike (cosine 0.99999) and
    # its InfoNCE gradients are rounding noise
    over["initializer_range"] = 0.2
    if name == "tiny-modernbert":
        over.update(embedding_dropout=dropout, attention_dropout=dropout, mlp_dropout=dropout)
    else:
        over.update(attention_dropout=dropout)
    torch.manual_seed(0)
    return EmbeddingModel.build({**cfg, "config_overrides": over}, pool("lmk-fixed", chunk_size=4),
                                query_max_length=16, passage_max_length=64)


def _batch(model: EmbeddingModel, n: int = 4, group: int = 3) -> dict:
    examples = [{"query": " ".join(WORDS[: 2 + i]),
                 "passages": [" ".join((WORDS * 8)[: 3 + 13 * ((i * group + j) % 5)]) for j in range(group)]}
                for i in range(n)]
    return PairCollator(model.landmark_tokenizer, 16, 64)(examples)


def _grads(model) -> dict[str, torch.Tensor]:
    return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


def _assert_grads_close(got: dict, ref: dict) -> None:
    assert got.keys() == ref.keys() and ref
    flat, ref_flat = (torch.cat([g[k].flatten() for k in sorted(ref)]) for g in (got, ref))
    assert float((flat - ref_flat).norm() / ref_flat.norm()) < GRAD_RTOL
    for k in ref:
        assert float((got[k] - ref[k]).norm()) <= TENSOR_RTOL * float(ref[k].norm()) + 1e-9, k


def _cached(module: ContrastiveModule, batch: dict) -> torch.Tensor:
    return grad_cache_step(lambda f: module.embed(f, "query"), batch["query"], batch["passage"], module.compute_loss,
                           chunk_size=module.cfg.grad_cache_chunk, token_budget=module.cfg.grad_cache_tokens,
                           passage_embed=lambda f: module.embed(f, "passage"))


@pytest.mark.parametrize("objective", ["single", "maxsim"])
@pytest.mark.parametrize("name", ["tiny-modernbert", "tiny-decoder"])
def test_token_budget_chunks_give_the_padded_steps_loss_and_gradients(name, objective):
    model = _model(name, 0.0)
    batch = _batch(model)
    plan = plan_chunks(batch["passage"], None, BUDGET)
    assert len(plan.chunks) > 2 and plan.computed < batch["passage"]["input_ids"].numel()  # really trimmed
    padded = ContrastiveModule(model, objective=objective)
    ref = padded.forward_loss(batch)
    ref.backward()
    ref = ref.detach()
    ref_grads = _grads(model)
    for grad_cache in (True, False):  # cached chunks, and chunks embedded with graphs
        model.zero_grad(set_to_none=True)
        module = ContrastiveModule(model, objective=objective, grad_cache=grad_cache, grad_cache_tokens=BUDGET)
        if grad_cache:
            got = _cached(module, batch)
        else:
            got = module.forward_loss(batch)
            got.backward()
            got = got.detach()
        assert abs(float(got) - float(ref)) <= LOSS_RTOL * abs(float(ref)), grad_cache
        _assert_grads_close(_grads(model), ref_grads)


@pytest.mark.parametrize("objective", ["single", "maxsim"])
def test_token_budget_chunks_replay_dropout(objective):
    """Dropout on: the cached step equals the same token-budget chunks embedded with graphs in the same RNG order
    (each chunk's masks drawn again for its second pass), and dropout really changes the loss."""
    model = _model("tiny-modernbert", 0.1)
    batch = _batch(model)
    module = ContrastiveModule(model, objective=objective, grad_cache=True, grad_cache_tokens=BUDGET)
    torch.manual_seed(123)
    ref = module.forward_loss(batch)  # grad_cache_tokens: the token-budget chunks, with graphs
    ref.backward()
    ref = ref.detach()
    ref_grads = _grads(model)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(123)
    got = _cached(module, batch)
    assert abs(float(got) - float(ref)) <= LOSS_RTOL * abs(float(ref))
    _assert_grads_close(_grads(model), ref_grads)
    torch.manual_seed(7)
    with torch.no_grad():
        assert abs(float(module.forward_loss(batch)) - float(ref)) > 1e-4


# ---- the record -----------------------------------------------------------------------------------------------------
def test_results_record_the_fill_of_the_padded_and_the_token_budget_runs(tmp_path):
    """results.json's `fill`: real tokens against tokens computed over the run, for the default (batch-padded) run
    too; the token-budget run trains on the same tokens and computes fewer; metrics.csv logs each step's fill."""
    import csv

    from test_train import in_process, results, write_pairs

    pairs = write_pairs(tmp_path / "pairs.jsonl")
    runs = {"padded": (), "tokens": ("train.grad_cache=true", "train.grad_cache_tokens=24")}
    fills = {}
    for name, extra in runs.items():
        in_process(tmp_path / name, pairs, "trainer.max_steps=2", "seed=1", *extra)
        fills[name] = results(tmp_path / name)["fill"]
        rows = list(csv.DictReader(open(tmp_path / name / "metrics.csv")))
        logged = [float(r["train/fill"]) for r in rows if r.get("train/fill")]
        assert len(logged) == 2 and all(0 < f <= 1 for f in logged), name
        assert fills[name]["mean_batch_fill"] == pytest.approx(sum(logged) / 2, rel=1e-5), name
    padded, tokens = fills["padded"], fills["tokens"]
    assert (padded["chunks"], tokens["chunks"], tokens["grad_cache_tokens"]) == ("batch", "tokens", 24)
    assert padded["batches"] == tokens["batches"] == 2
    assert padded["real_tokens"] == tokens["real_tokens"] > 0  # the same batches
    assert tokens["computed_tokens"] < padded["computed_tokens"]
    for fill in (padded, tokens):
        assert fill["fill"] == pytest.approx(fill["real_tokens"] / fill["computed_tokens"], abs=1e-6)
    assert padded["fill"] < tokens["fill"] <= 1
