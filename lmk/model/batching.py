"""Inference batches: a fixed number of rows, or as many rows as fit a token budget (padding counted).

A padded batch costs rows x longest row tokens; sorting by length first keeps that close to the real
token count. With a budget, 8192-token documents go a few at a time and short queries in wide batches;
a row longer than the budget goes alone (it cannot be split).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def length_order(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    """Indices longest first (stable: equal lengths keep input order), so a memory error shows at once."""
    return np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")


def fixed_batches(lengths: Sequence[int] | np.ndarray, batch_size: int) -> list[np.ndarray]:
    """Length-sorted batches of `batch_size` rows (indices into `lengths`)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be a positive int")
    order = length_order(lengths)
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def token_budget_batches(lengths: Sequence[int] | np.ndarray, max_tokens: int) -> list[np.ndarray]:
    """Length-sorted batches whose padded size (rows x longest row) stays within `max_tokens`.

    Greedy over rows sorted longest first: the first row of a batch is its longest, so a batch takes
    rows while (rows + 1) x first length <= max_tokens. A row longer than the budget is a batch alone.
    """
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens_per_batch={max_tokens!r} must be a positive int")
    lengths = np.asarray(lengths, dtype=np.int64)
    order = length_order(lengths)
    batches: list[np.ndarray] = []
    start = 0
    n = len(order)
    while start < n:
        longest = max(int(lengths[order[start]]), 1)
        rows = max(1, max_tokens // longest)
        batches.append(order[start : start + rows])
        start += rows
    return batches
