"""Sentence splitting for the `sentence` landmark strategy (docs/method.md sections 1 and 7).

Three splitters, chosen by ``PoolingConfig.sentence_splitter``:

- ``koehn`` (default, the authors' English splitter): the `sentence-splitter` package's rules (Koehn &
  Schroeder's heuristic with per-language non-breaking prefixes), run by lmk.model.koehn with the same output. It strips the text, collapses runs of spaces and
  breaks at every newline, so a blank line gives an empty piece (which still gets its landmark). Pieces
  carry no surrounding whitespace, as in the authors' code.
- ``multilingual`` (the authors' multilingual splitter): spaCy's ``xx_sent_ud_sm`` where spaCy and that
  model are installed; otherwise (offline machines: the model is not on PyPI) sentencex for `language`,
  a rule-based splitter for ~250 languages, with a one-time warning that names the install command.
- ``sentencex``: sentencex alone, with whitespace kept so that ``"".join(pieces) == text``: whitespace
  between sentences moves to the start of the next one (byte-level BPE tokenizers then see " This" as
  inside the whole text) and whitespace-only pieces merge into their neighbour.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import lru_cache

from sentencex import segment

from lmk.config.model import DEFAULT_LANGUAGE, DEFAULT_SPLITTER, SPLITTERS, check_splitter, koehn_languages  # noqa: F401
from lmk.model import koehn

SPACY_MODEL = "xx_sent_ud_sm"

log = logging.getLogger(__name__)


def _sentencex(text: str, language: str) -> list[str]:
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


@lru_cache(maxsize=1)
def _spacy_pipeline():  # -> spacy.Language | None
    try:
        import spacy  # optional: the authors' multilingual splitter, installed by those who want it

        nlp = spacy.load(SPACY_MODEL)
    except (ImportError, OSError):
        log.warning(
            "sentence_splitter=multilingual: spaCy's %s is not installed, using sentencex instead "
            "(to match the authors: pip install spacy && python -m spacy download %s)",
            SPACY_MODEL,
            SPACY_MODEL,
        )
        return None
    nlp.max_length = 10**8  # the sentence model needs no memory per character beyond the text
    return nlp


def multilingual_backend() -> str:
    """Which splitter ``multilingual`` uses on this machine: "spacy" or "sentencex"."""
    return "spacy" if _spacy_pipeline() is not None else "sentencex"


def _multilingual(text: str, language: str) -> list[str]:
    nlp = _spacy_pipeline()
    if nlp is None:
        return _sentencex(text, language)
    pieces = [s.text for s in nlp(text).sents]
    return pieces or [text]  # as the authors: a text the model returns nothing for stays one piece


def split_sentences(
    text: str, language: str = DEFAULT_LANGUAGE, splitter: str = DEFAULT_SPLITTER
) -> list[str]:
    """Split `text` into sentence pieces with `splitter`; [] for an empty or blank text."""
    if not isinstance(text, str):
        raise ValueError(f"split_sentences expects a str, got {type(text).__name__}")
    check_splitter(splitter, language)
    if not text.strip():
        return []
    if splitter == "koehn":
        return koehn.splitter(language)(text)
    if splitter == "multilingual":
        return _multilingual(text, language)
    return _sentencex(text, language)


def split_batch(
    texts: Sequence[str], language: str = DEFAULT_LANGUAGE, splitter: str = DEFAULT_SPLITTER
) -> list[list[str]]:
    """`split_sentences` for each text of a batch."""
    return [split_sentences(t, language, splitter) for t in texts]
