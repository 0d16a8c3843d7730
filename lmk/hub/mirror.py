"""A local mirror of Hugging Face hub repos, for compute nodes without internet.

Layout (the same files as the hub repo, one folder per repo):

    <mirror>/datasets/<owner>/<name>/...     e.g. <mirror>/datasets/mteb/scifact/README.md + parquet files
    <mirror>/models/<owner>/<name>/...       e.g. <mirror>/models/answerdotai/ModernBERT-base/config.json
    <mirror>/lmk_manifest.json               what is there: repo id, revision, local path, who wrote it
    <repo folder>/.lmk_complete.json         written LAST by a finished download or replica write: revision,
                                             configs, every file with its size (a partial download has none)
    <repo folder>/.lmk_incomplete            written FIRST by a download, removed by its completion

`python -m lmk.download ... --mirror DIR` fills it on a login node; `python -m lmk.eval.replicas --mirror DIR`
writes small offline replicas of the paper's eval datasets in the same layout. A job finds the mirror through
the config key `hub.mirror` or the environment variable `LMK_HUB_MIRROR`; mteb tasks whose dataset is in the
mirror then read it from there (their metadata's dataset path is rewritten to the folder, which
`datasets.load_dataset` reads exactly as it reads the hub repo), and encoders load from it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

from lmk.config.data import DataConfig
from lmk.hub.offline import is_hub_id, is_repo_id
from lmk.run.umask_files import write_json

ENV_VAR = "LMK_HUB_MIRROR"
MANIFEST = "lmk_manifest.json"
KINDS = ("dataset", "model")
COMPLETE = ".lmk_complete.json"
STARTED = ".lmk_incomplete"
_HF_PARTIAL = ".cache/huggingface/download"  # huggingface_hub's local_dir download leaves *.incomplete here


def configure(mirror: str | os.PathLike | None) -> Path | None:
    """Make `mirror` (the `hub.mirror` config key) the process's mirror; child processes (DDP ranks,
    launcher jobs) inherit it through the environment. None keeps `LMK_HUB_MIRROR` as it is."""
    if mirror not in (None, ""):
        path = Path(str(mirror)).expanduser().resolve()
        os.environ[ENV_VAR] = str(path)
    return mirror_root()


def mirror_root(explicit: str | os.PathLike | None = None) -> Path | None:
    """The mirror folder: `explicit`, else $LMK_HUB_MIRROR, else None."""
    value = explicit if explicit not in (None, "") else os.environ.get(ENV_VAR, "").strip()
    return Path(str(value)).expanduser() if value else None


def repo_dir(root: str | os.PathLike, kind: str, repo_id: str) -> Path:
    """Where hub repo `repo_id` of `kind` ("dataset" | "model") lives in the mirror."""
    if kind not in KINDS:
        raise ValueError(f"mirror kind {kind!r} is not valid; allowed values: {', '.join(KINDS)}")
    if not is_repo_id(repo_id):
        raise ValueError(f"{repo_id!r} is not a hub repo id (owner/name)")
    return Path(root) / f"{kind}s" / repo_id


def find(kind: str, repo_id: str, root: str | os.PathLike | None = None, config: str | None = None) -> Path | None:
    """The mirror folder of `repo_id` when it holds a complete copy (with `config`, when given), else None."""
    base = mirror_root(root)
    if base is None or not is_repo_id(repo_id):
        return None
    folder = repo_dir(base, kind, repo_id)
    return folder if incomplete(folder, config) is None else None


def _files(folder: Path) -> dict[str, int]:
    return {p.relative_to(folder).as_posix(): p.stat().st_size for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name not in (COMPLETE, STARTED) and not p.relative_to(folder).as_posix()
            .startswith(".cache/")}


def mark_started(folder: str | os.PathLike, repo_id: str, revision: str | None) -> None:
    """Before a download into `folder`: until `mark_complete`, the folder is not a copy (an interrupted one)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / COMPLETE).unlink(missing_ok=True)
    write_json(folder / STARTED, {"repo_id": repo_id, "revision": revision,
                                  "started": time.strftime("%Y-%m-%dT%H:%M:%S")})


def mark_complete(folder: str | os.PathLike, repo_id: str, revision: str | None, configs: list[str | None] | None = None,
                  source: str = "download") -> Path:
    """After every file of a repo copy is written: the completion marker (written last) lists each file with
    its size and the `configs` it holds (None: the whole repo), so a truncated or half-written copy is told."""
    folder = Path(folder)
    write_json(folder / COMPLETE, {"repo_id": repo_id, "revision": revision, "source": source,
                                   "configs": configs, "files": _files(folder)}, indent=1)
    (folder / STARTED).unlink(missing_ok=True)
    return folder / COMPLETE


def missing_or_truncated(folder: Path, files: dict[str, int]) -> str | None:
    """The first file of a completion record ({path relative to `folder`: size}) that is absent or of another size
    (a copy cut short), as a reason; None when every file is whole."""
    for rel, size in files.items():
        path = folder / rel
        if not path.is_file() or path.stat().st_size != size:
            return f"{rel} is missing or truncated"
    return None


def incomplete(folder: str | os.PathLike, config: str | None = None) -> str | None:
    """None when `folder` holds a complete repo copy (with `config` when given), else why it does not.

    A folder with a completion marker is complete when every file it lists is there with its size and it
    holds `config`; one without is a copy placed by hand, complete unless a download is under way in it
    (the start marker, huggingface_hub's *.incomplete files)."""
    folder = Path(folder)
    if not folder.is_dir() or not any(folder.iterdir()):
        return "not there"
    if (folder / STARTED).exists():
        return "a download into it started and did not finish"
    if any((folder / _HF_PARTIAL).rglob("*.incomplete")):
        return "huggingface_hub left partial files in it"
    marker = folder / COMPLETE
    if not marker.is_file():
        return None
    try:
        meta = json.loads(marker.read_text())
    except json.JSONDecodeError:
        return f"{marker} is not valid JSON"
    missing = missing_or_truncated(folder, meta.get("files") or {})
    if missing:
        return missing
    configs = meta.get("configs")
    if config is not None and configs is not None and config not in configs:
        return f"config {config!r} is not in it (it holds {', '.join(map(str, configs))})"
    return None


def read_manifest(root: str | os.PathLike) -> dict[str, Any]:
    path = Path(root) / MANIFEST
    if not path.is_file():
        return {"artifacts": []}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err}); delete it and rerun lmk.download / lmk.eval.replicas") from err
    data.setdefault("artifacts", [])
    return data


def record(root: str | os.PathLike, entries: list[dict[str, Any]]) -> Path:
    """Merge `entries` (kind, repo_id, revision, path, what, source) into the mirror's manifest."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    data = read_manifest(root)
    keyed = {(e["kind"], e["repo_id"], e.get("config")): e for e in data["artifacts"]}
    for e in entries:
        keyed[(e["kind"], e["repo_id"], e.get("config"))] = dict(e, recorded=time.strftime("%Y-%m-%dT%H:%M:%S"))
    data["artifacts"] = sorted(keyed.values(), key=lambda e: (e["kind"], e["repo_id"], str(e.get("config"))))
    path = root / MANIFEST
    write_json(path, data, indent=1)  # atomic; a unique temp name (two downloads never share one)
    return path


def mirrored_revision(kind: str, repo_id: str, root: str | os.PathLike | None = None) -> str | None:
    """The revision the manifest records for `repo_id` (None when not recorded)."""
    base = mirror_root(root)
    if base is None:
        return None
    for e in read_manifest(base)["artifacts"]:
        if e["kind"] == kind and e["repo_id"] == repo_id and e.get("revision"):
            return str(e["revision"])
    return None


def resolve_model(model_id: str, root: str | os.PathLike | None = None) -> str:
    """`model_id` itself, or its mirror folder when the mirror holds it (a local path is kept as is)."""
    local = find("model", model_id, root) if is_hub_id(model_id) else None
    return str(local) if local is not None else model_id


def with_mirrored_sources(data: DataConfig) -> DataConfig:
    """A copy of a validated `data` section whose hub-id sources held by the mirror read the mirror's folder
    instead (with the same `data_files` / `subset` / `split`, relative to the folder as on the hub, and the
    same source name)."""
    if mirror_root() is None:
        return data
    sources = []
    for src in data.sources:
        folder = find("dataset", src.path) if is_hub_id(src.path) else None
        sources.append(src if folder is None else dataclasses.replace(src, path=str(folder)))
    return dataclasses.replace(data, sources=sources)


_MIRRORED_CLASSES: dict[type, type] = {}


def _mirrored_class(base: type) -> type:
    """`base` whose `unload_data` keeps the mirrored metadata (mteb's drops instance metadata, which
    would point the next load back at the hub)."""
    if base not in _MIRRORED_CLASSES:
        def unload_data(self: Any) -> None:
            metadata = self.metadata
            base.unload_data(self)
            self.metadata = metadata

        _MIRRORED_CLASSES[base] = type(base.__name__, (base,), {"unload_data": unload_data,
                                                                "__module__": base.__module__})
    return _MIRRORED_CLASSES[base]


def apply_mirror(task: Any, root: str | os.PathLike | None = None) -> Path | None:
    """Point an mteb task at its dataset's mirror folder when the mirror holds it; returns the folder.

    The metadata's dataset `path` becomes the folder (mteb passes it to `datasets.load_dataset`, which
    reads a local repo folder with the hub repo's layout unchanged) and its `revision` becomes the revision
    the mirror's manifest records (a replica has its own), so cached scores never mix data versions.
    """
    dataset = dict(task.metadata.dataset)
    repo = str(dataset.get("path", ""))
    folder = find("dataset", repo, root, dataset.get("name"))  # this task's config (LongEmbed: one of five)
    if folder is None:
        return None
    dataset["path"] = str(folder.resolve())
    revision = mirrored_revision("dataset", repo, root)
    if revision:
        dataset["revision"] = revision
    task.metadata = task.metadata.model_copy(update={"dataset": dataset})
    if type(task) not in _MIRRORED_CLASSES.values():
        task.__class__ = _mirrored_class(type(task))
    return folder
