"""The gpu-check's packed section: padded against packed (unpadded, lmk.model.packed_attention) inference encoding.

Texts of a paper-like mixed length distribution (lognormal token counts, clipped to the max length: passages around
120 tokens at 512, long documents around 1500 at 8192) are tokenized once, cut into the length-sorted batches of
32768 padded tokens lmk.evaluate encodes, and run through `EmbeddingModel`'s batch forward on both paths: padded
(`encoder.packed=false`: SDPA with dense masks on ModernBERT's sliding-window layers) and packed (`auto`, which on
the GPU is torch's varlen_attn with each layer's window). For each it records real tokens/s (the median of the
timed passes after a warm-up) and the two paths' embeddings compared (largest absolute difference, smallest
cosine: bf16 autocast, so equal up to rounding; the section fails below a cosine of 0.99). Backbones: the paper's
ModernBERT-base shape (149M, fp32 weights under bf16 autocast, as lmk.evaluate runs it) at 512 and 8192 tokens, and
the decoders' 1B-class Llama shape (bf16 weights) at 512.

Size on one H100/H200: ~150K + ~130K tokens (ModernBERT) and ~40K tokens (decoder) per pass, 4 passes per path:
a few PFLOP, seconds; the 1B decoder's random init on the CPU dominates (~30 s). Without CUDA (or in --cpu-smoke) the
section is skipped: varlen_attn is CUDA only, and tests/test_packed_attention.py checks the packed layout on the
CPU through its reference attention.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.gpu_sections import ROOT, section, sync, words

MAX_TOKENS = 32768
MIN_COSINE = 0.99
# backbone -> (config overrides, {max length: (texts, median tokens, log-sd)}); the pooling is lmk-variable's
PACKED = {"modernbert-base-shape": ({"vocab_size": 50368}, {512: (1024, 120, 0.7), 8192: (64, 1500, 0.9)}),
          "decoder-1b-shape": (None, {512: (256, 120, 0.7)})}
REPEATS = 3


def mixed_texts(n: int, median: int, sigma: float, max_length: int, seed: int) -> list[str]:
    """`n` texts whose lengths follow a lognormal around `median` tokens (about one token a word), clipped."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(median), sigma, n), 8, max_length).astype(int)
    return [words(int(k), seed * 100_000 + i) for i, k in enumerate(lengths)]


def _batches(model: Any, texts: list[str], max_length: int) -> list[dict[str, torch.Tensor]]:
    from lmk.model.batching import token_budget_batches  # lmk loads hydra (checked first)

    lengths = model.token_lengths(texts, max_length=max_length)
    return [model.tokenize([texts[i] for i in idx], max_length=max_length)
            for idx in token_budget_batches(lengths, MAX_TOKENS)]


def _timed(model: Any, batches: list[dict[str, torch.Tensor]], precision: str, repeats: int
           ) -> tuple[list[float], torch.Tensor]:
    device, times, out = model.device, [], None
    with torch.inference_mode():
        for i in range(repeats + 1):  # the first pass warms up
            sync(device)
            t0 = time.perf_counter()
            embs = [model._embed_batch(feats, precision) for feats in batches]
            sync(device)
            if i:
                times.append(time.perf_counter() - t0)
            out = torch.cat(embs).float().cpu()
    return times, out


def compare(model: Any, texts: list[str], max_length: int, precision: str, packed: bool | str = "auto",
            repeats: int = REPEATS) -> dict[str, Any]:
    """Padded against packed (setting `packed`) batch forwards of `texts` on the model's device: tokens/s of each,
    their ratio and how far their embeddings differ."""
    batches = _batches(model, texts, max_length)
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    out: dict[str, Any] = {"texts": len(texts), "tokens": tokens, "batches": len(batches),
                           "padded_tokens": sum(int(b["attention_mask"].numel()) for b in batches),
                           "max_tokens_per_batch": MAX_TOKENS, "precision": precision}
    cfg, embs = model.encoder_cfg, {}
    try:
        for name, setting in (("padded", False), ("packed", packed)):
            model.encoder_cfg = dataclasses.replace(cfg, packed=setting)
            times, embs[name] = _timed(model, batches, precision, repeats)
            out[name] = {"tokens_per_s": round(tokens / statistics.median(times), 1),
                         "seconds": [round(t, 4) for t in times], "path": model.attention_path(precision)[1]}
    finally:
        model.encoder_cfg = cfg
    out["speedup"] = round(out["packed"]["tokens_per_s"] / out["padded"]["tokens_per_s"], 3)
    out["max_abs_diff"] = float((embs["padded"] - embs["packed"]).abs().max())
    out["min_cosine"] = float(torch.nn.functional.cosine_similarity(embs["padded"], embs["packed"], dim=1).min())
    return out


def _model(name: str, overrides: dict[str, Any] | None, max_length: int) -> Any:
    from omegaconf import OmegaConf  # a package the node may lack (checked first)

    from lmk.model.embedding import EmbeddingModel  # lmk loads hydra (checked first)

    enc = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "encoder" / f"{name}.yaml"))
    enc.update(seed=0, lora=None, gradient_checkpointing=False)  # inference on the base weights
    if overrides:
        enc["config_overrides"] = overrides
    pooling = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "pooling" / "lmk-variable.yaml"))
    return EmbeddingModel.build(enc, pooling, passage_max_length=max_length, seed=0).to("cuda").eval()


@section("packed")
def check_packed(smoke: bool, work: Path) -> dict[str, Any]:
    """Padded against packed encoding tokens/s, per backbone and max length, and their embeddings compared."""
    if not torch.cuda.is_available() or smoke:
        reason = "needs CUDA" if not torch.cuda.is_available() else "cpu smoke"
        return {"status": "skipped", "reason": f"{reason}: the packed path's kernel (torch varlen_attn) is CUDA only; "
                "tests/test_packed_attention.py checks the packed layout on the CPU"}
    out: dict[str, Any] = {"precision": "bf16", "max_tokens_per_batch": MAX_TOKENS,
                           "lengths": {m: {str(k): dict(zip(("texts", "median", "log_sd"), v, strict=True))
                                           for k, v in sizes.items()} for m, (_, sizes) in PACKED.items()}}
    for name, (overrides, sizes) in PACKED.items():
        model = _model(name, overrides, max(sizes))
        packed, why = model.attention_path("bf16")
        out[name] = {str(length): compare(model, mixed_texts(n, median, sigma, length, seed=length), length, "bf16")
                     for length, (n, median, sigma) in sizes.items()} if packed else {"status": "skipped",
                                                                                     "reason": why}
        del model
        torch.cuda.empty_cache()
    if all(out[m].get("status") == "skipped" for m in PACKED):
        return {"status": "skipped", "reason": "; ".join(f"{m}: {out[m]['reason']}" for m in PACKED), **out}
    low = [f"{m}@{k}: {v['min_cosine']:.4f}" for m in PACKED for k, v in out[m].items()
           if isinstance(v, dict) and v["min_cosine"] < MIN_COSINE]
    if low:
        raise FloatingPointError(f"packed embeddings differ from padded ones (cosine < {MIN_COSINE}): {', '.join(low)}")
    return out
