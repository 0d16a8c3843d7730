"""Where every token of a landmark-tokenized row goes: numpy index arithmetic on flat arrays, one scatter into
one padded array (no Python loop per token, no per-row torch op). `LandmarkTokenizer` calls the tokenizer once
per batch and hands the content ids here: a layout per strategy, then `pack` (truncation after insertion,
padding, masks)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .names import STRATEGY_TRAITS  # what each strategy does (names.py: config validation reads it there)


@dataclass
class Layout:
    """One batch laid out on flat arrays, before truncation and padding.

    Content token k sits in row `c_row[k]` at position `c_pos[k]`; inserted token k (landmark, extra CLS,
    final SEP) in row `i_row[k]` at `i_pos[k]` with id `i_id[k]`, pooled where `i_pool[k]`. Position 0 of
    every row is the leading token. `total` is each row's untruncated length.
    """

    c_ids: np.ndarray
    c_row: np.ndarray
    c_pos: np.ndarray
    i_row: np.ndarray
    i_pos: np.ndarray
    i_id: np.ndarray
    i_pool: np.ndarray
    total: np.ndarray
    pool_lead: bool = False


def rows_and_local(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For counts per row, the row of each flat element and its index inside its row."""
    rows = np.repeat(np.arange(len(lengths)), lengths)
    starts = np.cumsum(lengths) - lengths
    local = np.arange(int(lengths.sum())) - np.repeat(starts, lengths)
    return rows, local


def plain_layout(ids: np.ndarray, n: np.ndarray, landmark_id: int) -> Layout:
    """[CLS] content [SEP] (strategies none and every_k): `n` content tokens per row, flat in `ids`."""
    rows, local = rows_and_local(n)
    r = np.arange(len(n))
    return Layout(
        c_ids=ids,
        c_row=rows,
        c_pos=local + 1,
        i_row=r,
        i_pos=n + 1,
        i_id=np.full(len(n), landmark_id),
        i_pool=np.zeros(len(n), bool),
        total=n + 2,
    )


def chunked_layout(ids: np.ndarray, n: np.ndarray, chunk_sizes: np.ndarray, multi_cls: bool, landmark_id: int,
                   cls_id: int, before: bool = False) -> Layout:
    """A landmark after every `chunk_sizes[row]` content tokens (fixed, variable), or a CLS before every chunk and
    a final SEP (multi_cls). Content position j -> 1 + j + j // chunk_size (one inserted token per complete chunk
    before it). `before` (placement `authors`): the landmark goes before each chunk instead, none after the last
    (`[CLS] [LMK] z1 [LMK] z2 ... [LMK] zn`): content j -> 2 + j + j // chunk_size."""
    rows, local = rows_and_local(n)
    c_pos = 1 + local + local // chunk_sizes[rows] + int(before)
    m = np.maximum(1, -(-n // chunk_sizes))  # chunks per row (an empty text still gets one landmark)
    i_row, i_local = rows_and_local(m)
    chunk_size = chunk_sizes[i_row]
    if before:
        i_pos = 1 + i_local * (chunk_size + 1)  # chunk i starts after i chunks and their i landmarks
        i_id = np.full(len(i_row), landmark_id)
        i_pool = np.ones(len(i_row), bool)
    elif multi_cls:
        # a CLS before chunks 2..m at i * (chunk_size + 1), then a final SEP after the content (not pooled)
        is_last = i_local == m[i_row] - 1
        i_pos = np.where(is_last, n[i_row] + m[i_row], (i_local + 1) * (chunk_size + 1))
        i_id = np.where(is_last, landmark_id, cls_id)
        i_pool = ~is_last
    else:
        # landmark after content min((i+1) chunk_size, n), shifted by the i landmarks before it
        i_pos = 1 + np.minimum((i_local + 1) * chunk_size, n[i_row]) + i_local
        i_id = np.full(len(i_row), landmark_id)
        i_pool = np.ones(len(i_row), bool)
    return Layout(ids, rows, c_pos, i_row, i_pos, i_id, i_pool, total=1 + n + m, pool_lead=multi_cls)


def sentence_layout(ids: np.ndarray, s_len: np.ndarray, s_row: np.ndarray, n_texts: int,
                    max_sentence_tokens: int | None, landmark_id: int) -> Layout:
    """A landmark after each sentence piece (`s_len[k]` tokens of text `s_row[k]`, flat in `ids`) and, with
    `max_sentence_tokens`, after every that many tokens inside a piece too."""
    n = np.bincount(s_row, weights=s_len, minlength=n_texts).astype(np.int64)
    rows, local = rows_and_local(n)  # the sentences of a text are consecutive in `ids`

    # landmark boundaries: at each piece's end (an empty piece included, as the authors: a blank line
    # gives two landmarks in a row) and, with max_sentence_tokens, after every that many tokens inside a piece
    s_start = np.cumsum(s_len) - s_len - (np.cumsum(n) - n)[s_row]  # piece offset in its text
    if max_sentence_tokens is None:
        b_row, b_end = s_row, s_start + s_len
    else:
        parts = np.maximum(1, -(-s_len // max_sentence_tokens))
        p_sent, p_local = rows_and_local(parts)
        b_row = s_row[p_sent]
        b_end = s_start[p_sent] + np.minimum((p_local + 1) * max_sentence_tokens, s_len[p_sent])
    # a text without pieces (empty or blank) still gets its [LMK] (boundary 0)
    empty = np.flatnonzero(np.bincount(s_row, minlength=n_texts) == 0)
    if len(empty):
        b_row = np.concatenate([b_row, empty])
        b_end = np.concatenate([b_end, np.zeros(len(empty), np.int64)])
        order = np.argsort(b_row, kind="stable")
        b_row, b_end = b_row[order], b_end[order]
    b_count = np.bincount(b_row, minlength=n_texts)
    _, b_local = rows_and_local(b_count)

    # landmarks before content j = boundaries <= j in its row: one searchsorted on row-strided keys
    stride = int(n.max()) + 1
    b_key = b_row * stride + b_end
    before = (
        np.searchsorted(b_key, rows * stride + local, side="right") - (np.cumsum(b_count) - b_count)[rows]
    )
    return Layout(
        c_ids=ids,
        c_row=rows,
        c_pos=1 + local + before,
        i_row=b_row,
        i_pos=1 + b_end + b_local,
        i_id=np.full(len(b_row), landmark_id),
        i_pool=np.ones(len(b_row), bool),
        total=1 + n + b_count,
    )


def with_prompt(lay: Layout, ids: np.ndarray, n: np.ndarray) -> Layout:
    """`n[row]` prompt (instruction) tokens, flat in `ids`, between the leading token and the text's layout: the text's
    tokens and landmarks move right by them. The prompt holds no landmark and is never pooled: landmarks mark chunks
    of the text, whatever instruction precedes it."""
    rows, local = rows_and_local(n)
    return Layout(
        c_ids=np.concatenate([ids, lay.c_ids]),
        c_row=np.concatenate([rows, lay.c_row]),
        c_pos=np.concatenate([1 + local, lay.c_pos + n[lay.c_row]]),
        i_row=lay.i_row,
        i_pos=lay.i_pos + n[lay.i_row],
        i_id=lay.i_id,
        i_pool=lay.i_pool,
        total=lay.total + n,
        pool_lead=lay.pool_lead,
    )


def pack(lay: Layout, max_length: int, *, strategy: str, chunk_size: int, cls_id: int, landmark_id: int, pad_id: int,
         left_padding: bool) -> dict[str, torch.Tensor]:
    """Truncate every row to `max_length` tokens (landmarks count), pad, and build the masks; a row whose landmarks
    were all cut gets its last token overwritten with one."""
    n_rows = len(lay.total)
    length = np.minimum(lay.total, max_length)
    width = int(length.max())
    # left padding shifts every position of a row by its amount of padding
    shift = width - length if left_padding else np.zeros(n_rows, np.int64)
    ids = np.full((n_rows, width), pad_id, dtype=np.int64)
    pool = np.zeros((n_rows, width), dtype=bool)
    r = np.arange(n_rows)
    ids[r, shift] = cls_id
    pool[r, shift] = lay.pool_lead

    keep = lay.c_pos < max_length
    ids[lay.c_row[keep], lay.c_pos[keep] + shift[lay.c_row[keep]]] = lay.c_ids[keep]
    keep = lay.i_pos < max_length
    i_row, i_col = lay.i_row[keep], lay.i_pos[keep] + shift[lay.i_row[keep]]
    ids[i_row, i_col] = lay.i_id[keep]
    pool[i_row, i_col] = lay.i_pool[keep]

    cols = np.arange(width)
    if STRATEGY_TRAITS[strategy]["inserts_landmarks"]:
        # every landmark of a row was truncated away: the last token becomes the landmark
        lost = np.flatnonzero(~pool.any(axis=1))
        last = shift[lost] + length[lost] - 1
        ids[lost, last] = landmark_id
        pool[lost, last] = True
    elif strategy == "multi_cls":
        # as the authors: cut to max_length - 1, then the closing SEP (never a CLS as the last token)
        cut = np.flatnonzero(lay.total > max_length)
        last = shift[cut] + max_length - 1
        ids[cut, last] = landmark_id
        pool[cut, last] = False
    elif strategy == "every_k":
        pos = cols[None, :] - shift[:, None]  # position inside the row, padding excluded
        pool = (pos >= 0) & (pos < length[:, None]) & (pos % chunk_size == 0)

    mask = (cols[None, :] >= shift[:, None]) & (cols[None, :] < (shift + length)[:, None])
    return {
        "input_ids": torch.from_numpy(ids),
        "attention_mask": torch.from_numpy(mask.astype(np.int64)),
        "pool_mask": torch.from_numpy(pool),
    }
