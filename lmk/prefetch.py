"""What a job loads from the Hugging Face hub, fetched ahead of time, and checked before compute.

Compute nodes of a cluster usually have no internet: jobs run with `HF_HUB_OFFLINE=1`, so every model,
tokenizer, training file and mteb dataset a job loads must already be on disk. ONE function lists them,
`required_artifacts(cfg)`, used both by

- `python -m lmk.prefetch experiments/table2/spec.yaml --scale paper [--mirror DIR]` (`make prefetch
  SCALE=paper`), run on a login node: composes every job of the sweep, downloads each artifact into the
  Hugging Face cache (or the mirror folder, see `lmk.eval.mirror`) and writes a manifest (what, repo id,
  revision, local path); the downloads go through `huggingface_hub` / `datasets`, which honour
  HTTPS_PROXY / HTTP_PROXY / NO_PROXY;
- `check_available(cfg)`, run in config validation (before any model is built; the row sweeper runs it
  for every job before launching): offline, each artifact must be in the mirror, the Hugging Face cache
  or a manifest, else it fails naming what is missing and the prefetch command. It never probes the
  network.

`preflight(cfg)` adds the other checks that need no compute: local data paths exist and every eval task
name resolves in mteb's registry (offline).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lmk.data.config import LOCAL_SOURCE as LOCAL_DATA
from lmk.data.config import is_named_source
from lmk.eval import mirror
from lmk.eval.config import LOCAL_TASKS, EvalConfig
from lmk.schema import get_key

log = logging.getLogger(__name__)

MANIFEST = "lmk_manifest.json"


class MissingArtifactsError(RuntimeError):
    """Offline, something a job loads is neither in the mirror, the Hugging Face cache nor a manifest."""


class PreflightError(ValueError):
    """A job config names a data path that does not exist or an eval task that does not resolve."""


@dataclass(frozen=True)
class Artifact:
    kind: str                    # "model" (weights, tokenizer, config) | "dataset"
    repo_id: str                 # hub id, e.g. answerdotai/ModernBERT-base, mteb/scifact
    revision: str | None = None  # None: the default branch
    config: str | None = None    # dataset config name (LongEmbed's "needle", ...)
    data_files: Any = None       # training data: only these files of the repo
    what: str = ""               # who loads it: "encoder", "tokenizer", "training data", "eval task SciFact"
    task: str | None = None      # the mteb task that reads it (cache-mode prefetch runs its own load_data)
    options: Any = None          # that task's eval.task_options (splits / subsets: only those are loaded)

    @property
    def key(self) -> tuple[str, str, str | None]:
        return self.kind, self.repo_id, self.config

    def label(self) -> str:
        rev = f"@{self.revision[:12]}" if self.revision else ""
        cfg = f" [{self.config}]" if self.config else ""
        return f"{self.kind} {self.repo_id}{rev}{cfg} ({self.what})"


# ------------------------------------------------------------------------------------------ listing
_get = get_key


def _plain(node: Any) -> Any:
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(node, DictConfig | ListConfig):
            return OmegaConf.to_container(node, resolve=False)
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    return node


def _sources(data: Any) -> list[dict[str, Any]]:
    """A data config's sources as plain dicts (typed SourceConfig, mapping or a bare path string)."""
    import dataclasses

    out = []
    for src in _plain(_get(data, "sources")) or []:
        if isinstance(src, str):
            src = {"path": src}
        elif dataclasses.is_dataclass(src):
            src = dataclasses.asdict(src)
        out.append(dict(src))
    return out


def is_hub_id(ref: Any) -> bool:
    """A hub repo id ("owner/name") that is not a path on this machine."""
    if not isinstance(ref, str) or ref.count("/") != 1 or ref.startswith(("/", ".", "~")):
        return False
    return not Path(ref).expanduser().exists()


def _is_package(ref: str) -> bool:
    import importlib.util

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
    for src in _sources(data):
        path = src.get("path", LOCAL_DATA)
        if not is_named_source(path) and is_hub_id(path) and not Path(path).suffix:
            out.append(Artifact("dataset", path, src.get("revision"), src.get("subset"), _plain(src.get("data_files")),
                                what=f"training data {src.get('name') or path}"))
    return out


def _leaves(task: Any) -> list[Any]:
    from mteb.abstasks.aggregated_task import AbsTaskAggregate

    return list(task.metadata.tasks) if isinstance(task, AbsTaskAggregate) else [task]


def eval_artifacts(eval_cfg: Any) -> list[Artifact]:
    """The hub datasets of an eval suite's mteb tasks (their published `metadata.dataset`)."""
    names = [t for t in (_plain(_get(eval_cfg, "tasks")) or []) if t not in LOCAL_TASKS]
    if not names:
        return []
    import mteb

    options = _plain(_get(eval_cfg, "task_options")) or {}
    out = []
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
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def cache_manifest_path() -> Path:
    """The manifest prefetch writes in cache mode (next to the Hugging Face cache)."""
    from huggingface_hub import constants

    return Path(constants.HF_HOME) / MANIFEST


def _in_hub_cache(art: Artifact) -> Path | None:
    owner, name = art.repo_id.split("/")
    repo = _hub_cache_dir() / f"{art.kind}s--{owner}--{name}"
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    if art.revision:
        ref = repo / "refs" / art.revision
        sha = ref.read_text().strip() if ref.is_file() else art.revision
        return snapshots / sha if (snapshots / sha).is_dir() else None
    return next((p for p in snapshots.iterdir() if p.is_dir()), None)


def _in_datasets_cache(art: Artifact) -> Path | None:
    if art.kind != "dataset":
        return None
    import datasets

    base = Path(datasets.config.HF_DATASETS_CACHE)
    for name in (art.repo_id.replace("/", "___"), art.repo_id.replace("/", "___").lower()):
        if (base / name).is_dir():
            return base / name
    return None


def _in_manifest(art: Artifact, manifest: Path) -> Path | None:
    if not manifest.is_file():
        return None
    try:
        entries = json.loads(manifest.read_text()).get("artifacts", [])
    except json.JSONDecodeError:
        log.warning("%s is not valid JSON: ignored", manifest)
        return None
    for e in entries:
        if e.get("kind") == art.kind and e.get("repo_id") == art.repo_id and e.get("config") in (None, art.config):
            path = Path(e.get("path", ""))
            path = path if path.is_absolute() else manifest.parent / path
            if path.exists():
                return path
    return None


def locate(art: Artifact) -> str | None:
    """Where a job will find `art` offline ("mirror: ...", "hub cache: ...", ...), or None."""
    found = mirror.find(art.kind, art.repo_id)
    if found is not None:
        return f"mirror: {found}"
    for where, fn in (("hub cache", _in_hub_cache), ("datasets cache", _in_datasets_cache)):
        path = fn(art)
        if path is not None:
            return f"{where}: {path}"
    root = mirror.mirror_root()
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
    if not (mirror.hub_offline() if offline is None else offline):
        return
    missing = missing_artifacts(cfg)
    if missing:
        root = mirror.mirror_root()
        raise MissingArtifactsError(
            "offline (HF_HUB_OFFLINE is set) and this job loads hub data that is not on disk:\n  "
            + "\n  ".join(a.label() for a in missing)
            + f"\nLooked in: the mirror ({root or 'none: set hub.mirror=DIR or LMK_HUB_MIRROR'}), the Hugging Face "
            f"cache ({_hub_cache_dir()}) and the manifests. Fix: on a machine with internet run `python -m "
            "lmk.prefetch <spec> --scale <scale> [--mirror DIR]` (or `make prefetch`) and point the job at the "
            "same cache/mirror; for a local copy of the datasets use `python -m lmk.eval.replicas --mirror DIR`; "
            "or run the offline suite `eval=local`."
        )


# ------------------------------------------------------------------------------------------ preflight
def check_data_paths(data: Any) -> None:
    """Every local training data path exists (a missing file fails here, not after the model is built)."""
    missing = []
    for src in _sources(data):
        path = src.get("path", LOCAL_DATA)
        if is_named_source(path) or is_hub_id(path) and not Path(path).suffix:
            continue  # `local` and `replica:<name>` are built on demand in the lmk cache
        if not Path(path).expanduser().exists():
            missing.append(path)
    if missing:
        raise PreflightError(f"data.sources: path(s) {missing} do not exist; give existing .jsonl/.json/.parquet "
                             "files or folders, 'local' (the offline default set), 'replica:bge-full-data' or a hub id (owner/name)")


def check_eval_tasks(eval_cfg: Any) -> None:
    """Every eval task name resolves (mteb's registry, offline; or a local task)."""
    names = list(_plain(_get(eval_cfg, "tasks")) or [])
    names += [t for t in (_plain(_get(eval_cfg, "task_options")) or {}) if t not in names]  # a misspelt option key
    if any(t not in LOCAL_TASKS for t in names):
        from lmk.eval.suites import check_task_names

        check_task_names(names)


def preflight(cfg: Any, artifacts: bool = False) -> None:
    """Checks that need no compute: local data paths exist, eval task names resolve and (artifacts=True)
    offline, every hub artifact the job loads is on disk. lmk.config.validate and
    lmk.evaluate.validate_config run it without `artifacts` (so the row sweeper checks every job before
    launching, also on a laptop that plans a cluster sweep); the jobs themselves (lmk.train, lmk.evaluate)
    run it with `artifacts` on the node that computes, before any model is built."""
    mirror.configure(_get(_get(cfg, "hub"), "mirror"))
    check_data_paths(_get(cfg, "data"))
    check_eval_tasks(_get(cfg, "eval"))
    if artifacts:
        check_available(cfg)


# ------------------------------------------------------------------------------------------ fetching
def fetch(art: Artifact, mirror_dir: Path | None) -> Path:
    """Download one artifact into the mirror (the hub repo's files) or the Hugging Face caches.

    Cache mode reads it the way the job will, so the caches hold exactly what the job opens offline: an
    eval dataset through its mteb task's own `load_data`, training data through `datasets.load_dataset`
    with its `data_files`, a model as a hub snapshot. huggingface_hub and datasets honour HTTPS_PROXY /
    HTTP_PROXY / NO_PROXY (and HF_ENDPOINT), so this works behind a login node's proxy.
    """
    from huggingface_hub import snapshot_download

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
        import mteb

        opts = art.options or {}
        mteb.get_task(art.task, eval_splits=opts.get("eval_splits"), hf_subsets=opts.get("hf_subsets"),
                      languages=opts.get("languages")).load_data()
        return _in_hub_cache(art) or _in_datasets_cache(art) or _hub_cache_dir()
    if art.kind == "dataset":
        import datasets

        datasets.load_dataset(art.repo_id, name=art.config, data_files=art.data_files, revision=art.revision)
        return _in_hub_cache(art) or _in_datasets_cache(art) or _hub_cache_dir()
    return Path(snapshot_download(art.repo_id, repo_type=repo_type, revision=art.revision, allow_patterns=patterns))


def _compose_jobs(spec_path: str, scale_name: str) -> list[tuple[str, Any]]:
    """(label, composed config) of every job a sweep of `scale_name` launches."""
    from hydra import compose, initialize_config_dir

    from lmk.experiments.spec import load_spec
    spec = load_spec(spec_path)
    scale = spec.scale(scale_name)
    rows = spec.rows_for(scale, None)
    from lmk.config import CONF_DIR

    jobs = []
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        for row in rows:
            jobs.append((f"train/{row.id}", compose("train", overrides=[*scale.train_overrides, *row.overrides,
                                                                        f"row={row.id}"])))
            if scale.zero_shot:
                jobs.append((f"zeroshot/{row.id}", compose("evaluate", overrides=[
                    *scale.zero_shot_overrides, *row.overrides, f"row={row.id}"])))
        stage = getattr(scale, "eval_stage", None) or {}
        if stage:  # the eval stage: one lmk.evaluate job per (row, shard) on the trained model (lmk.experiments.eval_stage)
            from lmk.experiments.eval_stage import SEP, plan_shards

            overrides = [*stage.get("overrides", []), *stage.get("launcher_overrides", [])]
            suite = EvalConfig.from_cfg(compose("evaluate", overrides=overrides).eval)
            for row in rows:
                for shard, tasks in plan_shards(suite, str(stage.get("shard_by", "group"))).items():
                    jobs.append((f"eval/{row.id}{SEP}{shard}", compose("evaluate", overrides=[
                        *overrides, f"model=outputs/{spec.name}/{scale_name}/train/{row.id}",
                        f"eval.tasks=[{','.join(tasks)}]", "~eval.groups", f"row={row.id}{SEP}{shard}"])))
    return jobs


def scale_artifacts(spec_path: str, scale_name: str) -> list[Artifact]:
    """The union of `required_artifacts` over every job of the scale."""
    unique: dict[tuple[str, str, str | None], Artifact] = {}
    for _, cfg in _compose_jobs(spec_path, scale_name):
        for art in required_artifacts(cfg):
            unique.setdefault(art.key, art)
    return list(unique.values())


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
            if mirror.hub_offline():
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
            manifest.write_text(json.dumps({"artifacts": keep + [dict(e, recorded=time.strftime("%Y-%m-%dT%H:%M:%S"))
                                                                  for e in recorded]}, indent=1))
    return entries


def _write_scale_replicas(args: argparse.Namespace) -> int | None:
    """A scale whose `hub_mirror` says `replicas` (the rehearsal) stands local replicas in for the downloads:
    prefetch writes them where the sweep's jobs will look (the --mirror folder, else the scale's own)."""
    import dataclasses

    from lmk.experiments.hub_mirror import prepare
    from lmk.experiments.spec import load_spec

    spec = load_spec(args.spec)
    scale = spec.scale(args.scale)
    if not (scale.hub_mirror or {}).get("replicas"):
        return None
    if args.mirror:
        scale = dataclasses.replace(scale, hub_mirror={**scale.hub_mirror, "path": str(Path(args.mirror).resolve())})
    root = prepare(scale, Path(args.out or f"outputs/{spec.name}/{args.scale}"), dry_run=args.dry_run)
    print(f"[lmk.prefetch] scale {args.scale!r} reads offline replicas, nothing to download: "
          f"{'would write' if args.dry_run else 'wrote'} them into {root}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Download everything a sweep's jobs load, for offline compute nodes.")
    parser.add_argument("spec", help="table spec, e.g. experiments/table2/spec.yaml")
    parser.add_argument("--scale", default="paper")
    parser.add_argument("--mirror", default=None, help="a folder mirror (default: the Hugging Face cache)")
    parser.add_argument("--dry-run", action="store_true", help="list what would be fetched and what is on disk")
    parser.add_argument("--out", default=None, help="the sweep folder a relative hub_mirror path is under "
                        "(default outputs/<table>/<scale>, as lmk.sweep)")
    args = parser.parse_args(argv)
    replicated = _write_scale_replicas(args)
    if replicated is not None:
        return replicated
    arts = scale_artifacts(args.spec, args.scale)
    print(f"[lmk.prefetch] scale {args.scale!r}: {len(arts)} artifacts", flush=True)
    entries = prefetch(arts, args.mirror, dry_run=args.dry_run)
    missing = [e for e in entries if e["status"] == "missing"]
    if args.dry_run:
        print(f"[lmk.prefetch] dry run: {len(missing)} of {len(entries)} not on disk")
    else:
        where = Path(args.mirror) / mirror.MANIFEST if args.mirror else cache_manifest_path()
        print(f"[lmk.prefetch] manifest: {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
