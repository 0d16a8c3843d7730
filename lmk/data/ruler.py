"""RULER-style needle-in-a-haystack (NIAH) retrieval, generated offline (docs/method.md section 10).

The authors' long-context evaluation of their decoder models (`eval_scripts/decoder_ruler_eval.py` at e1d1c68)
hides RULER's needle "The special magic number for {key} is {value}." in a haystack of essays and asks which
document holds it. Here each variant is a retrieval split per length L (`test_<L>`): `n_docs` documents, each a
window of the haystack holding its own needles (keys are never shared between documents), and queries whose one
relevant document is the one holding the key(s) they name. Every distractor document holds needles of the same
form, so a query is answered by its key alone, not by "the document with a needle in it" (the authors' distractors
are pure haystack).

- single: one needle per document; the query asks for its key's number (RULER niah_single_1).
- multikey: four needles with four keys per document; the query asks for one, the other three are distractor keys
  in the same document (niah_multikey_1): the key must survive beside similar needles.
- multivalue: four needles of one key with four numbers (niah_multivalue); the query asks for all of them.
- multiquery: four needles with four keys; the query asks for all four keys at once (niah_multiquery): a document
  must keep several facts at several depths.

Lengths are "tokens" as in `lmk.data.longembed` (a document has floor(0.75 L) words, the needles included), so the
data do not depend on a tokenizer. The first needle of a document (the asked one for multikey; the first listed for
multivalue / multiquery) sits at the sentence boundary nearest to a target depth taken in turn from `depths` (an even
depth x length grid); the others at random sentence boundaries. Every document and query records the needle's depth
(words of haystack before it / haystack words), its character offset in the document, and every needle's depth and
offset. Deterministic for a seed and a haystack; each (variant, length) is seeded on its own.

Haystacks: `lmk-essays` (the project's own essays, `lmk/resources/needle_essays.txt`: natural prose that ships with
lmk), or `paul-graham` (Paul Graham's essays, the haystack of RULER and of the authors, read from the hub mirror's
copy of the dataset `PAUL_GRAHAM_REPO`); `auto` takes the essays of the mirror where it holds them, else the
project's. A window longer than the haystack wraps around.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import datasets
import numpy as np

from lmk.config.eval import LENGTHS, RULER_DEPTHS, RULER_ESSAYS_REPO, RULER_HAYSTACKS, RULER_VARIANTS
from lmk.data.longembed import _resource, load_passkey_names, split_name, word_budget
from lmk.data.retrieval import RetrievalCorpus
from lmk.hub import mirror

PAUL_GRAHAM_REPO = RULER_ESSAYS_REPO  # Paul Graham's essays as a hub dataset (a "text" column)
NEEDLE = "The special magic number for {key} is {value}."
QUESTIONS = {
    "single": "What is the special magic number for {key}?",
    "multikey": "What is the special magic number for {key}?",
    "multivalue": "What are all the special magic numbers for {key}?",
    "multiquery": "What are the special magic numbers for {keys}?",
}
NEEDLES = {"single": 1, "multikey": 4, "multivalue": 4, "multiquery": 4}  # per document (RULER's defaults)
_SENTENCE_END = re.compile(r"[.!?][\"')]?$")


@dataclass(frozen=True)
class Haystack:
    name: str      # lmk-essays | paul-graham
    source: str    # where its text was read from
    words: tuple[str, ...]
    starts: np.ndarray  # word indices a sentence starts at (window starts and needle positions)


def _haystack(name: str, source: str, text: str) -> Haystack:
    words = tuple(text.split())
    ends = np.flatnonzero([bool(_SENTENCE_END.search(w)) for w in words]) + 1
    return Haystack(name, source, words, np.concatenate([[0], ends[ends < len(words)]]))


def load_haystack(name: str = "auto") -> Haystack:
    """The haystack `name` (auto | lmk-essays | paul-graham); paul-graham needs the essays in the hub mirror."""
    if name not in RULER_HAYSTACKS:
        raise ValueError(f"ruler haystack {name!r} is not valid; allowed values: {', '.join(RULER_HAYSTACKS)}")
    folder = mirror.find("dataset", PAUL_GRAHAM_REPO) if name != "lmk-essays" else None
    if folder is None and name == "paul-graham":
        raise FileNotFoundError(f"the paul-graham haystack reads the dataset {PAUL_GRAHAM_REPO} from the hub mirror, "
                                "which has no complete copy; download it into the mirror (hub.mirror) or set "
                                "eval.ruler_haystack=lmk-essays")
    return _read_haystack(None if folder is None else str(folder))


@lru_cache(maxsize=4)  # by folder: a process that changes its mirror reads the other haystack
def _read_haystack(folder: str | None) -> Haystack:
    if folder is None:
        return _haystack("lmk-essays", "lmk/resources/needle_essays.txt", _resource("needle_essays.txt"))
    rows = datasets.load_dataset(folder, split="train")
    if "text" not in rows.column_names:
        raise ValueError(f"{folder}: the essays need a 'text' column, found {rows.column_names}")
    return _haystack("paul-graham", f"{PAUL_GRAHAM_REPO} ({folder})", "\n\n".join(rows["text"]))


def _check(variant: str, lengths: Sequence[int], n_docs: int, n_queries: int, depths: Sequence[float]) -> None:
    if variant not in RULER_VARIANTS:
        raise ValueError(f"ruler variant {variant!r} is not valid; allowed values: {', '.join(RULER_VARIANTS)}")
    if not lengths or any(x not in LENGTHS for x in lengths):
        raise ValueError(f"ruler lengths={list(lengths)!r} are not valid; allowed values: {list(LENGTHS)}")
    if not 1 <= n_queries <= n_docs:
        raise ValueError(f"ruler n_queries={n_queries} is not valid; allowed values: 1..n_docs ({n_docs})")
    if not depths or any(not 0.0 <= d <= 1.0 for d in depths):
        raise ValueError(f"ruler depths={list(depths)!r} are not valid; allowed values: fractions in [0, 1]")
    keys_needed = n_docs * (1 if variant == "multivalue" else NEEDLES[variant])
    if keys_needed > len(load_passkey_names()):
        raise ValueError(f"ruler n_docs={n_docs} needs {keys_needed} keys for {variant}; allowed: at most "
                         f"{len(load_passkey_names())} (lmk/resources/passkey_names.txt)")


def _window(hay: Haystack, n_words: int, rng: np.random.Generator) -> tuple[list[str], list[int]]:
    """`n_words` haystack words from a random sentence start (wrapping around), and the sentence starts in it."""
    start = int(hay.starts[int(rng.integers(len(hay.starts)))])
    n = len(hay.words)
    words = [hay.words[(start + i) % n] for i in range(n_words)]
    rel = (hay.starts - start) % n
    starts = sorted({*(int(s) for s in rel[rel < n_words]), 0, n_words})
    return words, starts


def _place(words: list[str], needles: list[str], positions: list[int]) -> tuple[str, list[int], list[float]]:
    """`words` with needle i inserted before word `positions[i]`: the text, each needle's character offset and its
    depth (haystack words before it / haystack words)."""
    order = sorted(range(len(needles)), key=lambda i: (positions[i], i))
    parts: list[str] = []
    offsets, cursor, taken = [0] * len(needles), 0, 0
    for i in [*order, None]:
        upto = len(words) if i is None else positions[i]
        chunk = " ".join(words[taken:upto])
        if chunk:
            cursor += len(chunk) + (1 if parts else 0)
            parts.append(chunk)
        taken = upto
        if i is not None:
            cursor += 1 if parts else 0
            offsets[i] = cursor
            cursor += len(needles[i])
            parts.append(needles[i])
    depths = [round(p / len(words), 6) if words else 0.0 for p in positions]
    return " ".join(parts), offsets, depths


def _document(variant: str, length: int, target: float, keys: list[str], hay: Haystack,
              rng: np.random.Generator) -> dict[str, Any]:
    values = [int(v) for v in rng.integers(1_000_000, 10_000_000, size=NEEDLES[variant])]
    needles = [NEEDLE.format(key=k, value=v) for k, v in zip(keys, values, strict=True)]
    room = word_budget(length) - sum(len(n.split()) for n in needles)
    if room < 1:
        raise ValueError(f"ruler length {length} cannot hold {len(needles)} needles; allowed: lengths >= 512")
    words, starts = _window(hay, room, rng)
    first = min(starts, key=lambda s: (abs(s - target * room), s))
    others = [int(s) for s in rng.choice(starts, size=len(needles) - 1)]
    text, offsets, depths = _place(words, needles, [first, *others])
    return {"text": text, "length": length, "depth": depths[0], "offset": offsets[0], "target_depth": target,
            "needle": needles[0], "needle_depths": depths, "needle_offsets": offsets, "needles": needles,
            "keys": keys, "values": values, "haystack": hay.name}


def _question(variant: str, keys: list[str]) -> str:
    if variant == "multiquery":
        return QUESTIONS[variant].format(keys=", ".join(keys[:-1]) + " and " + keys[-1])
    return QUESTIONS[variant].format(key=keys[0])


def generate_ruler(variant: str, lengths: Sequence[int] = (512, 1024, 2048, 4096), n_docs: int = 100,
                   n_queries: int = 50, seed: int = 0, haystack: str = "auto",
                   depths: Sequence[float] = RULER_DEPTHS) -> dict[int, RetrievalCorpus]:
    """One NIAH variant: {length: RetrievalCorpus(split "test_<L>")}; the first `n_queries` documents are asked
    for (document i's target depth is depths[i % len(depths)]), each query with exactly one relevant document."""
    _check(variant, lengths, n_docs, n_queries, depths)
    hay = load_haystack(haystack)
    names = load_passkey_names()
    per_doc = 1 if variant == "multivalue" else NEEDLES[variant]
    out = {}
    for length in lengths:
        rng = np.random.default_rng([seed, length, 3, RULER_VARIANTS.index(variant)])
        pool = [names[int(i)] for i in rng.choice(len(names), size=n_docs * per_doc, replace=False)]
        docs, queries, qrels = [], [], {}
        for i in range(n_docs):
            keys = pool[i * per_doc:(i + 1) * per_doc] * (NEEDLES[variant] // per_doc)
            doc = {"id": f"{length}_doc{i:03d}",
                   **_document(variant, length, float(depths[i % len(depths)]), keys, hay, rng)}
            docs.append(doc)
            if i < n_queries:
                qid = f"{length}_q{i:03d}"
                asked = keys if variant == "multiquery" else keys[:1]
                queries.append({"id": qid, "text": _question(variant, asked), "length": length, "depth": doc["depth"],
                                "offset": doc["offset"], "target_depth": doc["target_depth"], "keys": asked,
                                "n_needles": NEEDLES[variant] if variant != "multikey" else 1})
                qrels[qid] = {doc["id"]: 1}
        out[length] = RetrievalCorpus.from_records(f"RulerNiah-{variant}", split_name(length), docs, queries, qrels)
    return out


def query_depths(corpora: dict[int, RetrievalCorpus]) -> dict[str, dict[str, float]]:
    """{split: {query id: needle depth}}: what a per-query score is plotted against (the length is the split's)."""
    return {rc.split: dict(zip(rc.queries["id"], rc.queries["depth"], strict=True)) for rc in corpora.values()}
