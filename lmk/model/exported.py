"""An lmk export (a sentence-transformers folder; lmk.sharing.st_folder writes one) read back as an EmbeddingModel with
lmk's own classes: no code from the folder runs. The folder is checked first (files whole, shapes matching, modules
lmk has), so a folder cut short or edited by hand fails in one line naming the file and the fix.

Folders written before the code travelled name `lmk.export.LandmarkTransformer` / `lmk.export.LandmarkPooling` in
their modules.json; both still load (lmk/export.py keeps those names): the second is `LegacyPoolerLoader`, which
loads such a folder's pooling module into the pooler of its mode (it is not the LMK pooler, `LMKPooling`).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModel

from lmk.config import UserError
from lmk.config.model import EncoderConfig, PoolingConfig
from lmk.model.embedding import EmbeddingModel
from lmk.model.landmark import POOLER_CLASSES, LandmarkTransformer, Pooler, build_pooler

OLD_MODULES = ("lmk.export.LandmarkTransformer", "lmk.export.LandmarkPooling")


def is_export(path: str | os.PathLike) -> bool:
    """A sentence-transformers folder whose first module is the landmark input module (any version)."""
    modules = Path(path) / "modules.json"
    if not modules.is_file():
        return False
    try:
        first = json.loads(modules.read_text())[0]["type"]
    except (ValueError, KeyError, IndexError, TypeError):
        return True  # unreadable: load_exported names the file and the fix (check_folder)
    return str(first).endswith(".LandmarkTransformer")


class LegacyPoolerLoader:
    """Loads the pooling module of an export written before the code travelled (its modules.json names
    `lmk.export.LandmarkPooling`, then a wrapper around a pooler) into the pooler class of its mode: a loader, not a
    pooler, and not the LMK pooler (`LMKPooling`). `lmk.export.LandmarkPooling` is this class, for those folders."""

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", token: bool | str | None = None,
             cache_folder: str | None = None, revision: str | None = None, local_files_only: bool = False,
             **kwargs: Any) -> Pooler:
        hub = {"subfolder": subfolder, "token": token, "cache_folder": cache_folder, "revision": revision,
               "local_files_only": local_files_only}
        config = Pooler.load_config(model_name_or_path, **hub)  # pooler_name, hidden_size, pooler_kwargs
        pooler = build_pooler(config["pooler_name"], hidden_size=config["hidden_size"],
                              **config.get("pooler_kwargs") or {})
        if pooler.trainable:
            weights = Pooler.load_file_path(model_name_or_path, "model.safetensors", **hub)
            if weights is None:
                raise FileNotFoundError(f"{model_name_or_path}/{subfolder}: no model.safetensors for the trainable "
                                        f"pooler {config['pooler_name']!r}")
            state = load_file(weights)  # the wrapper kept the pooler as `.pooler`
            pooler.load_state_dict({k.removeprefix("pooler."): v for k, v in state.items()})
        return pooler


def _pooler_class(ref: str) -> Any:
    """modules.json's pooling type -> lmk's class (by class name: `<file>.<class>` names the folder's copy)."""
    if ref == OLD_MODULES[1]:
        return LegacyPoolerLoader
    name = ref.rsplit(".", 1)[-1]
    for cls in POOLER_CLASSES.values():
        if cls.__name__ == name:
            return cls
    raise ValueError(f"pooling module {ref!r}: no registered pooler class {name!r} in lmk.model.landmark "
                     f"(registered: {', '.join(c.__name__ for c in POOLER_CLASSES.values())})")


class ExportFolderError(UserError, ValueError):
    """A folder that is not a whole lmk export (a file missing, truncated or of the wrong shape)."""


REFETCH = "download the folder again, or export the run again (python -m lmk.export <run dir> --out <folder>)"


def _check_safetensors(file: Path) -> None:
    """The file is there and as long as its header says (a download or copy cut short is named, not loaded)."""
    if not file.is_file():
        raise ExportFolderError(f"{file} is missing; {REFETCH}")
    size = file.stat().st_size
    try:
        with open(file, "rb") as fh:
            length = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(length))
        end = max((int(e["data_offsets"][1]) for k, e in header.items() if k != "__metadata__"), default=0)
    except (struct.error, ValueError, KeyError, TypeError, UnicodeDecodeError, MemoryError, OverflowError) as err:
        raise ExportFolderError(f"{file} is not a whole safetensors file ({type(err).__name__}); {REFETCH}") from None
    if 8 + length + end != size:
        raise ExportFolderError(f"{file} is truncated ({size} of {8 + length + end} bytes); {REFETCH}")


def _header_shapes(file: Path) -> dict[str, tuple[int, ...]]:
    with open(file, "rb") as fh:
        header = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
    return {k: tuple(e["shape"]) for k, e in header.items() if k != "__metadata__"}


def _check_config(folder: Path) -> None:
    """config.json builds the backbone (transformers' own classes, no code from the folder) and its shapes are
    the weights': a config of the wrong shape is named before transformers loads (and re-initialises) anything."""
    file = folder / "config.json"
    try:
        config = AutoConfig.from_pretrained(str(folder), trust_remote_code=False)
        with torch.device("meta"):  # shapes only: no memory, no init
            model = AutoModel.from_config(config)
    except Exception as err:  # noqa: BLE001 - whatever transformers makes of it: one line naming the file
        first = (str(err).strip().splitlines() or [type(err).__name__])[-1].strip()
        raise ExportFolderError(f"{file} does not build a model ({first[:200]}); {REFETCH}") from None
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    prefix = f"{model.base_model_prefix}."
    for key, shape in _header_shapes(folder / "model.safetensors").items():
        want = expected.get(key, expected.get(key.removeprefix(prefix)))
        if want is not None and want != shape:
            raise ExportFolderError(f"{file} does not match model.safetensors ({key}: the config makes {list(want)}, "
                                    f"the weights are {list(shape)}); {REFETCH}")


def _modules(path: Path) -> list[dict[str, Any]]:
    """modules.json of an export: two modules, the landmark input module then a pooler lmk has."""
    file = path / "modules.json"
    try:
        modules = json.loads(file.read_text(encoding="utf-8"))
        types = [str(m["type"]) for m in modules]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ExportFolderError(f"{file} does not read as a module list ({type(err).__name__}); {REFETCH}") from None
    if is_multi_vector(types):
        return modules
    if len(modules) != 2 or not types[0].endswith(".LandmarkTransformer"):
        raise ExportFolderError(f"{file}: an lmk export has two modules (LandmarkTransformer, a pooler), or three "
                                f"for a multi-vector one (+ LandmarkVectorMask, Normalize), found {types}; {REFETCH}")
    try:
        _pooler_class(types[1])
    except ValueError as err:
        raise ExportFolderError(f"{file}: {err}; {REFETCH}") from None
    return modules


def is_multi_vector(types: list[str]) -> bool:
    """modules.json's types are those `export_multi_vector` writes."""
    return len(types) == 3 and types[0].endswith(".LandmarkTransformer") and \
        types[1].endswith(".LandmarkVectorMask") and types[2].endswith(".Normalize")


def check_folder(path: str | os.PathLike) -> list[dict[str, Any]]:
    """An export's modules (see `_modules`) once its weights files are whole; ExportFolderError (one line naming
    the file and the fix) otherwise. Nothing is loaded."""
    path = Path(path)
    modules = _modules(path)
    _check_safetensors(path / modules[0].get("path", "") / "model.safetensors")
    _check_config(path / modules[0].get("path", ""))
    pooler = modules[1] if len(modules) == 2 else {}  # a multi-vector export's mask has no weights
    for file in sorted((path / pooler["path"]).glob("*.safetensors")) if pooler.get("path") else []:
        _check_safetensors(file)
    return modules


def load_exported(path: str | os.PathLike, device: str | None = "cpu", query_max_length: int | None = None,
                  passage_max_length: int | None = None) -> EmbeddingModel:
    """An exported folder -> EmbeddingModel, built from lmk's own classes (no code from the folder runs). A
    multi-vector export loads as the LMK model of the same states (pooler lmk: `eval.scoring=maxsim` scores them).

    Both sides default to the folder's `max_seq_length` (landmark_config.json), the length sentence-transformers
    cuts texts at: the same folder gives the same embeddings either way unless a length is given here."""
    path = Path(path)
    if not is_export(path):
        raise ValueError(f"{path} is not an lmk export (no modules.json whose first module is LandmarkTransformer)")
    modules = check_folder(path)
    try:
        first = LandmarkTransformer.load(str(path), subfolder=modules[0]["path"])
        if len(modules) == 2:
            pooler = _pooler_class(modules[1]["type"]).load(str(path), subfolder=modules[1]["path"])
        else:  # multi-vector: its vectors are the landmark states the lmk pooler averages
            pooler = build_pooler("lmk")
    except (OSError, ValueError, RuntimeError, KeyError, TypeError) as err:  # a module's config lmk cannot read
        first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ExportFolderError(f"{path}: a module's settings do not load ({first_line[:300]}); {REFETCH}") from err
    meta = first.lmk
    enc = EncoderConfig.coerce(meta["encoder"]) if meta.get("encoder") else None
    pool = PoolingConfig.coerce(meta["pooling"]) if meta.get("pooling") else None
    landmark_tokenizer = first.landmark_tokenizer
    passage = int(passage_max_length or first.max_seq_length)
    if landmark_tokenizer.max_length != passage:  # lmk's convention: the tokenizer's default length is the passage one
        settings = {**landmark_tokenizer.config(), "max_length": passage}
        landmark_tokenizer = type(landmark_tokenizer).from_config(first.tokenizer, settings,
                                                                  prefix_dir=landmark_tokenizer.prefix_dir)
    model = EmbeddingModel(first.auto_model, landmark_tokenizer, pooler,
                           query_max_length=int(query_max_length or first.max_seq_length), passage_max_length=passage,
                           name=meta.get("name") or path.name, encoder_cfg=enc, pooling_cfg=pool)
    return model.to(device) if device else model
