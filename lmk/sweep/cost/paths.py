"""A training job's compute by the path its mini-batches take, at its texts' token lengths (`lengths.py`):

    padded         every text at its max length (query / passage): the upper bound the stage table prints
    batch          each device batch padded to its own longest text (what the collator does today: one width per
                   batch, which grad cache's chunks keep)
    sorted         each device batch sorted by length and cut into mini-batches (grad cache's chunks of
                   `train.grad_cache_chunk` rows, or as many rows as a token budget holds: `train.grad_cache_tokens`),
                   each padded to its own longest
    packed         the real tokens only (a varlen attention kernel on CUDA: no padding at all)

A row of L tokens costs L x the FLOPs per training token at length L (`EncoderShape.train_flops_per_token`: the
dense layers linear in L, the attention L^2 through its span), never a linear tokens ratio. The expected cost of
the batch paths is simulated over `SIM_STEPS` device batches drawn from the lengths (seeded). The MaxSim objective
(`train.objective: maxsim`) adds its score matrix: each local query's landmark states against every passage's
(gathered across devices when the job gathers), 2 x hidden FLOPs per pair, forward and backward.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from lmk.config import TrainSection
from lmk.config.registry import declared_objectives
from lmk.model.batching import token_budget_batches
from lmk.model.landmark.names import STRATEGY_TRAITS
from lmk.model.shape import EncoderShape

PATHS = ("padded", "batch", "sorted", "packed")
SIM_STEPS = 64


def token_budget(c: Mapping[str, Any]) -> int | None:
    """The job's most tokens per grad-cache mini-batch (`train.grad_cache_tokens` with grad cache on), else None."""
    train = c.get("train") or {}
    value = train.get("grad_cache_tokens") if train.get("grad_cache") else None
    return int(value) if value else None


def job_path(c: Mapping[str, Any]) -> str:
    """The path the job's mini-batches take: sorted where its config sets a token budget, else batch padding."""
    return "sorted" if token_budget(c) else "batch"


def objective(c: Mapping[str, Any]) -> str:
    """The job's training objective (`train.objective`; the schema's default where the config has none)."""
    return str((c.get("train") or {}).get("objective") or TrainSection.objective)


def _row_cost(per_token: Callable[[float], float]) -> Callable[[np.ndarray], np.ndarray]:
    memo: dict[int, float] = {}

    def cost(lengths: np.ndarray) -> np.ndarray:
        out = np.empty(len(lengths), dtype=np.float64)
        for i, n in enumerate(np.asarray(lengths, dtype=np.int64)):
            if int(n) not in memo:
                memo[int(n)] = float(n) * per_token(float(n))
            out[i] = memo[int(n)]
        return out
    return cost


def side_flops(sample: np.ndarray, rows: int, max_length: int, cost: Callable[[np.ndarray], np.ndarray],
               chunk: int | None, max_tokens: int | None, rng: np.random.Generator, steps: int = SIM_STEPS
               ) -> dict[str, float]:
    """Expected FLOPs of one device batch of `rows` texts drawn from `sample`, per path. Sorted: mini-batches of
    `max_tokens` tokens (padding counted), else of `chunk` rows, else the batch as one."""
    out = {"padded": rows * float(cost(np.array([max_length]))[0]),
           "packed": rows * float(cost(np.asarray(sample)).mean())}
    longest = grouped = 0.0
    for _ in range(steps):
        draw = np.sort(rng.choice(np.asarray(sample), size=rows, replace=True))[::-1]
        longest += rows * float(cost(draw[:1])[0])
        if max_tokens:
            groups = [(len(b), int(draw[b[0]])) for b in token_budget_batches(draw, max_tokens)]
        else:
            size = chunk or rows
            groups = [(len(draw[i:i + size]), int(draw[i])) for i in range(0, rows, size)]
        grouped += sum(n * float(cost(np.array([first]))[0]) for n, first in groups)
    out["batch"], out["sorted"] = longest / steps, grouped / steps
    return out


def landmark_vectors(tokens: np.ndarray, pooling: Mapping[str, Any]) -> float:
    """Landmark states per text, on average (approx.: one per chunk of content, per ~24-token sentence; 1 otherwise)."""
    strategy = str(pooling.get("strategy") or "none")
    t = np.asarray(tokens, dtype=np.float64)
    if strategy == "sentence":
        return float(np.maximum(1.0, np.round(t / 25.0)).mean())
    if STRATEGY_TRAITS.get(strategy, {}).get("chunked"):
        return float(np.maximum(1.0, np.round(t / (int(pooling.get("chunk_size") or 32) + 1))).mean())
    return 1.0


def maxsim_flops(c: Mapping[str, Any], queries: np.ndarray, passages: np.ndarray, gpus: int, hidden: int) -> float:
    """The MaxSim objective's score matrix per device step: local queries x passages in the loss x query vectors
    x passage vectors x 2 x hidden, x 3 (forward, backward 2)."""
    data, train, pooling = c.get("data") or {}, c.get("train") or {}, c.get("pooling") or {}
    local = int(data["batch_size"])
    passages_in_loss = local * int(data["group_size"]) * (gpus if train.get("gather_across_devices") else 1)
    pairs = local * passages_in_loss * landmark_vectors(queries, pooling) * landmark_vectors(passages, pooling)
    return 3.0 * 2.0 * hidden * pairs


def step_flops(c: Mapping[str, Any], shape: EncoderShape, per_token: Callable[[float], float], queries: np.ndarray,
               passages: np.ndarray, gpus: int, seed: int = 0) -> dict[str, float]:
    """Training FLOPs of one device step per path (queries + passages; the MaxSim objective's scores added)."""
    data, train = c.get("data") or {}, c.get("train") or {}
    per_device, group = int(data["batch_size"]), int(data["group_size"])
    chunk = int(train.get("grad_cache_chunk") or 0) if train.get("grad_cache") else None
    cost, rng, max_tokens = _row_cost(per_token), np.random.default_rng(seed), token_budget(c)
    q = side_flops(queries, per_device, int(data["query_max_length"]), cost, chunk, max_tokens, rng)
    p = side_flops(passages, per_device * group, int(data["passage_max_length"]), cost, chunk, max_tokens, rng)
    states = declared_objectives().get(objective(c), {}).get("embedding") == "landmark_states"
    extra = maxsim_flops(c, queries, passages, gpus, shape.hidden) if states else 0.0
    return {path: q[path] + p[path] + extra for path in PATHS}
