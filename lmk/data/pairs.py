"""Reading and validating training pairs in the BGE "full data" format.

One record per query: ``{"query": str, "pos": [str, ...], "neg": [str, ...],
"pos_scores": [float, ...], "neg_scores": [float, ...]}`` (scores optional; ``neg`` may be absent).
Every record is checked; a bad one raises `PairDataError` naming the file and line (or the hub id and
row), or is counted and skipped when ``skip_bad_rows=True``. Records are normalised to the fixed schema
`FEATURES` (absent scores / negatives become empty lists) so Arrow can store them.

Files go through `datasets.Dataset.from_generator` keyed by our own fingerprint of the file (path, size,
head/tail bytes): the validated Arrow copy is cached and memory-mapped, so files larger than memory work;
``streaming=True`` gives a `datasets.IterableDataset` that validates lazily instead.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import logging
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets

from lmk.data.config import LOCAL_SOURCE, SourceConfig

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
_FORMAT_HINT = 'expected one JSON object per line like {"query": str, "pos": [str, ...], "neg": [str, ...]}'


class PairDataError(ValueError):
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
    if value is None:
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
        import pyarrow.parquet as pq

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
                raise PairDataError(f"{err} (set skip_bad_rows: true to skip bad rows)") from None
            stats.skip(str(err))
            continue
        stats.rows += 1
        yield out


def _hub_raw(source: SourceConfig, streaming: bool) -> Iterator[tuple[str, Any]]:
    ds = load_hub_dataset(source, streaming=streaming)
    for i, rec in enumerate(ds, start=1):
        yield f"{source.path}[{source.split}]:row {i}", rec


def load_hub_dataset(source: SourceConfig, streaming: bool = False) -> Any:
    """`datasets.load_dataset` for a hub source, with an error that names the offline alternative."""
    try:
        return datasets.load_dataset(
            source.path,
            name=source.subset,
            split=source.split,
            data_files=source.data_files,
            revision=source.revision,
            streaming=streaming,
        )
    except Exception as err:
        raise PairDataError(
            f"cannot load training data {source.path!r} (split {source.split!r}) from the Hugging Face hub: "
            f"{type(err).__name__}: {str(err)[:300]}. Offline? Use the offline default set "
            f"(data=local, path {LOCAL_SOURCE!r}) or a local .jsonl/.parquet file"
        ) from err


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


def source_fingerprint(source: SourceConfig) -> str:
    """Identity of a source's content: file fingerprints for paths, id/split/revision for hub ids."""
    if source.path == LOCAL_SOURCE:
        from lmk.data.offline_pairs import offline_fingerprint

        return f"local:{source.split}:{offline_fingerprint()}"
    if _is_local_path(source.path):
        return "+".join(file_fingerprint(f) for f in resolve_files(source.path))
    return f"hub:{source.path}:{source.subset}:{source.split}:{source.data_files}:{source.revision}"


def _is_local_path(path: str) -> bool:
    # A hub id is "owner/name" and never exists on disk; anything with a file suffix is a path too,
    # so a missing file gets the FileNotFoundError rather than a hub lookup.
    return Path(path).expanduser().exists() or is_pair_file(path) or path.startswith((".", "/", "~"))


# -------------------------------------------------------------------------------------------- load
def _gen(files: list[str], skip_bad_rows: bool, max_rows: int | None) -> Iterator[dict[str, Any]]:
    stats = ReadStats()
    for f in files:
        yield from iter_records(iter_raw(Path(f)), skip_bad_rows, max_rows, stats)
    _report(files, stats)


def _gen_hub(source: dict[str, Any], skip_bad_rows: bool, max_rows: int | None) -> Iterator[dict[str, Any]]:
    stats = ReadStats()
    src = SourceConfig.coerce(source)
    yield from iter_records(_hub_raw(src, streaming=True), skip_bad_rows, max_rows, stats)
    _report([src.path], stats)


def _report(where: list[str], stats: ReadStats) -> None:
    if stats.skipped:
        log.warning(
            "skipped %d bad row(s) of %s (kept %d); first: %s", stats.skipped, ", ".join(where), stats.rows,
            stats.reasons[0],
        )


def load_pairs(
    source: SourceConfig | Mapping[str, Any] | str,
    *,
    skip_bad_rows: bool = False,
    max_rows: int | None = None,
    streaming: bool = False,
    cache_dir: str | None = None,
) -> datasets.Dataset | datasets.IterableDataset:
    """A validated BGE-format data set for one source (map-style, or iterable when streaming)."""
    source = SourceConfig.coerce(source)
    if source.path == LOCAL_SOURCE:
        from lmk.data.offline_pairs import load_offline_pairs

        # max_rows bounds the build itself (a small, separately cached set), so tests and smoke runs are quick
        ds = load_offline_pairs(split=source.split, max_rows=max_rows, cache_dir=cache_dir)
        return ds.to_iterable_dataset() if streaming else ds
    if _is_local_path(source.path):
        files = [str(f) for f in resolve_files(source.path)]
        kwargs = {"files": files, "skip_bad_rows": skip_bad_rows, "max_rows": max_rows}
        if streaming:
            return datasets.IterableDataset.from_generator(_gen, features=FEATURES, gen_kwargs=kwargs)
        fp = hashlib.sha256(
            f"{source_fingerprint(source)}|{skip_bad_rows}|{max_rows}".encode()
        ).hexdigest()[:16]
        return _materialize(_gen, kwargs, cache_dir, fp)
    # A hub id: stream through the validator; map-style data are cached as Arrow by `datasets`.
    kwargs = {"source": source.to_dict(), "skip_bad_rows": skip_bad_rows, "max_rows": max_rows}
    if streaming:
        return datasets.IterableDataset.from_generator(_gen_hub, features=FEATURES, gen_kwargs=kwargs)
    fp = hashlib.sha256(f"{source_fingerprint(source)}|{skip_bad_rows}|{max_rows}".encode()).hexdigest()[:16]
    return _materialize(_gen_hub, kwargs, cache_dir, fp)


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
    source: SourceConfig | Mapping[str, Any] | str, max_rows: int | None = None
) -> ReadStats:
    """Read a local source once without caching and return kept / skipped counts (for stats and tests)."""
    source = SourceConfig.coerce(source)
    stats = ReadStats()
    for f in resolve_files(source.path):
        for _ in iter_records(iter_raw(f), True, max_rows, stats):
            pass
    return stats
