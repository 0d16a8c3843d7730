"""Figure 6: the GPU section (bf16, SDPA vs eager, tokens/s at 8192; token-budget vs fixed-size batches under
bf16 autocast, as `lmk.evaluate` runs); recorded as skipped without CUDA."""

from __future__ import annotations

from typing import Any

import torch

from benchmarks.common import check_size, figure, paired_ratios, peak_memory_mb, skipped, time_interleaved

SECTION = "gpu"
SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"tokens": 1024, "batch": 2, "repeats": 2,
             "budget": {"n_docs": 16, "max_length": 1024, "batch_size": 8, "max_tokens": 4096, "repeats": 2}},
    "full": {"tokens": 8192, "batch": 4, "repeats": 5,
             "budget": {"n_docs": 256, "max_length": 8192, "batch_size": 32, "max_tokens": 65536, "repeats": 5}},
}


def run(size: str = "tiny") -> list[dict[str, Any]]:
    p = SIZES[check_size(size)]
    if not torch.cuda.is_available():
        why = "CUDA is not available on this machine"
        return [skipped(SECTION, f"bf16_sdpa_vs_eager_{p['tokens']}", why, unit="tokens/s",
                        peer_name="eager attention"),
                skipped(SECTION, f"token_budget_vs_fixed_batches_{p['budget']['max_length']}", why, unit="s",
                        peer_name="fixed batches")]
    from benchmarks.bench_long_inputs import budget_case, doc_of_tokens, long_model, set_attention

    t = p["tokens"]
    model = long_model(t)
    model.backbone.to(device="cuda", dtype=torch.bfloat16)
    if isinstance(model.pooler, torch.nn.Module):
        model.pooler.to("cuda")
    texts = [doc_of_tokens(model, t, seed=s) for s in range(p["batch"])]

    def enc(impl: str) -> Any:
        def fn() -> Any:
            set_attention(model, impl)
            return model.encode(texts, batch_size=p["batch"], max_length=t)  # .cpu() inside syncs
        return fn

    mem = {impl: peak_memory_mb(enc(impl), device="cuda")["peak_mb"] for impl in ("sdpa", "eager")}
    res = time_interleaved({"sdpa": enc("sdpa"), "eager": enc("eager")}, repeats=p["repeats"], warmup=0)
    set_attention(model, "sdpa")
    n_tok = t * len(texts)
    ours, peer = n_tok / res["sdpa"]["median_s"], n_tok / res["eager"]["median_s"]
    # weights back to float32: the token-budget case runs as lmk.evaluate does (bf16 autocast)
    model.backbone.to(dtype=torch.float32)
    budget = budget_case(model, p["budget"], section=SECTION, precision="bf16")
    return budget + [
        figure(SECTION, f"bf16_sdpa_vs_eager_{t}", unit="tokens/s", ours=ours, peer=peer,
               peer_name="eager attention (bf16)", ratio_def="ours_tokens_per_s / peer_tokens_per_s",
               goal=(">=", 1.0), details={"tokens": t, "batch": len(texts), "gpu": torch.cuda.get_device_name(0),
                                          "sdpa_times_s": res["sdpa"]["times_s"],
                                          "eager_times_s": res["eager"]["times_s"]},
               ratio_samples=paired_ratios(res["eager"]["times_s"], res["sdpa"]["times_s"])),
        figure(SECTION, f"bf16_sdpa_vs_eager_memory_{t}", unit="MiB", ours=mem["sdpa"], peer=mem["eager"],
               peer_name="eager attention (bf16)", ratio_def="sdpa_mb / eager_mb", goal=("<=", 1.0),
               details={"method": "torch.cuda.max_memory_allocated"}),
    ]
