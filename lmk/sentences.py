"""Sentence splitting for the `sentence` landmark strategy.

Wraps `sentencex` (a maintained, offline, rule-based splitter for ~250 languages; text without
punctuation comes back as one sentence). Two adjustments make the pieces safe to tokenize one by one:

- whitespace between sentences is moved to the *start* of the following sentence, so byte-level BPE
  tokenizers (ModernBERT, RoBERTa) see " This" exactly as they would inside the whole text;
- whitespace-only pieces are merged into their neighbour, so they never yield an empty sentence.

The concatenation of the returned pieces is always the input text.
"""

from __future__ import annotations

from collections.abc import Sequence

from sentencex import segment

DEFAULT_LANGUAGE = "en"


def split_sentences(text: str, language: str = DEFAULT_LANGUAGE) -> list[str]:
    """Split `text` into sentences; `"".join(result) == text`; [] for an empty or blank text."""
    if not isinstance(text, str):
        raise ValueError(f"split_sentences expects a str, got {type(text).__name__}")
    if not text.strip():
        return []
    pieces: list[str] = []
    carry = ""  # whitespace waiting to be prepended to the next sentence
    for piece in segment(language, text):
        body = piece.rstrip()
        if not body:  # whitespace-only piece: belongs to the next sentence's leading space
            carry += piece
            continue
        pieces.append(carry + body)
        carry = piece[len(body) :]
    if carry:  # trailing whitespace of the text stays on the last sentence
        pieces[-1] += carry
    return pieces


def split_batch(texts: Sequence[str], language: str = DEFAULT_LANGUAGE) -> list[list[str]]:
    """`split_sentences` for each text of a batch."""
    return [split_sentences(t, language) for t in texts]
