"""The encode pipeline against its own limit: end-to-end `EmbeddingModel.encode` (texts in, tokenization by the
pipeline's workers) over the model forward alone on the same batches, pre-tokenized and pre-batched (the most
any tokenization overlap can reach). Shared by `make bench` (section encode, CPU) and `make gpu-check`
(section encode_pipeline, CUDA)."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from benchmarks.common import load_conf, long_text, paired_ratios, time_interleaved


def tiny_modernbert(max_length: int, pooling: Any, layers: int = 2, **overrides: Any) -> Any:
    """tiny-modernbert with `layers` layers (tokenization is a visible share of its time) at `max_length`."""
    from lmk.model.embedding import EmbeddingModel

    enc = load_conf("encoder", "tiny-modernbert")
    enc.config_overrides.num_hidden_layers = layers
    for key, value in overrides.items():
        enc.config_overrides[key] = value
    enc.max_positions = max(int(enc.max_positions), max_length)
    enc.config_overrides.max_position_embeddings = enc.max_positions
    enc.seed = 0
    return EmbeddingModel.build(enc, pooling, passage_max_length=max_length).eval()


def full_texts(n: int, words: int, seed: int = 0) -> list[str]:
    """`n` real-text documents (sentences included) of `words` words: each fills a max length of about
    words / 1.3 tokens."""
    return [long_text(words, seed=seed + i) for i in range(n)]


def pre_batched(model: Any, texts: list[str], max_length: int, max_tokens: int
                ) -> list[tuple[dict[str, torch.Tensor], bool]]:
    """The batches encode runs (same plan), tokenized ahead of time and on the model's device, each with
    whether it is one unpadded row (read on the CPU, as encode does)."""
    from lmk.model.batching import token_budget_batches

    plan = token_budget_batches(model.token_lengths(texts, max_length=max_length), max_tokens)
    out = []
    for idx in plan:
        feats = model.landmark_tokenizer([texts[i] for i in idx], max_length=max_length)
        unpadded = len(idx) == 1 and bool(feats["attention_mask"].all())
        out.append(({k: v.to(model.device) for k, v in feats.items()}, unpadded))
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(model: Any, texts: list[str], max_length: int, max_tokens: int, repeats: int,
            precision: str = "fp32", workers: Any = "auto") -> dict[str, Any]:
    """End-to-end and forward-only timings, interleaved repeat by repeat, with the embeddings compared."""
    device = model.device
    batches = pre_batched(model, texts, max_length, max_tokens)
    tokens = int(sum(int(b["attention_mask"].sum()) for b, _ in batches))
    embed = functools.partial(model._embed, precision=precision)

    def end_to_end() -> np.ndarray:
        out = model.encode(texts, max_length=max_length, max_tokens_per_batch=max_tokens, precision=precision,
                           workers=workers)
        _sync(device)
        return out

    def forward_only() -> list[torch.Tensor]:
        with torch.inference_mode():
            out = [embed(b, unpadded=alone) for b, alone in batches]
        _sync(device)
        return out

    t = time_interleaved({"pipeline": end_to_end, "forward": forward_only}, repeats=repeats, warmup=1)
    e2e, fwd = t["pipeline"], t["forward"]
    return {
        "texts": len(texts), "tokens": tokens, "batches": len(batches), "max_length": max_length,
        "max_tokens_per_batch": max_tokens, "precision": precision, "device": str(device),
        "end_to_end_tokens_per_s": tokens / e2e["median_s"], "forward_only_tokens_per_s": tokens / fwd["median_s"],
        "ratio": fwd["median_s"] / e2e["median_s"], "end_to_end_times_s": e2e["times_s"],
        "forward_only_times_s": fwd["times_s"],
        # texts/s ratio, repeat by repeat: forward_s / end_to_end_s
        "ratio_samples": paired_ratios(fwd["times_s"], e2e["times_s"]),
    }
