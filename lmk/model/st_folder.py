"""An EmbeddingModel as a sentence-transformers folder that carries its own code.

Layout written by `export_sentence_transformers(model, path)`::

    path/
      modules.json                  landmark_transformer.LandmarkTransformer (root), <file>.<Pooler class> (1_<class>)
      config_sentence_transformers.json
      landmark_config.json          the input module's settings (landmark_interval, lmk_token_id, ... and `lmk`)
      config.json, model.safetensors, tokenizer files   the backbone (Hugging Face format)
      1_<Pooler class>/config.json  the pooler's settings (pooling_mode, options; model.safetensors when trainable)
      *.py                          lmk/model/landmark's files, verbatim (the code modules.json names)
      LICENSE                       lmk's licence (Apache-2.0), which that code is under
      non_breaking_prefixes/        the koehn splitter's prefix file and its licence (sentence strategy only)
      README.md

The modules are the classes lmk trains and encodes with (lmk.model.landmark). Without lmk,
`SentenceTransformer(path, trust_remote_code=True)` runs the folder's copy of them; with lmk, `load_exported(path)`
loads the folder with lmk's own classes (no code from the folder runs) into an EmbeddingModel. Folders written before
the code travelled name `lmk.export.LandmarkTransformer` / `lmk.export.LandmarkPooling`; both still load (lmk.export).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from sentence_transformers import SentenceTransformer
from transformers import AutoConfig, AutoModel

from lmk.config import UserError
from lmk.config.model import EncoderConfig, PoolingConfig
from lmk.model.embedding import EmbeddingModel
from lmk.model.landmark import POOLER_CLASSES, LandmarkTransformer, LandmarkVectorMask, Pooler, build_pooler
from lmk.model.lora import merged
from lmk.model.multi_vector import no_landmarks

CODE_DIR = Path(__file__).resolve().parent / "landmark"
OLD_MODULES = ("lmk.export.LandmarkTransformer", "lmk.export.LandmarkPooling")


def code_files() -> list[Path]:
    """The files an export carries: every module of lmk.model.landmark but its package `__init__`."""
    return sorted(p for p in CODE_DIR.glob("*.py") if p.name != "__init__.py")


def class_ref(module: torch.nn.Module) -> str:
    """A module's type in modules.json: `<file>.<class>`, resolved in the model's folder (the Hugging Face custom
    code convention sentence-transformers follows with trust_remote_code)."""
    cls = type(module)
    file = Path(sys.modules[cls.__module__].__file__ or "?")  # the defining file (lmk's, or a folder's copy)
    if file.name not in {p.name for p in code_files()}:
        raise ValueError(f"{cls.__qualname__} is defined in {file}, outside lmk/model/landmark: an export could not "
                         "carry its code; define the module there")
    return f"{file.stem}.{cls.__name__}"


def to_sentence_transformer(model: EmbeddingModel, max_length: int | None = None,
                            scored_at: dict[str, int] | None = None,
                            prompts: dict[str, str] | None = None) -> SentenceTransformer:
    """A SentenceTransformer sharing `model`'s backbone (a LoRA one: a merged copy), tokenizer and pooler;
    `max_length` becomes its `max_seq_length` (sentence-transformers' name). `scored_at`: the per-side lengths a model card's scores were
    computed at (query_max_length, passage_max_length), mteb's loader's defaults (lmk.eval.mteb_model). `prompts`:
    sentence-transformers' named prompts (e.g. {"query": "Instruct: ...\nQuery: "}), which the landmark input module
    puts before a text without landmarks in them."""
    if model.pooling_cfg is None:
        raise ValueError("export needs model.pooling_cfg (build the model with EmbeddingModel.build)")
    if not isinstance(model.pooler, Pooler):
        raise ValueError(f"export needs a registered pooler (lmk.model.landmark.poolers), got {type(model.pooler)}")
    description = model.config_dict()
    lmk = {k: description[k] for k in ("name", "encoder", "pooling", "query_max_length", "passage_max_length")}
    lmk["fingerprint"] = model.fingerprint()  # the weights' identity: mteb's model revision (lmk.eval.mteb_model)
    if scored_at:
        lmk["scored_at"] = {k: int(scored_at[k]) for k in ("query_max_length", "passage_max_length")}
    encoder = model.encoder_cfg
    # a LoRA backbone is exported with its adapters folded in (a copy): the folder loads without peft
    first = LandmarkTransformer(merged(model.backbone), model.landmark_tokenizer, max_seq_length=max_length or model.passage_max_length,
                                max_positions=model.max_positions, rope=encoder.rope if encoder else True,
                                attn_implementation=encoder.attn_implementation if encoder else "sdpa", lmk=lmk)
    # device=model's device so the shared backbone is not moved
    return SentenceTransformer(modules=[first, model.pooler], device=str(model.device), prompts=dict(prompts or {}))


def export_sentence_transformers(model: EmbeddingModel, path: str | os.PathLike,
                                 max_length: int | None = None, scored_at: dict[str, int] | None = None,
                                 prompts: dict[str, str] | None = None) -> Path:
    """Write a sentence-transformers folder that carries its code; `max_length` (the folder's `max_seq_length`: the
    one length both sentence-transformers and `load_exported` cut texts at by default) defaults to the model's
    passage max length; `prompts` go into config_sentence_transformers.json (`encode(..., prompt_name="query")`)."""
    path = Path(path)
    st = to_sentence_transformer(model, max_length=max_length, scored_at=scored_at, prompts=prompts)
    st.save(str(path), create_model_card=False)
    _carry_code(path, st)
    (path / "README.md").write_text(_README.format(name=model.name, max_len=st[0].max_seq_length,
                                                   pooling=json.dumps(model.pooling_cfg.to_dict()),
                                                   needs=needed_packages(model.landmark_tokenizer)))
    return path


def to_multi_vector_encoder(model: EmbeddingModel, max_length: int | None = None,
                            scored_at: dict[str, int] | None = None, queries: str = "landmarks") -> Any:
    """A sentence-transformers MultiVectorEncoder sharing `model`'s backbone and tokenizer: the landmark input module,
    `LandmarkVectorMask` (documents keep their landmark states; queries theirs, or all tokens with
    `queries="tokens"`) and sentence-transformers' own per-vector `Normalize`, scored by MaxSim."""
    # sentence-transformers >= 6 only (MultiVectorEncoder): the single-vector path keeps working with 5.x
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Normalize  # same: 6.x's module path

    why = no_landmarks(model)
    if why is not None:
        raise ValueError(why.replace("eval.scoring=maxsim", "a multi-vector export", 1))
    first = to_sentence_transformer(model, max_length=max_length, scored_at=scored_at)[0]
    modules = [first, LandmarkVectorMask(queries), Normalize(module_input_name="token_embeddings")]
    return MultiVectorEncoder(modules=modules, device=str(model.device), similarity_fn_name="maxsim")


def export_multi_vector(model: EmbeddingModel, path: str | os.PathLike, max_length: int | None = None,
                        scored_at: dict[str, int] | None = None, queries: str = "landmarks") -> Path:
    """Write a sentence-transformers MultiVectorEncoder folder that carries its code (see `to_multi_vector_encoder`):
    `MultiVectorEncoder(path, trust_remote_code=True)` gives a text's normalised landmark states, the vectors lmk's
    `eval.scoring=maxsim` scores with; `load_exported` reads it back as the LMK single-vector model of the same
    states."""
    path = Path(path)
    mve = to_multi_vector_encoder(model, max_length=max_length, scored_at=scored_at, queries=queries)
    mve.save(str(path), create_model_card=False)
    _carry_code(path, mve)
    (path / "README.md").write_text(_MV_README.format(name=model.name, max_len=mve[0].max_seq_length, queries=queries,
                                                      pooling=json.dumps(model.pooling_cfg.to_dict()),
                                                      needs=needed_packages(model.landmark_tokenizer)))
    return path


def _carry_code(path: Path, st: Any) -> None:
    """modules.json names lmk's modules by the folder's copies of their files, which are copied in (with the
    licence); sentence-transformers' own modules keep their import path."""
    modules = json.loads((path / "modules.json").read_text())
    for entry, module in zip(modules, st):
        if not type(module).__module__.startswith("sentence_transformers."):
            entry["type"] = class_ref(module)  # not lmk's import path: the folder's own copy
    (path / "modules.json").write_text(json.dumps(modules, indent=2))
    for file in code_files():
        shutil.copyfile(file, path / file.name)
    shutil.copyfile(CODE_DIR / "LICENSE", path / "LICENSE")  # lmk's licence, for the code that travels
    _normalise_tokenizer_config(path / "tokenizer_config.json")


# how the tokenizer was loaded this time (HF_HUB_OFFLINE, a cache or a folder), not what it is: left out, so an
# export's bytes do not depend on the environment it was written in
_LOAD_KEYS = ("local_files_only", "is_local", "cache_dir", "_commit_hash")


def _normalise_tokenizer_config(file: Path) -> None:
    if not file.is_file():
        return
    data = json.loads(file.read_text(encoding="utf-8"))
    kept = {k: v for k, v in data.items() if k not in _LOAD_KEYS}
    if kept != data:
        file.write_text(json.dumps(kept, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def needed_packages(landmark_tokenizer: Any) -> str:
    """What a user needs besides sentence-transformers to load the model: a sentence splitter the folder cannot
    carry (the koehn splitter's prefix file travels in it)."""
    tok = landmark_tokenizer
    if tok.strategy == "sentence" and tok.sentence_splitter in ("sentencex", "multilingual"):
        extra = " (the authors' multilingual splitter also uses spaCy's xx_sent_ud_sm where installed)" \
            if tok.sentence_splitter == "multilingual" else ""
        return f"Its sentence splitter needs `pip install sentencex`{extra}."
    return "It needs nothing beyond sentence-transformers (and its torch and transformers)."


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


class LegacyExportPooling:
    """The loader behind the pooling module name of exports written before the code travelled (their modules.json
    names `lmk.export.LandmarkPooling`, then a wrapper around a pooler): loads such a folder into the pooler class
    of its mode. `lmk.export` keeps that old name pointing here."""

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
        return LegacyExportPooling
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


_README = """---
library_name: sentence-transformers
tags: [sentence-transformers, lmk, landmark-pooling]
---
# {name}

Landmark (LMK) pooling embedding model written by `lmk`. The folder carries the code of its two modules
(`landmark_transformer.py` and the pooler's file), so sentence-transformers loads it alone:

```python
from sentence_transformers import SentenceTransformer
from transformers import AutoConfig, AutoModel
model = SentenceTransformer("PATH", trust_remote_code=True)   # runs the folder's own module code
model.max_seq_length = 8192   # default {max_len}; longer inputs are truncated after landmark insertion
emb = model.encode(["a text"])                                 # already L2-normalised
```

{needs}

Pooling: `{pooling}`
"""


_MV_README = """---
library_name: sentence-transformers
tags: [sentence-transformers, lmk, landmark-pooling, multi-vector, late-interaction]
---
# {name} (multi-vector)

Landmark (LMK) model written by `lmk` as a sentence-transformers `MultiVectorEncoder`: a text is its landmark
states (one per chunk, each L2-normalised), not their mean, and texts are scored by **MaxSim** (the sum over the
query's vectors of the max over the document's). Documents keep their landmark states; queries keep {queries}
(`LandmarkVectorMask`). This is lmk's `eval.scoring=maxsim`. The folder carries the code of its modules:

```python
from sentence_transformers import MultiVectorEncoder
model = MultiVectorEncoder("PATH", trust_remote_code=True)   # runs the folder's own module code
model.max_seq_length = 8192   # default {max_len}; longer inputs are truncated after landmark insertion
docs = model.encode_document(["a text", "another text"])       # one [landmarks, dim] tensor per text
queries = model.encode_query(["a question"])
print(model.similarity(queries, docs))                         # MaxSim
```

{needs}

Pooling: `{pooling}`
"""
