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
(lmk.model.exported) loads the folder with lmk's own classes (no code from the folder runs) into an EmbeddingModel.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from sentence_transformers import SentenceTransformer

from lmk.model import landmark
from lmk.model.embedding import EmbeddingModel
from lmk.model.landmark import LandmarkTransformer, LandmarkVectorMask, Pooler
from lmk.model.lora import merged
from lmk.model.multi_vector import no_landmarks

CODE_DIR = Path(landmark.__file__).resolve().parent


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
    computed at (query_max_length, passage_max_length), mteb's loader's defaults (lmk.sharing.mteb_model). `prompts`:
    sentence-transformers' named prompts (e.g. {"query": "Instruct: ...\nQuery: "}), which the landmark input module
    puts before a text without landmarks in them."""
    if model.pooling_cfg is None:
        raise ValueError("export needs model.pooling_cfg (build the model with EmbeddingModel.build)")
    if not isinstance(model.pooler, Pooler):
        raise ValueError(f"export needs a registered pooler (lmk.model.landmark.poolers), got {type(model.pooler)}")
    description = model.config_dict()
    lmk = {k: description[k] for k in ("name", "encoder", "pooling", "query_max_length", "passage_max_length")}
    lmk["fingerprint"] = model.fingerprint()  # the weights' identity: mteb's model revision (lmk.sharing.mteb_model)
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


def _query_option(maxsim_query: str | None, queries: str | None) -> str:
    """`maxsim_query`, or its old keyword name `queries` (kept working)."""
    if queries is not None:
        warnings.warn("queries= is deprecated here: use maxsim_query= (the export's LandmarkVectorMask keeps `queries`)",
                      DeprecationWarning, stacklevel=3)
        return queries
    return maxsim_query or "landmarks"


def to_multi_vector_encoder(model: EmbeddingModel, max_length: int | None = None,
                            scored_at: dict[str, int] | None = None, maxsim_query: str | None = None, *,
                            queries: str | None = None) -> Any:
    """A sentence-transformers MultiVectorEncoder sharing `model`'s backbone and tokenizer: the landmark input module,
    `LandmarkVectorMask` (documents keep their landmark states; queries theirs, or all tokens with
    `maxsim_query="tokens"`, the mask's `queries`) and sentence-transformers' own per-vector `Normalize`, scored by
    MaxSim. The pooling needs landmark states (a pooler that declares `needs_pool_mask`), not a given pooler."""
    # sentence-transformers >= 6 only (MultiVectorEncoder): the single-vector path keeps working with 5.x
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Normalize  # same: 6.x's module path

    maxsim_query = _query_option(maxsim_query, queries)
    why = no_landmarks(model)
    if why is not None:
        raise ValueError(why.replace("eval.scoring=maxsim", "a multi-vector export", 1))
    first = to_sentence_transformer(model, max_length=max_length, scored_at=scored_at)[0]
    modules = [first, LandmarkVectorMask(queries=maxsim_query), Normalize(module_input_name="token_embeddings")]
    return MultiVectorEncoder(modules=modules, device=str(model.device), similarity_fn_name="maxsim")


def export_multi_vector(model: EmbeddingModel, path: str | os.PathLike, max_length: int | None = None,
                        scored_at: dict[str, int] | None = None, maxsim_query: str | None = None, *,
                        queries: str | None = None) -> Path:
    """Write a sentence-transformers MultiVectorEncoder folder that carries its code (see `to_multi_vector_encoder`):
    `MultiVectorEncoder(path, trust_remote_code=True)` gives a text's normalised landmark states, the vectors lmk's
    `eval.scoring=maxsim` scores with (`maxsim_query`: which states a query is, as `eval.maxsim_query`);
    `load_exported` reads it back as the LMK single-vector model of the same states."""
    path = Path(path)
    maxsim_query = _query_option(maxsim_query, queries)
    mve = to_multi_vector_encoder(model, max_length=max_length, scored_at=scored_at, maxsim_query=maxsim_query)
    mve.save(str(path), create_model_card=False)
    _carry_code(path, mve)
    (path / "README.md").write_text(_MV_README.format(name=model.name, max_len=mve[0].max_seq_length,
                                                      queries=maxsim_query,
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
