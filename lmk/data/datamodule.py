"""`PairDataModule` (LightningDataModule) and `PairCollator`: contrastive training batches.

Per step each query gets one positive and ``group_size - 1`` hard negatives, drawn as the authors'
training collator draws them (`sample_group`: the first positive, negatives uniformly with replacement);
a query with no negatives at all gets random positives of other queries. Which rows an epoch visits, their order and the group members are all
drawn from generators seeded by ``(seed, epoch, ...)``, so two runs see the same batches, on any number
of DataLoader workers.

DDP: `EpochSampler` is a `DistributedSampler` subclass (so Lightning leaves it alone) that pads the
epoch to a multiple of the world size and gives rank r the items r, r+W, r+2W, ...: shards are
disjoint (up to the padding) and cover the epoch, and every rank has the same number of batches (a
must for the cross-device all_gather in the loss). Streaming sources are split by
`datasets.distributed.split_dataset_by_node` and repeat forever: use `trainer.max_steps`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import datasets
import lightning as L
import numpy as np
import torch
from datasets.distributed import split_dataset_by_node
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

from lmk.config.data import DataConfig, SourceConfig
from lmk.data.pairs import ReadStats, load_pairs, read_source, source_fingerprint

log = logging.getLogger(__name__)


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

    def __init__(self, sources: Sequence[datasets.Dataset], group_size: int, seed: int) -> None:
        self.sources = list(sources)
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


# ---------------------------------------------------------------------------------------- collator
class PairCollator:
    """Examples -> {"query": features, "passage": features, ["teacher_scores": FloatTensor[B, G]]}.

    Tokenizes through `LandmarkTokenizer(texts, train=True, max_length=...)`, so the `variable`
    strategy draws a chunk size per text. Its generator is reseeded from the batch's sample keys, so
    the draws are the same across runs whatever the worker count. A plain Hugging Face tokenizer also
    works (normal [CLS] ... [SEP] layout, pool_mask all False).
    """

    def __init__(self, tokenizer: Any, query_max_length: int = 128, passage_max_length: int = 512) -> None:
        if tokenizer is None:
            raise ValueError("PairCollator needs a tokenizer (a LandmarkTokenizer, e.g. model.tokenizer)")
        for key, value in (("query_max_length", query_max_length), ("passage_max_length", passage_max_length)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 2:
                raise ValueError(f"PairCollator {key}={value!r} is not valid; allowed values: an integer >= 2")
        self.tokenizer = tokenizer
        self.query_max_length = query_max_length
        self.passage_max_length = passage_max_length

    def _tokenize(self, texts: list[str], max_length: int) -> dict[str, torch.Tensor]:
        tok = self.tokenizer
        if hasattr(tok, "landmark_id"):
            return tok(texts, train=True, max_length=max_length)
        enc = tok(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        ids = enc["input_ids"]
        return {"input_ids": ids, "attention_mask": enc["attention_mask"], "pool_mask": torch.zeros_like(ids, dtype=torch.bool)}

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        if not examples:
            raise ValueError("PairCollator got an empty batch")
        sizes = {len(e["passages"]) for e in examples}
        if len(sizes) != 1:
            raise ValueError(f"examples have different group sizes {sorted(sizes)}; every group needs the same size")
        if hasattr(self.tokenizer, "reseed") and all("key" in e for e in examples):
            digest = hashlib.sha256(repr([tuple(e["key"]) for e in examples]).encode()).digest()
            self.tokenizer.reseed(int.from_bytes(digest[:4], "little"))
        queries = [e["query"] for e in examples]
        passages = [p for e in examples for p in e["passages"]]
        batch: dict[str, Any] = {
            "query": self._tokenize(queries, self.query_max_length),
            "passage": self._tokenize(passages, self.passage_max_length),
        }
        if all(e.get("scores") is not None for e in examples):
            batch["teacher_scores"] = torch.tensor([list(e["scores"]) for e in examples], dtype=torch.float32)
        return batch


# -------------------------------------------------------------------------------------- datamodule
class PairDataModule(L.LightningDataModule):
    """Training pairs from one or more weighted BGE-format sources (see `lmk.config.data.DataConfig`)."""

    def __init__(
        self,
        sources: Any = None,
        tokenizer: Any = None,
        collator: PairCollator | None = None,
        group_size: int = 4,
        batch_size: int = 16,
        query_max_length: int = 128,
        passage_max_length: int = 512,
        num_workers: int = 0,
        pin_memory: bool | None = None,
        seed: int = 0,
        skip_bad_rows: bool = False,
        max_rows: int | None = None,
        streaming: bool = False,
        drop_last: bool = True,
        shuffle_buffer: int = 10_000,
        cache_dir: str | None = None,
        world_size: int | None = None,
        rank: int | None = None,
    ) -> None:
        super().__init__()
        self.cfg = DataConfig(
            sources=[{"path": "local"}] if sources is None else sources,
            group_size=group_size,
            batch_size=batch_size,
            query_max_length=query_max_length,
            passage_max_length=passage_max_length,
            num_workers=num_workers,
            pin_memory=pin_memory,
            seed=seed,
            skip_bad_rows=skip_bad_rows,
            max_rows=max_rows,
            streaming=streaming,
            drop_last=drop_last,
            shuffle_buffer=shuffle_buffer,
            cache_dir=cache_dir,
        )
        if collator is None and tokenizer is not None:
            collator = PairCollator(tokenizer, query_max_length, passage_max_length)
        self.collator = collator
        self._world_size, self._rank = world_size, rank
        self.datasets: list[Any] | None = None
        self.read_stats: list[ReadStats | None] | None = None  # per source, after setup (None: streaming)
        self.train_set: PairDataset | StreamingPairDataset | None = None
        self._sampler: EpochSampler | None = None  # the training loader's (its position is checkpointed)
        self._sampler_state: Mapping[str, Any] | None = None  # from a checkpoint, applied to the next sampler

    # -------------------------------------------------------------------------------- properties
    @property
    def sources(self) -> list[SourceConfig]:
        return self.cfg.sources

    @property
    def fingerprint(self) -> str:
        """Hash of the sources' content ids and sizes plus the sampling config (for results.json)."""
        payload = {
            "sources": [
                {"id": source_fingerprint(s, self.cfg.max_rows), "weight": s.weight, "split": s.split, "name": s.name}
                for s in self.cfg.sources
            ],
            "sizes": None if self.datasets is None or self.cfg.streaming else [len(d) for d in self.datasets],
            "skipped": None if self.read_stats is None else [None if r is None else r.skipped for r in self.read_stats],
            "sampling": {
                k: getattr(self.cfg, k)
                for k in ("group_size", "batch_size", "query_max_length", "passage_max_length", "seed",
                          "max_rows", "skip_bad_rows", "streaming", "drop_last")
            },
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def rank_and_world(self) -> tuple[int, int]:
        if self._world_size is not None:
            return int(self._rank or 0), int(self._world_size)
        trainer = self.trainer
        if trainer is not None:
            return int(trainer.global_rank), int(trainer.world_size)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank(), torch.distributed.get_world_size()
        return 0, 1

    # ------------------------------------------------------------------------------------- setup
    def prepare_data(self) -> None:
        # Build caches (offline set, Arrow copies) once per node before the ranks read them.
        if not self.cfg.streaming:
            for s in self.cfg.sources:
                load_pairs(s, skip_bad_rows=self.cfg.skip_bad_rows, max_rows=self.cfg.max_rows, cache_dir=self.cfg.cache_dir)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        c = self.cfg
        loaded = [
            read_source(s, skip_bad_rows=c.skip_bad_rows, max_rows=c.max_rows, streaming=c.streaming, cache_dir=c.cache_dir)
            for s in c.sources
        ]
        self.datasets = [x.dataset for x in loaded]
        self.read_stats = [x.stats for x in loaded]
        if c.streaming:
            rank, world = self.rank_and_world()
            streams = self.datasets
            if len(streams) > 1:
                weights = np.array([s.weight for s in c.sources])
                stream = datasets.interleave_datasets(
                    streams, probabilities=list(weights / weights.sum()), seed=c.seed, stopping_strategy="all_exhausted"
                )
            else:
                stream = streams[0]
            if world > 1:
                stream = split_dataset_by_node(stream, rank=rank, world_size=world)
            self.train_set = StreamingPairDataset(stream, c.group_size, c.seed, rank, c.shuffle_buffer)
            return
        for s, d in zip(c.sources, self.datasets, strict=True):
            if len(d) == 0:
                raise ValueError(f"training source {s.name!r} ({s.path}) has no usable rows")
            log.info("training source %s: %d rows, weight %.2f", s.name, len(d), s.weight)
        self.train_set = PairDataset(self.datasets, c.group_size, c.seed)

    def sampler(self) -> EpochSampler:
        assert isinstance(self.train_set, PairDataset), "call setup() first (map-style sources)"
        rank, world = self.rank_and_world()
        sampler = EpochSampler(
            self.train_set.sizes, [s.weight for s in self.cfg.sources], seed=self.cfg.seed, num_replicas=world, rank=rank
        )
        if self._sampler_state is not None:  # resuming: continue the checkpoint's epoch where it stopped
            sampler.load_state_dict(self._sampler_state)
            self._sampler_state = None
        self._sampler = sampler
        return sampler

    def train_dataloader(self) -> DataLoader:
        if self.collator is None:
            raise ValueError(
                "PairDataModule has no tokenizer/collator; pass tokenizer= (instantiate(cfg.data, tokenizer=model.tokenizer))"
            )
        if self.train_set is None:
            self.setup("fit")
        c = self.cfg
        pin = torch.cuda.is_available() if c.pin_memory is None else c.pin_memory
        common = {
            "batch_size": c.batch_size,
            "collate_fn": self.collator,
            "num_workers": c.num_workers,
            "pin_memory": pin,
            "drop_last": c.drop_last,
            "persistent_workers": c.num_workers > 0,
        }
        if isinstance(self.train_set, StreamingPairDataset):
            return DataLoader(self.train_set, **common)
        sampler = self.sampler()
        if c.drop_last and len(sampler) < c.batch_size:
            raise ValueError(
                f"{len(sampler)} training rows per rank is fewer than batch_size={c.batch_size} with drop_last: "
                "lower batch_size, add data or set drop_last: false"
            )
        return DataLoader(self.train_set, sampler=sampler, **common)

    @property
    def report(self) -> dict[str, Any]:
        """Per source (after setup): rows kept, rows skipped as bad and the first reasons, for results.json.
        Streaming sources are validated lazily: their counts are only logged."""
        stats = self.read_stats or [None] * len(self.cfg.sources)
        return {
            s.name: {"path": s.path, "rows": r.rows, "skipped": r.skipped, "skip_reasons": r.reasons[:3]} if r is not None
            else {"path": s.path, "rows": None, "skipped": None, "skip_reasons": []}
            for s, r in zip(self.cfg.sources, stats, strict=True)
        }

    def state_dict(self) -> dict[str, Any]:
        """Saved in every checkpoint by Lightning: the data fingerprint and where the epoch's order stands.

        The collator/tokenizer need no state: every group and chunk-size draw is seeded from the batch's
        sample keys, so the same keys give the same batch after a resume."""
        state: dict[str, Any] = {"fingerprint": self.fingerprint}
        trainer = self.trainer
        if trainer is not None and self._sampler is not None:
            # Batches training has taken from this epoch (the one being checkpointed included).
            batches = trainer.fit_loop.epoch_loop.batch_progress.current.ready
            state["sampler"] = self._sampler.state_dict(batches * self.cfg.batch_size)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("fingerprint") not in (None, self.fingerprint):
            log.warning("resuming with different training data or sampling settings (fingerprint %s, was %s): "
                        "the batches will differ from the interrupted run's", self.fingerprint, state["fingerprint"])
        self._sampler_state = state.get("sampler")
