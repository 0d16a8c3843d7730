"""Attention profile: attention mass from the pooled rows over binned relative key position, per layer.

The pooled rows are the [CLS] row for CLS pooling, the landmark rows (`pool_mask`) for LMK and every
non-pad row for mean; the mass is averaged over heads, rows and inputs.

Memory: the backbone runs its ordinary SDPA attention; a custom attention function (registered with
transformers' `AttentionInterface` as ``"lmk_probe"``, so queries and keys arrive *after* rotary embedding,
exactly as the model uses them) additionally computes softmax(q k^T) for the pooled rows only, `row_chunk`
rows at a time, and reduces it to `n_bins` numbers per layer at once. Inputs run one at a time (no
padding). Peak extra memory per layer is heads x min(rows, row_chunk) x T floats (for CLS:
12 x 1 x 8192 x 4 B = 0.4 MB; for mean at 8192 tokens with row_chunk=256: 12 x 256 x 8192 x 4 B = 100 MB),
never the layers x heads x T x T tensor that ``output_attentions=True`` would keep (22 x 12 x 8192^2 x 4 B
= 71 GB for ModernBERT-base). ModernBERT's local (sliding-window) layers get their banded mask from
transformers as usual, so the probe sees the same mask the model applies.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch
from transformers import PretrainedConfig
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import AttentionInterface

from lmk.analysis.common import _check_int, _device, _max_length, bin_centers

if TYPE_CHECKING:  # imported lazily at run time: analysis sits above model / data in the layering
    from lmk.model.embedding import EmbeddingModel

ROW_KINDS = ("cls", "mean", "lmk")
PROBE_ATTN = "lmk_probe"  # the name registered in transformers' AttentionInterface


# --------------------------------------------------------------------------------------------------
# Binning (pure)
# --------------------------------------------------------------------------------------------------


def bin_attention(
    attn_rows: torch.Tensor, key_mask: torch.Tensor | None = None, n_bins: int = 20
) -> torch.Tensor:
    """Sum attention weights over `n_bins` equal bins of relative key position.

    attn_rows: [..., T] attention weights of some query rows over T keys. key_mask: [..., T] (broadcastable
    against attn_rows; True/1 = a real token). The relative position of a key is its rank among the real
    keys divided by their count, so left or right padding does not shift the bins; key r of n goes to bin
    floor(r * n_bins / n). Mass on masked keys is dropped (a softmax over real keys already gives it 0), so
    each output row sums to the row's mass on real keys: 1 for a proper attention row.
    Returns [..., n_bins] float32.
    """
    n_bins = _check_int("n_bins", n_bins)
    if attn_rows.dim() < 1 or attn_rows.shape[-1] == 0:
        raise ValueError(
            f"attn_rows must have a non-empty last (key) dimension, got shape {tuple(attn_rows.shape)}"
        )
    attn = attn_rows.float()
    if key_mask is None:
        key_mask = torch.ones(attn.shape[-1], dtype=torch.bool, device=attn.device)
    if key_mask.shape[-1] != attn.shape[-1]:
        raise ValueError(
            f"key_mask has {key_mask.shape[-1]} keys but attn_rows has {attn.shape[-1]}; pass the attention "
            "mask of the same input (shape [..., T])"
        )
    mask = key_mask.to(device=attn.device).bool()
    rank = mask.long().cumsum(-1) - 1
    count = mask.long().sum(-1, keepdim=True).clamp(min=1)
    idx = ((rank.clamp(min=0) * n_bins) // count).clamp(max=n_bins - 1)
    weights = attn * mask
    weights, idx = torch.broadcast_tensors(weights, idx)
    out = torch.zeros((*weights.shape[:-1], n_bins), dtype=torch.float32, device=attn.device)
    return out.scatter_add_(-1, idx.contiguous(), weights.contiguous())



# --------------------------------------------------------------------------------------------------
# Which rows are pooled
# --------------------------------------------------------------------------------------------------


class NotApplicable(ValueError):
    """The model's pooler declares no attention rows (`Pooler.attention_rows = None`): the probe does not apply."""


def pooling_kind(model: EmbeddingModel) -> str:
    """'cls', 'mean' or 'lmk': whose attention rows make the model's embedding, as its pooler declares
    (`Pooler.attention_rows`); NotApplicable for a pooler that declares none."""
    kind = getattr(model.pooler, "attention_rows", None)
    if kind is None:
        raise NotApplicable(
            f"pooler {getattr(model.pooler, 'name', type(model.pooler).__name__)!r} declares no attention rows "
            f"(attention_rows = None): the attention profile does not apply; pass rows= one of "
            f"{', '.join(ROW_KINDS)} to attention_profile to probe some rows anyway"
        )
    if kind not in ROW_KINDS:
        raise ValueError(f"pooler {model.pooler.name!r} declares attention_rows={kind!r}; allowed: {', '.join(ROW_KINDS)}")
    return kind


def pooled_rows(features: Mapping[str, torch.Tensor], kind: str) -> torch.Tensor:
    """Bool [B, T]: the query rows whose attention the probe reads, for pooling `kind`.

    cls: position 0. mean: every real (non-pad) token. lmk: the pooled landmarks (pool_mask), falling back
    to every real token in a row without one (as the LMK pooler falls back to the masked mean).
    """
    if kind not in ROW_KINDS:
        raise ValueError(f"unknown row kind {kind!r}; allowed: {', '.join(ROW_KINDS)}")
    real = features["attention_mask"].bool()
    if kind == "cls":
        rows = torch.zeros_like(real)
        rows[:, 0] = True
        return rows & real
    if kind == "mean":
        return real
    pool = features.get("pool_mask")
    if pool is None:
        raise ValueError(
            "lmk rows need features['pool_mask']; tokenize with a landmark strategy (e.g. fixed)"
        )
    rows = pool.bool() & real
    empty = ~rows.any(-1, keepdim=True)
    return torch.where(empty, real, rows)


# --------------------------------------------------------------------------------------------------
# Attention probe
# --------------------------------------------------------------------------------------------------


class AttentionRecorder:
    """Collects, per layer call, the binned attention mass of the selected rows of one input (B = 1)."""

    def __init__(self, rows: torch.Tensor, key_mask: torch.Tensor, n_bins: int, row_chunk: int) -> None:
        self.rows = rows.nonzero().flatten()
        self.key_mask = key_mask.bool()
        self.n_bins = n_bins
        self.row_chunk = row_chunk
        self.layers: list[torch.Tensor] = []  # [n_bins] summed over rows, one per attention call
        self.row_mass: list[torch.Tensor] = []  # [R] mass on real keys per row (1 for a proper softmax)

    @torch.no_grad()
    def record(
        self, query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, scaling: float | None
    ) -> None:
        if query.shape[0] != 1:
            raise RuntimeError("the attention probe runs one input at a time (batch of 1)")
        q, k = query[0], key[0]  # [H, T, d], [Hk, T, d]
        if k.shape[0] != q.shape[0]:  # grouped-query attention: share each key head
            k = k.repeat_interleave(q.shape[0] // k.shape[0], dim=0)
        scale = float(scaling) if scaling is not None else q.shape[-1] ** -0.5
        kt = k.float().transpose(-1, -2)
        m = None if mask is None else mask[0]  # [1 or H, Q or 1, K]
        total = torch.zeros(self.n_bins, dtype=torch.float32, device=q.device)
        masses = []
        for start in range(0, len(self.rows), self.row_chunk):
            idx = self.rows[start : start + self.row_chunk]
            scores = (q[:, idx].float() @ kt) * scale  # [H, r, T]: only the pooled rows, never T x T
            if m is not None:
                mm = m[:, idx] if m.shape[-2] > 1 else m
                scores = (
                    scores.masked_fill(~mm, float("-inf")) if mm.dtype == torch.bool else scores + mm.float()
                )
            probs = torch.softmax(scores, dim=-1).nan_to_num(0.0).mean(0)  # heads averaged: [r, T]
            total += bin_attention(probs, self.key_mask, self.n_bins).sum(0)
            masses.append((probs * self.key_mask).sum(-1))
        self.layers.append(total)
        self.row_mass.append(torch.cat(masses) if masses else torch.zeros(0))


_ACTIVE: AttentionRecorder | None = None


def _probe_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """SDPA as usual (the model's output is unchanged) + the pooled rows' attention for the recorder."""
    if _ACTIVE is not None:
        _ACTIVE.record(query, key, attention_mask, scaling)
    return sdpa_attention_forward(
        module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
    )


def _register_probe() -> None:
    # Adds one new key to transformers' registries; existing implementations are untouched.
    AttentionInterface.register(PROBE_ATTN, _probe_attention_forward)
    AttentionMaskInterface.register(PROBE_ATTN, sdpa_mask)


def _configs(backbone: torch.nn.Module) -> list[Any]:
    seen: dict[int, Any] = {}
    for mod in backbone.modules():
        cfg = getattr(mod, "config", None)
        if isinstance(cfg, PretrainedConfig):
            seen.setdefault(id(cfg), cfg)
    return list(seen.values())


@contextmanager
def probe_attention(backbone: torch.nn.Module) -> Iterator[None]:
    """Run `backbone` with the probe attention (eval mode) inside the block; restore everything after."""
    configs = _configs(backbone)
    if not configs:
        raise TypeError(
            f"{type(backbone).__name__} has no transformers config; the attention probe needs a transformers "
            "model that dispatches attention through AttentionInterface (e.g. BERT, ModernBERT)"
        )
    _register_probe()
    before = [cfg._attn_implementation for cfg in configs]
    was_training = backbone.training
    try:
        for cfg in configs:
            cfg._attn_implementation = PROBE_ATTN
        backbone.eval()
        yield
    finally:
        for cfg, impl in zip(configs, before, strict=True):
            cfg._attn_implementation = impl
        backbone.train(was_training)


@contextmanager
def _recording(rec: AttentionRecorder) -> Iterator[AttentionRecorder]:
    global _ACTIVE
    if _ACTIVE is not None:
        raise RuntimeError("attention probes cannot be nested")
    _ACTIVE = rec
    try:
        yield rec
    finally:
        _ACTIVE = None


def record_pooled_attention(
    forward: Any,
    backbone: torch.nn.Module,
    features: Mapping[str, torch.Tensor],
    rows: torch.Tensor,
    n_bins: int = 20,
    row_chunk: int = 256,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Low level: run `forward(features)` once (one input) and return (binned mass [L, n_bins] averaged over
    the selected rows, raw per-row mass on real keys per layer). `rows`: bool [1, T]."""
    n_bins = _check_int("n_bins", n_bins)
    row_chunk = _check_int("row_chunk", row_chunk)
    if rows.shape[0] != 1 or features["attention_mask"].shape[0] != 1:
        raise ValueError("record_pooled_attention takes one input (batch of 1)")
    if not rows.any():
        raise ValueError("no query row selected: rows must have at least one True")
    rec = AttentionRecorder(rows[0], features["attention_mask"][0], n_bins, row_chunk)
    with probe_attention(backbone), _recording(rec), torch.inference_mode():
        forward(features)
    if not rec.layers:
        raise RuntimeError(
            f"{type(backbone).__name__} never called the probe attention; it must dispatch attention through "
            "transformers' AttentionInterface (config._attn_implementation)"
        )
    n_rows = float(len(rec.rows))
    mass = torch.stack(rec.layers).cpu().numpy() / n_rows
    return mass, [m.cpu().numpy() for m in rec.row_mass]


@dataclass
class AttentionProfile:
    """Attention mass per layer over relative key position, averaged over heads, rows, then inputs.

    mass: [n_layers, n_bins] (each layer row sums to 1); per_input: [n_inputs, n_layers, n_bins];
    lengths: tokens per input; n_rows: pooled rows per input; row_mass_min/max: extremes of the raw
    per-row attention mass on real keys (1 up to float error: a sanity check of the masking).
    """

    label: str
    rows: str
    mass: np.ndarray
    per_input: np.ndarray
    lengths: list[int]
    n_rows: list[int]
    row_mass_min: float
    row_mass_max: float

    @property
    def n_layers(self) -> int:
        return int(self.mass.shape[0])

    @property
    def n_bins(self) -> int:
        return int(self.mass.shape[1])

    @property
    def centers(self) -> np.ndarray:
        return bin_centers(self.n_bins)

    def layer_mean(self) -> np.ndarray:
        """[n_bins]: the profile averaged over layers too (the paper's summary view)."""
        return self.mass.mean(0)

    def to_frame(self) -> pd.DataFrame:
        """Long table: label, rows, layer, bin, bin_center, mass."""
        layers, bins = np.meshgrid(np.arange(self.n_layers), np.arange(self.n_bins), indexing="ij")
        return pd.DataFrame(
            {
                "label": self.label,
                "rows": self.rows,
                "layer": layers.ravel(),
                "bin": bins.ravel(),
                "bin_center": self.centers[bins.ravel()],
                "mass": self.mass.ravel(),
            }
        )


def attention_profile(
    model: EmbeddingModel,
    texts: Sequence[str],
    *,
    n_bins: int = 20,
    max_length: int | None = None,
    rows: str | None = None,
    side: str = "passage",
    row_chunk: int = 256,
    label: str | None = None,
) -> AttentionProfile:
    """Attention mass from the pooled rows over binned relative key positions, per layer.

    rows: which query rows (`ROW_KINDS`); default from the model's pooler. max_length: tokens per input
    (default the model's max_positions, i.e. as much of each long text as the model takes). Each text is
    tokenized with the model's own landmark tokenizer and run alone (see the module docstring for memory).
    """
    if isinstance(texts, str) or not texts:
        raise ValueError("texts must be a non-empty list of strings (the long inputs to probe)")
    kind = rows if rows is not None else pooling_kind(model)
    if kind not in ROW_KINDS:
        raise ValueError(f"unknown rows {kind!r}; allowed: {', '.join(ROW_KINDS)}")
    length = _max_length(model, max_length)
    device = _device(model)
    per_input, lengths, n_rows, masses = [], [], [], []
    for text in texts:
        feats = model.tokenize([text], side=side, max_length=length)
        feats = {k: v.to(device) for k, v in feats.items()}
        sel = pooled_rows(feats, kind)
        mass, row_mass = record_pooled_attention(
            model.token_embeddings, model.backbone, feats, sel, n_bins=n_bins, row_chunk=row_chunk
        )
        per_input.append(mass)
        lengths.append(int(feats["attention_mask"].sum()))
        n_rows.append(int(sel.sum()))
        masses.extend(row_mass)
    stacked = np.stack(per_input)
    allmass = np.concatenate(masses)
    return AttentionProfile(
        label=label if label is not None else getattr(model, "name", "model"),
        rows=kind,
        mass=stacked.mean(0),
        per_input=stacked,
        lengths=lengths,
        n_rows=n_rows,
        row_mass_min=float(allmass.min()),
        row_mass_max=float(allmass.max()),
    )


def profile_models(
    models: Mapping[str, EmbeddingModel], texts: Sequence[str], **kwargs: Any
) -> dict[str, AttentionProfile]:
    """`attention_profile` for each labelled model (same texts, same settings)."""
    return {name: attention_profile(m, texts, label=name, **kwargs) for name, m in models.items()}
