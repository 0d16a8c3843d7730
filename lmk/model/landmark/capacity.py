"""What a layout implies for a text's count of landmarks, as plain Python (standard library only).

The one place for the two figures read outside the tokenizer: `max_landmarks`, the most landmark states a text can
have at a length (MaxSim's corpus chunk is sized by it, lmk.eval.maxsim; statistics report it beside the counts,
lmk.data.stats), and `expected_landmarks`, the count expected of a text of a given token length (the MaxSim index the
cost model sizes, lmk.sweep.cost.index). Both follow `layouts.py`: a chunked strategy puts one landmark per chunk of
`chunk_size` content tokens (a text cut at the max length keeps its leading token and whole chunks, each with its
landmark); the `sentence` strategy one per sentence. Importing this module loads no torch (config-layer and cost
code read it).
"""

from __future__ import annotations

import math

from .names import STRATEGY_TRAITS

TOKENS_PER_SENTENCE = 24.0  # English prose: about 24 tokens a sentence (assumed), for the sentence strategy


def max_landmarks(strategy: str, chunk_size: int, length: int) -> int:
    """The most landmark states a text can have at `length` tokens: one pooled position per chunk (and a lead one)
    for the chunked strategies, one per sentence of at least one token otherwise."""
    if STRATEGY_TRAITS[strategy]["chunked"]:
        return length // chunk_size + 2
    return length // 2 + 1


def expected_landmarks(strategy: str, chunk_size: int, tokens: float, max_length: int,
                       tokens_per_sentence: float = TOKENS_PER_SENTENCE) -> float:
    """Landmarks of a text of `tokens` content tokens cut at `max_length` (landmarks included): a landmark after every
    `chunk_size` tokens and after the last chunk, or one per sentence of `tokens_per_sentence` tokens (assumed)."""
    if STRATEGY_TRAITS[strategy]["chunked"]:
        marks = math.ceil(tokens / chunk_size)
        if 1 + tokens + marks <= max_length:  # the leading token, the text and its landmarks fit
            return float(max(1, marks))
        # a text cut at max_length keeps its leading token and whole chunks, each with its landmark
        return float(max(1, (max_length - 1) // (chunk_size + 1)))
    return max(1.0, math.ceil(min(tokens, max_length) / tokens_per_sentence))
