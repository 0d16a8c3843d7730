"""LongEmbed's synthetic tasks (passkey, needle), regenerated offline by the protocol of docs/method.md section 5.

Per length L in `LENGTHS`: `n_docs` (100) candidate documents shared by `n_queries` (50) queries, each
query with exactly one relevant document; a document has at most floor(0.75 * L) words.

- passkey: the filler "The grass is green. ... There and back again." repeated around one inserted
  line "{Name}'s pass key is {key}. Remember it. {key} is the pass key for {Name}." at a random sentence
  boundary; every document has its own first name (drawn from the list shipped in
  `lmk/resources/passkey_names.txt`, so no package upgrade can change the data) and 5-digit key; query
  "what is the passkey for {name}?" as in the real mteb rows (lower case, "passkey" one word).
- needle: as LongEmbed, every document of a length is the beginning of the same essay text (the project's
  own essays, `lmk/resources/needle_essays.txt`) cut to the word budget, with one fact of
  `lmk/resources/needles.json` (real general-knowledge facts) inserted at a random sentence boundary;
  only the fact and its position differ between documents. Query = the fact's question.

Every document and query records the needle's ``depth`` (0 = start, 1 = end: words before the needle /
words of filler) and the ``length``. Output: {L: RetrievalCorpus(split=f"test_{L}")} (mteb's LEMB split
names). Deterministic for a seed; each length is seeded on its own, so asking for fewer lengths gives
the same documents for those lengths. `fingerprint(tasks)` hashes a generated set (tests pin it).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np

from lmk.config.eval import LENGTHS
from lmk.data.hub import load_longembed  # noqa: F401 - re-exported: the real LongEmbed for users online
from lmk.data.retrieval import RetrievalCorpus

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
PASSKEY_LINE = "{name}'s pass key is {key}. Remember it. {key} is the pass key for {name}."
PASSKEY_QUERY = "what is the passkey for {name}?"
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
        raise ValueError(
            f"n_docs={n_docs} is not valid; allowed values: 1..{max_docs} (one fact per document)"
        )
    return lengths


def _insert(
    words: list[str], boundaries: list[int], insert: list[str], rng: np.random.Generator
) -> tuple[str, float]:
    """Insert `insert` at a random boundary of `words`; return the text and depth in [0, 1]."""
    k = int(boundaries[int(rng.integers(len(boundaries)))])
    depth = k / len(words) if words else 0.0
    return " ".join(words[:k] + insert + words[k:]), round(float(depth), 6)


def _corpus(
    name: str,
    length: int,
    docs: list[dict[str, Any]],
    questions: list[str],
    rng: np.random.Generator,
    n_queries: int,
) -> RetrievalCorpus:
    chosen = sorted(int(i) for i in rng.choice(len(docs), size=n_queries, replace=False))
    queries, qrels = [], {}
    for j, i in enumerate(chosen):
        qid = f"{length}_q{j:03d}"
        queries.append({"id": qid, "text": questions[i], "depth": docs[i]["depth"], "length": length})
        qrels[qid] = {docs[i]["id"]: 1}
    return RetrievalCorpus.from_records(name, split_name(length), docs, queries, qrels)


def _resource(name: str) -> str:
    return resources.files("lmk").joinpath(f"resources/{name}").read_text(encoding="utf-8")


def fingerprint(tasks: Mapping[int, RetrievalCorpus]) -> str:
    """A content hash of a generated set (every length's ids, texts and qrels), to notice any change."""
    h = hashlib.sha256()
    for length in sorted(tasks):
        rc = tasks[length]
        h.update(f"{length}|{rc.name}|{rc.split}\n".encode())
        for part in (rc.corpus, rc.queries):
            for ident, text in zip(part["id"], part["text"], strict=True):
                h.update(f"{ident}\t{text}\n".encode())
        for qid in sorted(rc.qrels):
            h.update(f"{qid}:{sorted(rc.qrels[qid].items())}\n".encode())
    return h.hexdigest()[:16]


# ------------------------------------------------------------------------------------------ passkey
@lru_cache(maxsize=1)
def load_passkey_names() -> tuple[str, ...]:
    """The shipped list of unusual first names (lmk/resources/passkey_names.txt), in file order."""
    lines = (line.strip() for line in _resource("passkey_names.txt").splitlines())
    return tuple(line for line in lines if line and not line.startswith("#"))


def _names(n: int, rng: np.random.Generator) -> list[str]:
    names = load_passkey_names()
    if n > len(names):
        raise ValueError(f"n_docs={n} is not valid; allowed values: 1..{len(names)} (one name per document)")
    return [names[int(i)] for i in rng.choice(len(names), size=n, replace=False)]


def passkey_document(name: str, key: int, max_words: int, rng: np.random.Generator) -> tuple[str, float]:
    """Filler sentences (whole ones, cycled) around the pass-key line, at most `max_words` words."""
    needle = PASSKEY_LINE.format(name=name, key=key).split()
    room = max_words - len(needle)
    if room < 0:
        raise ValueError(f"a word budget of {max_words} cannot hold the pass-key line ({len(needle)} words)")
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
    for length in _check(lengths, n_docs, n_queries, max_docs=len(load_passkey_names())):
        rng = np.random.default_rng([seed, length, 1])
        names = _names(n_docs, rng)
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
    """The project's 100 needles (lmk/resources/needles.json): topic, fact, question and the answer
    (a span of the fact)."""
    keys = ("topic", "fact", "question", "answer")
    return tuple({k: p[k] for k in keys} for p in json.loads(_resource("needles.json")))


_SENTENCE_END = re.compile(r"[.!?][\"')]?$")


@lru_cache(maxsize=1)
def background_words() -> tuple[tuple[str, ...], np.ndarray]:
    """Words of the needle background (lmk/resources/needle_essays.txt, whitespace-normalised) and the
    word counts after which a sentence ends (the boundaries a needle may be inserted at, 0 included)."""
    words = tuple(_resource("needle_essays.txt").split())
    ends = np.flatnonzero([bool(_SENTENCE_END.search(w)) for w in words]) + 1
    return words, np.concatenate([[0], ends])


def needle_document(fact: str, max_words: int, rng: np.random.Generator) -> tuple[str, float]:
    """The beginning of the background, cut so that it and `fact` fill `max_words` words, with `fact`
    inserted at a random sentence boundary."""
    words, ends = background_words()
    needle = fact.split()
    room = max_words - len(needle)
    if room < 0:
        raise ValueError(f"a word budget of {max_words} cannot hold the fact ({len(needle)} words)")
    if room > len(words):
        raise ValueError(
            f"a word budget of {max_words} needs {room} background words but lmk/resources/needle_essays.txt "
            f"has {len(words)}; allowed: lengths up to {4 * (len(words) + len(needle)) // 3} (or add text)"
        )
    boundaries = ends[ends <= room].tolist()
    return _insert(list(words[:room]), boundaries, needle, rng)


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
