"""A training job's cost: steps x global batch x (query + group x passage tokens, padded to the max lengths: an
upper bound) x FLOPs per training token, counted with the passes `lmk.train` runs (`EncoderShape.train_passes`:
forward, backward = 2 (1 for a base frozen under LoRA, whose adapters add their own), the forward gradient
checkpointing recomputes when the job turns it on, grad cache's no-grad embedding pass), divided by the training
FLOP/s of the rates, plus a per-job fixed cost (start-up, setup, checkpoints)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmk.model.shape import EncoderShape, encoder_shape
from lmk.sweep.cost.stage import StageCost
from lmk.sweep.cost.throughput import Rates
from lmk.train.memory import decide_checkpointing, job_lora, sections


@dataclass(frozen=True)
class TrainingJob:
    """One training job's wall time by its parts (what a time limit is checked against)."""

    steps: int
    gpus: int
    gpus_per_node: int
    per_device_batch: int
    compute_s: float  # all its steps, every rank at the rate of one
    overhead_s: float  # start-up, model build, data, checkpoints
    checkpoint_every: int = 0  # train.checkpoint_every_n_steps (0: at the end only)
    eval_s: float = 0.0  # evaluation inside the job (a scale without an eval stage)

    @property
    def step_s(self) -> float:
        return self.compute_s / max(self.steps, 1)

    @property
    def wall_s(self) -> float:
        return self.overhead_s + self.compute_s + self.eval_s

    @property
    def queries_per_step(self) -> int:
        return self.gpus * self.per_device_batch


def _sizes(c: dict[str, Any]) -> tuple[int, int, int, int, int]:
    data, trainer = c.get("data") or {}, c.get("trainer") or {}
    steps = int(trainer.get("max_steps") or 0)
    if steps <= 0:
        raise ValueError("trainer.max_steps must be set for a cost estimate (streaming / epochs have no length)")
    return (steps, int(data["batch_size"]), int(data["group_size"]), int(data["query_max_length"]),
            int(data["passage_max_length"]))


def training_flops(cfg: Any, gpus_per_job: int) -> tuple[float, float, int, list[str]]:
    """(tokens, FLOPs, passes per token, what the passes are) of one training job on `gpus_per_job` devices."""
    c = sections(cfg)
    steps, per_device, group, q_len, p_len = _sizes(c)
    shape = encoder_shape(c["encoder"])
    ckpt, cache = decide_checkpointing(c).on, bool((c.get("train") or {}).get("grad_cache"))
    lora = job_lora(c)
    passes = EncoderShape.train_passes(ckpt, cache, frozen=lora is not None)
    queries = steps * per_device * gpus_per_job
    flops = queries * (q_len * shape.train_flops_per_token(q_len, ckpt, cache, lora)
                       + group * p_len * shape.train_flops_per_token(p_len, ckpt, cache, lora))
    backward = "backward (1: frozen base, input gradients only; LoRA adapters 2)" if lora else "backward (2)"
    what = ["forward", backward] + ["checkpoint recompute"] * ckpt + ["grad-cache embedding pass"] * cache
    return float(queries * (q_len + group * p_len)), float(flops), passes, what


def training_job(cfg: Any, gpus_per_job: int, rates: Rates, eval_s: float = 0.0) -> TrainingJob:
    """One training job's wall time at `rates` (every rank at the measured rate of one: a CPU figure is measured
    at one rank's share of the cores)."""
    c = sections(cfg)
    _, flops, _, _ = training_flops(c, gpus_per_job)
    steps, per_device = _sizes(c)[:2]
    per_node = int((c.get("launcher") or {}).get("gpus_per_node") or 1)
    return TrainingJob(steps=steps, gpus=gpus_per_job, gpus_per_node=max(per_node, 1), per_device_batch=per_device,
                       compute_s=flops / (rates.train.flops_per_s * gpus_per_job), overhead_s=rates.job_overhead_s,
                       checkpoint_every=int((c.get("train") or {}).get("checkpoint_every_n_steps") or 0),
                       eval_s=eval_s)


def training_cost(cfg: Any, n_jobs: int, gpus_per_job: int) -> StageCost:
    """The training stage's tokens and FLOPs: `n_jobs` jobs of the config (rows differ in pooling only) on
    `gpus_per_job` devices (their times: `training_job`, checked against the limit by the sweep estimate)."""
    c = sections(cfg)
    steps, per_device, group, q_len, p_len = _sizes(c)
    tokens, flops, passes, what = training_flops(c, gpus_per_job)
    shape, lora = encoder_shape(c["encoder"]), job_lora(c)
    params = f"{shape.params() / 1e6:.0f}M params" + (f" frozen + {shape.lora_params(lora) / 1e6:.3g}M LoRA (r "
                                                        f"{lora['r']})" if lora else "")
    return StageCost("train", n_jobs, tokens * n_jobs, flops * n_jobs,
                     [f"{steps} steps x {per_device} queries x {gpus_per_job} devices, {group} passages each, "
                      f"{q_len}/{p_len} tokens (padded: an upper bound), {params}, "
                      f"{passes} passes per token ({', '.join(what)}); {decide_checkpointing(c).line}"],
                     devices_per_job=gpus_per_job, longest="each row")
