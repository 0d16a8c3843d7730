"""Landmark statistics: how many landmarks the texts a run used keep, after insertion and truncation.

Counted by the landmark tokenizer the model itself uses (`LandmarkTokenizer`, or any object with its call, `strategy`,
`config()`; this layer does not import the model): the pooled positions of each row's `pool_mask` are its landmarks
(for `every_k` and `multi_cls` the positions they pool), so nothing here lays out a row a second time. Per text:

- landmarks: pooled positions after truncation to `max_length` (None for strategies that pool no marked position);
- truncated: the layout did not fit `max_length` (the same call one token longer gives a longer row);
- split replaced (`sentence` only): the sentence split was replaced by the whole text (`sentence_pieces`).

A summary gives mean / median / minimum / maximum landmarks, the share of texts with a single landmark, the share
truncated and, for `sentence`, the share replaced. `LandmarkTally` gathers them per key (task, split, side) over
several calls, up to `max_texts` texts per key (the first ones), and says how many it saw.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lmk.config.registry import strategies

WINDOW = 256  # texts per tokenizer call: the padded id tensors stay small
EVAL_TEXTS = 2000  # eval tasks: the first this many texts of each (task, split, side) are counted (cost bound)
DIGITS = 4  # shares and means in results.json


@dataclass
class LandmarkCounts:
    """Per text: landmarks kept (None: the strategy marks no pooled position), truncated, split replaced."""

    landmarks: np.ndarray | None
    truncated: np.ndarray
    replaced: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.truncated)

    def extend(self, other: LandmarkCounts) -> LandmarkCounts:
        def cat(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
            return None if a is None or b is None else np.concatenate([a, b])

        return LandmarkCounts(cat(self.landmarks, other.landmarks), np.concatenate([self.truncated, other.truncated]),
                              cat(self.replaced, other.replaced))


def _training_copy(tokenizer: Any) -> Any:
    """A tokenizer equal to `tokenizer` with its own chunk-size generator: counting training layouts (`variable`
    draws) must not move the generator the training batches draw from."""
    return type(tokenizer).from_config(tokenizer.tokenizer, tokenizer.config(),
                                       prefix_dir=getattr(tokenizer, "prefix_dir", None))


def count_landmarks(tokenizer: Any, texts: Sequence[str], max_length: int, train: bool = False) -> LandmarkCounts:
    """Landmarks, truncation and (sentence) split replacement of each text as `tokenizer(texts, train, max_length)`
    lays it out. `train=True` counts on a copy (its `variable` draws follow the seed, not the training batches')."""
    texts = list(texts)
    marks = strategies()[tokenizer.strategy]["marks_pooled"]
    tok = _training_copy(tokenizer) if train else tokenizer
    landmarks = np.zeros(len(texts), dtype=np.int64)
    truncated = np.zeros(len(texts), dtype=bool)
    for start in range(0, len(texts), WINDOW):
        part = texts[start:start + WINDOW]
        if train:
            tok.reseed(tokenizer.seed + start)  # the same draws for both calls of this window
        features = tok(part, train=train, max_length=max_length)
        landmarks[start:start + len(part)] = features["pool_mask"].sum(dim=1).numpy()
        full = features["attention_mask"].sum(dim=1).numpy() >= max_length
        if full.any():  # exactly full or cut: one token more of room tells which
            if train:
                tok.reseed(tokenizer.seed + start)
            longer = tok(part, train=train, max_length=max_length + 1)["attention_mask"].sum(dim=1).numpy()
            truncated[start:start + len(part)] = longer > max_length
    replaced = None
    if tokenizer.strategy == "sentence":
        replaced = np.fromiter((tok.sentence_pieces(t, train)[1] for t in texts), dtype=bool, count=len(texts))
    return LandmarkCounts(landmarks if marks else None, truncated, replaced)


def _share(flags: np.ndarray) -> float:
    return round(float(flags.mean()), DIGITS)


def summarize(counts: LandmarkCounts, seen: int | None = None) -> dict[str, Any]:
    """results.json's figures of `counts`; `seen`: texts there were (when only the first ones were counted)."""
    n = len(counts)
    out: dict[str, Any] = {"texts": n}
    if seen is not None and seen != n:
        out["texts_seen"] = seen  # counted: the first `texts` of them
    if n == 0:
        return out
    if counts.landmarks is None:
        out["landmarks"] = None  # the strategy pools no marked position (cls, mean)
    else:
        lm = counts.landmarks
        out["landmarks"] = {"mean": round(float(lm.mean()), DIGITS), "median": float(np.median(lm)),
                            "min": int(lm.min()), "max": int(lm.max())}
        out["single_landmark_share"] = _share(lm <= 1)
    out["truncated_share"] = _share(counts.truncated)
    if counts.replaced is not None:
        out["split_replaced_share"] = _share(counts.replaced)
    return out


def landmark_stats(tokenizer: Any, texts: Sequence[str], max_length: int, train: bool = False) -> dict[str, Any]:
    """`summarize(count_landmarks(...))`."""
    return summarize(count_landmarks(tokenizer, texts, max_length, train))


class LandmarkTally:
    """Counts gathered per key (e.g. (task, split, side)) over several calls, the first `max_texts` texts of each key."""

    def __init__(self, max_texts: int | None = None) -> None:
        self.max_texts = max_texts
        self._counts: dict[tuple[str, ...], LandmarkCounts] = {}
        self._seen: dict[tuple[str, ...], int] = {}

    def add(self, key: tuple[str, ...], tokenizer: Any, texts: Sequence[str], max_length: int,
            train: bool = False) -> None:
        done = len(self._counts[key]) if key in self._counts else 0
        self._seen[key] = self._seen.get(key, 0) + len(texts)
        room = len(texts) if self.max_texts is None else max(0, min(len(texts), self.max_texts - done))
        if room == 0 and key in self._counts:
            return
        counts = count_landmarks(tokenizer, list(texts)[:room], max_length, train)
        self._counts[key] = self._counts[key].extend(counts) if key in self._counts else counts

    def pop(self, first: str) -> dict[str, Any]:
        """The summaries of every key starting with `first`, nested by the rest of the key; forgotten here."""
        out: dict[str, Any] = {}
        for key in [k for k in self._counts if k[0] == first]:
            node = out
            for part in key[1:-1]:
                node = node.setdefault(part, {})
            node[key[-1]] = summarize(self._counts.pop(key), self._seen.pop(key))
        return out


def flat_summary(prefix: str, nested: Mapping[str, Any]) -> dict[str, float]:
    """`prefix/<key>/.../<figure>` -> number, for a W&B run summary (None and strings left out)."""
    out: dict[str, float] = {}
    for key, value in nested.items():
        name = f"{prefix}/{key}"
        if isinstance(value, Mapping):
            out.update(flat_summary(name, value))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = value
    return out


TRAIN_ROWS = 200  # training sources: the first this many rows of each (query, positives, negatives): cost bound


def _first_rows(dataset: Any, rows: int) -> list[Mapping[str, Any]]:
    out = []
    for row in dataset:  # a map-style Dataset or a stream: only the first rows are read
        if len(out) >= rows:
            break
        out.append(row)
    return out


def training_landmarks(sources: Mapping[str, Any], tokenizer: Any, query_max_length: int, passage_max_length: int,
                       rows: int = TRAIN_ROWS) -> dict[str, Any]:
    """Per training source (name -> BGE-format rows): the figures of its first `rows` rows' queries and passages
    (positives and negatives) laid out as training lays them out (`train=True`, the training max lengths)."""
    out: dict[str, Any] = {}
    for name, dataset in sources.items():
        part = _first_rows(dataset, rows)
        passages = [p for r in part for p in [*(r.get("pos") or []), *(r.get("neg") or [])]]
        out[name] = {"rows": len(part), "sample": f"the first {rows} rows",
                     "query": landmark_stats(tokenizer, [r["query"] for r in part], query_max_length, train=True),
                     "passage": landmark_stats(tokenizer, passages, passage_max_length, train=True)}
    return out
