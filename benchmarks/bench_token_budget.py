"""Training step: grad-cache chunks of rows padded to the step's longest passage against token-budget chunks
(`train.grad_cache_tokens`, lmk.train.chunks), at a paper-like length mix.

Passages draw lognormal lengths averaging about 86 tokens with a tail to 512 (the longest passage of a step sets
every padded row's width), queries about 10 tokens. Both sides run the same cached step (ContrastiveModule's embed and
loss, lmk.train.gradcache) and an AdamW step on identically initialised models (no dropout) over the same
pre-tokenized batches; only the chunking differs. The budget holds the padded side's activation bound: a padded chunk
is `chunk` rows x the step's width, the token budget `chunk` x the passage max length. Throughput is real tokens per
second (the same real tokens on both sides); rounds alternate which side runs first, and the ratio is the geometric
mean of the per-round ratios with its t-interval. The fill (real / computed tokens) of each side is reported.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from typing import Any

import torch

from benchmarks.common import check_size, figure, find_pooling_conf, load_conf, long_text, paired_ratios

SECTION = "train_tokens"
SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"batches": 2, "warmup_steps": 1, "rounds": 1, "queries": 2, "group_size": 2, "chunk": 2,
             "passage_len": 64, "layers": 1, "hidden": 32},
    # a step of 8 queries x 4 passages: about a second padded on one busy CPU core
    "full": {"batches": 4, "warmup_steps": 1, "rounds": 6, "queries": 8, "group_size": 4, "chunk": 8,
             "passage_len": 512, "layers": 2, "hidden": 64},
}
QUERY_LEN = 32
# lognormal token lengths: mean exp(mu + sigma^2 / 2) ~ 86 (before the cut at the max length), a tail past 512
SIGMA = 0.75
MU = math.log(86) - SIGMA**2 / 2
QUERY_MU, QUERY_SIGMA = math.log(7), 0.35  # ~10 tokens with [CLS], [SEP] and the landmark
LR, TAU = 1e-4, 0.02
WORDS_PER_TOKEN = 0.5  # pydoc prose (symbols included) through the MiniLM tokenizer: ~2 tokens a word, landmarks added


def _lengths(n: int, mu: float, sigma: float, cap: int, rng: random.Random) -> list[int]:
    return [max(2, min(cap, round(math.exp(rng.gauss(mu, sigma))))) for _ in range(n)]


def _texts(lengths: list[int], rng: random.Random) -> list[str]:
    return [long_text(max(1, round(n * WORDS_PER_TOKEN)), seed=rng.randrange(1 << 30)) for n in lengths]


def fresh_model(p: dict[str, Any]) -> Any:
    """tiny-modernbert shrunk to the size's layers and width, LMK pooling (chunks of 32); the same weights per call."""
    from lmk.model.embedding import EmbeddingModel

    enc = load_conf("encoder", "tiny-modernbert")
    enc.config_overrides.update(num_hidden_layers=p["layers"], hidden_size=p["hidden"], num_attention_heads=2,
                                intermediate_size=2 * p["hidden"], global_attn_every_n_layers=1)
    enc.seed = 0
    return EmbeddingModel.build(enc, find_pooling_conf("lmk", "fixed", 32), query_max_length=QUERY_LEN,
                                passage_max_length=p["passage_len"]).train()


def make_batches(model: Any, p: dict[str, Any], seed: int = 7) -> list[dict[str, Any]]:
    """Pre-tokenized batches (PairCollator's layout) at the paper-like mix."""
    rng = random.Random(seed)
    batches = []
    for _ in range(p["batches"]):
        q = _lengths(p["queries"], QUERY_MU, QUERY_SIGMA, QUERY_LEN, rng)
        d = _lengths(p["queries"] * p["group_size"], MU, SIGMA, p["passage_len"], rng)
        batches.append({"query": model.tokenize(_texts(q, rng), side="query", train=True, max_length=QUERY_LEN),
                        "passage": model.tokenize(_texts(d, rng), side="passage", train=True,
                                                  max_length=p["passage_len"])})
    return batches


def run_steps(module: Any, batches: list[dict[str, Any]]) -> dict[str, Any]:
    """Cached steps (ContrastiveModule's plan, embed and loss) with AdamW: per-step seconds, losses, token counts."""
    from lmk.train.gradcache import cached_step

    opt = torch.optim.AdamW(module.model.parameters(), lr=LR)
    out: dict[str, Any] = {"step_s": [], "losses": [], "real": [], "computed": []}
    for batch in batches:
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        q_plan, p_plan = module.plan(batch["query"]), module.plan(batch["passage"])
        loss = cached_step(lambda f: module.embed(f, "query"), q_plan, p_plan, module.compute_loss,
                           passage_embed=lambda f: module.embed(f, "passage"))
        opt.step()
        out["step_s"].append(time.perf_counter() - start)
        out["losses"].append(float(loss))
        out["real"].append(int(q_plan.real + p_plan.real))
        out["computed"].append(q_plan.computed + p_plan.computed)
    return out


def run(size: str = "tiny") -> list[dict[str, Any]]:
    from lmk.train.module import ContrastiveModule

    p = SIZES[check_size(size)]
    budget = p["chunk"] * p["passage_len"]
    probe = fresh_model(p)
    batches = make_batches(probe, p)
    del probe
    sides = {
        "padded": lambda: ContrastiveModule(fresh_model(p), tau=TAU, grad_cache=True, grad_cache_chunk=p["chunk"],
                                            gather_across_devices=False),
        "tokens": lambda: ContrastiveModule(fresh_model(p), tau=TAU, grad_cache=True, grad_cache_chunk=p["chunk"],
                                            grad_cache_tokens=budget, gather_across_devices=False),
    }
    round_s: dict[str, list[float]] = {"padded": [], "tokens": []}
    ran: dict[str, dict[str, Any]] = {}
    for r in range(p["rounds"]):  # AB BA ...: drift and the first-in-round slowdown hit both sides alike
        for side in (("padded", "tokens") if r % 2 == 0 else ("tokens", "padded")):
            ran[side] = run_steps(sides[side](), batches)
            round_s[side].append(sum(ran[side]["step_s"][p["warmup_steps"]:]))
    real = sum(ran["padded"]["real"][p["warmup_steps"]:])
    assert real == sum(ran["tokens"]["real"][p["warmup_steps"]:])
    ours = real * p["rounds"] / sum(round_s["tokens"])
    peer = real * p["rounds"] / sum(round_s["padded"])
    fill = {side: sum(ran[side]["real"]) / sum(ran[side]["computed"]) for side in ran}
    lengths = torch.cat([b["passage"]["attention_mask"].sum(dim=1) for b in batches]).float()
    return [figure(
        SECTION, "token_budget_vs_padded_step", unit="real tokens/s", ours=ours, peer=peer,
        peer_name=f"grad-cache chunks of {p['chunk']} rows padded to the step's longest passage",
        ratio_def="token_budget_tokens_per_s / padded_tokens_per_s (same real tokens)", goal=(">=", 1.0),
        details={**{k: p[k] for k in ("queries", "group_size", "chunk", "passage_len", "layers", "hidden")},
                 "grad_cache_tokens": budget, "fill_padded": fill["padded"], "fill_tokens": fill["tokens"],
                 "passage_tokens_mean": float(lengths.mean()), "passage_tokens_max": int(lengths.max()),
                 "real_tokens_per_step": real / max(1, p["batches"] - p["warmup_steps"]),
                 "first_loss_diff": abs(ran["padded"]["losses"][0] - ran["tokens"]["losses"][0]),
                 "padded_round_s": round_s["padded"], "tokens_round_s": round_s["tokens"],
                 "padded_step_s_median": statistics.median(ran["padded"]["step_s"]),
                 "tokens_step_s_median": statistics.median(ran["tokens"]["step_s"])},
        # tokens/s ratio per round = padded seconds / token-budget seconds (the same real tokens)
        ratio_samples=paired_ratios(round_s["padded"], round_s["tokens"]),
    )]
