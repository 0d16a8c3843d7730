"""Sentence splitting for the `sentence` landmark strategy (docs/method.md sections 1 and 7).

Three splitters, chosen by ``PoolingConfig.sentence_splitter``:

- ``koehn`` (default, the authors' English splitter): the `sentence-splitter` package's rules (Koehn &
  Schroeder's heuristic with per-language non-breaking prefixes), run by `koehn_splitter.py` with the same output. It strips the text, collapses runs of
  spaces and breaks at every newline, so a blank line gives an empty piece (which still gets its landmark). Pieces
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
from functools import lru_cache

from .koehn_splitter import languages as koehn_languages
from .koehn_splitter import splitter as koehn_splitter
from .names import DEFAULT_LANGUAGE, DEFAULT_SPLITTER, SPLITTERS

try:
    from sentencex import segment
except ImportError:  # only the sentencex splitters need it: an export with another one loads without the package
    segment = None

SPACY_MODEL = "xx_sent_ud_sm"

log = logging.getLogger(__name__)


def check_splitter(splitter: str, language: str, prefix_dir: str | None = None) -> None:
    """Raise a ValueError naming the fix when `splitter` cannot split `language` (koehn: with the prefix files of
    `prefix_dir`, default the sentence-splitter package's)."""
    if splitter not in SPLITTERS:
        raise ValueError(f"unknown sentence splitter {splitter!r}; allowed: {', '.join(SPLITTERS)}")
    if not isinstance(language, str) or not language:
        raise ValueError(f"language must be a language code such as 'en', got {language!r}")
    if splitter == "koehn" and language not in koehn_languages(prefix_dir):
        raise ValueError(
            f"the koehn sentence splitter has no rules for language {language!r}; allowed: "
            f"{', '.join(koehn_languages(prefix_dir))}; for other languages use sentence_splitter: multilingual"
        )
    if splitter != "koehn" and segment is None:
        raise ModuleNotFoundError(f"the {splitter} sentence splitter needs the sentencex package: pip install sentencex")


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
    text: str, language: str = DEFAULT_LANGUAGE, splitter: str = DEFAULT_SPLITTER, prefix_dir: str | None = None
) -> list[str]:
    """Split `text` into sentence pieces with `splitter`; [] for an empty or blank text. `prefix_dir`: where the koehn
    splitter's non-breaking prefix files are (an export's copy; default: the sentence-splitter package)."""
    if not isinstance(text, str):
        raise ValueError(f"split_sentences expects a str, got {type(text).__name__}")
    check_splitter(splitter, language, prefix_dir)
    if not text.strip():
        return []
    if splitter == "koehn":
        return koehn_splitter(language, prefix_dir)(text)
    if splitter == "multilingual":
        return _multilingual(text, language)
    return _sentencex(text, language)
