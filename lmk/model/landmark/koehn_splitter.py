"""Koehn & Schroeder's sentence splitter, as the `sentence-splitter` package runs it, at a fraction of the cost.

The package (the authors' English splitter) compiles its patterns on every call through `regex`'s cache and tests
every word of a text with a regex search, so it dominated `lmk-sentence` tokenization (about 70% of it, and a
quarter of the encode of a 2-layer model in `make bench`). This is the same algorithm, step for step, with the
patterns compiled once, the per-word tests run only for words that end in a period (the only words the package's
first test can match: its pattern ends in `(\\.+)$`, and `$` also matches before a final newline), and the text rebuilt with one join. Its output equals the
package's for every text: `tests/test_sentences.py` compares the two on corpora and on generated texts.

The non-breaking prefixes are the package's files (LGPL-3.0, from Moses / Lingua::Sentence): read from the package,
or from a folder holding copies of them (an exported model carries the file of its language, so that it splits
without the package installed).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from importlib import resources
from pathlib import Path

import regex

# the package's patterns, verbatim; first its four insertions of a break, in its order
_BREAKS = tuple(
    regex.compile(p, flags=regex.UNICODE)
    for p in (
        r'([?!]) +([\'"([\u00bf\u00A1\p{Initial_Punctuation}]*[\p{Uppercase_Letter}\p{Other_Letter}])',
        r'(\.[\.]+) +([\'"([\u00bf\u00A1\p{Initial_Punctuation}]*[\p{Uppercase_Letter}\p{Other_Letter}])',
        r'([?!\.][\ ]*[\'")\]\p{Final_Punctuation}]+) +([\'"([\u00bf\u00A1\p{Initial_Punctuation}]*[\ ]*'
        r'[\p{Uppercase_Letter}\p{Other_Letter}])',
        r'([?!\.]) +([\'"[\u00bf\u00A1\p{Initial_Punctuation}]+[\ ]*[\p{Uppercase_Letter}\p{Other_Letter}])',
    )
)
_SPACES = regex.compile(r' +', flags=regex.UNICODE)
_PERIOD_END = regex.compile(r'([\w\.\-]*)([\'\"\)\]\%\p{Final_Punctuation}]*)(\.+)$', flags=regex.UNICODE)
_ACRONYM = regex.compile(r'(\.)[\p{Uppercase_Letter}\p{Other_Letter}\-]+(\.+)$', flags=regex.UNICODE)
_NEXT_STARTS = regex.compile(
    r'^([ ]*[\'"([\u00bf\u00A1\p{Initial_Punctuation}]*[ ]*[\p{Uppercase_Letter}\p{Other_Letter}0-9])',
    flags=regex.UNICODE)
_DIGITS = regex.compile(r"^[0-9]+", flags=regex.UNICODE)
_COMMENT = regex.compile(r"#.*", flags=regex.DOTALL | regex.UNICODE)
_SQUEEZE, _LEAD, _TRAIL = regex.compile(" +"), regex.compile("\n "), regex.compile(" \n")
DEFAULT, NUMERIC_ONLY = 1, 2  # kinds of non-breaking prefix


def prefix_file(language: str, folder: str | None = None) -> Path:
    """The non-breaking prefix file of `language`: in `folder` when given, else in the `sentence-splitter` package."""
    if folder is not None:
        return Path(folder) / f"{language}.txt"
    try:
        package = resources.files("sentence_splitter")
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError(
            "the koehn sentence splitter reads the non-breaking prefixes of the `sentence-splitter` package: "
            "pip install sentence-splitter (an exported model carries its own copy in non_breaking_prefixes/)"
        ) from err
    return Path(str(package.joinpath("non_breaking_prefixes", f"{language}.txt")))


@cache
def languages(folder: str | None = None) -> tuple[str, ...]:
    """The languages whose prefix files are in `folder` (default: the package), as ISO 639-1 codes."""
    found = prefix_file("en", folder).parent
    return tuple(sorted(p.name.removesuffix(".txt") for p in found.glob("*.txt"))) if found.is_dir() else ()


def non_breaking_prefixes(language: str, folder: str | None = None) -> dict[str, int]:
    """The non-breaking prefixes of `language`: prefix -> DEFAULT or NUMERIC_ONLY (the package's file format)."""
    path = prefix_file(language, folder)
    if not path.is_file():
        raise ValueError(f"the koehn sentence splitter has no rules for language {language!r} ({path} is missing); "
                         f"allowed: {', '.join(languages(folder))}")
    prefixes: dict[str, int] = {}
    with path.open("r", encoding="utf-8") as file:
        lines = file.readlines()  # as the package reads it
    for line in lines:
        kind = NUMERIC_ONLY if "#NUMERIC_ONLY#" in line else DEFAULT
        line = _COMMENT.sub("", line).strip()
        if line:
            prefixes[line] = kind
    return prefixes


def _breaks_after(word: str, following: str, prefixes: dict[str, int]) -> bool:
    """Whether a sentence ends after `word` (which ends in a period), `following` being the next word."""
    match = _PERIOD_END.search(word)
    prefix, punct = match.group(1), match.group(2)
    kind = prefixes.get(prefix) if prefix else None
    if kind == DEFAULT and not punct:
        return False  # an honorific such as "Mr."
    if _ACRONYM.search(word):
        return False  # an upper case acronym such as "U.S."
    if not _NEXT_STARTS.search(following):
        return False
    # a numeric-only prefix ("No.") followed by a number
    return not (kind == NUMERIC_ONLY and not punct and _DIGITS.search(following))


def split(text: str, prefixes: dict[str, int]) -> list[str]:
    """Sentences of `text` by the package's rules ([] for an empty text)."""
    if not text:
        return []
    for pattern in _BREAKS:
        text = pattern.sub("\\1\n\\2", text)
    words = _SPACES.split(text)
    for i in range(len(words) - 1):
        # `$` also matches before a final newline, so a word may end in ".\n" (a text's own newline)
        if words[i].endswith((".", ".\n")) and _breaks_after(words[i], words[i + 1], prefixes):
            words[i] += "\n"
    text = " ".join(words)
    text = _TRAIL.sub("\n", _LEAD.sub("\n", _SQUEEZE.sub(" ", text))).strip()
    return text.split("\n")


@cache
def splitter(language: str, folder: str | None = None) -> Callable[[str], list[str]]:
    """The splitter of `language` (prefixes read once), with the prefix files of `folder` (default: the package)."""
    prefixes = non_breaking_prefixes(language, folder)
    return lambda text: split(text, prefixes)
