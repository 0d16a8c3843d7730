"""Figure 1: landmark tokenization vs the plain fast tokenizer and vs a per-text Python baseline.

All three produce padded tensors for the same texts and the same truncation length, so the comparison is
what a user pays for landmarks on top of the tokenizer call they would make anyway.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from benchmarks.common import (
    check_size,
    figure,
    hf_tokenizer,
    mixed_texts,
    paired_ratios,
    quiet_transformers,
    time_interleaved,
)

SECTION = "tokenization"
SIZES: dict[str, dict[str, Any]] = {
    # n texts of min..max words (log-uniform), truncated to max_length; landmark every chunk_size tokens
    "tiny": {"n_texts": 100, "min_words": 20, "max_words": 400, "max_length": 512, "chunk_size": 32, "repeats": 1,
             "baseline_repeats": 1},
    "full": {"n_texts": 10_000, "min_words": 20, "max_words": 4000, "max_length": 512, "chunk_size": 32,
             "repeats": 7, "baseline_repeats": 3},
}


def python_landmark_baseline(
    tokenizer: Any, texts: Sequence[str], chunk_size: int, max_length: int
) -> dict[str, torch.Tensor]:
    """The straightforward implementation of the fixed layout: one tokenizer call and a Python loop per text.

    ``[CLS] z1 [LMK] ... zn [LMK]`` (a landmark after every ``chunk_size`` content tokens, the last chunk
    included), truncated to ``max_length`` after insertion; if no landmark survives, the last token is
    overwritten with one; an empty text is ``[CLS] [LMK]``. Right padding with the pad id.
    """
    cls_id = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    lmk_id = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else lmk_id
    rows: list[tuple[list[int], list[bool]]] = []
    for text in texts:
        # content past max_length can never survive, so truncate as any user would
        content = tokenizer(text, add_special_tokens=False, truncation=True, max_length=max_length)["input_ids"]
        ids, pool = [cls_id], [False]
        for i, tok in enumerate(content):
            ids.append(tok)
            pool.append(False)
            if (i + 1) % chunk_size == 0:
                ids.append(lmk_id)
                pool.append(True)
        if not content or len(content) % chunk_size:
            ids.append(lmk_id)
            pool.append(True)
        ids, pool = ids[:max_length], pool[:max_length]
        if not any(pool):
            ids[-1], pool[-1] = lmk_id, True
        rows.append((ids, pool))
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    pool_mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for r, (ids, pool) in enumerate(rows):
        input_ids[r, : len(ids)] = torch.tensor(ids)
        attention[r, : len(ids)] = 1
        pool_mask[r, : len(ids)] = torch.tensor(pool)
    return {"input_ids": input_ids, "attention_mask": attention, "pool_mask": pool_mask}


def compare_features(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Row-by-row equality of ids / attention / pool masks (padding width may differ, content may not)."""
    keys = ("input_ids", "attention_mask", "pool_mask")
    if a["input_ids"].shape[0] != b["input_ids"].shape[0]:
        return {"equal": False, "first_diff_row": -1, "reason": "different number of rows"}
    for r in range(a["input_ids"].shape[0]):
        na, nb = int(a["attention_mask"][r].sum()), int(b["attention_mask"][r].sum())
        if na != nb or any(not torch.equal(a[k][r, :na], b[k][r, :nb]) for k in keys):
            return {"equal": False, "first_diff_row": r, "len_a": na, "len_b": nb}
    return {"equal": True, "first_diff_row": None}


def run(size: str = "tiny") -> list[dict[str, Any]]:
    from lmk.model.landmark.tokenization import LandmarkTokenizer

    p = SIZES[check_size(size)]
    texts = mixed_texts(p["n_texts"], p["min_words"], p["max_words"], seed=1)
    hf = hf_tokenizer()
    lmk = LandmarkTokenizer(hf, strategy="fixed", chunk_size=p["chunk_size"], max_length=p["max_length"])

    def ours() -> dict[str, torch.Tensor]:
        return lmk(texts)

    def plain() -> dict[str, torch.Tensor]:
        return hf(texts, truncation=True, max_length=p["max_length"], padding=True, return_tensors="pt")

    def baseline() -> dict[str, torch.Tensor]:
        return python_landmark_baseline(hf, texts, p["chunk_size"], p["max_length"])

    warm = texts[: max(1, len(texts) // 50)]  # warm-up: lazy init / caches, not a full extra pass
    with quiet_transformers():
        lmk(warm)
        hf(warm, truncation=True, max_length=p["max_length"], padding=True, return_tensors="pt")
        python_landmark_baseline(hf, warm, p["chunk_size"], p["max_length"])
        t = time_interleaved({"ours": ours, "plain": plain}, repeats=p["repeats"], warmup=0)
        # the baseline is slow and only a reference: fewer repeats keep the full run short (paired with
        # its own interleaved runs of ours)
        t_pair = time_interleaved({"ours": ours, "baseline": baseline}, repeats=p["baseline_repeats"], warmup=0)
        t_base = t_pair["baseline"]
    t_ours, t_plain = t["ours"], t["plain"]
    same = compare_features(t_ours["result"], t_base["result"])
    n_tokens = int(t_plain["result"]["attention_mask"].sum())
    words = sum(len(t.split()) for t in texts)
    common = {"n_texts": len(texts), "words": words, "max_length": p["max_length"], "chunk_size": p["chunk_size"],
              "plain_tokens_after_truncation": n_tokens}
    ours_s, ours_times = t_ours["median_s"], t_ours["times_s"]
    return [
        figure(SECTION, "landmark_vs_plain_tokenizer", unit="s", ours=ours_s, peer=t_plain["median_s"],
               peer_name="tokenizer(texts, truncation=True, padding=True)", ratio_def="ours_s / peer_s",
               goal=("<=", 1.3), details={**common, "ours_times_s": ours_times, "peer_times_s": t_plain["times_s"]},
               ratio_samples=paired_ratios(ours_times, t_plain["times_s"])),
        figure(SECTION, "landmark_vs_python_baseline", unit="s", ours=ours_s, peer=t_base["median_s"],
               peer_name="per-text Python layout", ratio_def="ours_s / peer_s", goal=("<=", 1.0),
               details={**common, "ids_equal": same["equal"], "comparison": same,
                        "peer_times_s": t_base["times_s"]},
               ratio_samples=paired_ratios(t_pair["ours"]["times_s"], t_base["times_s"])),
    ]
