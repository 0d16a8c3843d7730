"""Loaders for the real data sets on the Hugging Face hub (users with a network).

- training pairs in BGE format (MS MARCO passage from ``cfli/bge-full-data``, the BGE "full data" release):
  named by the data config (conf/data/msmarco-passage.yaml) and read through `SourceConfig(path=<hub id>,
  data_files=...)`.
- LongEmbed (``dwzhu/LongEmbed``): `load_longembed(task)` -> {length: RetrievalCorpus} for the synthetic
  tasks, {"test": RetrievalCorpus} for the real ones.
- MLDR (``Shitao/MLDR``): `load_mldr(lang="en", split="test")` -> RetrievalCorpus.
- the layout of a BGE-format dataset repo (`BGE_COLUMNS`, `write_bge_folder`): parquet shards
  ``data/<split>-NNNNN-of-NNNNN.parquet`` and a README.md card whose ``configs:`` block maps each split to
  its files, as ``cfli/bge-full-data`` has them. The offline set and the local replica are written this way,
  so `datasets.load_dataset(folder, ...)` reads them exactly as it reads the hub repo.

Offline (HF_HUB_OFFLINE=1 or no network) each raises `HubUnavailableError` naming the offline
alternative, at once (the offline check runs before any download attempt).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from filelock import FileLock

from lmk.config.schema import UserError
from lmk.data.retrieval import RetrievalCorpus
from lmk.hub.offline import hub_offline
from lmk.run.umask_files import follow_umask, write_json

BGE_FULL_DATA_ID = "cfli/bge-full-data"
LONGEMBED_ID = "dwzhu/LongEmbed"
MLDR_ID = "Shitao/MLDR"
LONGEMBED_TASKS = ("passkey", "needle", "narrativeqa", "qmsum", "summ_screen_fd", "2wikimqa")
SYNTHETIC_TASKS = ("passkey", "needle")
_OFFLINE_ALTERNATIVE = {
    LONGEMBED_ID: "lmk.data.longembed.generate_passkey / generate_needle (regenerated offline)",
    MLDR_ID: "lmk.data.longdocs.build_longdoc_corpus (offline long-document task)",
}


class HubUnavailableError(UserError, RuntimeError):
    """The hub cannot be reached (offline); the message names the offline alternative."""


def _load(repo: str, **kwargs: Any) -> Any:
    alternative = _OFFLINE_ALTERNATIVE.get(repo, "a local file")
    if hub_offline():
        raise HubUnavailableError(
            f"{repo} needs the Hugging Face hub but HF_HUB_OFFLINE is set; offline, use {alternative}"
        )
    try:
        return datasets.load_dataset(repo, **kwargs)
    except Exception as err:  # connection errors come in many types across datasets versions
        raise HubUnavailableError(
            f"cannot load {repo} ({kwargs}) from the Hugging Face hub: {type(err).__name__}: {str(err)[:300]}; "
            f"offline, use {alternative}"
        ) from err


def load_longembed(task: str = "passkey") -> dict[int | str, RetrievalCorpus]:
    """The real LongEmbed task: {length: corpus} for passkey/needle (split "test_{L}"), else {"test": ...}."""
    if task not in LONGEMBED_TASKS:
        raise ValueError(f"LongEmbed task {task!r} is not valid; allowed values: {', '.join(LONGEMBED_TASKS)}")
    corpus = _load(LONGEMBED_ID, name=task, split="corpus")
    queries = _load(LONGEMBED_ID, name=task, split="queries")
    qrels = _load(LONGEMBED_ID, name=task, split="qrels")
    name = f"LEMB{task}"
    if task not in SYNTHETIC_TASKS:
        docs = [{"id": str(r["doc_id"]), "text": r["text"]} for r in corpus]
        qs = [{"id": str(r["qid"]), "text": r["text"]} for r in queries]
        rel: dict[str, dict[str, int]] = defaultdict(dict)
        for r in qrels:
            rel[str(r["qid"])][str(r["doc_id"])] = 1
        return {"test": RetrievalCorpus.from_records(name, "test", docs, qs, rel)}
    out: dict[int | str, RetrievalCorpus] = {}
    for length in sorted({int(r["context_length"]) for r in corpus}):
        docs = [{"id": str(r["doc_id"]), "text": r["text"], "length": length} for r in corpus if r["context_length"] == length]
        qs = [{"id": str(r["qid"]), "text": r["text"], "length": length} for r in queries if r["context_length"] == length]
        rel = defaultdict(dict)
        for r in qrels:
            if r["context_length"] == length:
                rel[str(r["qid"])][str(r["doc_id"])] = 1
        out[length] = RetrievalCorpus.from_records(name, f"test_{length}", docs, qs, rel)
    return out


def load_mldr(lang: str = "en", split: str = "test") -> RetrievalCorpus:
    """MLDR (MultiLongDocRetrieval) for one language: queries with their positives, the full corpus."""
    rows = _load(MLDR_ID, name=lang, split=split)
    corpus = _load(MLDR_ID, name=f"corpus-{lang}", split="corpus")
    docs = [{"id": str(r["docid"]), "text": r["text"]} for r in corpus]
    qs = [{"id": str(r["query_id"]), "text": r["query"]} for r in rows]
    rel = {str(r["query_id"]): {str(p["docid"]): 1 for p in r["positive_passages"]} for r in rows}
    return RetrievalCorpus.from_records(f"MLDR-{lang}", split, docs, qs, rel)


# ------------------------------------------------------------------------------- BGE repo layout
# The columns of cfli/bge-full-data in its card's order (dataset_info.features); scores are float32 there.
BGE_COLUMNS = ("query", "pos", "neg", "category", "type", "prompt", "pos_scores", "neg_scores")


def bge_features() -> Any:
    """`datasets.Features` of a BGE "full data" parquet shard (the hub repo's schema)."""
    text, texts, scores = datasets.Value("string"), datasets.List(datasets.Value("string")), datasets.List(datasets.Value("float32"))
    kinds = {"query": text, "pos": texts, "neg": texts, "category": text, "type": text, "prompt": text,
             "pos_scores": scores, "neg_scores": scores}
    return datasets.Features({c: kinds[c] for c in BGE_COLUMNS})


def _card_yaml(splits: Mapping[str, Sequence[Mapping[str, Any]]], sizes: Mapping[str, int]) -> str:
    features = [
        {"name": c, "sequence": "float32"} if c.endswith("_scores") else
        {"name": c, "sequence": "string"} if c in ("pos", "neg") else {"name": c, "dtype": "string"}
        for c in BGE_COLUMNS
    ]
    header = {
        "dataset_info": {
            "features": features,
            "splits": [{"name": s, "num_bytes": sizes[s], "num_examples": len(rows)} for s, rows in splits.items()],
        },
        # one split per subset, as the hub repo declares them (push_to_hub writes this block)
        "configs": [{"config_name": "default",
                     "data_files": [{"split": s, "path": f"data/{s}-*"} for s in splits]}],
    }
    return yaml.safe_dump(header, sort_keys=False)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_bge_folder(
    folder: str | os.PathLike,
    splits: Mapping[str, Sequence[Mapping[str, Any]]],
    shards: Mapping[str, int] | None = None,
    description: str = "",
) -> dict[str, dict[str, Any]]:
    """Write {split: rows} as a hub-layout BGE dataset repo under `folder` (which must not hold one yet).

    Rows need ``query`` and ``pos``; absent columns become "" / []. Each split is cut into ``shards[split]``
    (default 1) contiguous parquet files ``data/<split>-NNNNN-of-NNNNN.parquet``. Returns
    {relative path: {"sha256", "bytes", "rows"}} for an integrity check (`check_bge_folder`).
    """
    folder = Path(folder)
    (folder / "data").mkdir(parents=True, exist_ok=True)
    schema = bge_features().arrow_schema
    defaults = {"category": "", "type": "", "prompt": "", "neg": [], "pos_scores": [], "neg_scores": []}
    files: dict[str, dict[str, Any]] = {}
    sizes: dict[str, int] = {}
    for split, rows in splits.items():
        n = max(1, int((shards or {}).get(split, 1)))
        cols = {c: [r.get(c, defaults.get(c)) for r in rows] for c in BGE_COLUMNS}
        table = pa.Table.from_pydict(cols, schema=schema)
        sizes[split] = table.nbytes
        bounds = [len(rows) * i // n for i in range(n + 1)]
        for i in range(n):
            rel = f"data/{split}-{i:05d}-of-{n:05d}.parquet"
            part = table.slice(bounds[i], bounds[i + 1] - bounds[i])
            pq.write_table(part, folder / rel)
            files[rel] = {"sha256": _sha256(folder / rel), "bytes": (folder / rel).stat().st_size, "rows": part.num_rows}
    card = f"---\n{_card_yaml(splits, sizes)}---\n\n{description.strip()}\n"
    (folder / "README.md").write_text(card, encoding="utf-8")
    files["README.md"] = {"sha256": _sha256(folder / "README.md"), "bytes": (folder / "README.md").stat().st_size, "rows": None}
    return files


def check_bge_folder(folder: str | os.PathLike, files: Mapping[str, Mapping[str, Any]]) -> str | None:
    """None when every file `write_bge_folder` listed is present and unchanged, else what is wrong."""
    folder = Path(folder)
    for rel, info in files.items():
        f = folder / rel
        if not f.is_file():
            return f"{rel} missing"
        if f.stat().st_size != info.get("bytes") or _sha256(f) != info.get("sha256"):
            return f"{rel} truncated or modified"
    return None


def check_built_folder(folder: str | os.PathLike, fingerprint: str) -> str | None:
    """None when `folder` holds an intact build (meta.json fingerprint and file hashes match), else why not."""
    meta_path = Path(folder) / "meta.json"
    if not meta_path.exists():
        return "no meta.json"
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        return f"unreadable meta.json ({err})"
    if meta.get("fingerprint") != fingerprint:
        return "fingerprint mismatch"
    if not meta.get("files"):
        return "meta.json lists no files"
    return check_bge_folder(folder, meta["files"])


def ensure_built_folder(
    folder: str | os.PathLike,
    fingerprint: str,
    build: Any,
    rebuild: bool = False,
    what: str = "data set",
) -> Path:
    """`folder` holding an intact BGE-layout build, made by `build()` when missing or corrupt.

    `build()` returns (splits, shards, description, report) for `write_bge_folder`. The build goes into a
    temporary sibling folder that replaces `folder` only when complete (an interrupted build never looks
    valid), under a file lock so that ranks or jobs sharing a cache build it once.
    """
    log = logging.getLogger(__name__)
    folder = Path(folder)
    if not rebuild and check_built_folder(folder, fingerprint) is None:
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        problem = "rebuild requested" if rebuild else check_built_folder(folder, fingerprint)
        if problem is None:  # another process built it while we waited
            return folder
        if folder.exists():
            log.warning("%s at %s is not usable (%s): rebuilding", what, folder, problem)
        else:
            log.info("building the %s into %s", what, folder)
        splits, shards, description, report = build()
        tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
        follow_umask(tmp, directory=True)  # mkdtemp makes it 0700
        try:
            files = write_bge_folder(tmp, splits, shards, description)
            meta = {"fingerprint": fingerprint, "files": files, "report": report}
            write_json(tmp / "meta.json", meta)
            if folder.exists():
                shutil.rmtree(folder)
            os.replace(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return folder
