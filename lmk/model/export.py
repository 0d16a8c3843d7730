"""Export an EmbeddingModel as a sentence-transformers (6.x) folder with two custom lmk modules.

Layout written by `export_sentence_transformers(model, path)`::

    path/
      modules.json                      -> lmk.export.LandmarkTransformer (root), lmk.export.LandmarkPooling
      config_sentence_transformers.json
      config.json, model.safetensors    backbone (Hugging Face format)
      tokenizer files
      lmk_config.json                   landmark tokenizer + pooling + lengths (EmbeddingModel config)
      1_LandmarkPooling/config.json     pooler name/kwargs (+ model.safetensors when trainable)
      README.md

Reload (anywhere `lmk` is installed)::

    SentenceTransformer(path, trust_remote_code=True)   # custom modules need the flag in ST >= 6
    lmk.export.load_exported(path)                       # -> EmbeddingModel

The landmark logic stays in `lmk` (LandmarkTokenizer, build_pooler); these classes only adapt it to the
sentence-transformers module protocol (`preprocess` is the 6.x tokenization hook; `tokenize` is kept as an
alias for older callers).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.modules import InputModule, Module
from transformers import AutoModel, AutoTokenizer, PreTrainedModel

from lmk.config.model import EncoderConfig, PoolingConfig
from lmk.model.backbone import set_rope
from lmk.model.embedding import LMK_CONFIG_FILE, EmbeddingModel
from lmk.model.long_attention import guard_padded_rows
from lmk.model.pooling import build_pooler
from lmk.model.tokenization import LandmarkTokenizer

_BACKBONE_KEYS = ("input_ids", "attention_mask", "token_type_ids")


class LandmarkTransformer(InputModule):
    """Input module: landmark tokenization (LandmarkTokenizer) + backbone -> token_embeddings."""

    # modules.json names a module by `type(module).__module__`: saved folders say lmk.export.<class>, the stable
    # public path (lmk/export.py), so exports written before or after a reorganisation of lmk load alike
    __module__ = "lmk.export"

    config_file_name = LMK_CONFIG_FILE
    save_in_root = True

    def __init__(self, backbone: PreTrainedModel, lmk_tokenizer: LandmarkTokenizer, lmk_config: dict[str, Any],
                 max_seq_length: int | None = None) -> None:
        super().__init__()
        self.auto_model = backbone  # the attribute name sentence-transformers' own Transformer uses
        self.lmk_tokenizer = lmk_tokenizer
        self.tokenizer = lmk_tokenizer.tokenizer
        self.lmk_config = dict(lmk_config)
        self.max_positions = int(self.lmk_config["max_positions"])
        self.max_seq_length = int(max_seq_length or self.lmk_config.get("st_max_seq_length")
                                  or self.lmk_config["passage_max_length"])

    def preprocess(self, inputs: Sequence[str], prompt: str | None = None, **kwargs: Any) -> dict[str, torch.Tensor]:
        # One max length for queries and documents (the sentence-transformers convention: max_seq_length).
        texts = list(inputs)
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise ValueError(f"LandmarkTransformer takes text only; input {i} is {type(t).__name__}")
        if prompt:
            texts = [prompt + t for t in texts]
        return self.lmk_tokenizer(texts, train=False, max_length=min(self.max_seq_length, self.max_positions))

    def tokenize(self, texts: list[str], **kwargs: Any) -> dict[str, torch.Tensor]:
        return self.preprocess(texts, **kwargs)

    def forward(self, features: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        inputs = {k: features[k] for k in _BACKBONE_KEYS if k in features}
        features["token_embeddings"] = self.auto_model(**inputs).last_hidden_state
        return features

    def get_embedding_dimension(self) -> int:
        return int(self.auto_model.config.hidden_size)

    def get_config_dict(self) -> dict[str, Any]:
        return {**self.lmk_config, "tokenizer": self.lmk_tokenizer.config(), "st_max_seq_length": self.max_seq_length}

    def save(self, output_path: str, *args: Any, safe_serialization: bool = True, **kwargs: Any) -> None:
        self.auto_model.save_pretrained(output_path)
        self.tokenizer.save_pretrained(output_path)
        self.save_config(output_path)

    @classmethod
    def load(
        cls,
        model_name_or_path: str,
        subfolder: str = "",
        token: bool | str | None = None,
        cache_folder: str | None = None,
        revision: str | None = None,
        local_files_only: bool = False,
        trust_remote_code: bool = False,
        model_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> LandmarkTransformer:
        local = cls.load_dir_path(model_name_or_path, subfolder=subfolder, token=token, cache_folder=cache_folder,
                                  revision=revision, local_files_only=local_files_only)
        if local is None or not os.path.isfile(os.path.join(local, LMK_CONFIG_FILE)):
            raise FileNotFoundError(f"{model_name_or_path}/{subfolder}: no {LMK_CONFIG_FILE}; not an lmk export")
        cfg = json.loads(Path(local, LMK_CONFIG_FILE).read_text())
        enc = cfg.get("encoder") or {}
        load_kwargs: dict[str, Any] = {"attn_implementation": enc.get("attn_implementation", "sdpa"),
                                       "trust_remote_code": trust_remote_code}
        load_kwargs.update(model_kwargs or {})
        backbone = AutoModel.from_pretrained(local, **load_kwargs)
        set_rope(backbone, bool(enc.get("rope", True)), str(enc.get("name", "?")))  # not saved: reapply
        guard_padded_rows(backbone)  # as every lmk model: no NaN from a padded sliding-window row without a key
        hf_tok = AutoTokenizer.from_pretrained(local, model_max_length=int(cfg["max_positions"]),
                                               trust_remote_code=trust_remote_code)
        lmk_tok = LandmarkTokenizer.from_config(hf_tok, cfg.pop("tokenizer"))
        return cls(backbone, lmk_tok, cfg, max_seq_length=cfg.pop("st_max_seq_length", None))


class LandmarkPooling(Module):
    """Pooling module: an lmk pooler over token_embeddings / attention_mask / pool_mask -> sentence_embedding."""

    __module__ = "lmk.export"  # the stable path saved folders name (see LandmarkTransformer)

    config_keys = ["pooler_name", "hidden_size", "pooler_kwargs"]

    def __init__(self, pooler_name: str, hidden_size: int, pooler_kwargs: dict[str, Any] | None = None,
                 pooler: torch.nn.Module | None = None) -> None:
        super().__init__()
        self.pooler_name = pooler_name
        self.hidden_size = int(hidden_size)
        self.pooler_kwargs = dict(pooler_kwargs or {})
        self.pooler = pooler if pooler is not None else build_pooler(pooler_name, hidden_size=self.hidden_size,
                                                                     **self.pooler_kwargs)

    def forward(self, features: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        features["sentence_embedding"] = self.pooler(
            features["token_embeddings"], features["attention_mask"], features.get("pool_mask")
        )
        return features

    def get_embedding_dimension(self) -> int:
        return self.hidden_size

    def _trainable(self) -> bool:
        return any(True for _ in self.parameters())

    def save(self, output_path: str, *args: Any, safe_serialization: bool = True, **kwargs: Any) -> None:
        self.save_config(output_path)
        if self._trainable():
            self.save_torch_weights(output_path, safe_serialization=safe_serialization)

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", token: bool | str | None = None,
             cache_folder: str | None = None, revision: str | None = None, local_files_only: bool = False,
             **kwargs: Any) -> LandmarkPooling:
        hub = {"subfolder": subfolder, "token": token, "cache_folder": cache_folder, "revision": revision,
               "local_files_only": local_files_only}
        module = cls(**cls.load_config(model_name_or_path, **hub))
        if module._trainable():
            cls.load_torch_weights(model_name_or_path, model=module, **hub)
        return module


def to_sentence_transformer(model: EmbeddingModel, max_seq_length: int | None = None) -> SentenceTransformer:
    """A SentenceTransformer sharing `model`'s backbone and pooler (no copy)."""
    if model.pooling_cfg is None:
        raise ValueError("export needs model.pooling_cfg (build the model with EmbeddingModel.build)")
    first = LandmarkTransformer(model.backbone, model.tokenizer, model.lmk_config(), max_seq_length=max_seq_length)
    pooling = LandmarkPooling(model.pooling_cfg.pooler, model.hidden_size, model.pooling_cfg.pooler_kwargs,
                              pooler=model.pooler)
    # device=model's device so the shared backbone is not moved
    return SentenceTransformer(modules=[first, pooling], device=str(model.device))


def export_sentence_transformers(model: EmbeddingModel, path: str | os.PathLike,
                                 max_seq_length: int | None = None) -> Path:
    """Write a sentence-transformers folder; `max_seq_length` defaults to the model's passage max length."""
    path = Path(path)
    st = to_sentence_transformer(model, max_seq_length=max_seq_length)
    st.save(str(path), create_model_card=False)
    (path / "README.md").write_text(_README.format(name=model.name, max_len=st[0].max_seq_length,
                                                   pooling=json.dumps(model.pooling_cfg.to_dict())))
    return path


def load_exported(path: str | os.PathLike, device: str | None = "cpu") -> EmbeddingModel:
    """An exported folder -> EmbeddingModel (same backbone and pooler objects as the ST modules)."""
    st = SentenceTransformer(str(path), trust_remote_code=True, device=device)
    first, pooling = st[0], st[1]
    if not isinstance(first, LandmarkTransformer) or not isinstance(pooling, LandmarkPooling):
        raise ValueError(f"{path} is not an lmk export (modules: {[type(m).__name__ for m in st]})")
    cfg = first.lmk_config
    enc = EncoderConfig.coerce(cfg["encoder"]) if cfg.get("encoder") else None
    pool = PoolingConfig.coerce(cfg["pooling"]) if cfg.get("pooling") else None
    return EmbeddingModel(first.auto_model, first.lmk_tokenizer, pooling.pooler,
                          query_max_length=cfg["query_max_length"], passage_max_length=cfg["passage_max_length"],
                          name=cfg["name"], encoder_cfg=enc, pooling_cfg=pool)


_README = """---
library_name: sentence-transformers
tags: [sentence-transformers, lmk, landmark-pooling]
---
# {name}

Landmark (LMK) pooling embedding model exported by `lmk` (custom sentence-transformers modules
`lmk.export.LandmarkTransformer` and `lmk.export.LandmarkPooling`; needs `pip install lmk`).

```python
from sentence_transformers import SentenceTransformer
model = SentenceTransformer("PATH", trust_remote_code=True)   # imports lmk.export (custom modules)
model.max_seq_length = 8192   # default {max_len}; longer inputs are truncated after landmark insertion
emb = model.encode(["a text"])                                 # already L2-normalised

from lmk.export import load_exported                          # or as an lmk EmbeddingModel
m = load_exported("PATH"); m.encode(["a text"])
```

Pooling: `{pooling}`
"""
