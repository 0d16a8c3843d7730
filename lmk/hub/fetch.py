"""Fetching what jobs load: one artifact into the Hugging Face caches or a mirror folder, a list of them with a
manifest. Runs on a machine with the network (a login node); `python -m lmk.prefetch` composes a sweep's jobs
and calls `prefetch` on the union of their `required_artifacts`."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import datasets
import mteb
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
from lmk.hub.offline import hub_offline
from lmk.run.files import write_json


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
        return Path(snapshot_download(art.repo_id, repo_type=repo_type, revision=art.revision,
                                      allow_patterns=patterns, local_dir=str(local_dir)))
    if art.task:  # only the configs / splits the job reads (MLDR `en`, not 13 languages)
        opts = art.options or {}
        mteb.get_task(art.task, eval_splits=opts.get("eval_splits"), hf_subsets=opts.get("hf_subsets"),
                      languages=opts.get("languages")).load_data()
        return _in_hub_cache(art) or _in_datasets_cache(art) or _hub_cache_dir()
    if art.kind == "dataset":
        datasets.load_dataset(art.repo_id, name=art.config, data_files=art.data_files, revision=art.revision)
        return _in_hub_cache(art) or _in_datasets_cache(art) or _hub_cache_dir()
    return Path(snapshot_download(art.repo_id, repo_type=repo_type, revision=art.revision, allow_patterns=patterns))



def prefetch(artifacts: Iterable[Artifact], mirror_dir: str | os.PathLike | None = None,
             dry_run: bool = False) -> list[dict[str, Any]]:
    """Fetch what is not on disk yet; returns manifest entries (also written to the manifest)."""
    root = Path(mirror_dir).resolve() if mirror_dir else None
    if root is not None:
        mirror.configure(root)
    entries = []
    for art in artifacts:
        where = locate(art)
        if where is None and not dry_run:
            if hub_offline():
                raise MissingArtifactsError(f"{art.label()}: not on disk and HF_HUB_OFFLINE is set; prefetch needs "
                                            "the network (unset HF_HUB_OFFLINE on a login node)")
            path = fetch(art, root)
            where = f"fetched: {path}"
        status = "missing" if where is None else where.split(":", 1)[0]
        path = where.split(": ", 1)[1] if where and ": " in where else None
        if path and root is not None and Path(path).is_relative_to(root):
            path = str(Path(path).relative_to(root))
        entries.append({**asdict(art), "status": status, "path": path})
        print(f"{status:<16} {art.label()}" + (f"  -> {path}" if path else ""), flush=True)
    if not dry_run:
        recorded = [e for e in entries if e["path"]]
        if root is not None:
            mirror.record(root, recorded)
        else:
            manifest = cache_manifest_path()
            manifest.parent.mkdir(parents=True, exist_ok=True)
            old = json.loads(manifest.read_text()).get("artifacts", []) if manifest.is_file() else []
            keep = [e for e in old if (e["kind"], e["repo_id"], e.get("config")) not in
                    {(r["kind"], r["repo_id"], r.get("config")) for r in recorded}]
            write_json(manifest, {"artifacts": keep + [dict(e, recorded=time.strftime("%Y-%m-%dT%H:%M:%S"))
                                                        for e in recorded]}, indent=1)
    return entries


