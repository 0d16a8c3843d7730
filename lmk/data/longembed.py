"""LongEmbed's synthetic tasks (passkey, needle), regenerated offline by the protocol of docs/method.md section 5.

Per length L in `LENGTHS`: `n_docs` (100) candidate documents shared by `n_queries` (50) queries, each
query with exactly one relevant document; a document has at most floor(0.75 * L) words.

- passkey: the filler "The grass is green. ... There and back again." repeated around one inserted
  line "{Name}'s pass key is {key}. Remember it. {key} is the pass key for {Name}." at a random sentence
  boundary; every document has its own person name (Faker, seeded) and 5-digit key; query
  "What is the pass key for {Name}?".
- needle: a window of real prose (the standard library's `pydoc_data.topics`) with one (fact, question)
  pair of `lmk/resources/needles.json` inserted at a random sentence boundary; every document of a length
  has its own fact; query = the question.

Every document and query records the needle's ``depth`` (0 = start, 1 = end: words before the needle /
words of filler) and the ``length``. Output: {L: RetrievalCorpus(split=f"test_{L}")} (mteb's LEMB split
names). Deterministic for a seed; each length is seeded on its own, so asking for fewer lengths gives
the same documents for those lengths.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np

from lmk.data.hub import load_longembed  # noqa: F401 - re-exported: the real LongEmbed for users online
from lmk.data.retrieval import RetrievalCorpus

LENGTHS: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
PASSKEY_LINE = "{name}'s pass key is {key}. Remember it. {key} is the pass key for {name}."
PASSKEY_QUERY = "What is the pass key for {name}?"
_FILLER_SENTENCES = [s.strip() + "." for s in FILLER.split(".") if s.strip()]


def word_budget(length: int) -> int:
    """The most words a document of `length` "tokens" may have: floor(0.75 * L)."""
    return (3 * length) // 4


def split_name(length: int) -> str:
    return f"test_{length}"


def _check(lengths: Sequence[int], n_docs: int, n_queries: int, max_docs: int | None = None) -> list[int]:
    lengths = list(lengths)
    if not lengths or any(isinstance(x, bool) or not isinstance(x, int) or x < 16 for x in lengths):
        raise ValueError(f"lengths={lengths!r} is not valid; allowed values: integers >= 16, e.g. {LENGTHS}")
    if not 1 <= n_queries <= n_docs:
        raise ValueError(f"n_queries={n_queries} is not valid; allowed values: 1..n_docs ({n_docs})")
    if max_docs is not None and n_docs > max_docs:
        raise ValueError(f"n_docs={n_docs} is not valid; allowed values: 1..{max_docs} (one fact per document)")
    return lengths


def _insert(words: list[str], boundaries: list[int], insert: list[str], rng: np.random.Generator) -> tuple[str, float]:
    """Insert `insert` at a random boundary of `words`; return the text and depth in [0, 1]."""
    k = int(boundaries[int(rng.integers(len(boundaries)))])
    depth = k / len(words) if words else 0.0
    return " ".join(words[:k] + insert + words[k:]), round(float(depth), 6)


def _corpus(
    name: str, length: int, docs: list[dict[str, Any]], questions: list[str], rng: np.random.Generator, n_queries: int
) -> RetrievalCorpus:
    chosen = sorted(int(i) for i in rng.choice(len(docs), size=n_queries, replace=False))
    queries, qrels = [], {}
    for j, i in enumerate(chosen):
        qid = f"{length}_q{j:03d}"
        queries.append({"id": qid, "text": questions[i], "depth": docs[i]["depth"], "length": length})
        qrels[qid] = {docs[i]["id"]: 1}
    return RetrievalCorpus.from_records(name, split_name(length), docs, queries, qrels)


# ------------------------------------------------------------------------------------------ passkey
def _names(n: int, seed: int) -> list[str]:
    from faker import Faker

    fake = Faker("en_US")
    fake.seed_instance(seed)
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n:  # first + last name: no "Dr." / "MD" decorations, unique per length
        name = f"{fake.first_name()} {fake.last_name()}"
        if name not in seen:
            seen.add(name)
            out.append(name)
    return out


def passkey_document(name: str, key: int, budget: int, rng: np.random.Generator) -> tuple[str, float]:
    """Filler sentences (whole ones, cycled) around the pass-key line, at most `budget` words."""
    needle = PASSKEY_LINE.format(name=name, key=key).split()
    room = budget - len(needle)
    if room < 0:
        raise ValueError(f"a word budget of {budget} cannot hold the pass-key line ({len(needle)} words)")
    words: list[str] = []
    boundaries = [0]
    i = 0
    while True:
        sentence = _FILLER_SENTENCES[i % len(_FILLER_SENTENCES)].split()
        if len(words) + len(sentence) > room:
            break
        words += sentence
        boundaries.append(len(words))
        i += 1
    return _insert(words, boundaries, needle, rng)


def generate_passkey(
    lengths: Sequence[int] = LENGTHS, n_docs: int = 100, n_queries: int = 50, seed: int = 0
) -> dict[int, RetrievalCorpus]:
    """LongEmbed passkey: {length: RetrievalCorpus} with split names "test_{length}"."""
    out = {}
    for length in _check(lengths, n_docs, n_queries):
        rng = np.random.default_rng([seed, length, 1])
        names = _names(n_docs, seed * 1_000_003 + length)
        keys = [int(k) for k in rng.choice(np.arange(10_000, 100_000), size=n_docs, replace=False)]
        docs, questions = [], []
        for i, (name, key) in enumerate(zip(names, keys, strict=True)):
            text, depth = passkey_document(name, key, word_budget(length), rng)
            docs.append({"id": f"{length}_doc{i:03d}", "text": text, "depth": depth, "length": length})
            questions.append(PASSKEY_QUERY.format(name=name))
        out[length] = _corpus("LocalPasskey", length, docs, questions, rng, n_queries)
    return out


# ------------------------------------------------------------------------------------------- needle
@lru_cache(maxsize=1)
def load_needles() -> tuple[dict[str, str], ...]:
    """The project's 100 (fact, question) pairs (lmk/resources/needles.json)."""
    text = resources.files("lmk").joinpath("resources/needles.json").read_text(encoding="utf-8")
    pairs = json.loads(text)
    return tuple({"fact": p["fact"], "question": p["question"]} for p in pairs)


_SENTENCE_END = re.compile(r"[.!?][\"')]?$")


@lru_cache(maxsize=1)
def haystack_words() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Words of the pydoc topics (sorted by topic, whitespace-normalised), a flag per word that ends a
    sentence, and the sentence-start indices."""
    from pydoc_data.topics import topics

    words: list[str] = []
    for key in sorted(topics):
        words += topics[key].split()
    ends = np.array([bool(_SENTENCE_END.search(w)) for w in words])
    starts = np.concatenate([[0], np.flatnonzero(ends[:-1]) + 1])
    return np.array(words, dtype=object), ends, starts


def needle_document(fact: str, budget: int, rng: np.random.Generator) -> tuple[str, float]:
    """A window of haystack prose starting at a sentence start, with `fact` inserted at a sentence boundary."""
    hay, ends, starts = haystack_words()
    needle = fact.split()
    room = budget - len(needle)
    if room < 0:
        raise ValueError(f"a word budget of {budget} cannot hold the fact ({len(needle)} words)")
    start = int(starts[int(rng.integers(len(starts)))])
    idx = (start + np.arange(room)) % len(hay)  # wraps around for windows longer than the haystack
    words = hay[idx].tolist()
    boundaries = [0, *(np.flatnonzero(ends[idx]) + 1).tolist()]
    if boundaries[-1] != len(words):
        boundaries.append(len(words))
    return _insert(words, boundaries, needle, rng)


def generate_needle(
    lengths: Sequence[int] = LENGTHS, n_docs: int = 100, n_queries: int = 50, seed: int = 0
) -> dict[int, RetrievalCorpus]:
    """LongEmbed needle: {length: RetrievalCorpus}; each document of a length carries its own fact."""
    needles = load_needles()
    out = {}
    for length in _check(lengths, n_docs, n_queries, max_docs=len(needles)):
        rng = np.random.default_rng([seed, length, 2])
        order = rng.permutation(len(needles))[:n_docs]
        docs, questions = [], []
        for i, n in enumerate(order):
            text, depth = needle_document(needles[n]["fact"], word_budget(length), rng)
            docs.append({"id": f"{length}_doc{i:03d}", "text": text, "depth": depth, "length": length})
            questions.append(needles[n]["question"])
        out[length] = _corpus("LocalNeedle", length, docs, questions, rng, n_queries)
    return out
