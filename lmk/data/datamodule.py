"""`PairDataModule` (LightningDataModule): contrastive training batches (collated by lmk.data.collator).

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
from collections.abc import Mapping, Sequence
from typing import Any

import datasets
import lightning as L
import numpy as np
import torch
from datasets.distributed import split_dataset_by_node
from torch.utils.data import DataLoader

from lmk.config.data import DataConfig, SourceConfig
from lmk.data.collator import PairCollator
from lmk.data.landmarks import training_landmarks
from lmk.data.pairs import ReadStats, load_pairs, read_source, source_fingerprint
from lmk.data.sampling import EpochSampler, PairDataset, StreamingPairDataset

log = logging.getLogger(__name__)

# -------------------------------------------------------------------------------------- datamodule
class PairDataModule(L.LightningDataModule):
    """Training pairs from one or more weighted BGE-format sources (see `lmk.config.data.DataConfig`)."""

    def __init__(
        self,
        cfg: DataConfig | Mapping[str, Any] | None = None,
        tokenizer: Any = None,
        collator: PairCollator | None = None,
        world_size: int | None = None,
        rank: int | None = None,
        **settings: Any,
    ) -> None:
        """`cfg`: the validated `data.*` section as it is; or its keys as keyword arguments (`batch_size=4`, what
        `instantiate(cfg.data)` passes), checked by the same schema (DataConfig)."""
        super().__init__()
        if cfg is not None and settings:
            raise TypeError(f"PairDataModule: give `cfg` or its keys ({', '.join(sorted(settings))}), not both")
        self.cfg: DataConfig = DataConfig.coerce(settings if cfg is None else cfg)
        # One prepare_data per run (global rank 0), not one per node: on a shared cache five nodes would build the
        # same Arrow copy at once, and a file lock cannot be trusted across nodes everywhere (Lustre mounted with
        # localflock). A node-local cache is built in setup() by that node's ranks, which lock within the node.
        self.prepare_data_per_node = False
        if collator is None and tokenizer is not None:
            collator = PairCollator(tokenizer, self.cfg.query_max_length, self.cfg.passage_max_length)
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
        # Build caches (offline set, Arrow copies) once, on global rank 0, before the ranks read them.
        log.info("prepare_data (once per job, global rank 0): %d source(s)", len(self.cfg.sources))
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
        self.train_set = PairDataset(self.datasets, c.group_size, c.seed, [s.query_prompt for s in c.sources])

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
                "PairDataModule has no tokenizer/collator; pass tokenizer= (instantiate(cfg.data, tokenizer=model.landmark_tokenizer))"
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

    def describe_keys(self, keys: Sequence[Sequence[int]]) -> list[str]:
        """Sample keys as `<source>:row <n> (key ...)` where the map-style view can locate them (else the key)."""
        out = []
        for key in keys:
            key = tuple(int(k) for k in key)
            if isinstance(self.train_set, PairDataset) and len(key) >= 3:
                src, row = self.train_set.locate(key[2])  # (seed, epoch, global index, [repeat])
                out.append(f"{self.cfg.sources[src].name}:row {row} (key {key})")
            else:
                out.append(f"key {key}")
        return out

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

    def landmark_report(self) -> dict[str, Any] | None:
        """Per source (after setup): landmark statistics of its first rows as the collator's landmark tokenizer lays
        them out in training (`lmk.data.landmarks.training_landmarks`); None without a landmark tokenizer."""
        tok = getattr(self.collator, "tokenizer", None)
        if self.datasets is None or not hasattr(tok, "landmark_id"):
            return None
        named = {s.name: d for s, d in zip(self.cfg.sources, self.datasets, strict=True)}
        return training_landmarks(named, tok, self.cfg.query_max_length, self.cfg.passage_max_length)

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
