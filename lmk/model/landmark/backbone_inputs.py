"""What the backbone is called with, for an encoder and a decoder alike: the one place their inputs differ.

Landmark tokenization gives every backbone the same features (`input_ids`, `attention_mask`, `pool_mask`); the layout
itself already holds what a decoder needs at the end of a text (the closing landmark: the tokenizer's SEP, else its
EOS, so `last_token` pooling reads an EOS state). What differs is decided here:

  - position ids: a row padded on the left (decoders pad there for last-token pooling, `encoder.padding_side`)
    would number its first real token after its padding, so the same text would embed differently in another batch.
    Positions are counted from each row's first real token (the attention mask's running sum) for every backbone
    that takes position ids: on a right-padded row these are the backbone's own positions 0, 1, ... (its real
    tokens embed bit for bit as without them), and computing them always keeps the device from waiting on a
    "is this batch left-padded?" read.
  - token type ids: passed only where the features carry them and the backbone takes them (decoders take none).
  - `pool_mask` never reaches the backbone (it is the pooler's).

This file travels inside every exported model (sentence-transformers runs it without lmk), so it imports only torch
and the standard library.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch


def _accepts(model: Any, name: str) -> bool:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft wrapper takes **kwargs
    try:
        return name in inspect.signature(base.forward).parameters
    except (TypeError, ValueError):  # a forward without a signature: pass only what every backbone takes
        return False


def backbone_inputs(model: Any, features: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The keyword arguments of `model(**inputs)` for landmark-tokenized `features` (see the module doc)."""
    inputs = {"input_ids": features["input_ids"]}
    mask = features.get("attention_mask")
    if mask is not None:
        inputs["attention_mask"] = mask
        if _accepts(model, "position_ids"):
            inputs["position_ids"] = (mask.long().cumsum(dim=1) - 1).clamp(min=0)
    if "token_type_ids" in features and _accepts(model, "token_type_ids"):
        inputs["token_type_ids"] = features["token_type_ids"]
    return inputs
