"""A trained run -> a shareable model folder: the export, a model card generated from the run, and the run's mteb
results in the results repository's layout; then, when asked, the hub.

    publish(run_dir, out=..., repo_id="org/lmk-fixed-32", private=False, revision=None, table=None)

The folder (`out`, a temporary one when only pushing):

    <export>                          lmk.sharing.st_folder's layout (the code travels, with lmk's LICENSE);
                                      max_seq_length = the eval passage length (the training one when not evaluated)
    README.md                         the card (lmk.sharing.card): metadata (library_name, tags, base_model, datasets,
                                      license, model-index) and the run's facts
    results/<org>__<model>/<rev>/     each evaluated task's mteb TaskResult + model_meta.json (mteb's ResultCache);
                                      absent for a run never evaluated (the card says it has no scores)

The Table 2 row comes from the sweep's table (`<sweep>/<table>.json`, found above the run folder, or `table=`):
its cells under their column names, and the table's provenance lines.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml
from mteb.models.model_meta import ModelMeta
from mteb.results import TaskResult

from lmk.config import trains_landmark_states
from lmk.config.model import EncoderConfig
from lmk.config.registry import declared_scorings
from lmk.hub.push import Pushed, push_folder
from lmk.model.config_files import package_model_path
from lmk.model.loading import load_model as load_run_model
from lmk.run.results import EvalRecord, Results
from lmk.sharing.card import TableRow, model_card
from lmk.sharing.mteb_model import FRAMEWORK, PAPER, citation, load_model, n_parameters, save_results
from lmk.sharing.refusals import PublishError, check_out, check_publish, check_run
from lmk.sharing.st_folder import export_multi_vector, export_sentence_transformers

log = logging.getLogger(__name__)

# BGE "full data" subsets (data/<subset>-*.parquet) that are MTEB datasets, under their MTEB names
MTEB_TRAINING_SETS = {"msmarco_passage": "MSMARCO", "nq": "NQ", "hotpotqa": "HotpotQA", "fever": "FEVER",
                      "fiqa": "FiQA2018", "quora": "QuoraRetrieval", "arguana": "ArguAna", "scifact": "SciFact"}
CONFIG_SECTIONS = ("encoder", "pooling", "data", "train", "trainer", "seed")  # the training config on the card


@dataclass
class Publication:
    folder: Path
    meta: ModelMeta
    row: TableRow | None
    pushed: Pushed | None = None


def table_row(run_dir: Path, table: str | Path | None = None) -> TableRow | None:
    """The run's row of the table built over its sweep (`table`, else the first `<name>.json` with cells found in
    the three folders above the run); None when no table names the run."""
    candidates = [Path(table)] if table else [p for d in list(run_dir.resolve().parents)[:3] for p in d.glob("*.json")]
    for path in candidates:
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if not isinstance(data, dict) or "cells" not in data:
            continue
        cells = [c for c in data["cells"] if c.get("block") == "train" and c.get("run_dir")
                 and Path(c["run_dir"]).resolve() == run_dir.resolve()]
        if cells:
            return TableRow(path, str(data.get("spec")), str(data.get("scale")), cells[0]["row"], cells[0]["label"],
                            cells, list(data.get("provenance") or []))
    if table:
        raise PublishError(f"{table} has no row whose run folder is {run_dir}; give the table built over this run's "
                           "sweep (<sweep>/table2.json), or leave --table out")
    return None


def task_results(run_dir: Path, section: EvalRecord) -> list[TaskResult]:
    """The mteb TaskResult of every task of the run's eval section, from the run's mteb cache."""
    cache = Path(section.cache_dir or run_dir / "mteb_cache") / "results"
    model = str(section.model).replace("/", "__").replace(" ", "_")
    found = []
    for task in section.tasks:
        files = sorted((cache / model / str(section.fingerprint)).rglob(f"{task}.json"))
        if not files:
            raise PublishError(f"{run_dir}: no mteb result for {task} under {cache / model}; rerun its evaluation "
                               f"(python -m lmk.evaluate model={run_dir})")
        found.append(TaskResult.from_disk(files[0]))
    return found


def base_model(encoder: EncoderConfig) -> str | None:
    """The hub id the encoder started from: a hub encoder's model_id, or the id a model package's card names."""
    if encoder.source == "hub" and encoder.model_id and not Path(encoder.model_id).expanduser().exists():
        return encoder.model_id
    if encoder.source == "package" and encoder.package:
        card = _card_metadata(Path(package_model_path(encoder.package)) / "README.md")
        if card.get("base_model"):
            return str(card["base_model"])
        summary = metadata.metadata(encoder.package.replace("_", "-")).get("Summary") or ""
        ids = [w.strip(".,") for w in summary.split() if w.count("/") == 1 and not w.startswith("http")]
        return ids[0] if ids else None
    return None


def _card_metadata(readme: Path) -> dict[str, Any]:
    text = readme.read_text(encoding="utf-8") if readme.is_file() else ""
    if not text.startswith("---\n"):
        return {}
    return yaml.safe_load(text.split("\n---", 2)[0][4:]) or {}


def base_license(encoder: EncoderConfig) -> str:
    """The weights' licence: a model package's card's; a random init is lmk's own weights (lmk's licence)."""
    if encoder.source == "package" and encoder.package:
        found = _card_metadata(Path(package_model_path(encoder.package)) / "README.md").get("license")
        if found:
            return str(found)
    if encoder.source == "random":
        return str(metadata.metadata("lmk").get("License-Expression") or "apache-2.0").lower()
    return "other"  # a hub model: the card says its base model's licence applies


def training_sets(config: dict[str, Any]) -> tuple[list[str], set[str]]:
    """(hub dataset ids, MTEB dataset names) of the run's training sources."""
    hub, mteb_names = [], set()
    for source in (config.get("data") or {}).get("sources") or []:
        path = str(source.get("path") or "")
        if path.count("/") == 1 and not path.startswith((".", "/", "~")) and ":" not in path:
            hub.append(path)
            files = str(source.get("data_files") or "")
            subset = Path(files).name.split("-")[0] if files else ""
            if subset in MTEB_TRAINING_SETS:
                mteb_names.add(MTEB_TRAINING_SETS[subset])
    return sorted(set(hub)), mteb_names


def _meta(folder: Path, name: str, model: Any, results: Results, license_: str, base: str | None,
          repo_id: str | None) -> ModelMeta:
    section = results.eval
    hub, mteb_names = training_sets(results.config)
    # the lengths the scores were computed at, as the model applies them (cut to its positions)
    scored = {k: min(int(getattr(section, k) or model.max_positions), model.max_positions)
              for k in ("query_max_length", "passage_max_length")} if section.tasks else {}
    return ModelMeta(
        loader=load_model, loader_kwargs=scored,
        name=name, revision=model.fingerprint(), release_date=datetime.date.today().isoformat(), languages=None,
        n_parameters=n_parameters(folder), memory_usage_mb=round(n_parameters(folder) * 4 / 2**20, 1),
        max_tokens=float(model.max_positions), embed_dim=model.hidden_size, license=license_, open_weights=True,
        public_training_code=None, public_training_data=f"https://huggingface.co/datasets/{hub[0]}" if hub else None,
        framework=FRAMEWORK, reference=f"https://huggingface.co/{repo_id}" if repo_id else PAPER,
        similarity_fn_name="cosine", use_instructions=False, training_datasets=mteb_names, adapted_from=base,
        citation=citation(), model_type=["dense"],
    )


def usage_source(out: Path, repo_id: str | None) -> str:
    """What the card's usage lines load: the repo id, else the folder relative to where the command ran (never a
    path of this machine: the card travels)."""
    if repo_id:
        return repo_id
    rel = Path(os.path.relpath(out.resolve(), Path.cwd().resolve()))
    return rel.as_posix() if not rel.as_posix().startswith("..") else out.name


def write_folder(run_dir: str | Path, out: str | Path, *, repo_id: str | None = None, table: str | Path | None = None,
                 license_: str | None = None, base: str | None = None, multi_vector: bool | None = None) -> Publication:
    """Write the publication folder of a finished run (see the module doc); nothing is uploaded. The folder appears
    whole or not at all: it is written beside `out` and renamed into place. `multi_vector` None: as the run was
    trained (a MaxSim-trained run as its landmark states, `trains_landmark_states`; else one vector)."""
    run_dir, out = Path(run_dir), Path(out)
    check_out(out)
    results = check_run(run_dir)
    model, _ = load_run_model(run_dir)
    if multi_vector is None:
        multi_vector = trains_landmark_states((results.config.get("train") or {}).get("objective"))
    section = results.eval if results.eval.tasks else None
    if section is not None and model.fingerprint() != section.fingerprint:
        log.warning("%s: the weights (fingerprint %s) are not the ones evaluated (%s); evaluate them again: "
                    "python -m lmk.evaluate model=%s record=true", run_dir, model.fingerprint(), section.fingerprint,
                    run_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)  # mkdtemp's 0700 would stay on the published folder
    try:
        meta, row = _write(run_dir, staging, model, results, section, out=out, repo_id=repo_id, table=table,
                           license_=license_, base=base, multi_vector=multi_vector)
        if out.exists():
            out.rmdir()  # empty (checked above)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return Publication(out, meta, row)


def _maxsim_query(section: EvalRecord | None) -> str:
    """Which states a query is in the multi-vector export: as the run's multi-vector scores were computed
    (results.json's eval.maxsim_query), else its landmarks."""
    if section is None or not section.tasks or not declared_scorings().get(section.scoring, {}).get("multi_vector"):
        return "landmarks"
    return str(section.extra.get("maxsim_query") or "landmarks")


def _write(run_dir: Path, folder: Path, model: Any, results: Results, section: EvalRecord | None, *, out: Path,
           repo_id: str | None, table: str | Path | None, license_: str | None, base: str | None,
           multi_vector: bool = False) -> tuple[ModelMeta, TableRow | None]:
    length = min(model.passage_max_length, model.max_positions)
    scored = None
    if section is not None:  # the length the scores were computed at: sentence-transformers' and lmk's default
        length = min(int(section.passage_max_length or model.max_positions), model.max_positions)
        scored = {"query_max_length": min(int(section.query_max_length or length), model.max_positions),
                  "passage_max_length": length}
    try:
        if multi_vector:  # the states the card's scores used: a query's as the run's eval.maxsim_query
            export_multi_vector(model, folder, max_length=length, scored_at=scored, maxsim_query=_maxsim_query(section))
        else:
            export_sentence_transformers(model, folder, max_length=length, scored_at=scored)
    except ValueError as err:  # a pooling without landmarks has no multi-vector form
        raise PublishError(f"{run_dir}: {err}") from None
    encoder = model.encoder_cfg
    base = base or (base_model(encoder) if encoder else None)
    license_ = license_ or (base_license(encoder) if encoder else "other")
    label = "".join(c if c.isalnum() or c in "-_." else "-" for c in model.name)
    meta = _meta(folder, repo_id or f"lmk/{label}", model, results, license_, base, repo_id)
    results_found = task_results(run_dir, section) if section is not None else []
    if results_found:
        save_results(results_found, meta, folder)
    row = table_row(run_dir, table)
    config = {k: results.config[k] for k in CONFIG_SECTIONS if k in results.config}
    (folder / "README.md").write_text(model_card(meta=meta, model=model, results=results, config=config, row=row,
                                                 task_results=results_found, source=usage_source(out, repo_id),
                                                 length=length, multi_vector=multi_vector))
    return meta, row


def publish(run_dir: str | Path, *, out: str | Path | None = None, repo_id: str | None = None, private: bool = False,
            revision: str | None = None, table: str | Path | None = None, license_: str | None = None,
            base: str | None = None, multi_vector: bool | None = None, checked: bool = False) -> Publication:
    """Write the folder (into `out`, else a temporary one) and, with `repo_id`, push it to the hub. The refusals come
    first (lmk.sharing.refusals.check_publish; `checked`: the caller ran it, as `python -m lmk.export` does)."""
    if not checked:
        check_publish(run_dir, out, repo_id)
    with tempfile.TemporaryDirectory(prefix="lmk-publish-") as scratch:
        pub = write_folder(run_dir, Path(out) if out else Path(scratch) / "model", repo_id=repo_id, table=table,
                           license_=license_, base=base, multi_vector=multi_vector)
        if repo_id:
            pub.pushed = push_folder(pub.folder, repo_id, private=private, revision=revision,
                                     message=f"Upload {pub.meta.name} (lmk, weights {pub.meta.revision})")
    return pub
