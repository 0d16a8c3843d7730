"""Figure 5: achieved FLOP/s of the encoder forward vs a plain matmul on this machine.

FLOPs are counted by `torch.utils.flop_counter.FlopCounterMode` on one forward (matmuls and attention),
cross-checked against the analytic 2 * non-embedding params * tokens + attention terms. The peer is a
plain float32 matmul of the encoder's largest projection shape ([B*T, H] x [H, I]), repeated to the same
total FLOPs, so the ratio says how close to the machine's matmul rate the whole encoder runs.
"""

from __future__ import annotations

from typing import Any

import torch

from benchmarks.common import build_model, check_size, figure, time_interleaved

SECTION = "roofline"
SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"encoder": "minilm-l6", "batch": 1, "tokens": 32, "repeats": 1},
    "full": {"encoder": "minilm-l6", "batch": 8, "tokens": 512, "repeats": 3},
}


def count_flops(fn: Any) -> int:
    """FLOPs of one call of ``fn()`` as torch's flop counter sees them (no printed table)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def analytic_flops(backbone: torch.nn.Module, batch: int, tokens: int) -> int:
    """2 * (non-embedding params) * tokens for the projections + 4 * layers * B * T^2 * H for attention."""
    cfg = backbone.config
    params = sum(p.numel() for n, p in backbone.named_parameters() if "embeddings" not in n and p.dim() > 1)
    attention = 4 * int(cfg.num_hidden_layers) * batch * tokens * tokens * int(cfg.hidden_size)
    return 2 * params * batch * tokens + attention


def run(size: str = "tiny") -> list[dict[str, Any]]:
    p = SIZES[check_size(size)]
    model = build_model(p["encoder"], "mean", "none", passage_max_length=p["tokens"])
    backbone = model.backbone
    b, t = p["batch"], p["tokens"]
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, int(backbone.config.vocab_size), (b, t), generator=gen)
    mask = torch.ones_like(ids)
    hidden, inter = int(backbone.config.hidden_size), int(backbone.config.intermediate_size)

    def forward() -> torch.Tensor:
        with torch.inference_mode():
            return backbone(input_ids=ids, attention_mask=mask).last_hidden_state

    flops = count_flops(forward)
    a = torch.randn(b * t, hidden, generator=gen)
    w = torch.randn(hidden, inter, generator=gen)
    mm_flops = 2 * b * t * hidden * inter
    n_mm = max(1, round(flops / mm_flops))  # as many matmuls as the forward's FLOPs

    def matmul() -> torch.Tensor:
        with torch.inference_mode():
            out = a @ w
            for _ in range(n_mm - 1):
                out = a @ w
            return out

    sq = torch.randn(1024, 1024, generator=gen)

    def square() -> torch.Tensor:
        with torch.inference_mode():
            return sq @ sq

    res = time_interleaved({"forward": forward, "matmul": matmul, "square": square}, repeats=p["repeats"],
                           warmup=1)
    ours = flops / res["forward"]["median_s"] / 1e9
    peer = n_mm * mm_flops / res["matmul"]["median_s"] / 1e9
    return [figure(
        SECTION, f"{p['encoder']}_forward_vs_matmul", unit="GFLOP/s", ours=ours, peer=peer,
        peer_name=f"matmul [{b * t}x{hidden}] @ [{hidden}x{inter}] x{n_mm}", ratio_def="ours_gflops / peer_gflops",
        goal=None,  # informational: how far the encoder is from the machine's matmul rate
        details={"batch": b, "tokens": t, "flops_counted": flops,
                 "flops_analytic": analytic_flops(backbone, b, t),
                 "square_1024_gflops": 2 * 1024**3 / res["square"]["median_s"] / 1e9,
                 "forward_times_s": res["forward"]["times_s"], "matmul_times_s": res["matmul"]["times_s"],
                 "threads": torch.get_num_threads()},
    )]
