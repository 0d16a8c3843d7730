"""Token lengths of a training job's texts, for the cost estimate: each query's and passage's tokens as the job lays
them out (its leading token, the row's landmarks, cut at the max length), from one of two places, named on every
figure that uses them:

    measured   the first `SAMPLE_ROWS` rows of the source, read where the job would read them (a local file or
               folder, the offline set, a replica, a hub dataset already in the cache or mirror), tokenized by the
               row's own landmark tokenizer (`train=True`: the variable strategy's draws, the sentence splits);
               the length histogram is cached in lmk's cache folder per (source, tokenizer, max lengths, layout)
    profile    a published statistic of the same texts shipped in lmk/resources/length_profiles.json (characters,
               at CHARS_PER_TOKEN, a log-normal shape), with landmarks added by the strategy's arithmetic:
               approximate, and said so

A source with neither gives no lengths (None): the estimate then has the padded figure only.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

from lmk.model.landmark.names import STRATEGY_TRAITS
from lmk.run.umask_files import cache_root, write_json
from lmk.sweep.cost.index import TOKENS_PER_SENTENCE

CHARS_PER_TOKEN = 4.0  # English BPE / WordPiece: about 4 characters per token (the eval stage's figure too)
SAMPLE_ROWS = 512  # rows of a source measured: its queries, and its passages as a training group takes them
PROFILE_POINTS = 4096  # texts a profile stands for (its quantiles at evenly spaced probabilities)
CACHE_VERSION = 1


@dataclass(frozen=True)
class Lengths:
    """Tokens per query and per passage of a job (one entry per text), and where they come from."""

    queries: np.ndarray
    passages: np.ndarray
    kind: str  # measured | profile
    source: str  # in words: what was read or which profile, and how
    cached: bool = False  # read back from lmk's cache (measured only)

    def stats(self) -> str:
        q, p = self.queries, self.passages
        return (f"queries mean {q.mean():.1f} (p90 {np.percentile(q, 90):.0f}, max {q.max()}), passages mean "
                f"{p.mean():.1f} (p90 {np.percentile(p, 90):.0f}, max {p.max()}) tokens")


# ------------------------------------------------------------------------------------------------ layouts
def laid_out(content: np.ndarray, pooling: Mapping[str, Any], max_length: int) -> np.ndarray:
    """Tokens of texts of `content` tokens each as the strategy lays them out for training, cut at `max_length`:
    the leading token, then a landmark after each chunk (the variable strategy: its training chunk sizes, on
    average) or each sentence (~TOKENS_PER_SENTENCE), else a closing SEP."""
    strategy = str(pooling.get("strategy") or "none")
    c = np.maximum(np.asarray(content, dtype=np.float64), 1.0)
    if strategy == "variable":
        sizes = [int(s) for s in pooling.get("train_chunk_sizes") or [pooling.get("chunk_size") or 32]]
        marks = np.mean([np.ceil(c / s) for s in sizes], axis=0)  # each text draws one size
    elif STRATEGY_TRAITS.get(strategy, {}).get("chunked") and strategy != "every_k":
        marks = np.ceil(c / int(pooling.get("chunk_size") or 32))
    elif strategy == "sentence":
        marks = np.ceil(c / TOKENS_PER_SENTENCE)
    else:  # [CLS] text [SEP]
        marks = np.ones_like(c)
    return np.minimum(np.ceil(1 + c + marks), max_length).astype(np.int64)


# ------------------------------------------------------------------------------------------------ profiles
def _profiles() -> dict[str, Any]:
    return json.loads(resources.files("lmk.resources").joinpath("length_profiles.json").read_text("utf-8"))


def profile_for(source: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The shipped profile (name, entry) whose `matches` the source's path and data_files contain; None: no profile."""
    for name, entry in _profiles().items():
        match = entry.get("matches") if isinstance(entry, dict) else None
        if match and all(str(v) in str(source.get(k) or "") for k, v in match.items()):
            return name, entry
    return None


def _lognormal_chars(side: Mapping[str, Any], points: int) -> np.ndarray:
    """Characters per text at `points` evenly spaced quantiles of a log-normal with the published mean whose
    spread puts the longest of `count` texts (its 1 - 1/count quantile) at the published maximum, clipped to
    the published minimum and maximum."""
    mean, lo, hi, n = (float(side[k]) for k in ("mean_chars", "min_chars", "max_chars", "count"))
    z = NormalDist().inv_cdf(1.0 - 1.0 / max(n, 2.0))
    ratio = math.log(max(hi / mean, 1.0 + 1e-9))  # ln(max / mean) = sigma z - sigma^2 / 2
    sigma = z - math.sqrt(max(z * z - 2.0 * ratio, 0.0))
    mu = math.log(mean) - sigma * sigma / 2.0
    probs = (np.arange(points) + 0.5) / points
    quantiles = np.array([NormalDist(mu, sigma).inv_cdf(float(p)) for p in probs]) if sigma > 0 else np.full(points, mu)
    return np.clip(np.exp(quantiles), lo, hi)


def profile_lengths(source: Mapping[str, Any], pooling: Mapping[str, Any], query_max_length: int,
                    passage_max_length: int, points: int = PROFILE_POINTS) -> Lengths | None:
    found = profile_for(source)
    if found is None:
        return None
    name, entry = found
    q = laid_out(_lognormal_chars(entry["query"], points) / CHARS_PER_TOKEN, pooling, query_max_length)
    p = laid_out(_lognormal_chars(entry["passage"], points) / CHARS_PER_TOKEN, pooling, passage_max_length)
    return Lengths(q, p, "profile", f"profile {name!r}, not a measurement (approximate: {entry['source']}; "
                   f"{CHARS_PER_TOKEN:g} characters per token, log-normal shape, landmarks by the strategy's arithmetic)")


# ------------------------------------------------------------------------------------------------ measured
def _histogram(lengths: np.ndarray) -> dict[str, int]:
    values, counts = np.unique(lengths, return_counts=True)
    return {str(int(v)): int(c) for v, c in zip(values, counts, strict=True)}


def _expand(hist: Mapping[str, int]) -> np.ndarray:
    return np.repeat(np.array([int(k) for k in hist], dtype=np.int64), [int(v) for v in hist.values()])


def cache_path(key: Mapping[str, Any], cache_dir: str | Path | None = None) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return cache_root(cache_dir) / "token-lengths" / f"{digest}.json"


def tokenized_lengths(tokenizer: Any, texts: Sequence[str], max_length: int, batch: int = 256) -> np.ndarray:
    """Tokens per text as `tokenizer` (a LandmarkTokenizer: `train=True`; a plain one: truncated) lays them out."""
    out: list[np.ndarray] = []
    for i in range(0, len(texts), batch):
        part = list(texts[i:i + batch])
        if hasattr(tokenizer, "landmark_id"):
            enc = tokenizer(part, train=True, max_length=max_length)
        else:
            enc = tokenizer(part, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        out.append(enc["attention_mask"].sum(dim=1).numpy().astype(np.int64))
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def measure_rows(rows: Sequence[Mapping[str, Any]], tokenizer: Any, query_max_length: int, passage_max_length: int,
                 group_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Token lengths of BGE-format rows: each query, and each row's passages as a training group takes them (its
    first positive and `group_size` - 1 negatives)."""
    queries = [str(r["query"]) for r in rows]
    passages = [str(p) for r in rows for p in [*(r.get("pos") or [])[:1], *(r.get("neg") or [])[:group_size - 1]]]
    return (tokenized_lengths(tokenizer, queries, query_max_length),
            tokenized_lengths(tokenizer, passages, passage_max_length))


def measure_source(source: Mapping[str, Any], tokenizer: Any, key: Mapping[str, Any], query_max_length: int,
                   passage_max_length: int, group_size: int, rows: int = SAMPLE_ROWS,
                   cache_dir: str | Path | None = None) -> Lengths:
    """The measured lengths of the first `rows` rows of a readable `source` (lmk.data.pairs), cached under `key`
    (what identifies the source, the tokenizer and the layout) with the max lengths, group size and row count."""
    full = {**dict(key), "query_max_length": query_max_length, "passage_max_length": passage_max_length,
            "group_size": group_size, "rows": rows, "version": CACHE_VERSION}
    path = cache_path(full, cache_dir)
    if path.is_file():
        try:
            data = json.loads(path.read_text())
            return Lengths(_expand(data["query"]), _expand(data["passage"]), "measured", data["source"], cached=True)
        except (OSError, KeyError, ValueError):
            pass  # a damaged entry: measure again and rewrite it
    from lmk.data.pairs import load_pairs  # the data stack only when a source is measured

    taken = []
    for row in load_pairs(dict(source), streaming=True):
        if len(taken) >= rows:
            break
        taken.append(row)
    q, p = measure_rows(taken, tokenizer, query_max_length, passage_max_length, group_size)
    if not len(q) or not len(p):
        raise ValueError(f"source {source.get('path')!r}: no rows to measure")
    where = (f"measured: the first {len(taken)} rows of {source.get('path')} ({len(q)} queries, {len(p)} passages), "
             f"tokenized by the row's landmark tokenizer ({key.get('tokenizer')}), cached in {path.parent}")
    write_json(path, {"key": full, "source": where, "query": _histogram(q), "passage": _histogram(p)})
    return Lengths(q, p, "measured", where)


# ------------------------------------------------------------------------------------------------ a job's
def _readable(source: Mapping[str, Any]) -> str | None:
    """Why a source cannot be read here (None: it can): a local path, a named source (built on first use) or a
    hub dataset the cache or the mirror holds."""
    # loaded when a job is sized: the sweep driver imports lmk.sweep.cost without the data and model stacks
    from lmk.config.data import LOCAL_SOURCE, REPLICA_PREFIX
    from lmk.hub.artifacts import Artifact, locate  # (as above)
    from lmk.hub.offline import is_hub_id  # (as above)

    path = str(source.get("path") or LOCAL_SOURCE)
    if path == LOCAL_SOURCE or path.startswith(REPLICA_PREFIX) or Path(path).expanduser().exists():
        return None
    if is_hub_id(path) and locate(Artifact("dataset", path, source.get("revision"), source.get("subset"),
                                           source.get("data_files"))) is not None:
        return None
    return f"{path} is not on disk here (no hub cache or mirror copy)"


def _landmark_tokenizer(c: Mapping[str, Any]) -> tuple[Any, str]:
    """The row's landmark tokenizer as its job builds it (the encoder's tokenizer, the pooling's layout)."""
    # loaded when a job is sized: the sweep driver imports lmk.sweep.cost without the data and model stacks
    from lmk.config.model import EncoderConfig, PoolingConfig
    from lmk.model.backbone import load_tokenizer, package_model_path  # (as above)
    from lmk.model.landmark.tokenization import LandmarkTokenizer  # (as above)

    enc = EncoderConfig.coerce(c["encoder"])
    spec = enc.tokenizer or (package_model_path(enc.package) if enc.source == "package" else enc.model_id)
    tok = load_tokenizer(str(spec), enc.max_positions, enc)
    pool = PoolingConfig.coerce(c["pooling"])
    landmark = LandmarkTokenizer(tok, strategy=pool.strategy, chunk_size=pool.chunk_size,
                                 train_chunk_sizes=tuple(pool.train_chunk_sizes), seed=0, language=pool.language,
                                 sentence_splitter=pool.sentence_splitter, max_sentence_tokens=pool.max_sentence_tokens,
                                 placement=pool.placement)
    return landmark, str(spec)


def _pooling(c: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("strategy", "chunk_size", "train_chunk_sizes", "language", "sentence_splitter", "max_sentence_tokens",
            "placement")
    pooling = c.get("pooling") or {}
    return {k: (list(v) if isinstance(v, Sequence) and not isinstance(v, str) else v)
            for k in keys if (v := pooling.get(k)) is not None}


def _source_lengths(src: Mapping[str, Any], c: Mapping[str, Any], q_max: int, p_max: int, group: int,
                    cache_dir: str | Path | None) -> tuple[Lengths | None, str]:
    """One source's lengths: measured where it can be read here and its tokenizer loads, else its profile."""
    why = _readable(src)
    if why is None:
        try:
            tokenizer, name = _landmark_tokenizer(c)
            from lmk.data.pairs import source_fingerprint  # the data stack only when a source is measured

            key = {"source": source_fingerprint(dict(src)), "tokenizer": name, "pooling": _pooling(c)}
            return measure_source(src, tokenizer, key, q_max, p_max, group, cache_dir=cache_dir), ""
        except Exception as err:  # noqa: BLE001 - any failure to read or tokenize falls back to the profile, said
            why = f"{src.get('path')} not measured ({type(err).__name__}: {str(err)[:160]})"
    return profile_lengths(src, _pooling(c), q_max, p_max), why


def job_lengths(c: Mapping[str, Any], cache_dir: str | Path | None = None) -> tuple[Lengths | None, str]:
    """A training job's lengths (its sources mixed by weight) and why any source was not measured; None where a
    source has neither a readable copy nor a profile."""
    data = c.get("data") or {}
    q_max, p_max, group = int(data["query_max_length"]), int(data["passage_max_length"]), int(data["group_size"])
    # loaded when a job is sized: the sweep driver imports lmk.sweep.cost without the data and model stacks
    from lmk.hub.artifacts import data_sources

    parts, whys = [], []
    for src in data_sources(data):
        lengths, why = _source_lengths(src, c, q_max, p_max, group, cache_dir)
        whys += [why] if why else []
        if lengths is None:
            return None, "; ".join([*whys, f"{src.get('path')}: no length profile (lmk/resources/length_profiles.json)"])
        parts.append((float(src.get("weight") or 1.0), lengths))
    if len(parts) == 1:
        return parts[0][1], "; ".join(whys)
    total = sum(w for w, _ in parts)  # mixed by weight: each source's share of a fixed number of texts
    q = np.concatenate([np.resize(x.queries, max(1, round(PROFILE_POINTS * w / total))) for w, x in parts])
    p = np.concatenate([np.resize(x.passages, max(1, round(PROFILE_POINTS * w / total))) for w, x in parts])
    kinds = sorted({x.kind for _, x in parts})
    return Lengths(q, p, "+".join(kinds), "; ".join(x.source for _, x in parts)), "; ".join(whys)
