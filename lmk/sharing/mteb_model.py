"""An exported LMK model as an mteb model: a `ModelMeta` with a loader (mteb's own pattern, as its model
implementations declare theirs), and its results in the layout of the MTEB results repository.

    meta = model_meta("outputs/table2/mini/train/lmk-fixed-32/export")   # or a hub id "org/lmk-fixed-32"
    model = meta.load_model(query_max_length=512)                         # mteb's ModelMeta.load_model
    mteb.evaluate(model, tasks)                                           # the scores lmk.evaluate gives

`model_meta(source)` describes a folder (or the snapshot of a hub id) from its files: the published `model_meta.json`
under `results/` when the folder was published (name, licence, training data, ...), else what the folder says
(name `lmk/<model name>`, embedding size, parameters, positions). Its revision is the weights fingerprint lmk gives
every model (`EmbeddingModel.fingerprint`: equal fingerprints, equal embeddings). The loader is `load_model`: the
folder through `lmk.model.exported.load_exported` into `LmkEncoder`, the adapter `lmk.evaluate` runs, so the
scores are lmk's at the same per-side max lengths (`query_max_length`, `passage_max_length`: loader keywords,
recorded as mteb experiment settings by `ModelMeta.load_model`). mteb's registry lists the models mteb itself
implements; an lmk export is loaded from its meta, as mteb loads any of them (`mteb.get_model` is that call after a
registry lookup).

`save_results(results, meta, folder)` writes task results through mteb's own `ResultCache`:
`<folder>/results/<org>__<model>/<revision>/<Task>.json` beside `model_meta.json`, the results repository's layout.
"""

from __future__ import annotations

import json
import logging
import struct
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any

import mteb
from huggingface_hub import snapshot_download
from mteb.models.model_meta import ModelMeta
from mteb.results import TaskResult

from lmk.eval.encoder import LmkEncoder
from lmk.model.exported import is_export, load_exported
from lmk.model.landmark.landmark_transformer import read_settings

log = logging.getLogger(__name__)

FRAMEWORK = ["PyTorch", "Sentence Transformers"]
RESULTS_DIR = "results"  # ResultCache(cache_path=folder) writes <folder>/results/<org>__<model>/<revision>/
PAPER = "https://arxiv.org/abs/2601.21525"


def citation() -> str:
    """The paper's BibTeX entry (lmk/resources/citation.bib)."""
    return resources.files("lmk").joinpath("resources/citation.bib").read_text(encoding="utf-8").strip()


def local_folder(source: str | Path, hub_revision: str | None = None) -> Path:
    """An export folder as is; a hub id downloaded (or read from the Hugging Face cache) at `hub_revision`."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if path.is_absolute() or str(source).startswith((".", "~")) or str(source).count("/") != 1:
        raise FileNotFoundError(f"{source!r} is neither a model folder nor a hub id (owner/name)")
    return Path(snapshot_download(str(source), revision=hub_revision))


def n_parameters(folder: Path) -> int:
    """Parameters in the folder's safetensors files (their headers only: shapes, no weights read)."""
    total = 0
    for file in sorted(folder.rglob("*.safetensors")):
        with open(file, "rb") as fh:
            header = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
        for key, entry in header.items():
            if key != "__metadata__":
                count = 1
                for dim in entry["shape"]:
                    count *= dim
                total += count
    return total


def _published(folder: Path) -> dict[str, Any] | None:
    """The model_meta.json a publication wrote under results/ (one model), else None."""
    found = sorted((folder / RESULTS_DIR).glob("*/*/model_meta.json"))
    return json.loads(found[0].read_text()) if len(found) == 1 else None


def model_meta(source: str | Path, *, name: str | None = None, hub_revision: str | None = None) -> ModelMeta:
    """The ModelMeta of an export folder or hub id, with `load_model` as its loader (see the module doc)."""
    folder = local_folder(source, hub_revision)
    if not is_export(folder):
        raise ValueError(f"{source}: not an lmk export (modules.json does not start with LandmarkTransformer)")
    loader_kwargs = {"source": str(source), "hub_revision": hub_revision}
    published = _published(folder)
    if published is not None:
        fields = {k: v for k, v in published.items() if k in ModelMeta.model_fields and k != "loader"}
        # the published defaults (the per-side lengths the scores were computed at) and where the folder is now
        fields.update(loader=load_model, loader_kwargs={**(published.get("loader_kwargs") or {}), **loader_kwargs},
                      experiment_kwargs=None)
        if name:
            fields["name"] = name
        return ModelMeta(**fields)
    settings = read_settings(folder)
    lmk = settings.get("lmk") or {}
    config = json.loads((folder / "config.json").read_text())
    label = "".join(c if c.isalnum() or c in "-_." else "-" for c in str(lmk.get("name") or folder.name))
    return ModelMeta(
        loader=load_model, loader_kwargs=loader_kwargs,
        name=name or (str(source) if not Path(source).expanduser().is_dir() else f"lmk/{label}"),
        revision=lmk.get("fingerprint"), release_date=None, languages=None, n_parameters=n_parameters(folder),
        memory_usage_mb=None, max_tokens=float(settings["max_positions"]), embed_dim=int(config["hidden_size"]),
        license=None, open_weights=True, public_training_code=None, public_training_data=None, framework=FRAMEWORK,
        reference=None, similarity_fn_name="cosine", use_instructions=False, training_datasets=None,
        citation=citation(), model_type=["dense"],
    )


def load_model(model_name: str, revision: str | None = None, device: str | None = None, *, source: str,
               hub_revision: str | None = None, query_max_length: int | None = None,
               passage_max_length: int | None = None, batch_size: int = 32, max_tokens_per_batch: int | None = None,
               precision: str = "fp32", workers: int | str = "auto", **kwargs: Any) -> LmkEncoder:
    """mteb's loader: the export at `source` as the encoder `lmk.evaluate` runs. The max lengths default to those
    the folder's card scores were computed at (`scored_at`, written by `python -m lmk.export`), else to its
    max_seq_length (as sentence-transformers encodes)."""
    if kwargs:
        raise TypeError(f"{model_name}: unknown loader options {sorted(kwargs)}; allowed: query_max_length, "
                        "passage_max_length, batch_size, max_tokens_per_batch, precision, workers")
    folder = local_folder(source, hub_revision)
    model = load_exported(folder, device=device or "cpu")
    if revision and revision != model.fingerprint():
        raise ValueError(f"{model_name}: revision {revision} asked for, the folder's weights are {model.fingerprint()}"
                         " (lmk's weights fingerprint); load the matching folder or revision")
    settings = read_settings(folder)
    default = int(settings.get("max_seq_length") or model.passage_max_length)
    scored = (settings.get("lmk") or {}).get("scored_at") or {}
    query_max_length = query_max_length or int(scored.get("query_max_length") or default)
    passage_max_length = passage_max_length or int(scored.get("passage_max_length") or default)
    return LmkEncoder(model, query_max_length, passage_max_length, batch_size,
                      max_tokens_per_batch=max_tokens_per_batch, precision=precision, workers=workers)


def save_results(results: Iterable[TaskResult], meta: ModelMeta, folder: str | Path) -> list[Path]:
    """Each task result through mteb's ResultCache into `<folder>/results/<org>__<model>/<revision>/<Task>.json`
    (with model_meta.json beside them): the results repository's layout. The meta must carry no experiment
    settings (they would add an experiments/ level)."""
    if meta.experiment_kwargs:
        meta = meta.model_copy(update={"experiment_kwargs": None})
    cache = mteb.ResultCache(cache_path=folder)
    written = []
    for result in results:
        cache.save_to_cache(result, meta)
        written.append(Path(cache.get_task_result_path(result.task_name, meta)))
    return written
