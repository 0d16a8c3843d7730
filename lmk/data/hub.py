"""Loaders for the real data sets on the Hugging Face hub (users with a network).

- training pairs in BGE format: `HUB_SOURCES` (MS MARCO passage / document from ``cfli/bge-full-data``,
  the BGE "full data" release); used through `SourceConfig(path=<hub id>, data_files=...)`.
- LongEmbed (``dwzhu/LongEmbed``): `load_longembed(task)` -> {length: RetrievalCorpus} for the synthetic
  tasks, {"test": RetrievalCorpus} for the real ones.
- MLDR (``Shitao/MLDR``): `load_mldr(lang="en", split="test")` -> RetrievalCorpus.

Offline (HF_HUB_OFFLINE=1 or no network) each raises `HubUnavailableError` naming the offline
alternative, at once (the offline check runs before any download attempt).
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any

from lmk.data.retrieval import RetrievalCorpus

LONGEMBED_ID = "dwzhu/LongEmbed"
MLDR_ID = "Shitao/MLDR"
LONGEMBED_TASKS = ("passkey", "needle", "narrativeqa", "qmsum", "summ_screen_fd", "2wikimqa")
SYNTHETIC_TASKS = ("passkey", "needle")
HUB_SOURCES: dict[str, dict[str, Any]] = {
    "msmarco-passage": {"path": "cfli/bge-full-data", "data_files": "data/msmarco_passage-*.parquet", "split": "train"},
    "msmarco-document": {"path": "cfli/bge-full-data", "data_files": "data/msmarco_document-*.parquet", "split": "train"},
}
_OFFLINE_ALTERNATIVE = {
    LONGEMBED_ID: "lmk.data.longembed.generate_passkey / generate_needle (regenerated offline)",
    MLDR_ID: "lmk.data.longdocs.build_longdoc_corpus (offline long-document task)",
}


class HubUnavailableError(RuntimeError):
    """The hub cannot be reached (offline); the message names the offline alternative."""


def hub_offline() -> bool:
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on") for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def _load(repo: str, **kwargs: Any) -> Any:
    alternative = _OFFLINE_ALTERNATIVE.get(repo, "a local file")
    if hub_offline():
        raise HubUnavailableError(
            f"{repo} needs the Hugging Face hub but HF_HUB_OFFLINE is set; offline, use {alternative}"
        )
    import datasets

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


def hub_source(name: str) -> dict[str, Any]:
    """The SourceConfig keys of a known hub training set (msmarco-passage / msmarco-document)."""
    if name not in HUB_SOURCES:
        raise ValueError(f"hub training set {name!r} is not known; allowed values: {', '.join(HUB_SOURCES)}")
    return dict(HUB_SOURCES[name], name=name)
