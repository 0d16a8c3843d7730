"""Offline long-document retrieval (an MLDR stand-in): function summary -> the whole module file.

Candidates are module source files of installed packages (default: the standard library, present
everywhere, so the task is the same on every machine with the same Python). A seeded sample of
`n_docs` files is the corpus (many run to tens of thousands of tokens); each file gets one query, the
summary line of one of its functions' docstrings, chosen so that it occurs in no other document of the
corpus: exactly one relevant document per query.
"""

from __future__ import annotations

import ast
import re
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from lmk.data.offline_pairs import iter_source_files, package_roots
from lmk.data.retrieval import RetrievalCorpus

_MIN_WORDS, _MAX_WORDS = 5, 40
_MIN_FILE_CHARS = 2_000  # skip stubs and tiny __init__ files: this task is about long documents


def _summaries(src: str) -> list[str]:
    """First-paragraph summaries of the functions' docstrings in a module source (prose only)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(src)
    except (SyntaxError, ValueError):
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("test"):
            doc = ast.get_docstring(node)
            if not doc:
                continue
            summary = " ".join(re.split(r"\n\s*\n", doc.strip(), maxsplit=1)[0].split())
            if _MIN_WORDS <= len(summary.split()) <= _MAX_WORDS and "->" not in summary and "(" not in summary[:1]:
                out.append(summary)
    return out


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def build_longdoc_corpus(
    n_docs: int = 100, seed: int = 0, n_queries: int | None = None, packages: Sequence[str] = ("stdlib",)
) -> RetrievalCorpus:
    """RetrievalCorpus "LocalLongDoc" (split "test"): `n_docs` module files, `n_queries` (default all)
    queries, one relevant file each. Corpus / queries carry "length" (the document's words)."""
    if isinstance(n_docs, bool) or not isinstance(n_docs, int) or n_docs < 1:
        raise ValueError(f"n_docs={n_docs!r} is not valid; allowed values: an integer >= 1")
    n_queries = n_docs if n_queries is None else n_queries  # fewer if a file has no unique summary
    if not 1 <= n_queries <= n_docs:
        raise ValueError(f"n_queries={n_queries} is not valid; allowed values: 1..n_docs ({n_docs})")
    files: list[tuple[str, Path]] = []
    for name, root in package_roots(packages):
        files += [(f"{name}/{p.relative_to(root).as_posix()}", p) for p in iter_source_files(root)]
    rng = np.random.default_rng([seed, 3])
    chosen: list[tuple[str, str, list[str]]] = []
    for i in rng.permutation(len(files)):  # parse only as many files as needed
        doc_id, path = files[int(i)]
        try:
            src = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if len(src) < _MIN_FILE_CHARS:
            continue
        summaries = _summaries(src)
        if summaries:
            chosen.append((doc_id, src, summaries))
        if len(chosen) == n_docs:
            break
    if len(chosen) < n_docs:
        raise ValueError(f"only {len(chosen)} usable module files in {list(packages)}; lower n_docs (got {n_docs})")
    normed = [_norm(src) for _, src, _ in chosen]
    docs, queries, qrels = [], [], {}
    query_docs = set(int(i) for i in rng.choice(n_docs, size=n_queries, replace=False))
    for i, (doc_id, src, summaries) in enumerate(chosen):
        length = len(src.split())
        docs.append({"id": doc_id, "text": src, "length": length})
        if i not in query_docs:
            continue
        order = rng.permutation(len(summaries))
        for j in order:  # a summary that no other document contains: the query has one relevant doc
            s = _norm(summaries[int(j)])
            if not any(s in other for k, other in enumerate(normed) if k != i):
                qid = f"q{len(queries):03d}"
                queries.append({"id": qid, "text": summaries[int(j)], "length": length})
                qrels[qid] = {doc_id: 1}
                break
    return RetrievalCorpus.from_records("LocalLongDoc", "test", docs, queries, qrels)
