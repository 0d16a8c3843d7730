"""Offline long-document retrieval over natural prose: a sentence -> the section of Python's reference it is in.

The long-document task of `lmk.data.longdocs` reads Python modules: code, where the `sentence` strategy's evaluation
rule (a split keeping under 90% of the characters is replaced by the whole text) leaves one landmark per document.
This task is its prose counterpart, read from the text that ships with every CPython: `pydoc_data.topics.topics`,
the Language Reference's topics that `help()` prints (79 English topics, about 465,000 characters in 3.11; the same
module in 3.12). Grammar productions (`::=` blocks) and heading underlines are left out; code examples stay, as in
any manual.

Each topic is cut at paragraph boundaries into documents of `_MIN_CHARS`..`_MAX_CHARS` characters (the topic's
title heads each part), so a document runs past the mini suite's 512 tokens. A seeded sample of `n_docs` documents is
the corpus; each gets one query, a sentence of its own prose (anywhere in it, so often past the tokens a model
keeps) that occurs in no other document of the corpus: exactly one relevant document per query, answerable from
a local span, as in MLDR.
"""

from __future__ import annotations

import re
import sys

import numpy as np

from lmk.data.retrieval import RetrievalCorpus

NAME = "LocalProse"
_MIN_CHARS, _MAX_CHARS = 2_000, 4_000  # a document: longer than 512 tokens (~2,000 characters), one topic's part
_MIN_WORDS, _MAX_WORDS = 8, 40  # a query sentence: specific enough to be unique, short as a query
_PROSE_SHARE = 0.85  # letters and spaces in a prose paragraph (code and tables have fewer)
_UNDERLINE = re.compile(r"[*=\-^~]{3,}")
_SENTENCE_END = re.compile(r"(?<=[a-z0-9)][.!?])\s+(?=[A-Z])")


def source_version() -> str:
    """What the documents are read from (the text changes with CPython's minor version)."""
    return f"pydoc_data.topics (Python {sys.version_info.major}.{sys.version_info.minor})"


def _topics() -> dict[str, str]:
    from pydoc_data.topics import topics  # the stdlib's own copy: installs with the interpreter

    return dict(topics)


def _paragraphs(text: str) -> tuple[str, list[str]]:
    """(title, paragraphs) of one topic, grammar productions and heading underlines dropped."""
    title, out = "", []
    for block in re.split(r"\n\s*\n", text.strip()):
        lines = [ln for ln in block.rstrip().split("\n") if not _UNDERLINE.fullmatch(ln.strip())]
        if not lines or "::=" in block:
            continue
        para = " ".join(" ".join(lines).split())  # reflowed: the help text's wrapping and indentation dropped
        if not title:  # the topic's first block is its title ("Assignment statements" + an underline)
            title = para
        elif _is_prose(para):
            out.append(para)
    return title, out


def _is_prose(para: str) -> bool:
    """A paragraph of sentences, not a code example (doctest, statements) or a table."""
    if ">>>" in para or not para.endswith((".", ":", "?", "!")):
        return False
    return sum(c.isalpha() or c.isspace() for c in para) >= _PROSE_SHARE * len(para)


def _parts(title: str, paragraphs: list[str]) -> list[str]:
    """The topic cut at paragraph boundaries into pieces of at most _MAX_CHARS (a short tail joins the last piece)."""
    parts: list[list[str]] = [[]]
    size = 0
    for para in paragraphs:
        if parts[-1] and size + len(para) > _MAX_CHARS:
            parts.append([])
            size = 0
        parts[-1].append(para)
        size += len(para) + 2
    if len(parts) > 1 and sum(len(p) + 2 for p in parts[-1]) < _MIN_CHARS:
        tail = parts.pop()
        parts[-1] += tail
    texts = [f"{title}\n\n" + "\n\n".join(p) for p in parts]
    return [t for t in texts if len(t) >= _MIN_CHARS]


def documents() -> list[tuple[str, str]]:
    """Every candidate document, (id, text), in a fixed order (longest topic first, then part)."""
    out, seen = [], set()
    # Topics repeat one another (`specialnames` holds `attribute-access`, ...): a paragraph is kept once, in the
    # longest topic that has it, so no two documents share a passage (each query has one relevant document).
    for topic, text in sorted(_topics().items(), key=lambda kv: (-len(kv[1]), kv[0])):
        title, paragraphs = _paragraphs(text)
        paragraphs = [p for p in paragraphs if p not in seen]
        seen.update(paragraphs)
        for i, part in enumerate(_parts(title, paragraphs)):
            out.append((f"{topic}/{i}", part))
    return out


def sentences(text: str) -> list[str]:
    """Candidate query sentences of a document: whole prose sentences of _MIN_WORDS.._MAX_WORDS words."""
    out = []
    for para in text.split("\n\n")[1:]:  # not the title
        for s in _SENTENCE_END.split(para):
            words = s.split()
            if (_MIN_WORDS <= len(words) <= _MAX_WORDS and s[:1].isupper() and s.endswith(".")
                    and "`" not in s):
                out.append(s)
    return out


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def build_prose_corpus(n_docs: int = 50, seed: int = 0, n_queries: int | None = None) -> RetrievalCorpus:
    """RetrievalCorpus "LocalProse" (split "test"): `n_docs` parts of Python's reference topics, `n_queries` (default
    all) queries, one relevant document each. Corpus / queries carry "length" (the document's words)."""
    candidates = documents()
    if isinstance(n_docs, bool) or not isinstance(n_docs, int) or not 1 <= n_docs <= len(candidates):
        raise ValueError(f"n_docs={n_docs!r} is not valid; allowed values: 1..{len(candidates)} (the documents "
                         f"{source_version()} gives)")
    n_queries = n_docs if n_queries is None else n_queries  # fewer if a document has no unique sentence
    if not 1 <= n_queries <= n_docs:
        raise ValueError(f"n_queries={n_queries} is not valid; allowed values: 1..n_docs ({n_docs})")
    rng = np.random.default_rng([seed, 5])
    chosen = [candidates[int(i)] for i in rng.permutation(len(candidates))[:n_docs]]
    normed = [_norm(text) for _, text in chosen]
    query_docs = set(int(i) for i in rng.choice(n_docs, size=n_queries, replace=False))
    docs, queries, qrels = [], [], {}
    for i, (doc_id, text) in enumerate(chosen):
        length = len(text.split())
        docs.append({"id": doc_id, "text": text, "length": length})
        if i not in query_docs:
            continue
        options = sentences(text)
        for j in rng.permutation(len(options)):  # a sentence no other document holds: one relevant document
            s = options[int(j)]
            if not any(_norm(s) in other for k, other in enumerate(normed) if k != i):
                qid = f"q{len(queries):03d}"
                queries.append({"id": qid, "text": s, "length": length})
                qrels[qid] = {doc_id: 1}
                break
    return RetrievalCorpus.from_records(NAME, "test", docs, queries, qrels)
