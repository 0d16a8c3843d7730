"""Figure 4: long inputs with tiny-modernbert: SDPA vs eager attention, length-sorted vs naive batches,
token-budget vs fixed-size batches.

Per length L: wall time and extra peak memory of encoding one L-token document, SDPA vs eager (same
weights: the attention implementation is switched on the one backbone). A lone unpadded document needs
no mask: with SDPA, `encode` builds none and runs ModernBERT's sliding-window layers block by block
(`lmk.model.long_attention`), so memory grows linearly and 32,768 tokens fit; eager still holds T x T scores.
Then mixed-length batch workloads: our `encode` (length-sorted batches) vs naive batching (input order,
padded to each batch's longest), and batches filled to a token budget vs a fixed row count (today's
eval.batch_size), embeddings compared. Cases whose attention buffers cannot fit are recorded as skipped.
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import torch

from benchmarks.common import (
    available_memory_mb,
    check_size,
    figure,
    find_pooling_conf,
    load_conf,
    long_text,
    mixed_texts,
    paired_ratios,
    peak_memory_mb,
    skipped,
    time_interleaved,
    time_pair,
)

SECTION = "long_inputs"
SIZES: dict[str, dict[str, Any]] = {
    # repeats per length: long cases are expensive, the median of fewer runs is still warm-up free
    "tiny": {"lengths": [64, 128], "repeats": {64: 1, 128: 1},
             "batch": {"n_docs": 4, "max_length": 128, "batch_size": 2, "repeats": 1},
             "budget": {"n_docs": 10, "max_length": 128, "batch_size": 4, "max_tokens": 256, "repeats": 2}},
    "full": {"lengths": [2048, 8192, 32768], "repeats": {2048: 5, 8192: 3, 32768: 1},
             "batch": {"n_docs": 16, "max_length": 2048, "batch_size": 4, "repeats": 5},
             # today's eval.batch_size (32 rows) vs a token budget, same mixed-length corpus
             "budget": {"n_docs": 48, "max_length": 2048, "batch_size": 32, "max_tokens": 16384, "repeats": 3}},
}
IMPLS = ("sdpa", "eager")
MEMORY_FRACTION = 0.5  # skip a case whose estimated peak exceeds this share of the available memory


def estimate_attention_mb(length: int, heads: int, impl: str, batch: int = 1) -> float:
    """Rough peak of the attention buffers (float32), measured shape on ModernBERT on CPU.

    SDPA on one unpadded row (how `encode` runs a lone document): no mask, the global layers use the
    flash kernel and the sliding-window layers go block by block, so memory is linear in T (measured:
    about 550 MiB at 32,768 tokens). Eager materialises [B, 1, T, T] masks and [B, heads, T, T] scores
    and probabilities.
    """
    from lmk.model.long_attention import BLOCK

    if impl == "sdpa":
        return batch * 4 * heads * length * 2 * BLOCK / 2**20
    return batch * (16 + 8 * heads) * length * length / 2**20


def long_model(max_positions: int, pooler: str = "mean", strategy: str = "none") -> Any:
    """tiny-modernbert with its position budget raised to `max_positions` (RoPE: no new weights)."""
    from lmk.model.embedding import EmbeddingModel

    enc = load_conf("encoder", "tiny-modernbert")
    enc.max_positions = max(int(enc.max_positions), max_positions)
    enc.config_overrides.max_position_embeddings = enc.max_positions
    model = EmbeddingModel.build(enc, find_pooling_conf(pooler, strategy), passage_max_length=enc.max_positions)
    return model.eval()


def set_attention(model: Any, impl: str) -> None:
    if impl not in IMPLS:
        raise ValueError(f"attention implementation {impl!r} not benchmarked; allowed: {', '.join(IMPLS)}")
    model.backbone.set_attn_implementation(impl)


def doc_of_tokens(model: Any, length: int, seed: int = 0) -> str:
    """A real-text document with at least `length` content tokens (encode truncates it to exactly L)."""
    words = length
    while True:
        text = long_text(words, seed=seed)
        n = int(model.tokenize([text], max_length=model.max_positions)["attention_mask"].sum())
        if n >= min(length, model.max_positions):
            return text
        words = int(words * 1.5) + 1


def naive_encode(model: Any, texts: list[str], batch_size: int, max_length: int) -> np.ndarray:
    """What a user writes first: batches in input order, each padded to its longest text."""
    out = []
    with torch.inference_mode():
        for i in range(0, len(texts), batch_size):
            feats = model.tokenize(texts[i : i + batch_size], max_length=max_length)
            out.append(model(feats).float().numpy())
    return np.concatenate(out)


def padded_tokens(model: Any, texts: list[str], batch_size: int, max_length: int, order: list[int]) -> int:
    """Tokens the backbone processes (padding included) when texts are batched in `order`."""
    total = 0
    for i in range(0, len(order), batch_size):
        feats = model.tokenize([texts[j] for j in order[i : i + batch_size]], max_length=max_length)
        total += int(feats["input_ids"].numel())
    return total


def _length_cases(model: Any, p: dict[str, Any]) -> list[dict[str, Any]]:
    heads = int(model.backbone.config.num_attention_heads)
    avail = available_memory_mb()
    figs = []
    for length in p["lengths"]:
        text = doc_of_tokens(model, length)
        results: dict[str, dict[str, Any]] = {}
        fns = {}
        for impl in IMPLS:
            est = estimate_attention_mb(length, heads, impl)
            if est > MEMORY_FRACTION * avail:
                results[impl] = {"skipped": f"needs about {est:,.0f} MiB of attention buffers; "
                                            f"{avail:,.0f} MiB available"}
                continue

            def enc(text: str = text, length: int = length, impl: str = impl) -> np.ndarray:
                set_attention(model, impl)
                return model.encode([text], batch_size=1, max_length=length)

            mem = peak_memory_mb(enc)  # doubles as the warm-up run
            fns[impl] = enc
            results[impl] = {"peak_mb": mem["peak_mb"], "memory_method": mem["method"], "estimate_mb": est}
        # AB BA AB...: the two kernels alternate repeat by repeat, in turn first
        timed = time_interleaved(fns, repeats=p["repeats"][length], warmup=0) if fns else {}
        for impl, t in timed.items():
            results[impl].update(median_s=t["median_s"], times_s=t["times_s"], emb=t["result"])
        set_attention(model, "sdpa")
        sd, ea = results["sdpa"], results["eager"]
        name = f"sdpa_vs_eager_{length}"
        if "skipped" in sd or "skipped" in ea:
            why = sd.get("skipped") or ea.get("skipped")
            figs.append(skipped(SECTION, name, f"{'sdpa' if 'skipped' in sd else 'eager'}: {why}", unit="s",
                                peer_name="eager attention"))
            if "skipped" not in sd:  # SDPA alone still gives the time and memory at this length
                figs.append(figure(SECTION, f"sdpa_{length}", unit="s", ours=sd["median_s"], peer=None,
                                   peer_name="", ratio_def="", details={"tokens": length, "peak_mb": sd["peak_mb"],
                                                                        "tokens_per_s": length / sd["median_s"]}))
            continue
        diff = float(np.max(np.abs(sd["emb"] - ea["emb"])))
        det = {"tokens": length, "sdpa_peak_mb": sd["peak_mb"], "eager_peak_mb": ea["peak_mb"],
               "memory_method": sd["memory_method"], "sdpa_tokens_per_s": length / sd["median_s"],
               "eager_tokens_per_s": length / ea["median_s"], "max_abs_diff": diff,
               "sdpa_times_s": sd["times_s"], "eager_times_s": ea["times_s"]}
        figs.append(figure(SECTION, name, unit="s", ours=sd["median_s"], peer=ea["median_s"],
                           peer_name="eager attention", ratio_def="sdpa_s / eager_s", goal=("<=", 1.0), details=det,
                           ratio_samples=paired_ratios(sd["times_s"], ea["times_s"])))
        figs.append(figure(SECTION, f"sdpa_vs_eager_memory_{length}", unit="MiB", ours=sd["peak_mb"],
                           peer=ea["peak_mb"], peer_name="eager attention", ratio_def="sdpa_mb / eager_mb",
                           goal=("<=", 1.0), details={"tokens": length, "memory_method": sd["memory_method"]}))
    return figs


def _batch_case(model: Any, b: dict[str, Any]) -> list[dict[str, Any]]:
    ml, bs = b["max_length"], b["batch_size"]
    # documents from ~1/16 of the budget to the full budget (log-uniform words), shuffled
    texts = mixed_texts(b["n_docs"], max(4, ml // 16), ml, seed=4)
    random.Random(4).shuffle(texts)

    def ours() -> np.ndarray:
        return model.encode(texts, batch_size=bs, max_length=ml)

    def peer() -> np.ndarray:
        return naive_encode(model, texts, bs, ml)

    m_ours, m_peer = peak_memory_mb(ours), peak_memory_mb(peer)  # warm-up runs
    t_ours, t_peer = time_pair(ours, peer, repeats=b["repeats"], warmup=0)
    diff = float(np.max(np.abs(t_ours["result"] - t_peer["result"])))
    sorted_order = [int(i) for i in np.argsort([-len(t) for t in texts], kind="stable")]
    det = {"n_docs": len(texts), "max_length": ml, "batch_size": bs, "max_abs_diff": diff,
           "ours_peak_mb": m_ours["peak_mb"], "peer_peak_mb": m_peer["peak_mb"],
           "ours_padded_tokens": padded_tokens(model, texts, bs, ml, sorted_order),
           "peer_padded_tokens": padded_tokens(model, texts, bs, ml, list(range(len(texts)))),
           "real_tokens": int(model.tokenize(texts, max_length=ml)["attention_mask"].sum()),
           "ours_times_s": t_ours["times_s"], "peer_times_s": t_peer["times_s"]}
    return [figure(SECTION, f"sorted_vs_naive_batches_{ml}", unit="s", ours=t_ours["median_s"],
                   peer=t_peer["median_s"], peer_name="input-order batches padded to their longest",
                   ratio_def="ours_s / peer_s", goal=("<=", 1.0), details=det,
                   ratio_samples=paired_ratios(t_ours["times_s"], t_peer["times_s"]))]


def padded_size(lengths: np.ndarray, batches: list[np.ndarray]) -> int:
    """Tokens the backbone processes (padding included) for these batches of rows with these lengths."""
    return int(sum(len(b) * int(lengths[b].max()) for b in batches))


def budget_case(model: Any, b: dict[str, Any], section: str = SECTION, precision: str = "fp32",
                seed: int = 5) -> list[dict[str, Any]]:
    """Token-budget batches vs today's fixed row count on one mixed-length corpus (same model, same device)."""
    from lmk.model.batching import fixed_batches, token_budget_batches

    ml, bs, budget = b["max_length"], b["batch_size"], b["max_tokens"]
    texts = mixed_texts(b["n_docs"], 4, ml, seed=seed)  # log-uniform words: queries to full documents
    device = str(model.device)

    def ours() -> np.ndarray:
        return model.encode(texts, max_length=ml, max_tokens_per_batch=budget, precision=precision)

    def peer() -> np.ndarray:
        return model.encode(texts, batch_size=bs, max_length=ml, precision=precision)

    m_ours, m_peer = peak_memory_mb(ours, device=device), peak_memory_mb(peer, device=device)  # warm-up runs
    t = time_interleaved({"ours": ours, "peer": peer}, repeats=b["repeats"], warmup=0)
    t_ours, t_peer = t["ours"], t["peer"]
    lengths = model.token_lengths(texts, max_length=ml)
    budget_batches = token_budget_batches(lengths, budget)
    fixed = fixed_batches([len(x) for x in texts], bs)  # what encode does with batch_size (char-length sort)
    diff = float(np.max(np.abs(t_ours["result"] - t_peer["result"])))
    det = {"n_docs": len(texts), "max_length": ml, "batch_size": bs, "max_tokens_per_batch": budget,
           "precision": precision, "device": device, "max_abs_diff": diff,
           "real_tokens": int(lengths.sum()), "ours_padded_tokens": padded_size(lengths, budget_batches),
           "peer_padded_tokens": padded_size(lengths, fixed), "ours_batches": len(budget_batches),
           "peer_batches": len(fixed), "ours_max_batch_tokens": max(len(x) * int(lengths[x].max()) for x in budget_batches),
           "peer_max_batch_tokens": max(len(x) * int(lengths[x].max()) for x in fixed),
           "ours_peak_mb": m_ours["peak_mb"], "peer_peak_mb": m_peer["peak_mb"], "memory_method": m_ours["method"],
           "ours_times_s": t_ours["times_s"], "peer_times_s": t_peer["times_s"]}
    peer_name = f"fixed batches of {bs} rows (length-sorted)"
    return [
        figure(section, f"token_budget_vs_fixed_batches_{ml}", unit="s", ours=t_ours["median_s"],
               peer=t_peer["median_s"], peer_name=peer_name, ratio_def="ours_s / peer_s", goal=("<=", 1.0),
               details=det, ratio_samples=paired_ratios(t_ours["times_s"], t_peer["times_s"])),
        figure(section, f"token_budget_vs_fixed_batches_memory_{ml}", unit="MiB", ours=m_ours["peak_mb"],
               peer=m_peer["peak_mb"], peer_name=peer_name, ratio_def="ours_mb / peer_mb", goal=None,
               details={"memory_method": m_ours["method"], "device": device}),
    ]


def run(size: str = "tiny") -> list[dict[str, Any]]:
    p = SIZES[check_size(size)]
    need = max(max(p["lengths"]), p["batch"]["max_length"], p["budget"]["max_length"])
    model = long_model(2 ** math.ceil(math.log2(need)))
    return _length_cases(model, p) + _batch_case(model, p["batch"]) + budget_case(model, p["budget"])
