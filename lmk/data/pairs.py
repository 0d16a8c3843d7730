"""Reading and validating training pairs in the BGE "full data" format.

One record per query: ``{"query": str, "pos": [str, ...], "neg": [str, ...],
"pos_scores": [float, ...], "neg_scores": [float, ...]}`` (scores optional; ``neg`` may be absent).
Every record is checked; a bad one raises `PairDataError` naming the file and line (or the hub id and
row), or is counted and skipped when ``skip_bad_rows=True``. Records are normalised to the fixed schema
`FEATURES` (absent scores / negatives become empty lists) so Arrow can store them.

One path for every source (`read_source`): a named source (``local``: the offline default set;
``replica:bge-full-data``: a replica of the paper's training set) first resolves to the BGE-format folder it
stands for (built in the cache on first use); a folder or a hub id is then read by
`datasets.load_dataset(path, name=subset, split=split, data_files=data_files)`, so a local copy of a hub repo
honours the same keys as the repo; a single file is read row by row here (errors name the line). Rows go
through the validator into `datasets.Dataset.from_generator`, keyed by our fingerprint of the source (file
path, size, head/tail bytes; subset / split / data_files): the validated Arrow copy is cached and
memory-mapped, so data larger than memory work, and the read counts (kept / skipped rows) are stored beside
it. ``streaming=True`` gives a `datasets.IterableDataset` that validates lazily instead. A source with no
usable row raises `PairDataError` naming it and why (empty, or every row skipped and for what).
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import logging
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import pyarrow.parquet as pq

from lmk.config.data import LOCAL_SOURCE, REPLICA_PREFIX, SourceConfig
from lmk.config.schema import UserError
from lmk.data import offline_pairs, replica
from lmk.run.umask_files import write_json

log = logging.getLogger(__name__)

SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".parquet")
FEATURES = datasets.Features(
    {
        "query": datasets.Value("string"),
        "pos": datasets.List(datasets.Value("string")),
        "neg": datasets.List(datasets.Value("string")),
        "pos_scores": datasets.List(datasets.Value("float32")),
        "neg_scores": datasets.List(datasets.Value("float32")),
    }
)
STATS_VERSION = 2  # part of the Arrow cache key: copies made before read counts were stored are not reused
_FORMAT_HINT = 'expected one JSON object per line like {"query": str, "pos": [str, ...], "neg": [str, ...]}'


class PairDataError(UserError, ValueError):
    """A training record (or file) that cannot be used; the message names the file and line."""


@dataclass
class ReadStats:
    """What reading a source saw: rows kept and rows skipped (with the first few reasons)."""

    rows: int = 0
    skipped: int = 0
    reasons: list[str] = field(default_factory=list)

    def skip(self, reason: str) -> None:
        self.skipped += 1
        if len(self.reasons) < 5:
            self.reasons.append(reason)

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "skipped": self.skipped, "reasons": list(self.reasons)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ReadStats:
        return cls(rows=int(d["rows"]), skipped=int(d["skipped"]), reasons=list(d.get("reasons", [])))


# ------------------------------------------------------------------------------------------ records
def _text_list(rec: Mapping[str, Any], key: str, where: str, required: bool) -> list[str]:
    value = rec.get(key)
    if value is None:
        if required:
            raise PairDataError(f"{where}: record has no {key!r} list; {_FORMAT_HINT}")
        return []
    if isinstance(value, str):
        raise PairDataError(f"{where}: {key!r} must be a list of strings, got a bare string; wrap it: [\"...\"]")
    if not isinstance(value, list | tuple):
        raise PairDataError(f"{where}: {key!r} must be a list of strings, got {type(value).__name__}")
    for i, text in enumerate(value):
        if not isinstance(text, str):
            raise PairDataError(f"{where}: {key}[{i}] is {type(text).__name__} ({text!r:.40}), not a string")
    if required and not value:
        raise PairDataError(f"{where}: {key!r} is empty; every query needs at least one positive passage")
    return list(value)


def _scores(rec: Mapping[str, Any], key: str, n: int, where: str) -> list[float]:
    value = rec.get(key)
    if value is None or (isinstance(value, list | tuple) and not value):  # [] = no scores (a parquet column needs a value)
        return []
    if not isinstance(value, list | tuple) or len(value) != n:
        got = len(value) if isinstance(value, list | tuple) else type(value).__name__
        raise PairDataError(f"{where}: {key!r} must be a list of {n} numbers (one per passage), got {got}")
    out = []
    for i, s in enumerate(value):
        if isinstance(s, bool) or not isinstance(s, int | float) or not math.isfinite(s):
            raise PairDataError(f"{where}: {key}[{i}]={s!r} is not a finite number")
        out.append(float(s))
    return out


def normalize_record(rec: Any, where: str) -> dict[str, Any]:
    """Check one record and return it in the `FEATURES` schema; raise `PairDataError` naming `where`."""
    if not isinstance(rec, Mapping):
        raise PairDataError(f"{where}: expected a JSON object, got {type(rec).__name__}; {_FORMAT_HINT}")
    if "query" not in rec:
        raise PairDataError(f"{where}: record has no 'query' (keys: {sorted(rec)[:6]}); {_FORMAT_HINT}")
    query = rec["query"]
    if not isinstance(query, str):
        raise PairDataError(f"{where}: 'query' is {type(query).__name__} ({query!r:.40}), not a string")
    pos = _text_list(rec, "pos", where, required=True)
    neg = _text_list(rec, "neg", where, required=False)
    pos_scores = _scores(rec, "pos_scores", len(pos), where)
    neg_scores = _scores(rec, "neg_scores", len(neg), where)
    if bool(pos_scores) != bool(neg_scores) and neg:
        raise PairDataError(f"{where}: has only one of 'pos_scores' / 'neg_scores'; give both or neither")
    return {"query": query, "pos": pos, "neg": neg, "pos_scores": pos_scores, "neg_scores": neg_scores}


# -------------------------------------------------------------------------------------------- files
def is_pair_file(path: str | os.PathLike) -> bool:
    return str(path).lower().endswith(SUFFIXES)


def resolve_files(path: str | os.PathLike) -> list[Path]:
    """A file, or every supported file under a folder (sorted, so the order is stable)."""
    p = Path(path).expanduser()
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and is_pair_file(f))
        if not files:
            raise PairDataError(f"{p}: folder holds no {', '.join(SUFFIXES)} files")
        return files
    if not p.exists():
        raise FileNotFoundError(
            f"training data file {str(p)!r} does not exist; give an existing {'/'.join(SUFFIXES)} path, "
            f"{LOCAL_SOURCE!r} for the offline default set, or a hub id"
        )
    if not is_pair_file(p):
        raise PairDataError(f"{p}: unsupported file type; allowed: {', '.join(SUFFIXES)}")
    return [p]


def iter_raw(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, raw record) for every row of one file; JSON syntax errors come back as exceptions."""
    name = str(path)
    if name.lower().endswith(".parquet"):
        row = 0
        for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
            for rec in batch.to_pylist():
                row += 1
                yield f"{name}:row {row}", rec
        return
    opener = gzip.open if name.lower().endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            for line_no, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                where = f"{name}:{line_no}"
                try:
                    yield where, json.loads(line)
                except json.JSONDecodeError as err:
                    yield where, PairDataError(f"{where}: invalid JSON ({err.msg} at column {err.colno})")
    except (OSError, EOFError, UnicodeDecodeError) as err:  # truncated gzip, binary junk
        raise PairDataError(f"{name}: cannot read the file ({err})") from err


def iter_records(
    raw: Iterator[tuple[str, Any]], skip_bad_rows: bool, max_rows: int | None, stats: ReadStats
) -> Iterator[dict[str, Any]]:
    """Validate raw rows; raise on the first bad one, or count and skip it."""
    for where, rec in raw:
        if max_rows is not None and stats.rows >= max_rows:
            return
        try:
            if isinstance(rec, Exception):
                raise rec
            out = normalize_record(rec, where)
        except PairDataError as err:
            if not skip_bad_rows:
                raise PairDataError(str(err), fix="correct that row, or set data.skip_bad_rows=true to skip bad rows") from None
            stats.skip(str(err))
            continue
        stats.rows += 1
        yield out


# Files up to this size are read once before the model is built (`precheck_rows`): a bad row then fails in
# seconds, not after the model load. Larger files are checked as they are read.
PRECHECK_MAX_BYTES = 64 * 2**20


def precheck_rows(data: Mapping[str, Any]) -> None:
    """Validate every row of the local training files of `data` (the data config) that are small enough, before
    anything is built; PairDataError at the first bad row (as the load would raise), unless skip_bad_rows."""
    if data.get("skip_bad_rows") or data.get("streaming"):
        return
    max_rows = data.get("max_rows")
    for raw in data.get("sources") or []:
        source = SourceConfig.coerce(raw)
        if not _is_file_source(source) or not Path(source.path).expanduser().is_file():
            continue  # folders, hub ids and named sources: checked where they are read
        path = Path(source.path).expanduser()
        if path.stat().st_size <= PRECHECK_MAX_BYTES:
            for _ in iter_records(iter_raw(path), False, max_rows, ReadStats()):
                pass


# -------------------------------------------------------------------------------------- sources
def resolve_source(
    source: SourceConfig | Mapping[str, Any] | str, *, max_rows: int | None = None, cache_dir: str | None = None
) -> SourceConfig:
    """A named source (``local``, ``replica:<name>``) as the folder it stands for, built on first use;
    any other source unchanged. `max_rows` bounds the offline build (a small, separately cached set)."""
    source = SourceConfig.coerce(source)
    if source.path == LOCAL_SOURCE:
        folder = offline_pairs.ensure_offline_pairs(cache_dir, max_rows=max_rows)
    elif source.path.startswith(REPLICA_PREFIX):
        folder = replica.replica_folder(source.path[len(REPLICA_PREFIX):], cache_dir)
    else:
        return source
    return dataclasses.replace(source, path=str(folder))


def _is_local_path(path: str) -> bool:
    # A hub id is "owner/name" and never exists on disk; anything with a file suffix is a path too,
    # so a missing file gets the FileNotFoundError rather than a hub lookup.
    return Path(path).expanduser().exists() or is_pair_file(path) or path.startswith((".", "/", "~"))


def _is_file_source(source: SourceConfig) -> bool:
    """A single file (read row by row here, errors name the line); folders and hub ids are repos."""
    return _is_local_path(source.path) and not Path(source.path).expanduser().is_dir()


def _label(source: SourceConfig) -> str:
    extra = "".join(f", {k}={v}" for k in ("subset", "data_files") if (v := getattr(source, k)) is not None)
    return f"{source.path} [split={source.split}{extra}]"


def load_hub_dataset(source: SourceConfig, streaming: bool = False) -> Any:
    """`datasets.load_dataset` for a hub id or a local folder (a local copy of a hub repo, or a folder of
    files), honouring subset / split / data_files / revision; errors name the source and the fix."""
    local = Path(source.path).expanduser().is_dir()
    try:
        return datasets.load_dataset(
            str(Path(source.path).expanduser()) if local else source.path,
            name=source.subset,
            split=source.split,
            data_files=source.data_files,
            revision=source.revision,
            streaming=streaming,
        )
    except Exception as err:
        if local:
            raise PairDataError(
                f"cannot read the training data folder {_label(source)}: {type(err).__name__}: {str(err)[:400]}. "
                "Check split / subset / data_files (patterns are relative to the folder)"
            ) from err
        raise PairDataError(
            f"cannot load training data {source.path!r} (split {source.split!r}) from the Hugging Face hub: "
            f"{type(err).__name__}: {str(err)[:300]}. Offline? Use the offline default set "
            f"(data=local, path {LOCAL_SOURCE!r}), a local copy of the repo (path: <folder>, same data_files), "
            f"data=bge-full-data-replica (path replica:bge-full-data) or a local .jsonl/.parquet file"
        ) from err


def iter_source(source: SourceConfig, files: Sequence[str] | None = None) -> Iterator[tuple[str, Any]]:
    """(where, raw record) of a resolved source: a file's rows, or a repo's (folder or hub id) rows."""
    if _is_file_source(source):
        for f in files if files is not None else resolve_files(source.path):
            yield from iter_raw(Path(f))
        return
    for i, rec in enumerate(load_hub_dataset(source, streaming=True), start=1):
        yield f"{_label(source)}:row {i}", rec


# ------------------------------------------------------------------------------------- fingerprints
def file_fingerprint(path: Path) -> str:
    """Cheap content fingerprint: path, size, first and last MiB (catches edits without reading GBs)."""
    h = hashlib.sha256()
    size = path.stat().st_size
    h.update(f"{path.resolve()}|{size}".encode())
    with open(path, "rb") as fh:
        h.update(fh.read(1 << 20))
        if size > 2 << 20:
            fh.seek(-(1 << 20), io.SEEK_END)
            h.update(fh.read())
    return h.hexdigest()[:16]


def source_fingerprint(source: SourceConfig | Mapping[str, Any] | str, max_rows: int | None = None) -> str:
    """Identity of a source's content and of what is read from it (subset / split / data_files).

    Named sources are identified by their build fingerprint (no build needed), files and folders by
    their files' fingerprints, hub ids by id and revision.
    """
    source = SourceConfig.coerce(source)
    which = f"{source.subset}:{source.split}:{source.data_files}"
    if source.path == LOCAL_SOURCE:
        return f"local:{source.split}:{offline_pairs.offline_fingerprint(max_rows=max_rows)}"
    if source.path.startswith(REPLICA_PREFIX):
        return f"{source.path}:{replica.replica_fingerprint()}:{which}"
    if _is_file_source(source):
        return "+".join(file_fingerprint(f) for f in resolve_files(source.path))
    if _is_local_path(source.path):
        return "+".join(file_fingerprint(f) for f in _folder_files(source)) + f":{which}"
    return f"hub:{source.path}:{which}:{source.revision}"


def _folder_files(source: SourceConfig) -> list[Path]:
    """The files of a folder source that its subset / split / data_files select, resolved by `datasets`
    (the card's configs, the patterns): a clone of a large repo is fingerprinted by what is read only."""
    folder = Path(source.path).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(f"training data folder {str(folder)!r} does not exist; give an existing folder")
    try:
        builder = datasets.load_dataset_builder(str(folder), name=source.subset, data_files=source.data_files)
        files = builder.config.data_files[source.split]
    except Exception as err:  # the load reports it with the available splits / subsets
        log.debug("cannot resolve the files of %s (%s): fingerprinting every file", _label(source), err)
        return resolve_files(folder)
    return [Path(f) for f in files]


# -------------------------------------------------------------------------------------------- load
def _gen(
    source: dict[str, Any],
    files: list[str] | None,
    n_files: int,
    skip_bad_rows: bool,
    max_rows: int | None,
    stats_path: str | None,
) -> Iterator[dict[str, Any]]:
    """Validated rows of one source. `files` is this shard's share of a file source (`datasets` shards the
    list across stream workers); the emptiness check needs the whole source (all `n_files`)."""
    src = SourceConfig.coerce(source)
    stats = ReadStats()
    yield from iter_records(iter_source(src, files), skip_bad_rows, max_rows, stats)
    if stats.rows == 0 and (files is None or len(files) == n_files):
        raise PairDataError(empty_message(src, stats))
    if stats_path is None:  # streaming: nothing is cached, report each pass
        _report(src, stats)
    else:
        write_json(stats_path, stats.to_dict())


def empty_message(source: SourceConfig, stats: ReadStats) -> str:
    why = (
        f"all {stats.skipped} row(s) were skipped as bad (skip_bad_rows: true); first: {stats.reasons[0]}"
        if stats.skipped else "it holds no rows"
    )
    return f"training source {source.name!r} ({_label(source)}) has no usable rows: {why}. Fix the data or drop the source"


def _report(source: SourceConfig, stats: ReadStats) -> None:
    if stats.skipped:
        log.warning(
            "skipped %d bad row(s) of %s (kept %d); first: %s", stats.skipped, _label(source), stats.rows,
            stats.reasons[0],
        )


_REPORTED: set[str] = set()


@dataclass
class LoadedSource:
    """A loaded source: its rows, the source as read (named sources resolved) and what reading saw
    (None while streaming: rows are validated lazily)."""

    dataset: datasets.Dataset | datasets.IterableDataset
    source: SourceConfig
    stats: ReadStats | None


def read_source(
    source: SourceConfig | Mapping[str, Any] | str,
    *,
    skip_bad_rows: bool = False,
    max_rows: int | None = None,
    streaming: bool = False,
    cache_dir: str | None = None,
) -> LoadedSource:
    """One source, validated: the same path for named sources, files, folders and hub ids.

    Map-style data are materialised once as a cached Arrow copy keyed by the source's fingerprint; the
    read counts (kept / skipped rows) are stored beside it, so a cached rerun reports them too.
    """
    name_source = SourceConfig.coerce(source)
    source = resolve_source(name_source, max_rows=max_rows, cache_dir=cache_dir)
    files = [str(f) for f in resolve_files(source.path)] if _is_file_source(source) else None
    kwargs = {"source": source.to_dict(), "files": files, "n_files": len(files or ()), "skip_bad_rows": skip_bad_rows,
              "max_rows": max_rows, "stats_path": None}
    if streaming:
        ds = datasets.IterableDataset.from_generator(_gen, features=FEATURES, gen_kwargs=kwargs)
        return LoadedSource(ds, source, None)
    fp = hashlib.sha256(
        f"v{STATS_VERSION}|{source_fingerprint(source)}|{skip_bad_rows}|{max_rows}".encode()
    ).hexdigest()[:16]
    stats_path = Path(cache_dir or datasets.config.HF_DATASETS_CACHE) / "lmk_read_stats" / f"{fp}.json"
    ds = _materialize(_gen, {**kwargs, "stats_path": str(stats_path)}, cache_dir, fp)
    if stats_path.exists():
        stats = ReadStats.from_dict(json.loads(stats_path.read_text()))
    else:  # an Arrow copy whose counts were lost: count again (one pass, nothing cached)
        stats = count_skipped(source, max_rows=max_rows, skip_bad_rows=skip_bad_rows)
    if fp not in _REPORTED:  # once per process (prepare_data and setup both read), cached or not
        _REPORTED.add(fp)
        _report(source, stats)
    return LoadedSource(ds, source, stats)


def load_pairs(
    source: SourceConfig | Mapping[str, Any] | str,
    *,
    skip_bad_rows: bool = False,
    max_rows: int | None = None,
    streaming: bool = False,
    cache_dir: str | None = None,
) -> datasets.Dataset | datasets.IterableDataset:
    """A validated BGE-format data set for one source (map-style, or iterable when streaming)."""
    return read_source(source, skip_bad_rows=skip_bad_rows, max_rows=max_rows, streaming=streaming,
                       cache_dir=cache_dir).dataset


def _materialize(gen: Any, kwargs: dict[str, Any], cache_dir: str | None, fp: str) -> datasets.Dataset:
    """Validated Arrow copy (cached by `fp`); our own errors come out unwrapped."""
    try:
        return datasets.Dataset.from_generator(
            gen, features=FEATURES, gen_kwargs=kwargs, cache_dir=cache_dir, fingerprint=fp
        )
    except Exception as err:
        cause = err
        while cause is not None and not isinstance(cause, PairDataError | FileNotFoundError):
            cause = cause.__cause__ or cause.__context__
        if cause is not None:
            raise cause from None
        raise


def count_skipped(
    source: SourceConfig | Mapping[str, Any] | str,
    max_rows: int | None = None,
    skip_bad_rows: bool = True,
    cache_dir: str | None = None,
) -> ReadStats:
    """Read a source once without caching and return kept / skipped counts (for stats and tests)."""
    source = resolve_source(source, max_rows=max_rows, cache_dir=cache_dir)
    stats = ReadStats()
    for _ in iter_records(iter_source(source), skip_bad_rows, max_rows, stats):
        pass
    return stats
