"""What a job loads from the Hugging Face hub, and whether it is on disk (never probing the network).

Compute nodes of a cluster usually have no internet: jobs run with `HF_HUB_OFFLINE=1`, so every model,
tokenizer, training file and mteb dataset a job loads must already be on disk. ONE function lists them,
`required_artifacts(cfg)`, used both by the download on a login node (`lmk.hub.fetch`, `python -m
lmk.download`) and by `check_available(cfg)`, which every job runs before any model is built: offline, each
artifact must be in the mirror, the Hugging Face cache or a manifest, else it fails naming what is missing and
the download command.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from huggingface_hub import constants
from omegaconf import DictConfig, ListConfig, OmegaConf

from lmk.config.data import LOCAL_SOURCE as LOCAL_DATA
from lmk.config.data import is_named_source
from lmk.config.eval import RULER_ESSAYS_REPO, EvalConfig
from lmk.config.schema import UserError
from lmk.config.schema import get_key as _get
from lmk.hub import mirror
from lmk.hub.offline import hub_offline, is_hub_id
from lmk.hub.task_registry import hub_task_names

log = logging.getLogger(__name__)

MANIFEST = mirror.MANIFEST


class MissingArtifactsError(UserError, RuntimeError):
    """Offline, something a job loads is neither in the mirror, the Hugging Face cache nor a manifest."""




@dataclass(frozen=True)
class Artifact:
    kind: str                    # "model" (weights, tokenizer, config) | "dataset"
    repo_id: str                 # hub id, e.g. answerdotai/ModernBERT-base, mteb/scifact
    revision: str | None = None  # None: the default branch
    config: str | None = None    # dataset config name (LongEmbed's "needle", ...)
    data_files: Any = None       # training data: only these files of the repo
    what: str = ""               # who loads it: "encoder", "tokenizer", "training data", "eval task SciFact"
    task: str | None = None      # the mteb task that reads it (a cache-mode download runs its own load_data)
    options: Any = None          # that task's eval.task_options (splits / subsets: only those are loaded)

    @property
    def key(self) -> tuple[str, str, str | None]:
        return self.kind, self.repo_id, self.config

    def label(self) -> str:
        rev = f"@{self.revision[:12]}" if self.revision else ""
        cfg = f" [{self.config}]" if self.config else ""
        return f"{self.kind} {self.repo_id}{rev}{cfg} ({self.what})"




# ------------------------------------------------------------------------------------------ listing


def _plain(node: Any) -> Any:
    if isinstance(node, DictConfig | ListConfig):
        return OmegaConf.to_container(node, resolve=False)
    return node


def eval_task_names(eval_cfg: Any) -> list[str]:
    """An eval config's task names, then the keys of its `task_options` that name no task (a misspelt key)."""
    names = list(_plain(_get(eval_cfg, "tasks")) or [])
    return names + [t for t in (_plain(_get(eval_cfg, "task_options")) or {}) if t not in names]


def data_sources(data: Any) -> list[dict[str, Any]]:
    """A data config's sources as plain dicts (typed SourceConfig, mapping or a bare path string)."""
    out = []
    for src in _plain(_get(data, "sources")) or []:
        if isinstance(src, str):
            src = {"path": src}
        elif dataclasses.is_dataclass(src):
            src = dataclasses.asdict(src)
        out.append(dict(src))
    return out


def _is_package(ref: str) -> bool:
    return "/" not in ref and importlib.util.find_spec(ref) is not None


def encoder_artifacts(encoder: Any) -> list[Artifact]:
    """The hub repos an encoder config loads (nothing for packages, local folders, random init with a
    package tokenizer)."""
    if encoder is None:
        return []
    source, revision = _get(encoder, "source", "package"), _get(encoder, "revision")
    out: list[Artifact] = []
    model_id = _get(encoder, "model_id")
    if source == "hub" and is_hub_id(model_id):
        out.append(Artifact("model", model_id, revision, what=f"encoder {_get(encoder, 'name')}"))
    tokenizer = _get(encoder, "tokenizer")
    if tokenizer and tokenizer != model_id and is_hub_id(tokenizer) and not _is_package(tokenizer):
        out.append(Artifact("model", tokenizer, revision, what=f"tokenizer of encoder {_get(encoder, 'name')}"))
    return out


def data_artifacts(data: Any) -> list[Artifact]:
    """The hub datasets a data config's sources load."""
    out = []
    for src in data_sources(data):
        path = src.get("path", LOCAL_DATA)
        if not is_named_source(path) and is_hub_id(path) and not Path(path).suffix:
            out.append(Artifact("dataset", path, src.get("revision"), src.get("subset"), _plain(src.get("data_files")),
                                what=f"training data {src.get('name') or path}"))
    return out


def _leaves(task: Any) -> list[Any]:
    from mteb.abstasks.aggregated_task import AbsTaskAggregate  # mteb loads once a suite names a task

    return list(task.metadata.tasks) if isinstance(task, AbsTaskAggregate) else [task]


def eval_artifacts(eval_cfg: Any) -> list[Artifact]:
    """The hub datasets of an eval suite's mteb tasks (their published `metadata.dataset`), and Paul Graham's essays
    where the RULER tasks are to read them (`eval.ruler_haystack=paul-graham`; `auto` falls back to lmk's own)."""
    tasks = _plain(_get(eval_cfg, "tasks")) or []
    out = []
    if _get(eval_cfg, "ruler_haystack") == "paul-graham" and any(str(t).startswith("RulerNiah") for t in tasks):
        out.append(Artifact("dataset", RULER_ESSAYS_REPO, what="the RULER NIAH haystack"))
    names = [t for t in tasks if t in hub_task_names()]
    if not names:
        return out
    options = _plain(_get(eval_cfg, "task_options")) or {}
    import mteb  # loaded once a suite names a hub task (hub_task_names)

    for name in names:
        leaves = _leaves(mteb.get_task(name))
        for leaf in leaves:
            ds = type(leaf).metadata.dataset
            opts = dict(options.get(name) or {}) if len(leaves) == 1 else None
            out.append(Artifact("dataset", ds["path"], ds.get("revision"), ds.get("name"),
                                what=f"eval task {leaf.metadata.name}", task=leaf.metadata.name, options=opts))
    return out


def _evaluates_a_saved_model(cfg: Any) -> bool:
    # lmk.evaluate with model=<run dir / folder / .ckpt>: the weights are local; model=null builds the encoder.
    return str(_get(cfg, "model", None)) not in ("None", "", "null")


def required_artifacts(cfg: Any) -> list[Artifact]:
    """Everything a job with composed config `cfg` (lmk.train or lmk.evaluate) loads from the hub, deduplicated
    by (kind, repo id, config): the encoder's weights and tokenizer, training data, eval task datasets."""
    found: list[Artifact] = []
    model = _get(cfg, "model", None)
    if not _evaluates_a_saved_model(cfg):
        found += encoder_artifacts(_get(cfg, "encoder"))
    elif is_hub_id(model):  # lmk.evaluate model=<hub id>: a published encoder as a baseline
        found.append(Artifact("model", str(model), None, what="model (a published encoder)"))
    found += data_artifacts(_get(cfg, "data"))
    eval_cfg = _get(cfg, "eval")
    if eval_cfg is not None and _get(cfg, "train") is not None:
        # a training job evaluates only its `eval.in_training` part (the eval stage's jobs the rest)
        eval_cfg = EvalConfig.from_cfg(eval_cfg).training_view()
    if eval_cfg is not None:
        found += eval_artifacts(eval_cfg)
    unique: dict[tuple[str, str, str | None], Artifact] = {}
    for art in found:
        if art.key in unique:
            prev = unique[art.key]
            unique[art.key] = Artifact(prev.kind, prev.repo_id, prev.revision, prev.config, prev.data_files,
                                       f"{prev.what}; {art.what}", prev.task, prev.options)
        else:
            unique[art.key] = art
    return list(unique.values())



# ------------------------------------------------------------------------------------------ locating
def _hub_cache_dir() -> Path:
    return Path(constants.HF_HUB_CACHE)


def cache_manifest_path() -> Path:
    """The manifest the download writes in cache mode (next to the Hugging Face cache)."""
    return Path(constants.HF_HOME) / MANIFEST


_WEIGHTS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.h5", "*.msgpack", "*.gguf")


def _in_hub_cache(art: Artifact) -> Path | None:
    """A model's complete snapshot in the Hugging Face hub cache: it has its config and weights (a tokenizer
    artifact: its tokenizer files) and no download of the repo is unfinished (huggingface_hub's `*.incomplete` blobs). A dataset snapshot alone never counts: the
    files of one config do not make another one's (see `_in_datasets_cache` and the manifest)."""
    if art.kind != "model":
        return None
    owner, name = art.repo_id.split("/")
    repo = _hub_cache_dir() / f"{art.kind}s--{owner}--{name}"
    snapshots = repo / "snapshots"
    if not snapshots.is_dir() or any((repo / "blobs").glob("*.incomplete")):
        return None
    if art.revision:
        ref = repo / "refs" / art.revision
        sha = ref.read_text().strip() if ref.is_file() else art.revision
        candidates = [snapshots / sha]
    else:
        candidates = sorted(p for p in snapshots.iterdir() if p.is_dir())
    tokenizer_only = art.what.startswith("tokenizer")  # encoder_artifacts' tokenizer of another repo
    for snap in candidates:
        if tokenizer_only and any((snap / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
            return snap
        if (snap / "config.json").exists() and any(any(snap.glob(w)) for w in _WEIGHTS):
            return snap
    return None


def _in_datasets_cache(art: Artifact) -> Path | None:
    """The `datasets` cache's prepared copy of this config (`<owner>___<snake_name>/<config>/<version>/<sha>/`,
    moved into place only once complete: `datasets` prepares into an `.incomplete` folder), else None."""
    if art.kind != "dataset" or (art.task and art.config is None):
        return None  # an mteb task without a config reads several (corpus, queries, qrels): the manifest decides
    # fast path: `datasets` (a second or more) loads where a cache is looked into, not when a config is checked
    import datasets
    from datasets.naming import camelcase_to_snakecase  # (the same reason)

    base = Path(datasets.config.HF_DATASETS_CACHE)
    owner, name = art.repo_id.split("/")
    for folder_name in dict.fromkeys((f"{owner}___{camelcase_to_snakecase(name)}", f"{owner}___{name}",
                                      f"{owner}___{name}".lower())):
        folder = base / folder_name / (art.config or "default")
        infos = [p for p in folder.glob("*/*/dataset_info.json") if ".incomplete" not in p.parent.name] \
            if folder.is_dir() else []
        if art.revision:
            infos = [p for p in infos if _prepared_revision(p) in (None, art.revision)]
        if infos:
            return infos[0].parent
    return None


def _prepared_revision(info: Path) -> str | None:
    """The hub commit a prepared copy was built from: `datasets` names its folder after it (else its
    download_checksums' URLs may); None when it cannot be told (the copy then counts)."""
    if re.fullmatch(r"[0-9a-f]{40}", info.parent.name):
        return info.parent.name
    try:
        data = json.loads(info.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    urls = " ".join(str(k) for k in (data.get("download_checksums") or {}))
    found = re.search(r"(?:@|/resolve/)([0-9a-f]{40})/", urls)
    return found.group(1) if found else None


def _in_manifest(art: Artifact, manifest: Path) -> Path | None:
    """The manifest entry a finished fetch of exactly this artifact wrote (kind, repo, revision, config)."""
    if not manifest.is_file():
        return None
    try:
        entries = json.loads(manifest.read_text()).get("artifacts", [])
    except json.JSONDecodeError:
        log.warning("%s is not valid JSON: ignored", manifest)
        return None
    for e in entries:
        if (e.get("kind"), e.get("repo_id"), e.get("config")) != (art.kind, art.repo_id, art.config):
            continue
        if art.revision and e.get("revision") not in (None, art.revision) and e.get("source") != "replica":
            continue
        if art.data_files and e.get("data_files") not in (None, art.data_files):
            continue
        path = Path(e.get("path") or "")
        path = path if path.is_absolute() else manifest.parent / path
        if e.get("path") and path.exists() and (e.get("source") == "replica" or e.get("status") != "missing"):
            return path
    return None


def locate(art: Artifact) -> str | None:
    """Where a job will find `art` offline ("mirror: ...", "hub cache: ...", ...), or None. Judged per
    (repo, revision, config, files): one config of a repo on disk says nothing of the others, and a download
    that did not finish is not there."""
    found = mirror.find(art.kind, art.repo_id, config=art.config)
    if found is not None:
        return f"mirror: {found}"
    for where, fn in (("hub cache", _in_hub_cache), ("datasets cache", _in_datasets_cache)):
        path = fn(art)
        if path is not None:
            return f"{where}: {path}"
    root = mirror.mirror_root()
    if root is not None and mirror.incomplete(mirror.repo_dir(root, art.kind, art.repo_id)) not in (None, "not there"):
        return None  # a partial copy in the mirror: its manifest entry (if any) does not vouch for it
    for manifest in ([root / MANIFEST] if root else []) + [cache_manifest_path()]:
        path = _in_manifest(art, manifest)
        if path is not None:
            return f"manifest {manifest}: {path}"
    return None


def missing_artifacts(cfg: Any) -> list[Artifact]:
    return [a for a in required_artifacts(cfg) if locate(a) is None]


def check_available(cfg: Any, offline: bool | None = None) -> None:
    """Offline (HF_HUB_OFFLINE & co.), fail naming every artifact the job loads that is not on disk.
    Online nothing is checked: the job downloads what it needs. The network is never probed."""
    if not (hub_offline() if offline is None else offline):
        return
    missing = missing_artifacts(cfg)
    if missing:
        root = mirror.mirror_root()
        raise MissingArtifactsError(
            "offline (HF_HUB_OFFLINE is set) and this job loads hub data that is not on disk:\n  "
            + "\n  ".join(a.label() for a in missing)
            + f"\nLooked in: the mirror ({root or 'none: set hub.mirror=DIR or LMK_HUB_MIRROR'}), the Hugging Face "
            f"cache ({_hub_cache_dir()}) and the manifests. Fix: on a machine with internet run `python -m "
            "lmk.download <spec> --scale <scale> [--mirror DIR]` (or `make download`) and point the job at the "
            "same cache/mirror; for a local copy of the datasets use `python -m lmk.eval.replicas --mirror DIR`; "
            "or run the offline suite `eval=local`."
        )


