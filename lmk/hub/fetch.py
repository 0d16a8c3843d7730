"""Fetching what jobs load: one artifact into the Hugging Face caches or a mirror folder, a list of them with a
manifest. Runs on a machine with the network (a login node); `python -m lmk.download` composes a sweep's jobs
and calls `download` on the union of their `required_artifacts`."""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import datasets
import mteb
from datasets.naming import camelcase_to_snakecase
from huggingface_hub import snapshot_download

from lmk.hub import mirror
from lmk.hub.artifacts import (
    Artifact,
    MissingArtifactsError,
    _hub_cache_dir,
    _in_datasets_cache,
    _in_hub_cache,
    cache_manifest_path,
    locate,
)
from lmk.hub.offline import offline_setting
from lmk.run.umask_files import write_json


# ------------------------------------------------------------------------------------------ fetching
def fetch(art: Artifact, mirror_dir: Path | None) -> Path:
    """Download one artifact into the mirror (the hub repo's files) or the Hugging Face caches.

    Cache mode reads it the way the job will, so the caches hold exactly what the job opens offline: an
    eval dataset through its mteb task's own `load_data`, training data through `datasets.load_dataset`
    with its `data_files`, a model as a hub snapshot. huggingface_hub and datasets honour HTTPS_PROXY /
    HTTP_PROXY / NO_PROXY (and HF_ENDPOINT), so this works behind a login node's proxy.
    """
    repo_type = "dataset" if art.kind == "dataset" else "model"
    patterns = None
    if art.data_files:
        files = art.data_files if isinstance(art.data_files, list) else [art.data_files]
        patterns = [*map(str, files), "README.md", "*.json"]  # only these files of a large repo
    if mirror_dir is not None:
        local_dir = mirror.repo_dir(mirror_dir, art.kind, art.repo_id)
        mirror.mark_started(local_dir, art.repo_id, art.revision)  # until the end, a partial copy
        path = Path(snapshot_download(art.repo_id, repo_type=repo_type, revision=art.revision,
                                      allow_patterns=patterns, local_dir=str(local_dir)))
        mirror.mark_complete(local_dir, art.repo_id, art.revision, None if patterns is None else [art.config])
        return path
    if art.task:  # only the configs / splits the job reads (MLDR `en`, not 13 languages)
        opts = art.options or {}
        mteb.get_task(art.task, eval_splits=opts.get("eval_splits"), hf_subsets=opts.get("hf_subsets"),
                      languages=opts.get("languages")).load_data()
        return _in_hub_cache(art) or _in_datasets_cache(art) or _hub_cache_dir()
    if art.kind == "dataset":
        datasets.load_dataset(art.repo_id, name=art.config, data_files=art.data_files, revision=art.revision)
        return _in_hub_cache(art) or _in_datasets_cache(art) or _hub_cache_dir()
    return Path(snapshot_download(art.repo_id, repo_type=repo_type, revision=art.revision, allow_patterns=patterns))



def _record(root: Path | None, entries: list[dict[str, Any]]) -> None:
    """Add finished entries to the manifest (the mirror's, else the cache's): the record of a complete fetch,
    written after it, so an interrupted download never vouches for what it did not finish."""
    if root is not None:
        mirror.record(root, entries)
        return
    manifest = cache_manifest_path()
    manifest.parent.mkdir(parents=True, exist_ok=True)
    old = json.loads(manifest.read_text()).get("artifacts", []) if manifest.is_file() else []
    keys = {_entry_key(r) for r in entries}
    keep = [e for e in old if _entry_key(e) not in keys]
    write_json(manifest, {"artifacts": keep + [dict(e, recorded=time.strftime("%Y-%m-%dT%H:%M:%S"))
                                                for e in entries]}, indent=1)


def _entry_key(e: dict[str, Any]) -> tuple[Any, ...]:
    return e["kind"], e["repo_id"], e.get("config"), e.get("revision"), str(e.get("data_files"))


def _refuse_offline(art: Artifact) -> None:
    setting = offline_setting()
    if setting is not None:
        var = setting.split("=", 1)[0]
        raise MissingArtifactsError(
            f"{art.label()} is not on disk and {setting} forbids downloading it; the download needs the network: "
            f"on a login node run `{var}= make download ...` (or `{var}= python -m lmk.download ...`)")


class FetchError(RuntimeError):
    """A download failed (the network, a proxy, the hub); what finished before it is recorded."""


def download(artifacts: Iterable[Artifact], mirror_dir: str | os.PathLike | None = None,
             dry_run: bool = False, keep_going: bool = False) -> list[dict[str, Any]]:
    """Fetch what is not on disk yet, each (repo, revision, config, files) on its own; returns the manifest
    entries (each recorded in the manifest as soon as it is complete). A failed download stops it, or with
    `keep_going` is listed ("failed") and the others are fetched; either way FetchError names it."""
    root = Path(mirror_dir).resolve() if mirror_dir else None
    if root is not None:
        mirror.configure(root)
    entries: list[dict[str, Any]] = []
    failed: list[str] = []
    for art in artifacts:
        where = locate(art)
        if where is None and not dry_run:
            _refuse_offline(art)
            try:
                where = f"fetched: {fetch(art, root)}"
            except Exception as err:  # any failure of the network / hub stack: named, the manifest kept
                failed.append(f"{art.label()}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
                print(f"{'failed':<16} {art.label()}  ({type(err).__name__})", flush=True)
                if not keep_going:
                    break
                continue
        status = "missing" if where is None else where.split(":", 1)[0]
        path = where.split(": ", 1)[1] if where and ": " in where else None
        if path and root is not None and Path(path).is_relative_to(root):
            path = str(Path(path).relative_to(root))
        entries.append({**asdict(art), "status": status, "path": path})
        print(f"{status:<16} {art.label()}" + (f"  -> {path}" if path else ""), flush=True)
        if path and not dry_run:
            _record(root, [entries[-1]])
    if failed:
        raise FetchError(f"{len(failed)} download(s) failed, first {failed[0]}; check the network (HTTPS_PROXY, "
                         "HF_ENDPOINT) and rerun the same command: what finished is recorded and skipped")
    return entries


def prefetch(*args: Any, **kwargs: Any) -> list[dict[str, Any]]:
    """The old name of `download`, kept working."""
    warnings.warn("lmk.hub.fetch.prefetch is deprecated: use lmk.hub.fetch.download",  # deprecated alias
                  DeprecationWarning, stacklevel=2)
    return download(*args, **kwargs)


def interrupt_download(art: Artifact, mirror_dir: str | os.PathLike | None = None) -> Path:
    """Fault injection: leave `art` as a download killed midway leaves it, in the mirror (`mirror_dir`) or
    the Hugging Face caches, so that `locate` must not count it (the rehearsal's "interrupted download").

    Mirror: the start marker with one truncated file and huggingface_hub's `.incomplete` part. Cache: an
    `.incomplete` blob, a snapshot without weights, a `datasets` config folder still `.incomplete`, and no
    manifest entry (a download records an artifact only once its fetch returned). Returns the folder touched.
    """
    if mirror_dir is not None:
        folder = mirror.repo_dir(mirror_dir, art.kind, art.repo_id)
        mirror.mark_started(folder, art.repo_id, art.revision)
        (folder / "README.md").write_text("---\nconfigs:\n")  # cut mid-file
        part = folder / ".cache" / "huggingface" / "download" / "data.parquet.incomplete"
        part.parent.mkdir(parents=True, exist_ok=True)
        part.write_bytes(b"PAR1")
        return folder
    owner, name = art.repo_id.split("/")
    repo = _hub_cache_dir() / f"{art.kind}s--{owner}--{name}"
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "blobs" / ("0" * 64 + ".incomplete")).write_bytes(b"partial")
    (repo / "snapshots" / (art.revision or "0" * 40)).mkdir(parents=True, exist_ok=True)
    if art.kind == "dataset":
        owner, name = art.repo_id.split("/")
        prep = Path(datasets.config.HF_DATASETS_CACHE) / f"{owner}___{camelcase_to_snakecase(name)}" / (art.config or "default")
        (prep / "0.0.0" / f"{art.revision or '0' * 40}.incomplete").mkdir(parents=True, exist_ok=True)
    manifest = cache_manifest_path()
    if manifest.is_file():
        data = json.loads(manifest.read_text())
        data["artifacts"] = [e for e in data.get("artifacts", []) if (e.get("kind"), e.get("repo_id"), e.get(
            "config")) != (art.kind, art.repo_id, art.config)]
        write_json(manifest, data, indent=1)
    return repo
