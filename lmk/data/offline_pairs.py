"""The offline default training set: docstrings of the installed Python packages, in BGE format.

Query = a docstring's summary (first paragraph), positive = the rest of that docstring, negatives =
BM25 (bm25s) hard negatives mined among the other docstrings of the same split. The text is real
English written by people and present wherever the venv exists (the standard library always; numpy,
scipy, pandas, scikit-learn when installed). Source files are parsed with `ast`, never imported, so
the build is fast and safe.

Split by a hash of the query (stable whatever `max_rows` or the package set): ``train`` for training,
``test`` held out for `offline_short_corpus` (negatives are mined within a split, so no test passage
ever appears in training).

Cache: ``$LMK_CACHE`` or the user cache dir (platformdirs) / ``offline_pairs/<fingerprint>/`` is an ordinary
BGE-format dataset repo in the hub's layout (`lmk.data.hub.write_bge_folder`): ``data/train-00000-of-00001.parquet``,
``data/test-00000-of-00001.parquet`` with the columns of ``cfli/bge-full-data``, a README.md card declaring the
splits, and ``meta.json`` (fingerprint, per-file sha256 / rows / bytes, build report). A cache whose
fingerprint or file hashes do not match (edited, truncated) is rebuilt. Training reads it with the loader
every source uses (`lmk.data.pairs`: the source name ``local`` resolves to this folder).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import sys
import sysconfig
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import bm25s
import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lmk.data.hub import bge_features, check_built_folder, ensure_built_folder
from lmk.data.retrieval import RetrievalCorpus
from lmk.run.umask_files import cache_root

log = logging.getLogger(__name__)

CACHE_VERSION = 3  # 2: a BGE-layout repo (parquet shards + card) instead of jsonl files; 3: BM25 ties by index
DEFAULT_PACKAGES: tuple[str, ...] = ("stdlib", "numpy", "scipy", "pandas", "sklearn")
SPLITS = ("train", "test")
TEST_FRACTION = 0.1
N_NEGATIVES = 7
_MINE_DEPTH = 30  # BM25 hits retrieved per query; negatives are sampled from the top 2 x N_NEGATIVES of them
_SKIP_DIRS = {
    "test", "tests", "testing", "site-packages", "idlelib", "lib2to3", "__pycache__", "ensurepip",
    "turtledemo", "_vendor", "vendored", "externals", "_build_utils",
}
_MIN_SUMMARY_WORDS, _MAX_SUMMARY_WORDS = 4, 40
_MIN_BODY_WORDS = 20
_MAX_BODY_CHARS = 3000
# The hub set's string columns, filled for the offline set (training reads only query / pos / neg / scores).
CATEGORY, TYPE = "retrieval", "normal"
PROMPT = "Given the summary line of a Python docstring, retrieve the rest of that docstring."
_CARD = """# Offline BGE-format training pairs (lmk)

Docstrings of the installed packages ({packages}): query = a docstring's summary line, pos = the rest of it,
neg = BM25 hard negatives mined within the split. Built by `lmk.data.offline_pairs`; no teacher scores.
"""


# ------------------------------------------------------------------------------------------ sources
def package_roots(packages: Sequence[str] = DEFAULT_PACKAGES) -> list[tuple[str, Path]]:
    """(name, folder) for each requested package that is installed ("stdlib" always is)."""
    roots = []
    for name in packages:
        if name == "stdlib":
            roots.append((name, Path(sysconfig.get_paths()["stdlib"])))
            continue
        spec = importlib.util.find_spec(name)  # top-level: finds without importing
        if spec is None or not spec.submodule_search_locations:
            log.info("offline pairs: package %s not installed, skipped", name)
            continue
        roots.append((name, Path(next(iter(spec.submodule_search_locations)))))
    return roots


def _versions(packages: Sequence[str]) -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    dist = {"sklearn": "scikit-learn"}
    for name in packages:
        if name == "stdlib":
            continue
        try:
            out[name] = importlib.metadata.version(dist.get(name, name))
        except importlib.metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def iter_source_files(root: Path) -> Iterator[Path]:
    """Python files under root, sorted, skipping test suites and vendored copies."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        for f in sorted(filenames):
            if f.endswith(".py") and not f.startswith("test_"):
                yield Path(dirpath) / f


def split_docstring(doc: str) -> tuple[str, str] | None:
    """(summary, body) of a cleaned docstring, or None when it is too short / not prose."""
    parts = re.split(r"\n\s*\n", doc.strip(), maxsplit=1)
    if len(parts) < 2:
        return None
    summary = " ".join(parts[0].split())
    body = parts[1].strip()
    n_summary = len(summary.split())
    if not _MIN_SUMMARY_WORDS <= n_summary <= _MAX_SUMMARY_WORDS:
        return None
    # signature lines ("foo(a, b) -> c"), reST directives and section underlines are not queries
    if "->" in summary or summary.startswith((".. ", ":", "---", "===")) or re.match(r"^[\w.]+\(.*\)$", summary):
        return None
    if len(body.split()) < _MIN_BODY_WORDS:
        return None
    if len(body) > _MAX_BODY_CHARS:
        body = body[:_MAX_BODY_CHARS].rsplit(None, 1)[0]
    return summary, body


def iter_docstrings(packages: Sequence[str] = DEFAULT_PACKAGES) -> Iterator[dict[str, str]]:
    """{"query", "pos", "source"} for every usable docstring, in a fixed order."""
    for name, root in package_roots(packages):
        for path in iter_source_files(root):
            try:
                src = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            if '"""' not in src and "'''" not in src:
                continue
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # invalid escape sequences in old sources
                    tree = ast.parse(src)
            except (SyntaxError, ValueError):
                continue
            rel = path.relative_to(root).as_posix()
            for node in ast.walk(tree):
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Module):
                    continue
                if getattr(node, "name", "").startswith("test"):
                    continue
                doc = ast.get_docstring(node)
                if not doc:
                    continue
                pair = split_docstring(doc)
                if pair is None:
                    continue
                yield {"query": pair[0], "pos": pair[1], "source": f"{name}/{rel}:{getattr(node, 'name', '<module>')}"}


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def _split_of(query: str, test_fraction: float) -> str:
    h = int(hashlib.sha1(_norm(query).encode()).hexdigest()[:8], 16)
    return "test" if (h % 10_000) < test_fraction * 10_000 else "train"


def bm25_scores(retriever: bm25s.BM25, tokens: Sequence[str], n_docs: int) -> np.ndarray:
    """BM25 score of one tokenized query against every indexed document; tokens the index never saw count for
    nothing (zeros when none is known: bm25s fails on an empty query)."""
    known = [t for t in tokens if t in retriever.vocab_dict]
    return retriever.get_scores(known) if known else np.zeros(n_docs, dtype=np.float32)


def top_hits(scores: np.ndarray, k: int) -> np.ndarray:
    """The indices of the `k` highest scores, highest first, a tie going to the lower index. The same on every CPU:
    bm25s's own top-k uses numpy's partition and sort kernels, which order tied scores by the CPU's SIMD (an AVX-512
    machine mined other negatives than an AVX2 one from the same scores, and so trained other models)."""
    k = min(k, len(scores))
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    kth = np.partition(scores, len(scores) - k)[len(scores) - k]  # a value: the same whichever tie sits there
    tied_or_above = np.flatnonzero(scores >= kth)  # ascending index; the stable sort keeps it among equal scores
    return tied_or_above[np.argsort(-scores[tied_or_above], kind="stable")][:k]


def mine_negatives(queries: list[str], docs: list[str], n_negatives: int, seed: int) -> list[list[int]]:
    """For query i (whose positive is docs[i]): n_negatives BM25 hard-negative doc indices != i."""
    n = len(docs)
    if n < 2 or n_negatives == 0:
        return [[] for _ in queries]
    k = min(n, _MINE_DEPTH + 1)
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(docs, stopwords="en", show_progress=False), show_progress=False)
    tokens = bm25s.tokenize(list(queries), stopwords="en", return_ids=False, show_progress=False)
    rng = np.random.default_rng(seed)
    out = []
    for i, toks in enumerate(tokens):
        cands = [int(j) for j in top_hits(bm25_scores(retriever, toks, n), k) if int(j) != i]
        top = cands[: 2 * n_negatives]  # the strongest hits (not only the top few: fewer false negatives), sampled
        take = min(n_negatives, len(top))
        out.append([top[j] for j in sorted(rng.choice(len(top), size=take, replace=False))] if take else [])
    return out


def build_offline_pairs(
    packages: Sequence[str] = DEFAULT_PACKAGES,
    max_rows: int | None = None,
    n_negatives: int = N_NEGATIVES,
    test_fraction: float = TEST_FRACTION,
    seed: int = 0,
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
    """Extract, deduplicate, split and mine. Returns ({split: records}, report)."""
    t0 = time.perf_counter()
    seen_q: set[str] = set()
    seen_p: set[str] = set()
    rows: dict[str, list[dict[str, str]]] = {s: [] for s in SPLITS}
    n_seen = 0
    for item in iter_docstrings(packages):
        n_seen += 1
        q, p = _norm(item["query"]), hashlib.sha1(_norm(item["pos"]).encode()).hexdigest()
        if q in seen_q or p in seen_p:  # re-exported / copied docstrings
            continue
        seen_q.add(q)
        seen_p.add(p)
        rows[_split_of(item["query"], test_fraction)].append(item)
        if max_rows is not None and sum(map(len, rows.values())) >= max_rows:
            break
    t_extract = time.perf_counter() - t0
    out: dict[str, list[dict[str, Any]]] = {}
    for split, items in rows.items():
        queries = [r["query"] for r in items]
        docs = [r["pos"] for r in items]
        negs = mine_negatives(queries, docs, n_negatives, seed)
        out[split] = [
            {"query": r["query"], "pos": [r["pos"]], "neg": [docs[j] for j in neg], "source": r["source"]}
            for r, neg in zip(items, negs, strict=True)
        ]
    words = sum(len(r["query"].split()) + len(r["pos"][0].split()) for v in out.values() for r in v)
    report = {
        "rows": {s: len(v) for s, v in out.items()},
        "docstrings_seen": n_seen,
        "words": words,
        "extract_s": round(t_extract, 2),
        "build_s": round(time.perf_counter() - t0, 2),
        "packages": _versions(packages),
    }
    return out, report


# -------------------------------------------------------------------------------------------- cache
def offline_fingerprint(
    packages: Sequence[str] = DEFAULT_PACKAGES, max_rows: int | None = None, n_negatives: int = N_NEGATIVES
) -> str:
    """What the set is built from: code version, Python and package versions, build knobs."""
    payload = {
        "v": CACHE_VERSION,
        "versions": _versions(packages),
        "packages": list(packages),
        "max_rows": max_rows,
        "n_negatives": n_negatives,
        "test_fraction": TEST_FRACTION,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def check_cache(folder: Path, fingerprint: str) -> str | None:
    """None when the cache folder is intact, else why it is not."""
    return check_built_folder(folder, fingerprint)


def ensure_offline_pairs(
    cache_dir: str | os.PathLike | None = None,
    packages: Sequence[str] = DEFAULT_PACKAGES,
    max_rows: int | None = None,
    rebuild: bool = False,
) -> Path:
    """The folder of a valid cached build (a BGE-layout dataset repo), building or rebuilding it when needed."""
    fp = offline_fingerprint(packages, max_rows)

    def build() -> tuple[dict[str, list[dict[str, Any]]], None, str, dict[str, Any]]:
        records, report = build_offline_pairs(packages, max_rows=max_rows)
        log.info("offline training set: %s rows in %.1f s", report["rows"], report["build_s"])
        rows = {s: [{**r, "category": CATEGORY, "type": TYPE, "prompt": PROMPT} for r in v] for s, v in records.items()}
        return rows, None, _CARD.format(packages=", ".join(packages)), report

    return ensure_built_folder(cache_root(cache_dir) / "offline_pairs" / fp, fp, build, rebuild, "offline training set")


def offline_report(cache_dir: str | os.PathLike | None = None, max_rows: int | None = None) -> dict[str, Any]:
    """The build report (rows per split, words, build seconds, package versions) of the cached set."""
    folder = ensure_offline_pairs(cache_dir, max_rows=max_rows)
    return json.loads((folder / "meta.json").read_text())["report"]


def load_offline_pairs(
    split: str = "train",
    max_rows: int | None = None,
    cache_dir: str | os.PathLike | None = None,
    rebuild: bool = False,
    packages: Sequence[str] = DEFAULT_PACKAGES,
) -> datasets.Dataset:
    """One split of the offline set as stored (the columns of `lmk.data.hub.BGE_COLUMNS`), cached.

    `max_rows` bounds the number of docstrings the build extracts (a smaller, separately cached set: for
    tests), not a slice of the full set. Training reads the same folder through `lmk.data.pairs.load_pairs`
    (source path ``local``), like any other BGE-format repo.
    """
    if split not in SPLITS:
        raise ValueError(f"offline pairs split {split!r} is not valid; allowed values: {', '.join(SPLITS)}")
    folder = ensure_offline_pairs(cache_dir, packages, max_rows, rebuild)
    table = pa.concat_tables(pq.read_table(f) for f in sorted((folder / "data").glob(f"{split}-*.parquet")))
    return datasets.Dataset.from_dict(table.to_pydict(), features=bge_features())


def offline_short_corpus(
    n_queries: int = 200, seed: int = 0, cache_dir: str | os.PathLike | None = None, max_rows: int | None = None,
    n_docs: int | None = None,
) -> RetrievalCorpus:
    """Held-out short retrieval task: test-split summaries -> their docstring bodies. Never overlaps the
    training split. Candidates: all test bodies, or (`n_docs`) the queries' own documents plus seeded
    distractors up to `n_docs` (a CPU-sized corpus)."""
    ds = load_offline_pairs("test", max_rows=max_rows, cache_dir=cache_dir)
    if ds.num_rows == 0:
        raise ValueError("the offline test split is empty; build with more rows (max_rows=None)")
    rng = np.random.default_rng(seed)
    pick = sorted(rng.choice(ds.num_rows, size=min(n_queries, ds.num_rows), replace=False))
    keep = set(int(i) for i in pick)
    if n_docs is not None and n_docs > len(keep):
        rest = np.array(sorted(set(range(ds.num_rows)) - keep))
        keep |= {int(i) for i in rng.choice(rest, size=min(n_docs - len(keep), len(rest)), replace=False)}
    elif n_docs is None:
        keep = set(range(ds.num_rows))
    corpus = [{"id": f"doc{i}", "text": r["pos"][0]} for i, r in enumerate(ds) if i in keep]
    queries = [{"id": f"q{i}", "text": ds[int(i)]["query"]} for i in pick]
    qrels = {f"q{i}": {f"doc{i}": 1} for i in pick}
    return RetrievalCorpus.from_records("LocalShort", "test", corpus, queries, qrels)
