"""Position-bias probes: where does each pooling "look" in a long input? (method.md section 6)

Three probes, each a plain function over an `EmbeddingModel` (the notebook
`notebooks/attention_position_bias.ipynb` only calls these):

1. `attention_profile`: attention mass from the pooled positions (the [CLS] row for CLS pooling, the
   landmark rows (`pool_mask`) for LMK, every non-pad row for mean) over key positions binned by relative
   position, per layer, averaged over heads, rows and inputs.
2. `evidence_position_sensitivity` + `depth_length_table`: retrieval Acc@1 by argmax cosine (an analysis
   view, NOT the leaderboard metric, which mteb computes) against needle depth x context length on the
   regenerated passkey / needle data.
3. `position_similarity` + `position_curve`: cosine between a long document's pooled embedding and the
   embedding of each of its chunks alone, against the chunk's relative position.

Memory of the attention probe: the backbone runs its ordinary SDPA attention; a custom attention function
(registered with transformers' `AttentionInterface` as ``"lmk_probe"``, so queries and keys arrive *after*
rotary embedding, exactly as the model uses them) additionally computes softmax(q k^T) for the pooled
rows only, `row_chunk` rows at a time, and reduces it to `n_bins` numbers per layer at once. Inputs run one
at a time (no padding). Peak extra memory per layer is heads x min(rows, row_chunk) x T floats (for CLS:
12 x 1 x 8192 x 4 B = 0.4 MB; for mean at 8192 tokens with row_chunk=256: 12 x 256 x 8192 x 4 B = 100 MB),
never the layers x heads x T x T tensor that ``output_attentions=True`` would keep (22 x 12 x 8192^2 x 4 B
= 71 GB for ModernBERT-base). ModernBERT's local (sliding-window) layers get their banded mask from
transformers as usual, so the probe sees the same mask the model applies.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch
from matplotlib.figure import Figure

if TYPE_CHECKING:  # imported lazily at run time: analysis sits above model / data in the layering
    from lmk.data.retrieval import RetrievalCorpus
    from lmk.model import EmbeddingModel

ROW_KINDS = ("cls", "mean", "lmk")
PROBE_ATTN = "lmk_probe"  # the name registered in transformers' AttentionInterface
TASKS = ("passkey", "needle")

__all__ = [
    "ROW_KINDS",
    "TASKS",
    "AttentionProfile",
    "attention_profile",
    "bin_attention",
    "bin_centers",
    "depth_bins",
    "depth_length_table",
    "evidence_position_sensitivity",
    "load_models",
    "long_texts",
    "plot_attention_profile",
    "plot_attention_profiles",
    "plot_depth_length_heatmap",
    "plot_depth_length_heatmaps",
    "plot_position_similarity",
    "pooled_rows",
    "pooling_kind",
    "position_curve",
    "position_similarity",
    "probe_attention",
    "record_pooled_attention",
    "profile_models",
    "save_figure",
    "sensitivity_tables",
    "similarity_curves",
    "synthetic_corpora",
]


def _check_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


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


def bin_centers(n_bins: int) -> np.ndarray:
    """Relative position (0..1) of each bin's centre."""
    n_bins = _check_int("n_bins", n_bins)
    return (np.arange(n_bins) + 0.5) / n_bins


# --------------------------------------------------------------------------------------------------
# Which rows are pooled
# --------------------------------------------------------------------------------------------------


def pooling_kind(model: EmbeddingModel) -> str:
    """'cls', 'mean' or 'lmk': whose attention rows make the model's embedding."""
    from lmk.pooling import POOLERS

    declared = getattr(getattr(model, "pooling_cfg", None), "pooler", None)
    if declared in ROW_KINDS:
        return declared
    for name, cls in POOLERS.items():
        if isinstance(model.pooler, cls) and name in ROW_KINDS:
            return name
    raise ValueError(
        f"no attention rows are defined for pooler {type(model.pooler).__name__}; pass rows= one of "
        f"{', '.join(ROW_KINDS)} to attention_profile"
    )


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


class _Recorder:
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


_ACTIVE: _Recorder | None = None


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
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if _ACTIVE is not None:
        _ACTIVE.record(query, key, attention_mask, scaling)
    return sdpa_attention_forward(
        module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
    )


def _register_probe() -> None:
    # Adds one new key to transformers' registries; existing implementations are untouched.
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(PROBE_ATTN, _probe_attention_forward)
    AttentionMaskInterface.register(PROBE_ATTN, sdpa_mask)


def _configs(backbone: torch.nn.Module) -> list[Any]:
    from transformers import PretrainedConfig

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
def _recording(rec: _Recorder) -> Iterator[_Recorder]:
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
    rec = _Recorder(rows[0], features["attention_mask"][0], n_bins, row_chunk)
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


def _device(model: torch.nn.Module) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


def _max_length(model: EmbeddingModel, max_length: int | None) -> int:
    if max_length is None:
        return int(model.max_positions)
    return _check_int("max_length", max_length, minimum=3)


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


# --------------------------------------------------------------------------------------------------
# Evidence-position sensitivity (needle depth x context length)
# --------------------------------------------------------------------------------------------------


def synthetic_corpora(
    task: str = "passkey",
    lengths: Sequence[int] = (256, 512),
    n_docs: int = 20,
    n_queries: int = 20,
    seed: int = 0,
) -> dict[int, RetrievalCorpus]:
    """The regenerated LongEmbed passkey / needle data (lmk.data.longembed), per length."""
    if task not in TASKS:
        raise ValueError(f"unknown synthetic task {task!r}; allowed: {', '.join(TASKS)}")
    from lmk.data import longembed

    gen = longembed.generate_passkey if task == "passkey" else longembed.generate_needle
    return gen(lengths=tuple(lengths), n_docs=n_docs, n_queries=n_queries, seed=seed)


def long_texts(corpora: Mapping[int, RetrievalCorpus], n: int, length: int | None = None) -> list[str]:
    """The first `n` documents of the corpus at `length` (default the longest): inputs for the probes."""
    n = _check_int("n", n)
    if not corpora:
        raise ValueError("corpora is empty; build it with synthetic_corpora(...)")
    key = max(corpora) if length is None else length
    if key not in corpora:
        raise ValueError(f"no corpus at length {key}; available: {sorted(corpora)}")
    texts = list(corpora[key].corpus["text"])
    return texts[:n]


def _as_mapping(corpora: Mapping[int, RetrievalCorpus] | RetrievalCorpus) -> Mapping[int, RetrievalCorpus]:
    if isinstance(corpora, Mapping):
        return corpora
    return {-1: corpora}  # one corpus: its length comes from the "length" column


def evidence_position_sensitivity(
    model: EmbeddingModel,
    corpora: Mapping[int, RetrievalCorpus] | RetrievalCorpus,
    *,
    max_length: int | None = None,
    batch_size: int = 16,
) -> pd.DataFrame:
    """One row per query: where its evidence sits and how the gold document ranks.

    Columns: task, length, query_id, gold_id, depth, gold_rank (1 = top), gold_sim, best_sim,
    acc_at_1 (argmax-cosine Acc@1: an analysis view, not mteb's leaderboard score).
    Documents are encoded with `max_length` tokens (default the model's max_positions).
    """
    length_cap = _max_length(model, max_length)
    frames = []
    for key, rc in _as_mapping(corpora).items():
        doc_ids = [str(i) for i in rc.corpus["id"]]
        q_ids = [str(i) for i in rc.queries["id"]]
        if not doc_ids or not q_ids:
            raise ValueError(f"corpus {rc.name!r} at length {key} has no documents or no queries")
        pos = {d: i for i, d in enumerate(doc_ids)}
        docs = model.encode(
            list(rc.corpus["text"]), side="passage", batch_size=batch_size, max_length=length_cap
        )
        queries = model.encode(list(rc.queries["text"]), side="query", batch_size=batch_size)
        sims = np.asarray(queries, dtype=np.float32) @ np.asarray(docs, dtype=np.float32).T
        cols = rc.queries.column_names
        depth_by_doc = (
            dict(zip(doc_ids, rc.corpus["depth"], strict=True)) if "depth" in rc.corpus.column_names else {}
        )
        for qi, qid in enumerate(q_ids):
            golds = [d for d, rel in rc.qrels.get(qid, {}).items() if rel > 0 and d in pos]
            if not golds:
                raise ValueError(f"query {qid!r} of {rc.name!r} has no relevant document in the corpus")
            row = sims[qi]
            ranks = {g: 1 + int((row > row[pos[g]]).sum()) for g in golds}
            gold = min(ranks, key=ranks.get)
            if "depth" in cols:
                depth = float(rc.queries[qi]["depth"])
            elif gold in depth_by_doc:
                depth = float(depth_by_doc[gold])
            else:
                raise ValueError(
                    f"{rc.name!r} carries no 'depth' column (queries or corpus); use synthetic data"
                )
            length = int(rc.queries[qi]["length"]) if "length" in cols else int(key)
            frames.append(
                {
                    "task": rc.name,
                    "length": length,
                    "query_id": qid,
                    "gold_id": gold,
                    "depth": depth,
                    "gold_rank": ranks[gold],
                    "gold_sim": float(row[pos[gold]]),
                    "best_sim": float(row.max()),
                    "acc_at_1": float(ranks[gold] == 1),
                }
            )
    return pd.DataFrame(frames)


def depth_bins(depth: Sequence[float] | np.ndarray | pd.Series, n_bins: int = 5) -> np.ndarray:
    """Bin index 0..n_bins-1 of each depth in [0, 1] (equal-width bins; depth 1.0 is in the last)."""
    n_bins = _check_int("n_bins", n_bins)
    d = np.asarray(depth, dtype=float)
    if d.size and (np.nanmin(d) < 0 or np.nanmax(d) > 1):
        raise ValueError(f"depth must lie in [0, 1], got values in [{np.nanmin(d)}, {np.nanmax(d)}]")
    return np.minimum((d * n_bins).astype(int), n_bins - 1)


def _bin_labels(n_bins: int) -> list[str]:
    return [f"{i / n_bins:.2f}-{(i + 1) / n_bins:.2f}" for i in range(n_bins)]


def depth_length_table(
    per_query: pd.DataFrame, value: str = "acc_at_1", n_depth_bins: int = 5, agg: str = "mean"
) -> pd.DataFrame:
    """Depth bin (rows, all `n_depth_bins` kept, top = shallowest) x context length (columns).

    agg: "mean" (NaN where a cell has no query) or "count" (0 there). value: a column of
    `evidence_position_sensitivity` (acc_at_1, gold_rank, gold_sim...).
    """
    if agg not in ("mean", "count"):
        raise ValueError(f"unknown agg {agg!r}; allowed: mean, count")
    missing = {value, "depth", "length"} - set(per_query.columns)
    if missing:
        raise ValueError(
            f"per_query lacks columns {sorted(missing)}; build it with evidence_position_sensitivity"
        )
    labels = _bin_labels(n_depth_bins)
    df = per_query.assign(depth_bin=[labels[i] for i in depth_bins(per_query["depth"], n_depth_bins)])
    lengths = sorted(df["length"].unique())
    table = df.pivot_table(index="depth_bin", columns="length", values=value, aggfunc=agg)
    table = table.reindex(index=labels, columns=lengths)
    if agg == "count":
        table = table.fillna(0).astype(int)
    table.index.name = "depth"
    table.columns.name = "length"
    return table


def sensitivity_tables(
    models: Mapping[str, EmbeddingModel],
    corpora: Mapping[int, RetrievalCorpus],
    *,
    value: str = "acc_at_1",
    n_depth_bins: int = 5,
    **kwargs: Any,
) -> tuple[pd.DataFrame, dict[str, pd.DataFrame]]:
    """(all per-query rows with a 'model' column, {model: depth x length table of `value`})."""
    rows, tables = [], {}
    for name, m in models.items():
        pq = evidence_position_sensitivity(m, corpora, **kwargs).assign(model=name)
        rows.append(pq)
        tables[name] = depth_length_table(pq, value=value, n_depth_bins=n_depth_bins)
    return pd.concat(rows, ignore_index=True), tables


# --------------------------------------------------------------------------------------------------
# Information at position
# --------------------------------------------------------------------------------------------------


def _visible_words(model: EmbeddingModel, words: list[str], max_length: int) -> int:
    """How many leading words survive the model's truncation at `max_length` (all if it cannot tell)."""
    tok = model.tokenizer
    feats = model.tokenize([" ".join(words)], side="passage", max_length=max_length)
    ids = feats["input_ids"][0][feats["attention_mask"][0].bool()]
    special = torch.tensor([tok.cls_id, tok.landmark_id, tok.pad_id], device=ids.device)
    n_content = int((~torch.isin(ids, special)).sum())
    hf = getattr(tok, "tokenizer", None)
    try:
        enc = hf(words, is_split_into_words=True, add_special_tokens=False, verbose=False)
        word_ids = enc.word_ids()
    except (TypeError, ValueError, AttributeError):  # slow tokenizer: no word alignment
        return len(words)
    if len(word_ids) <= n_content:
        return len(words)
    return int(word_ids[n_content])  # the word whose first cut token is at n_content is only partly seen


def position_similarity(
    model: EmbeddingModel,
    texts: Sequence[str],
    *,
    chunk_words: int = 32,
    max_length: int | None = None,
    batch_size: int = 16,
) -> pd.DataFrame:
    """Cosine between each document's pooled embedding and each of its `chunk_words`-word chunks alone.

    Only the words the model sees (after truncation at `max_length`, default max_positions) are chunked;
    rel_pos is the chunk centre over the visible words (0 = start, 1 = end).
    Columns: doc, chunk, start_word, n_words, rel_pos, cos.
    """
    if isinstance(texts, str) or not texts:
        raise ValueError("texts must be a non-empty list of strings (the long documents)")
    chunk_words = _check_int("chunk_words", chunk_words)
    length = _max_length(model, max_length)
    doc_emb = np.asarray(model.encode(list(texts), side="passage", batch_size=batch_size, max_length=length))
    chunk_texts, meta = [], []
    for d, text in enumerate(texts):
        words = text.split()
        n_vis = _visible_words(model, words, length) if words else 0
        for c, start in enumerate(range(0, n_vis, chunk_words)):
            piece = words[start : min(start + chunk_words, n_vis)]
            chunk_texts.append(" ".join(piece))
            meta.append((d, c, start, len(piece), (start + len(piece) / 2) / n_vis))
    if not chunk_texts:
        raise ValueError("the documents have no words to chunk")
    chunk_emb = np.asarray(
        model.encode(chunk_texts, side="passage", batch_size=batch_size, max_length=length)
    )
    docs = np.array([m[0] for m in meta])
    cos = (chunk_emb * doc_emb[docs]).sum(-1)  # embeddings are L2-normalised
    df = pd.DataFrame(meta, columns=["doc", "chunk", "start_word", "n_words", "rel_pos"])
    df["cos"] = cos.astype(float)
    return df


def position_curve(per_chunk: pd.DataFrame, n_bins: int = 10, value: str = "cos") -> pd.DataFrame:
    """Mean / std / count of `value` per relative-position bin (all `n_bins` rows kept; NaN if empty)."""
    n_bins = _check_int("n_bins", n_bins)
    if value not in per_chunk.columns or "rel_pos" not in per_chunk.columns:
        raise ValueError(f"per_chunk needs columns rel_pos and {value!r}; build it with position_similarity")
    b = np.minimum((per_chunk["rel_pos"].to_numpy() * n_bins).astype(int), n_bins - 1)
    g = per_chunk.assign(bin=b).groupby("bin")[value]
    out = pd.DataFrame({"mean": g.mean(), "std": g.std(ddof=0), "count": g.size()}).reindex(range(n_bins))
    out["count"] = out["count"].fillna(0).astype(int)
    out.insert(0, "bin_center", bin_centers(n_bins))
    out.index.name = "bin"
    return out


def similarity_curves(
    models: Mapping[str, EmbeddingModel], texts: Sequence[str], *, n_bins: int = 10, **kwargs: Any
) -> dict[str, pd.DataFrame]:
    """{model: position_curve(position_similarity(model, texts, ...))}."""
    return {
        name: position_curve(position_similarity(m, texts, **kwargs), n_bins=n_bins)
        for name, m in models.items()
    }


# --------------------------------------------------------------------------------------------------
# Models for the notebook
# --------------------------------------------------------------------------------------------------


def _conf_dir(conf_dir: str | Path | None) -> Path:
    if conf_dir is not None:
        return Path(conf_dir)
    return Path(__file__).resolve().parents[1] / "conf"


def _load_cfg(conf: Path, group: str, name: str) -> Any:
    from omegaconf import OmegaConf

    path = conf / group / f"{name}.yaml"
    if not path.is_file():
        avail = sorted(p.stem for p in (conf / group).glob("*.yaml"))
        raise ValueError(
            f"unknown {group} {name!r}; allowed: {', '.join(avail) or '(none found in ' + str(conf) + ')'}"
        )
    return OmegaConf.load(path)


def _run_label(run_dir: Path) -> str:
    import json

    try:
        cfg = json.loads((run_dir / "results.json").read_text()).get("config", {})
        enc = cfg.get("encoder", {}).get("name")
        pool = cfg.get("pooling", {})
        pname = pool.get("name")
        if (
            pname
            and pool.get("strategy") in ("fixed", "variable", "every_k", "multi_cls")
            and pool.get("chunk_size")
        ):
            pname = f"{pname}-{pool['chunk_size']}"
        if enc and pname:
            return f"{enc}/{pname}"
    except (OSError, ValueError, AttributeError):
        pass
    return run_dir.name


def _load_export(export: Path, device: str) -> EmbeddingModel:
    from lmk.model import EmbeddingModel

    if (export / "modules.json").is_file():  # a sentence-transformers export (lmk.export)
        from lmk.export import load_exported

        return load_exported(export, device=device).eval()
    return EmbeddingModel.from_pretrained(export).to(device).eval()  # a save_pretrained folder


def load_models(
    results_dir: str | Path | None = None,
    encoders: Sequence[str] = ("minilm-l6", "tiny-modernbert"),
    poolings: Sequence[str] = ("cls", "mean", "lmk-fixed"),
    *,
    conf_dir: str | Path | None = None,
    device: str = "cpu",
) -> dict[str, EmbeddingModel]:
    """Labelled models to compare, on `device`.

    results_dir given: every run folder under it (a Table 2 sweep) holding export/ and results.json,
    labelled "encoder/pooling" from its results.json (else the folder name). Otherwise each encoder of
    conf/encoder/ built once (untrained heads; random init for tiny-modernbert) and re-pooled with each
    of conf/pooling/ via with_pooling, so the poolings of one encoder share the very same weights.
    """
    from lmk.model import EmbeddingModel

    models: dict[str, EmbeddingModel] = {}
    if results_dir is not None:
        root = Path(results_dir)
        if not root.is_dir():
            raise ValueError(
                f"results_dir {str(root)!r} is not a folder; pass a Table 2 sweep folder or None"
            )
        runs = sorted(p.parent for p in root.rglob("results.json") if (p.parent / "export").is_dir())
        if not runs:
            raise ValueError(f"no run folder with export/ and results.json under {str(root)!r}")
        for run in runs:
            label = _run_label(run)
            if label in models:
                label = f"{label} ({run.name})"
            models[label] = _load_export(run / "export", device)
        return models
    if not encoders or not poolings:
        raise ValueError("encoders and poolings must be non-empty lists of config names")
    conf = _conf_dir(conf_dir)
    pool_cfgs = [_load_cfg(conf, "pooling", p) for p in poolings]
    for enc in encoders:
        base = EmbeddingModel.build(_load_cfg(conf, "encoder", enc), pool_cfgs[0]).to(device).eval()
        for name, pcfg in zip(poolings, pool_cfgs, strict=True):
            models[f"{enc}/{name}"] = base if pcfg is pool_cfgs[0] else base.with_pooling(pcfg)
    return models


# --------------------------------------------------------------------------------------------------
# Plots (matplotlib Figures, no pyplot state)
# --------------------------------------------------------------------------------------------------


def _grid(n: int, ncols: int, size: tuple[float, float] = (4.2, 3.2)) -> tuple[Figure, list[Any]]:
    ncols = max(1, min(ncols, n))
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(size[0] * ncols, size[1] * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel().tolist()
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def _draw_profile(ax: Any, profile: AttentionProfile, title: str | None) -> None:
    import matplotlib as mpl

    cmap = mpl.colormaps["viridis"]
    x = profile.centers
    for layer in range(profile.n_layers):
        color = cmap(layer / max(1, profile.n_layers - 1))
        ax.plot(x, profile.mass[layer], color=color, lw=1.2, label=f"layer {layer}")
    ax.plot(x, profile.layer_mean(), color="black", lw=2, ls="--", label="mean")
    ax.axhline(1.0 / profile.n_bins, color="grey", lw=0.8, ls=":", label="uniform")
    ax.set_xlim(0, 1)
    ax.set_xlabel("relative key position")
    ax.set_ylabel("attention mass per bin")
    ax.set_title(title if title is not None else f"{profile.label} ({profile.rows} rows)", fontsize=9)


def plot_attention_profile(profile: AttentionProfile, title: str | None = None) -> Figure:
    """Attention mass vs relative key position, one line per layer (+ the layer mean, + uniform)."""
    fig = Figure(figsize=(5.5, 3.6), layout="constrained")
    ax = fig.subplots()
    _draw_profile(ax, profile, title)
    ax.legend(fontsize=7, ncol=2)
    return fig


def plot_attention_profiles(profiles: Mapping[str, AttentionProfile], ncols: int = 3) -> Figure:
    """One panel per model (per-layer lines), shared y axis."""
    if not profiles:
        raise ValueError("profiles is empty")
    fig, axes = _grid(len(profiles), ncols)
    ymax = max(float(p.mass.max()) for p in profiles.values())
    for ax, (name, prof) in zip(axes, profiles.items(), strict=True):
        _draw_profile(ax, prof, f"{name} ({prof.rows} rows)")
        ax.set_ylim(0, ymax * 1.05)
    axes[0].legend(fontsize=6, ncol=2)
    return fig


def _draw_heatmap(ax: Any, table: pd.DataFrame, title: str, vmin: float | None, vmax: float | None) -> Any:
    data = table.to_numpy(dtype=float)
    im = ax.imshow(data, aspect="auto", cmap="magma", vmin=vmin, vmax=vmax, origin="upper")
    ax.set_xticks(range(table.shape[1]), [str(c) for c in table.columns])
    ax.set_yticks(range(table.shape[0]), [str(i) for i in table.index])
    ax.set_xlabel("context length")
    ax.set_ylabel("evidence depth")
    ax.set_title(title, fontsize=9)
    for (i, j), v in np.ndenumerate(data):
        if np.isfinite(v):
            ax.text(
                j, i, f"{v:.2f}", ha="center", va="center", fontsize=7, color="white" if v < 0.6 else "black"
            )
    return im


def plot_depth_length_heatmap(
    table: pd.DataFrame, title: str = "Acc@1", vmin: float | None = 0.0, vmax: float | None = 1.0
) -> Figure:
    """Depth (rows) x length (columns) heatmap of a `depth_length_table`."""
    fig = Figure(figsize=(1.2 * table.shape[1] + 2.5, 0.5 * table.shape[0] + 1.8), layout="constrained")
    ax = fig.subplots()
    im = _draw_heatmap(ax, table, title, vmin, vmax)
    fig.colorbar(im, ax=ax)
    return fig


def plot_depth_length_heatmaps(
    tables: Mapping[str, pd.DataFrame], ncols: int = 3, vmin: float | None = 0.0, vmax: float | None = 1.0
) -> Figure:
    """One depth x length heatmap per model, shared colour scale."""
    if not tables:
        raise ValueError("tables is empty")
    fig, axes = _grid(len(tables), ncols, size=(3.6, 3.0))
    im = None
    for ax, (name, table) in zip(axes, tables.items(), strict=True):
        im = _draw_heatmap(ax, table, name, vmin, vmax)
    fig.colorbar(im, ax=axes)
    return fig


def plot_position_similarity(
    curves: Mapping[str, pd.DataFrame], title: str = "document vs chunk cosine"
) -> Figure:
    """Mean cosine (doc embedding vs chunk alone) against chunk position, one line per model (+/- std)."""
    if not curves:
        raise ValueError("curves is empty")
    fig = Figure(figsize=(6, 3.8), layout="constrained")
    ax = fig.subplots()
    for name, c in curves.items():
        ax.plot(c["bin_center"], c["mean"], marker="o", ms=3, label=name)
        ax.fill_between(c["bin_center"], c["mean"] - c["std"], c["mean"] + c["std"], alpha=0.15)
    ax.set_xlim(0, 1)
    ax.set_xlabel("chunk position in document (relative)")
    ax.set_ylabel("cosine(doc, chunk)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    return fig


def save_figure(fig: Figure, fig_dir: str | Path, name: str, dpi: int = 120) -> Path:
    """Write `fig` as `<fig_dir>/<name>.png` (folders created) and return the path."""
    out = Path(fig_dir)
    out.mkdir(parents=True, exist_ok=True)
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)
    path = out / f"{safe}.png"
    fig.savefig(path, dpi=dpi)
    return path
