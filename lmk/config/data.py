"""Structured config for the `data/` group: `DataConfig` (the PairDataModule's keys) and `SourceConfig`.

Both validate in `__post_init__`, so a bad value fails when the config is composed/validated, before any
file is read. `DataConfig.coerce(x)` accepts a dataclass, a DictConfig or a plain dict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from lmk.config.schema import Coercible, ConfigError, above, at_least, hash_neutral, plain

# Named sources: a name that resolves to a BGE-format folder built on first use (lmk.data.pairs.resolve_source).
# "local" is the offline default training set (lmk.data.offline_pairs); "replica:<name>" a local replica of a
# hub training set in its real layout (lmk.data.replica).
LOCAL_SOURCE = "local"
SPLITS_LOCAL = ("train", "test")
REPLICA_PREFIX = "replica:"
REPLICAS = ("bge-full-data",)


def is_named_source(path: str) -> bool:
    """True for `local` and `replica:<name>`: names that resolve to a folder built in the cache."""
    return path == LOCAL_SOURCE or path.startswith(REPLICA_PREFIX)


@dataclass
class SourceConfig(Coercible):
    """One training source in the BGE "full data" format.

    path: a local .jsonl / .jsonl.gz / .json / .parquet file; a folder (a local copy of a hub dataset, or a
      folder of such files); a `datasets` hub id (anything that is not an existing path); or a name that
      resolves to a folder built in the cache: ``local`` (the offline default set) or
      ``replica:bge-full-data`` (a replica of ``cfli/bge-full-data`` in its real layout).
    weight: sampling multiplier per epoch: 1.0 uses each row once, 0.5 a (seeded, per-epoch) half of
      the rows, 2.0 each row twice. Weights mix several sources (the BGE-M3 recipe).
    split / data_files / subset / revision: passed to `datasets.load_dataset` for hub ids and folders alike
      (``data_files`` patterns are relative to the folder or repo root).
    query_prompt: an instruction put before every query of this source (not its passages), e.g. the authors'
      decoder format "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery: ";
      it gets no landmark (lmk.model.landmark.layouts.with_prompt). null: none. Map-style sources only.
    """

    @classmethod
    def _prepare(cls, cfg: Any) -> Any:
        return {"path": cfg} if isinstance(cfg, str) else cfg  # a bare path / hub id is a one-key source

    section: ClassVar[str] = "data.sources"
    path: str = LOCAL_SOURCE
    weight: float = above(0, 1.0)
    split: str = "train"
    name: str | None = None
    data_files: Any = None
    subset: str | None = None
    revision: str | None = None
    query_prompt: str | None = hash_neutral(None, config_hash=False)  # (unset, a source keeps its data fingerprint)

    def __post_init__(self) -> None:
        if self.query_prompt is not None and not isinstance(self.query_prompt, str):
            raise ConfigError(f"data.sources.query_prompt={self.query_prompt!r} must be a string (an instruction "
                              "before each query) or null")
        if not isinstance(self.path, str) or not self.path.strip():
            raise ConfigError(
                f"data.sources.path={self.path!r} is not valid; allowed values: a file path, "
                f"{LOCAL_SOURCE!r} (offline default set) or a hub id such as 'cfli/bge-full-data'"
            )
        self.check_fields()
        self.weight = float(self.weight)
        if not isinstance(self.split, str) or not self.split:
            raise ConfigError(f"data.sources.split={self.split!r} is not valid; allowed values: a split name")
        if self.path == LOCAL_SOURCE and self.split not in SPLITS_LOCAL:
            raise ConfigError(
                f"data.sources.split={self.split!r} is not valid for the local source; allowed values: "
                f"{', '.join(SPLITS_LOCAL)}"
            )
        if self.path.startswith(REPLICA_PREFIX) and self.path[len(REPLICA_PREFIX):] not in REPLICAS:
            raise ConfigError(
                f"data.sources.path={self.path!r} is not valid; allowed replicas: "
                f"{', '.join(REPLICA_PREFIX + r for r in REPLICAS)}"
            )
        if self.name is None:
            self.name = self.path if self.path == LOCAL_SOURCE else self.path.rstrip("/").split("/")[-1]


@dataclass
class DataConfig(Coercible):
    """Keys of `conf/data/*.yaml` (PairDataModule's arguments except the tokenizer / collator)."""

    section: ClassVar[str] = "data"
    _target_: str = "lmk.data.datamodule.PairDataModule"
    sources: Any = field(default_factory=lambda: [{"path": LOCAL_SOURCE}])
    group_size: int = at_least(1, 4)
    batch_size: int = at_least(1, 16)
    query_max_length: int = at_least(2, 128)
    passage_max_length: int = at_least(2, 512)
    num_workers: int = at_least(0, 0)
    pin_memory: bool | None = None  # null: on when CUDA is available
    seed: int | None = at_least(0, 0)  # data order and groups; null in a config: the root `seed`
    skip_bad_rows: bool = False
    max_rows: int | None = at_least(1, None)
    streaming: bool = False
    drop_last: bool = True
    shuffle_buffer: int = at_least(1, 10_000)
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        sources = plain(self.sources)
        if isinstance(sources, str | dict):
            sources = [sources]
        if not isinstance(sources, list) or not sources:
            raise ConfigError(
                f"data.sources={self.sources!r} is not valid; allowed values: a non-empty list of "
                "sources ({path, weight, split, name})"
            )
        self.sources = [SourceConfig.coerce(s, f"data.sources[{i}]") for i, s in enumerate(sources)]
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise ConfigError(f"data.sources: duplicate source names {names}; give each a distinct `name`")
        if self.streaming and any(s.query_prompt for s in self.sources):
            # an interleaved stream does not say which source a row came from
            raise ConfigError("data.sources.query_prompt needs map-style sources; set data.streaming=false or drop "
                              "the query_prompt")
        if self.seed is None:  # a group file used without lmk.config.derive_seeds (which sets the root seed)
            self.seed = 0
        self.check_fields()
        if self._target_ != "lmk.data.datamodule.PairDataModule":
            raise ConfigError(
                f"data._target_={self._target_!r} is not valid; allowed values: lmk.data.datamodule.PairDataModule"
            )
