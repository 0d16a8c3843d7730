"""Information at position: cosine between a long document's embedding and each of its chunks alone."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch

from lmk.analysis.common import _check_int, _max_length, bin_centers

if TYPE_CHECKING:  # imported lazily at run time: analysis sits above model / data in the layering
    from lmk.model.embedding import EmbeddingModel


def _visible_words(model: EmbeddingModel, words: list[str], max_length: int) -> int:
    """How many leading words survive the model's truncation at `max_length` (all if it cannot tell)."""
    tok = model.landmark_tokenizer
    feats = model.tokenize([" ".join(words)], side="passage", max_length=max_length)
    ids = feats["input_ids"][0][feats["attention_mask"][0].bool()]
    special = torch.tensor([tok.cls_id, tok.landmark_id, tok.pad_id], device=ids.device)
    n_content = int((~torch.isin(ids, special)).sum())
    hf = model.tokenizer
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
