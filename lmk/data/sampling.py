"""What one training step sees: the group of each query (`sample_group`), the seeded order of an epoch over
weighted sources sharded by rank (`EpochSampler`, map-style `PairDataset`), and the endless shuffled stream of
streaming sources (`StreamingPairDataset`). Every draw comes from a generator seeded by ``(seed, epoch, ...)``,
so two runs see the same batches on any number of DataLoader workers, and a resumed run continues exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import datasets
import numpy as np
import torch
from torch.utils.data import DistributedSampler, IterableDataset


def _rng(*keys: int) -> np.random.Generator:
    return np.random.default_rng([int(k) for k in keys])


# ------------------------------------------------------------------------------------------ groups
SAMPLING_MODES = ("authors", "flagembedding")


def sample_group(
    record: Mapping[str, Any],
    group_size: int,
    rng: np.random.Generator,
    random_negatives: Sequence[str] = (),
    mode: str = "authors",
) -> dict[str, Any]:
    """One positive + (group_size - 1) negatives of a record, with their teacher scores when present.

    mode "authors" (the LMK authors' training collator, DistilEmbedCollator): the FIRST positive, and the
    negatives drawn uniformly WITH replacement (`random.choices`), however many the record has.
    mode "flagembedding" (upstream FlagEmbedding's dataset): a random positive, negatives without
    replacement; a record with too few repeats its list, then samples, so every negative appears before
    any appears twice. Returns {"query", "passages" (group_size texts, positive first), "scores" (list or None)}.
    """
    if mode not in SAMPLING_MODES:
        raise ValueError(f"sampling mode {mode!r} is not valid; allowed values: {', '.join(SAMPLING_MODES)}")
    pos, neg = record["pos"], record["neg"]
    pos_scores, neg_scores = record.get("pos_scores") or [], record.get("neg_scores") or []
    p = 0 if mode == "authors" else int(rng.integers(len(pos)))
    passages = [pos[p]]
    scores: list[float] | None = [float(pos_scores[p])] if pos_scores and neg_scores else None
    n = group_size - 1
    if n > 0:
        if neg:
            if mode == "authors":
                idx = rng.integers(len(neg), size=n)
            elif len(neg) >= n:
                idx = rng.choice(len(neg), size=n, replace=False)
            else:  # too few: repeat the list so each appears before any repeats, then sample
                reps = math.ceil(n / len(neg))
                idx = rng.permutation(np.tile(np.arange(len(neg)), reps))[:n]
            passages += [neg[i] for i in idx]
            if scores is not None:
                scores += [float(neg_scores[i]) for i in idx]
        else:
            # The authors' collator adds no negative here (a short group); lmk keeps the group size.
            if not random_negatives:
                raise ValueError(
                    f"query {record['query']!r:.60} has no negatives and there are no other passages to "
                    "draw random negatives from; add 'neg' lists or set group_size: 1"
                )
            idx = rng.integers(len(random_negatives), size=n)
            passages += [random_negatives[i] for i in idx]
            scores = None
    return {"query": record["query"], "passages": passages, "scores": scores}


class PairDataset(torch.utils.data.Dataset):
    """Map-style view of several sources; item keys are ``(epoch, global_index[, repeat])`` (from `EpochSampler`)."""

    def __init__(self, sources: Sequence[datasets.Dataset], group_size: int, seed: int,
                 query_prompts: Sequence[str | None] | None = None) -> None:
        self.sources = list(sources)
        # per source: the instruction before its queries (the collator tokenizes it without landmarks)
        self.query_prompts = list(query_prompts or [None] * len(self.sources))
        self.sizes = [len(s) for s in self.sources]
        self.offsets = np.cumsum([0] + self.sizes)
        self.group_size = group_size
        self.seed = seed

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def locate(self, index: int) -> tuple[int, int]:
        src = int(np.searchsorted(self.offsets, index, side="right") - 1)
        return src, index - int(self.offsets[src])

    def __getitem__(self, key: int | tuple[int, ...]) -> dict[str, Any]:
        epoch, index, *repeat = key if isinstance(key, tuple) else (0, key)
        src, row = self.locate(index)
        record = self.sources[src][row]
        rng = _rng(self.seed, epoch, index, *repeat)
        pool: list[str] = []
        if not record["neg"] and self.group_size > 1:
            pool = self._random_pool(src, row, rng)
        out = sample_group(record, self.group_size, rng, pool)
        out["key"] = (self.seed, epoch, index, *repeat)
        if self.query_prompts[src]:
            out["query_prompt"] = self.query_prompts[src]
        return out

    def _random_pool(self, src: int, row: int, rng: np.random.Generator) -> list[str]:
        """Positives of a few other rows of the same source (random negatives)."""
        size = self.sizes[src]
        if size < 2:
            return []
        others = [int(j) for j in rng.choice(size, size=min(size, 2 * self.group_size), replace=False) if j != row]
        return [self.sources[src][j]["pos"][0] for j in others[: self.group_size]]


class EpochSampler(DistributedSampler):
    """Seeded per-epoch order over weighted sources, sharded by rank; yields ``(epoch, index)`` keys.

    A source of size n and weight w contributes floor(w) full passes plus a seeded sample of
    round((w - floor(w)) * n) rows per epoch.
    """

    def __init__(
        self,
        sizes: Sequence[int],
        weights: Sequence[float] | None = None,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
        shuffle: bool = True,
    ) -> None:
        # DistributedSampler.__init__ would query torch.distributed; set its fields ourselves.
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not valid for world size {num_replicas}; allowed: 0..{num_replicas - 1}")
        self.sizes = [int(s) for s in sizes]
        self.weights = [1.0] * len(self.sizes) if weights is None else [float(w) for w in weights]
        self.seed = seed
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.epoch = 0
        self.drop_last = False
        self.offsets = np.cumsum([0] + self.sizes)
        self.total_size = sum(self._count(i) for i in range(len(self.sizes)))
        self.num_samples = math.ceil(self.total_size / num_replicas) if self.total_size else 0
        self._resume: tuple[int, int] | None = None  # (epoch, items of it this rank already consumed)

    def _count(self, i: int) -> int:
        w = self.weights[i]
        return int(math.floor(w)) * self.sizes[i] + int(round((w - math.floor(w)) * self.sizes[i]))

    def epoch_keys(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """The whole epoch's global indices (all ranks), padded to a multiple of the world size, and
        each item's repeat number (pass p of a source with weight >= 2 has repeat p)."""
        parts, reps = [], []
        for i, (size, w) in enumerate(zip(self.sizes, self.weights, strict=True)):
            base = np.arange(size) + self.offsets[i]
            for p in range(int(math.floor(w))):
                parts.append(base)
                reps.append(np.full(size, p))
            frac = int(round((w - math.floor(w)) * size))
            if frac:
                parts.append(np.sort(_rng(self.seed, epoch, 7919, i).choice(base, size=frac, replace=False)))
                reps.append(np.full(frac, int(math.floor(w))))
        idx = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        rep = np.concatenate(reps) if reps else np.zeros(0, dtype=np.int64)
        if self.shuffle:
            perm = _rng(self.seed, epoch).permutation(len(idx))
            idx, rep = idx[perm], rep[perm]
        pad = self.num_samples * self.num_replicas - len(idx)
        if pad and len(idx):
            idx, rep = np.concatenate([idx, np.resize(idx, pad)]), np.concatenate([rep, np.resize(rep, pad)])
        return idx, rep

    def epoch_indices(self, epoch: int) -> np.ndarray:
        """The whole epoch's global indices (all ranks), padded to a multiple of the world size."""
        return self.epoch_keys(epoch)[0]

    def __iter__(self) -> Iterator[tuple[int, ...]]:
        epoch = self.epoch
        idx, rep = self.epoch_keys(epoch)
        start = 0
        if self._resume is not None and self._resume[0] == epoch:
            start, self._resume = self._resume[1], None  # one-shot: the next epoch starts at 0
        # A row repeated within an epoch (weight >= 2) draws a fresh group per repeat: the repeat number
        # joins the item key (and so the seed); first passes keep the plain (epoch, index) key.
        mine = zip(idx[self.rank :: self.num_replicas], rep[self.rank :: self.num_replicas], strict=True)
        for n, (i, r) in enumerate(mine):
            if n >= start:
                yield (epoch, int(i)) if r == 0 else (epoch, int(i), int(r))

    def state_dict(self, consumed: int) -> dict[str, int]:
        """Where this epoch stands after `consumed` items per rank (the sampler runs ahead of training:
        DataLoader prefetch, so the caller counts what training consumed)."""
        return {"seed": self.seed, "epoch": int(self.epoch), "consumed": int(consumed) * self.num_replicas}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Continue `state`'s epoch after the items already consumed: the order is a function of
        (seed, epoch), so skipping them gives exactly the batches an uninterrupted run sees."""
        if int(state["seed"]) != self.seed:
            raise ValueError(f"the checkpoint's data order has seed {state['seed']}, this run {self.seed}: resume "
                             "with the same seed/data.seed, or start over without ckpt_path")
        self.epoch = int(state["epoch"])
        self._resume = (self.epoch, int(state["consumed"]) // self.num_replicas)  # global count: any world size

    def __len__(self) -> int:
        return self.num_samples


class StreamingPairDataset(IterableDataset):
    """Endless stream of groups from (interleaved) streaming sources, shuffled per epoch with a buffer."""

    def __init__(
        self, stream: datasets.IterableDataset, group_size: int, seed: int, rank: int, shuffle_buffer: int
    ) -> None:
        self.stream = stream
        self.group_size = group_size
        self.seed = seed
        self.rank = rank
        self.shuffle_buffer = shuffle_buffer

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = torch.utils.data.get_worker_info()
        worker = info.id if info is not None else 0
        recent: list[str] = []  # positives seen lately: random negatives for rows without any
        pending: list[tuple[dict, int]] = []
        epoch = 0
        while True:
            stream = self.stream.shuffle(seed=self.seed, buffer_size=self.shuffle_buffer)
            stream.set_epoch(epoch)
            n = -1
            for n, record in enumerate(stream):
                key = (self.seed, epoch, self.rank, worker, n)
                recent = (recent + [record["pos"][0]])[-256:]
                if not record["neg"] and self.group_size > 1 and len(recent) < 2:
                    pending.append((record, n))
                    continue
                for rec, m in [*pending, (record, n)]:
                    rng = _rng(self.seed, epoch, self.rank, worker, m)
                    pool = [p for p in recent if p not in rec["pos"]]
                    out = sample_group(rec, self.group_size, rng, pool)
                    out["key"] = key
                    yield out
                pending = []
            if n < 0:
                if worker > 0:
                    # `datasets` gives DataLoader workers whole shards; with more workers than shards (a hub
                    # stream or one file is a single shard) the extra workers get none: they just stop.
                    return
                raise ValueError("streaming training data is empty on this rank/worker")
            epoch += 1
