"""The pooler contract, its registry and the paper's poolers: token embeddings [B, T, H] -> L2-normalised sentence
embeddings [B, H].

A pooler is a small `Pooler` subclass with a `name` (its pooling mode) and a `config()`; its needs are declared in
`names.DECLARED_POOLERS` (plain Python, read by config validation without torch), or, for a pooler defined outside this
package, by its class attributes. `@register_pooler` adds the class to `POOLER_CLASSES` (a duplicate name is an error) and
`build_pooler(name, hidden_size, **kwargs)` builds one. Each pooler is also a sentence-transformers module (the
one class lmk trains and encodes with is the one an export saves and loads): called with the features dict it writes
`sentence_embedding`, called with tensors it returns the embeddings. Inputs are never modified in place, and means
are computed in float32 so bf16 / fp16 backbones pool exactly; the output is float32. Pooling runs with autocast
off: under Lightning's bf16-mixed autocast an einsum or a linear layer would otherwise run (and return) bf16.

The paper's poolers (mode = `name`):
  - ``cls``: the first non-pad token (position 0 with right padding).
  - ``mean``: masked mean over all non-pad tokens ([CLS] and [SEP] included).
  - ``lmk``: mean over `pool_mask & attention_mask` (landmarks, or every-k / multi-CLS positions); a row with no
    pooled position falls back to the masked mean.
  - ``last_token``: the last non-pad token (the decoder baseline: the closing EOS of the layout), with left or
    right padding.
"""

from __future__ import annotations

import json
import os
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from .names import DECLARED_POOLERS, POOLER_NEEDS, declare_pooler

try:
    from sentence_transformers.base.modules import Module
except ImportError:  # sentence-transformers 5.x keeps its module classes in `models`
    from sentence_transformers.models import Module

CONFIG_FILE = "config.json"  # a pooler's settings in its sentence-transformers folder


def masked_mean(x: Tensor, weights: Tensor) -> Tensor:
    """Mean of x [B, T, H] over T with 0/1 weights [B, T], in float32; an all-zero row gives zeros.

    Positions of weight 0 are never read: a non-finite value there (a padded row that attended to no key) would
    otherwise turn the sum into NaN (0 x NaN = NaN)."""
    w = weights.to(torch.float32)
    x = torch.where(w[..., None] > 0, x.to(torch.float32), 0.0)
    total = torch.einsum("bt,bth->bh", w, x)
    return total / w.sum(dim=1, keepdim=True).clamp(min=1.0)


def _check_inputs(token_embeddings: Tensor, attention_mask: Tensor, pool_mask: Tensor | None) -> None:
    if token_embeddings.dim() != 3:
        raise ValueError(
            f"token_embeddings must be [batch, tokens, hidden], got shape {tuple(token_embeddings.shape)}"
        )
    expected = tuple(token_embeddings.shape[:2])
    if tuple(attention_mask.shape) != expected:
        raise ValueError(
            f"attention_mask shape {tuple(attention_mask.shape)} != token_embeddings [B, T] {expected}"
        )
    if pool_mask is not None and tuple(pool_mask.shape) != expected:
        raise ValueError(f"pool_mask shape {tuple(pool_mask.shape)} != token_embeddings [B, T] {expected}")


class Pooler(Module):
    """Base class: subclasses implement `pool` (unnormalised [B, H]); `forward` checks and normalises."""

    name: ClassVar[str] = ""
    # What the pooler needs (read by other modules instead of testing its name): set by `register_pooler` from its
    # declaration in names.DECLARED_POOLERS; a pooler outside this package declares them here (see names.py)
    needs_pool_mask: ClassVar[bool] = False  # pools positions the strategy marks (pool_mask)
    needs_hidden_size: ClassVar[bool] = False  # built with the backbone's hidden size
    trainable: ClassVar[bool] = False  # has weights (saved with the model: model.safetensors in its folder)
    # whose attention rows the position-bias probe reads (lmk.analysis.attention): "cls" (the first token),
    # "mean" (every token), "lmk" (the pooled positions); None: the probe does not apply to this pooler
    attention_rows: ClassVar[str | None] = None
    config_file_name = CONFIG_FILE

    def forward(self, features: dict[str, Any] | Tensor, attention_mask: Tensor | None = None,
                pool_mask: Tensor | None = None, **kwargs: Any) -> dict[str, Any] | Tensor:
        """`pooler(token_embeddings, attention_mask, pool_mask)` -> [B, H]; `pooler(features)` (a sentence-transformers
        pipeline) -> `features` with `sentence_embedding` added."""
        if isinstance(features, dict):
            features["sentence_embedding"] = self.embed(
                features["token_embeddings"], features["attention_mask"], features.get("pool_mask"))
            return features
        if attention_mask is None:
            raise ValueError(f"pooler {self.name!r} needs the attention_mask with the token embeddings")
        return self.embed(features, attention_mask, pool_mask)

    def embed(self, token_embeddings: Tensor, attention_mask: Tensor, pool_mask: Tensor | None = None) -> Tensor:
        """L2-normalised float32 embeddings [B, H]."""
        _check_inputs(token_embeddings, attention_mask, pool_mask)
        with torch.autocast(token_embeddings.device.type, enabled=False):  # fp32 pooling under bf16-mixed too
            pooled = self.pool(
                token_embeddings, attention_mask.bool(), None if pool_mask is None else pool_mask.bool()
            )
            return F.normalize(pooled.to(torch.float32), p=2, dim=-1)

    def pool(self, token_embeddings: Tensor, attention_mask: Tensor, pool_mask: Tensor | None) -> Tensor:
        raise NotImplementedError

    def config(self) -> dict[str, Any]:
        """JSON-able; `build_pooler(**config)` rebuilds this pooler."""
        return {"name": self.name}

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.config().items() if k != "name")

    # ------------------------------------------------------------------ sentence-transformers folder
    def get_config_dict(self) -> dict[str, Any]:
        """The saved settings: the pooling mode (sentence-transformers' key) and the constructor's options."""
        return {"pooling_mode": self.name, **{k: v for k, v in self.config().items() if k != "name"}}

    def save(self, output_path: str, *args: Any, safe_serialization: bool = True, **kwargs: Any) -> None:
        os.makedirs(output_path, exist_ok=True)
        with open(os.path.join(output_path, self.config_file_name), "w", encoding="utf-8") as f:
            json.dump(self.get_config_dict(), f, indent=2)
        if self.trainable:
            self.save_torch_weights(output_path, safe_serialization=safe_serialization)

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", token: bool | str | None = None,
             cache_folder: str | None = None, revision: str | None = None, local_files_only: bool = False,
             **kwargs: Any) -> Pooler:
        hub = {"subfolder": subfolder, "token": token, "cache_folder": cache_folder, "revision": revision,
               "local_files_only": local_files_only}
        config = dict(cls.load_config(model_name_or_path, **hub))
        mode = config.pop("pooling_mode", cls.name)
        if mode != cls.name:
            raise ValueError(f"{model_name_or_path}/{subfolder}: pooling_mode {mode!r} saved for a {cls.__name__} "
                             f"(pooling_mode {cls.name!r}); the folder's modules.json and config disagree")
        module = cls(**config)
        if cls.trainable:
            cls.load_torch_weights(model_name_or_path, model=module, **hub)
        return module


POOLER_CLASSES: dict[str, type[Pooler]] = {}


def register_pooler(cls: type[Pooler]) -> type[Pooler]:
    """Class decorator: add a pooler to `POOLER_CLASSES` under its `name`. A name declared in names.DECLARED_POOLERS gives the class
    its needs; any other name is declared there from the class's attributes, so config validation knows it."""
    if not cls.name:
        raise ValueError(f"pooler class {cls.__qualname__} has no `name`")
    if cls.name in POOLER_CLASSES and POOLER_CLASSES[cls.name] is not cls:
        raise ValueError(f"pooler name {cls.name!r} is registered twice ({POOLER_CLASSES[cls.name].__qualname__} and "
                         f"{cls.__qualname__}); give each pooler its own name")
    if cls.name in DECLARED_POOLERS:
        for need, value in DECLARED_POOLERS[cls.name].items():
            if need in vars(cls) and vars(cls)[need] != value:
                raise ValueError(f"pooler {cls.__qualname__} sets {need}={vars(cls)[need]!r} but names.DECLARED_POOLERS "
                                 f"declares {value!r} for {cls.name!r}; change the declaration, not the class")
            setattr(cls, need, value)
    else:
        declare_pooler(cls.name, **{need: getattr(cls, need) for need in POOLER_NEEDS})
    POOLER_CLASSES[cls.name] = cls
    return cls


def build_pooler(name: str, hidden_size: int | None = None, **kwargs: Any) -> Pooler:
    """Build a pooler by registry name; `hidden_size` is passed only to poolers that need it."""
    if name not in POOLER_CLASSES:
        raise ValueError(f"unknown pooler {name!r}; allowed: {', '.join(POOLER_CLASSES)}")
    if POOLER_CLASSES[name].needs_hidden_size:
        if hidden_size is None:
            raise ValueError(
                f"pooler {name!r} is trainable and needs hidden_size (the backbone's hidden size)"
            )
        return POOLER_CLASSES[name](hidden_size=hidden_size, **kwargs)
    if kwargs:
        raise ValueError(f"pooler {name!r} takes no options, got {sorted(kwargs)}")
    return POOLER_CLASSES[name]()


@register_pooler
class CLSPooling(Pooler):
    name = "cls"  # needs: names.DECLARED_POOLERS["cls"]

    def pool(self, token_embeddings: Tensor, attention_mask: Tensor, pool_mask: Tensor | None) -> Tensor:
        # first non-pad token: position 0 with right padding, after the padding with left padding
        first = attention_mask.to(torch.int8).argmax(dim=1)
        rows = torch.arange(token_embeddings.shape[0], device=token_embeddings.device)
        return token_embeddings[rows, first]


@register_pooler
class MeanPooling(Pooler):
    name = "mean"  # needs: names.DECLARED_POOLERS["mean"]

    def pool(self, token_embeddings: Tensor, attention_mask: Tensor, pool_mask: Tensor | None) -> Tensor:
        return masked_mean(token_embeddings, attention_mask)


@register_pooler
class LMKPooling(Pooler):
    """Pooling mode ``lmk`` (the name sentence-transformers' LMK pull request gives it)."""

    name = "lmk"  # needs: names.DECLARED_POOLERS["lmk"] (the pool_mask)

    def pool(self, token_embeddings: Tensor, attention_mask: Tensor, pool_mask: Tensor | None) -> Tensor:
        if pool_mask is None:
            raise ValueError(
                "the 'lmk' pooler needs a pool_mask (from LandmarkTokenizer); use pooler 'cls' or 'mean' "
                "for inputs without one"
            )
        mask = pool_mask & attention_mask  # padding is never pooled
        # a row with no pooled position falls back to the masked mean over its tokens
        has_any = mask.any(dim=1, keepdim=True)
        return masked_mean(token_embeddings, torch.where(has_any, mask, attention_mask))


@register_pooler
class LastTokenPooling(Pooler):
    """The decoder baseline (the authors' `last_token_pool`, sentence-transformers' `lasttoken` mode): under causal
    attention the last token is the only one that has seen the whole text; the layout ends every text with the
    landmark token (the EOS of a decoder)."""

    name = "last_token"  # needs: names.DECLARED_POOLERS["last_token"]

    def pool(self, token_embeddings: Tensor, attention_mask: Tensor, pool_mask: Tensor | None) -> Tensor:
        # the last non-pad position: T - 1 with left padding, length - 1 with right padding
        width = attention_mask.shape[1]
        last = width - 1 - attention_mask.flip(dims=[1]).to(torch.int8).argmax(dim=1)
        rows = torch.arange(token_embeddings.shape[0], device=token_embeddings.device)
        return token_embeddings[rows, last]
