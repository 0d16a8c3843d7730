"""The gpu-check's decoder section: the decoder table's paper step (conf/experiment/decoder-paper.yaml: 16 queries x
8 passages at 128/512 tokens, grad-cache mini-batch 8, bf16-mixed) on a random-weight 1B-class decoder
(conf/encoder/decoder-1b-shape.yaml: Llama-3.2-1B's layout, ~0.98B parameters, frozen in bf16) with the authors' LoRA
(r 64, alpha 32, dropout 0.1 on q/k/v/o/gate/up/down) through peft, the ContrastiveModule and Lightning's Trainer as
`lmk.train` runs them. It reports training tokens/s and FLOP/s, the trainable (adapter) and frozen parameter counts,
and the peak memory beside lmk.train.memory's estimate of the same job (the figure the dry run prints for an 8B
row), with gradient checkpointing decided as the job decides it against this GPU's memory.

Size on one H100/H200: 16 x (128 + 8 x 512) = 67.6K tokens a step x ~2 GFLOP a token forward x 3 passes (forward,
a frozen base's one-forward backward, grad cache's embedding pass) = ~0.4 PFLOP, about 1.5 s a step; 3 steps plus
the random init of 1B weights on the CPU: ~40 s.

`--cpu-smoke`: the decoder table's rehearsal config (conf/experiment/decoder-rehearsal.yaml: the 2-layer random
Mistral-shape decoder, LoRA r 8, its sizes) on the CPU: the same code path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu_sections import paper_config, section, timed_steps

DECODER = {"experiment": "decoder-paper", "encoder": "decoder-1b-shape", "encoder_overrides": None, "steps": 3}
DECODER_SMOKE = {"experiment": "decoder-rehearsal", "encoder": None, "encoder_overrides": None, "steps": 3}


@section("decoder_step")
def check_decoder_step(smoke: bool, work: Path) -> dict[str, Any]:
    """The decoder paper step with LoRA on a 1B-class random decoder: tokens/s, peak memory against the estimate."""
    from omegaconf import open_dict  # a package the node may lack (checked first)

    from lmk.train.memory import job_lora  # lmk loads hydra (checked first)

    device = "cpu" if smoke else "cuda"
    cfg = paper_config(smoke, work / "decoder_step", DECODER_SMOKE if smoke else DECODER)
    with open_dict(cfg):
        if not smoke:  # `auto` checkpointing decided against this GPU's memory, as on the cluster's
            cfg.launcher.gpu_memory_gb = round(torch.cuda.get_device_properties(0).total_memory / 1e9)
    out = timed_steps(cfg, device, work, smoke)
    estimate = out["estimated_memory_gib"]["total"]
    out.update(encoder=str(cfg.encoder.name), lora=job_lora(cfg),
               frozen_params=out["model_params"] - out["trainable_params"],
               peak_over_estimate=round(out["peak_reserved_gib"] / estimate, 2) if out["peak_reserved_gib"] else None)
    return out
