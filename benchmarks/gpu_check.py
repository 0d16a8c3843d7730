"""`make gpu-check`: does the paper scale run on this GPU, how fast, in how much memory? One JSON report.

Sections (`SECTIONS`, run in that order; each timed, each in the report even when it fails):
  train_step   a paper-shaped training step: ModernBERT-base-shaped random weights (the shipped config,
               149M parameters), the paper config's batch (256 queries x 8 passages at 128/512 tokens,
               teacher scores), bf16-mixed, gradient checkpointing, grad cache and `deterministic: warn` as
               table2-paper sets them, through the same ContrastiveModule and Lightning Trainer as
               `lmk.train`; step time, training tokens/s and FLOP/s (passes counted as the code runs them),
               peak memory allocated and reserved next to lmk.sweep.cost's estimate.
  padded       what only a GPU kernel can get wrong: texts of mixed lengths (20 / 150 / 512 tokens) padded
               to 512, forward and backward under bf16 autocast with SDPA, and mixed lengths padded to 8192
               through `EmbeddingModel.encode`; every embedding, valid hidden state and gradient finite.
  encode       inference tokens/s at 512 and 8192 tokens, SDPA (and flash_attention_2 when installed).
  encode_pipeline  lmk.evaluate's encode end to end (tokenization workers, bf16 autocast, 32768-token batches) vs
               the forward alone on the same pre-tokenized batches, tokens/s at 512 and 8192, ModernBERT-base shape.
  rehearsal    the rehearsal scale's first row (experiment=table2-rehearsal) through `lmk.train`, DDP over
               every visible GPU when there are several; rerunnable (overwrite=true in its scratch folder).
Needs no network and nothing outside the repository: every model is built from its config.

    python -m benchmarks.gpu_check [--out outputs/gpu_check] [--sections train_step,padded,encode,encode_pipeline,rehearsal]
    python -m benchmarks.gpu_check --cpu-smoke      # the same code on the CPU at the rehearsal's sizes

Without CUDA (and without --cpu-smoke) it prints a "skipped" report, writes nothing and exits 0. A GPU run
writes <out>/gpu_check.json, whose "throughput" section the cost estimate reads as measured
(`lmk.sweep.cost.read_gpu_check`: mode "gpu", status "ok" only). A --cpu-smoke run writes <out>/cpu_check.json
instead: this machine's throughput at the rehearsal's sizes, which the estimate takes only when given
explicitly for a CPU scale (`python -m lmk.sweep ... --scale rehearsal --throughput <out>/cpu_check.json`).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = "outputs/gpu_check"
REPORT_FILE = {"gpu": "gpu_check.json", "cpu-smoke": "cpu_check.json"}  # only the first counts as measured

# Paper sizes (the batch and lengths come from conf/experiment/table2-paper.yaml itself).
PAPER = {"experiment": "table2-paper", "encoder": "modernbert-base-shape",
         "encoder_overrides": {"vocab_size": 50368},  # ModernBERT-base's vocabulary: the full 149M shape
         "steps": 3, "encode": {512: 64, 8192: 4}, "encode_repeats": 3,
         "padded": {"train": (20, 150, 512), "encode": (100, 3000, 8192)}}
# CPU smoke: the rehearsal's own config (its encoder, batch and lengths), so that the step it times is the
# step the rehearsal runs: this machine's throughput for the rehearsal's cost estimate.
SMOKE = {"experiment": "table2-rehearsal", "encoder": None, "encoder_overrides": None,
         "steps": 4, "encode": {64: 4, 256: 2}, "encode_repeats": 1,
         "padded": {"train": (8, 40, 192), "encode": (8, 100, 512)}}


def _compose(overrides: list[str]) -> Any:
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        return compose("train", overrides=overrides)


def paper_config(smoke: bool, run_dir: Path) -> Any:
    """table2-paper with the encoder swapped for its offline shape (the rehearsal's config in smoke mode)."""
    from omegaconf import OmegaConf, open_dict

    sizes = SMOKE if smoke else PAPER
    cfg = _compose([f"experiment={sizes['experiment']}", "pooling=lmk-variable", "+row=gpu-check",
                    *([f"encoder={sizes['encoder']}"] if sizes["encoder"] else []),
                    "launcher=local", "logger=none", "eval=none", f"run_dir={run_dir}"])
    with open_dict(cfg):
        if sizes["encoder_overrides"]:
            cfg.encoder.config_overrides = OmegaConf.create(sizes["encoder_overrides"])
        cfg.encoder.gradient_checkpointing = True
        cfg.trainer.devices = 1
        cfg.trainer.num_nodes = 1
        cfg.trainer.strategy = "auto"
        cfg.trainer.accelerator = "cpu" if smoke else "gpu"
        cfg.trainer.max_steps = sizes["steps"]
    return cfg


def cpu_cores() -> int:
    """The cores this process may run on (what Lightning divides among a machine's ranks)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def rehearsal_ranks() -> int:
    """DDP ranks per machine in the rehearsal (its launcher.tasks_per_node): they share the CPU's cores."""
    from omegaconf import OmegaConf

    return int(OmegaConf.load(ROOT / "conf/experiment/table2-rehearsal.yaml").launcher.tasks_per_node)


def _words(n: int, seed: int) -> str:
    import random

    rng = random.Random(seed)
    vocab = ("the retrieval model encodes passages and queries into dense vectors while landmark tokens "
             "summarise each chunk of text for pooling at training and inference time across long documents").split()
    return " ".join(rng.choice(vocab) for _ in range(n))


def paper_batch(model: Any, cfg: Any) -> dict[str, Any]:
    """One collated batch of the paper's shape, every text long enough to fill its max length."""
    import torch

    from lmk.data.datamodule import PairCollator

    d = cfg.data
    examples = [{"query": _words(2 * d.query_max_length, i), "key": (0, i),
                 "passages": [_words(2 * d.passage_max_length, 1000 * i + j) for j in range(d.group_size)],
                 "scores": [float(d.group_size - j) for j in range(d.group_size)]}
                for i in range(d.batch_size)]
    batch = PairCollator(model.tokenizer, d.query_max_length, d.passage_max_length)(examples)
    assert isinstance(batch["teacher_scores"], torch.Tensor)
    return batch


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


# The sections, in run order: name -> check(smoke, work folder) -> the section's figures. A new section is
# one decorated function (and, if the cost estimate should read it, a line in `throughput`).
SECTIONS: dict[str, Callable[[bool, Path], dict[str, Any]]] = {}


def section(name: str) -> Callable[[Callable[[bool, Path], dict[str, Any]]], Callable[[bool, Path], dict[str, Any]]]:
    def register(fn: Callable[[bool, Path], dict[str, Any]]) -> Callable[[bool, Path], dict[str, Any]]:
        if name in SECTIONS:
            raise ValueError(f"gpu-check section {name!r} is registered twice")
        SECTIONS[name] = fn
        return fn
    return register


def _memory(device: str) -> dict[str, float | None]:
    """Peak memory since the last reset: allocated (tensors) and reserved (what the allocator holds)."""
    import torch

    if device != "cuda":
        return {"peak_memory_gib": None, "peak_reserved_gib": None}
    return {"peak_memory_gib": round(torch.cuda.max_memory_allocated() / 1024**3, 2),
            "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 1024**3, 2)}


@section("train_step")
def check_train_step(smoke: bool, work: Path) -> dict[str, Any]:
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader

    from lmk.config import validate
    from lmk.model.embedding import EmbeddingModel
    from lmk.sweep.cost import encoder_shape, job_memory
    from lmk.train.fit import build_module

    device = "cpu" if smoke else "cuda"
    cfg = paper_config(smoke, work / "train_step")
    typed = validate(cfg)
    pl.seed_everything(0)
    t0 = time.perf_counter()
    model = EmbeddingModel.build(cfg.encoder, cfg.pooling, query_max_length=cfg.data.query_max_length,
                                 passage_max_length=cfg.data.passage_max_length, seed=0)
    build_s = time.perf_counter() - t0
    module = build_module(typed, model)
    batch = paper_batch(model, cfg)
    steps = int(cfg.trainer.max_steps)
    times: list[float] = []

    class Timer(pl.Callback):
        def on_train_batch_start(self, *args: Any) -> None:
            _sync(device)
            self.t = time.perf_counter()

        def on_train_batch_end(self, *args: Any) -> None:
            _sync(device)
            times.append(time.perf_counter() - self.t)

    # the process-wide settings the Trainer changes, restored afterwards (the check also runs inside tests)
    threads, determinism = torch.get_num_threads(), (torch.are_deterministic_algorithms_enabled(),
                                                     torch.is_deterministic_algorithms_warn_only_enabled())
    if smoke and "OMP_NUM_THREADS" not in os.environ:
        # one rank's share of the cores, as Lightning gives each of the rehearsal's DDP ranks
        torch.set_num_threads(max(1, cpu_cores() // rehearsal_ranks()))
    trainer = pl.Trainer(accelerator=cfg.trainer.accelerator, devices=1, precision=cfg.trainer.precision,
                         max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[Timer()], use_distributed_sampler=False,
                         gradient_clip_val=None if cfg.train.grad_cache else cfg.trainer.gradient_clip_val,
                         deterministic=cfg.trainer.deterministic, default_root_dir=str(work / "train_step"))
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    try:
        trainer.fit(module, train_dataloaders=DataLoader([batch] * steps, batch_size=None))
        used_threads = torch.get_num_threads()
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(determinism[0], warn_only=determinism[1])
    tokens = int(batch["query"]["attention_mask"].sum() + batch["passage"]["attention_mask"].sum())
    # the first step includes warm-up (allocator, kernels): report the median of the rest
    steady = times[1:] or times
    step_s = statistics.median(steady)
    shape = encoder_shape(cfg.encoder)
    q_len, p_len = cfg.data.query_max_length, cfg.data.passage_max_length
    cache = bool(cfg.train.grad_cache)
    flops = sum(n * shape.train_flops_per_token(t, checkpointing=True, grad_cache=cache)
                for n, t in ((int(batch["query"]["attention_mask"].sum()), q_len),
                             (int(batch["passage"]["attention_mask"].sum()), p_len)))
    estimate = job_memory(cfg)
    return {
        "model_params": sum(p.numel() for p in model.parameters()), "model_build_s": round(build_s, 2),
        "queries": int(cfg.data.batch_size), "group_size": int(cfg.data.group_size), "query_len": q_len,
        "passage_len": p_len, "precision": str(cfg.trainer.precision), "gradient_checkpointing": True,
        "deterministic": cfg.trainer.deterministic, "torch_threads": used_threads,
        "grad_cache": cache, "grad_cache_chunk": int(cfg.train.grad_cache_chunk),
        "passes": shape.train_passes(checkpointing=True, grad_cache=cache), "teacher_scores": True, "steps": len(times), "step_s": [round(t, 3) for t in times],
        "step_s_median": round(step_s, 3), "tokens_per_step": tokens, "train_tokens_per_s": round(tokens / step_s, 1),
        "train_flops_per_s": flops / step_s, "loss_finite": bool(torch.isfinite(
            torch.tensor(float(trainer.callback_metrics.get("train/loss", float("nan")))))),
        **_memory(device), "estimated_memory_gib": estimate.gib(),
    }


def _texts_of_lengths(model: Any, lengths: tuple[int, ...], max_length: int) -> tuple[list[str], list[int]]:
    """Texts whose tokenized lengths are about `lengths` (the last fills `max_length`), and those lengths."""
    texts = [_words(max(n // 2 - 1, 1), n) if n < max_length else _words(2 * max_length, n) for n in lengths]
    mask = model.tokenize(texts, max_length=max_length)["attention_mask"]
    return texts, [int(n) for n in mask.sum(dim=1)]


@section("padded")
def check_padded(smoke: bool, work: Path) -> dict[str, Any]:
    """Mixed-length padded batches through the paper's model on this device: a training forward and backward
    under bf16 autocast (SDPA, gradient checkpointing as trained) and an 8192-token encode. Sliding-window
    layers leave padded query rows with no valid key; a kernel that returns NaN there (pytorch#110213) would
    spread it to every token at the next global layer. Raises (the section fails) on any non-finite value."""
    import torch

    from lmk.model.embedding import EmbeddingModel

    device = "cpu" if smoke else "cuda"
    sizes = (SMOKE if smoke else PAPER)["padded"]
    cfg = paper_config(smoke, work / "padded")
    model = EmbeddingModel.build(cfg.encoder, cfg.pooling, query_max_length=cfg.data.query_max_length,
                                 passage_max_length=max(sizes["encode"]), seed=0).to(device)
    model.train()
    texts, lengths = _texts_of_lengths(model, sizes["train"], max(sizes["train"]))
    feats = {k: v.to(device) for k, v in model.tokenize(texts, train=True, max_length=max(sizes["train"])).items()}
    with torch.autocast(device_type=device, dtype=torch.bfloat16):
        hidden = model.token_embeddings(feats)
        emb = model.pooler(hidden.float(), feats["attention_mask"], feats.get("pool_mask"))
    emb.float().sum().backward()
    valid = feats["attention_mask"].bool()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    train = {"lengths": lengths, "padded_to": int(valid.shape[1]), "autocast": "bfloat16",
             "attn_implementation": str(cfg.encoder.attn_implementation),
             "embeddings_finite": bool(torch.isfinite(emb).all()),
             "valid_hidden_finite": bool(torch.isfinite(hidden[valid]).all()),
             "padded_hidden_finite": bool(torch.isfinite(hidden[~valid]).all()),  # unused by pooling: reported
             "grads_finite": bool(grads) and all(bool(torch.isfinite(g).all()) for g in grads)}
    model.zero_grad(set_to_none=True)
    texts, lengths = _texts_of_lengths(model, sizes["encode"], max(sizes["encode"]))
    # one batch of all three (batch_size = 3): the short texts padded to the longest, as the eval encodes them
    enc = model.encode(texts, batch_size=len(texts), max_length=max(sizes["encode"]), precision="bf16")
    encode = {"lengths": lengths, "padded_to": max(lengths), "precision": "bf16",
              "embeddings_finite": bool(torch.isfinite(torch.as_tensor(enc)).all())}
    bad = [f"{side}.{k}" for side, d in (("train", train), ("encode", encode)) for k, v in d.items()
           if k.endswith("finite") and k != "padded_hidden_finite" and v is not True]
    if bad:
        raise FloatingPointError(f"non-finite values in mixed-length padded batches: {', '.join(bad)}")
    return {"train": train, "encode": encode}


@section("encode")
def check_encode(smoke: bool, work: Path) -> dict[str, Any]:
    """Backbone forward throughput (bf16 weights, inference mode) per attention implementation and length."""
    import torch

    from lmk.config.model import EncoderConfig
    from lmk.model.backbone import load_backbone

    device = "cpu" if smoke else "cuda"
    sizes = SMOKE if smoke else PAPER
    impls = ["sdpa"] + (["flash_attention_2"] if importlib.util.find_spec("flash_attn") and not smoke else [])
    out: dict[str, Any] = {"dtype": "bfloat16"}
    if "flash_attention_2" not in impls:
        out["flash_attention_2"] = {"status": "skipped", "reason": "flash_attn is not installed" if not smoke
                                    else "cpu smoke"}
    base = paper_config(smoke, work / "encode").encoder
    for impl in impls:
        enc = EncoderConfig.coerce({**dict(base), "attn_implementation": impl, "gradient_checkpointing": False,
                                    "dtype": "bfloat16"})
        backbone, tok = load_backbone(enc)
        backbone.to(device).eval()
        per_len: dict[str, Any] = {}
        for length, batch_size in sizes["encode"].items():
            g = torch.Generator().manual_seed(length)
            ids = torch.randint(0, tok.unk_token_id, (batch_size, length), generator=g).to(device)
            mask = torch.ones_like(ids)
            times = []
            with torch.inference_mode():
                for i in range(sizes["encode_repeats"] + 1):  # the first call warms up
                    _sync(device)
                    t0 = time.perf_counter()
                    backbone(input_ids=ids, attention_mask=mask)
                    _sync(device)
                    if i:
                        times.append(time.perf_counter() - t0)
            per_len[str(length)] = {"batch": batch_size, "tokens_per_s": round(ids.numel() / statistics.median(times), 1),
                                    "times_s": [round(t, 4) for t in times]}
        out[impl] = per_len
        del backbone
        if device == "cuda":
            torch.cuda.empty_cache()
    return out


@section("encode_pipeline")
def check_encode_pipeline(smoke: bool, work: Path) -> dict[str, Any]:
    """Per length: end_to_end_tokens_per_s (EmbeddingModel.encode as lmk.evaluate runs it), forward_only_tokens_per_s
    (the same batches pre-tokenized, on the device) and their ratio (goal >= 0.9); the cost estimate reads these."""
    from benchmarks.encode_pipeline import full_texts, measure
    from lmk.model.embedding import EmbeddingModel

    cfg = paper_config(smoke, work / "encode_pipeline")
    sizes = {64: 8, 256: 4} if smoke else {512: 512, 8192: 32}  # max length -> texts, each filling it
    model = EmbeddingModel.build(cfg.encoder, cfg.pooling, passage_max_length=max(sizes), seed=0)
    model.to("cpu" if smoke else "cuda").eval()
    out: dict[str, Any] = {"model": "modernbert-base-shape", "pooling": model.pooling_cfg.label,
                           "precision": "fp32" if smoke else "bf16", "max_tokens_per_batch": 32768}
    for length, n in sizes.items():
        m = measure(model, full_texts(n, int(length * 1.3) + 8, seed=length), length, 32768,
                    repeats=1 if smoke else 3, precision=out["precision"])
        m.pop("ratio_samples")
        out[str(length)] = {k: round(v, 4) if isinstance(v, float) else v for k, v in m.items()}
    return out


def _run(cmd: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, **env})
    return proc, round(time.perf_counter() - t0, 1)


@section("rehearsal")
def check_rehearsal(smoke: bool, work: Path) -> dict[str, Any]:
    """The rehearsal's first row as the sweep runs it: `lmk.train` with DDP over every visible GPU (the
    rehearsal's own CPU ranks in smoke mode; Lightning starts the ranks), then one `lmk.evaluate` job on the
    trained row with the eval stage's suite. Its folders are scratch: each run starts them over
    (overwrite=true), so the check reruns. The training job's wall time, less its steps, is the fixed cost
    of a job that the cost estimate adds (`job_overhead_s`)."""
    import torch

    from lmk.run.results import read_results
    from lmk.sweep.hub_mirror import prepare
    from lmk.sweep.jobs import stage_overrides
    from lmk.sweep.spec import load_spec

    spec = load_spec(ROOT / "experiments/table2/spec.yaml")
    scale = spec.scale("rehearsal")
    row = spec.rows_for(scale)[0]
    run_dir, eval_dir = work / "rehearsal" / row.id, work / "rehearsal" / f"{row.id}-eval"
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries only the JSON report
        mirror = prepare(scale, work / "rehearsal")  # the replicas, read offline like a compute node
    hub = [f"hub.mirror={mirror}"] if mirror else []
    ranks = rehearsal_ranks() if smoke else torch.cuda.device_count()
    cmd = [sys.executable, "-m", "lmk.train", *scale.train_overrides, *row.overrides, f"++row={row.id}",
           "launcher=local", "trainer.num_nodes=1", f"trainer.accelerator={'cpu' if smoke else 'gpu'}",
           f"trainer.devices={ranks}", f"trainer.strategy={'ddp' if ranks > 1 else 'auto'}",
           f"hydra.run.dir={run_dir}", "eval.in_training=none", "overwrite=true", *hub]
    proc, wall = _run(cmd, scale.env)
    res = read_results(run_dir)
    out: dict[str, Any] = {"row": row.id, "command": " ".join(cmd[1:]), "returncode": proc.returncode,
                           "wall_s": wall, "world_size": ranks, "run_status": res.get("status"),
                           "global_step": (res.get("metrics") or {}).get("global_step"),
                           "timings": res.get("timings") or {}}
    if proc.returncode != 0 or res.get("status") != "done":
        return {**out, "stderr_tail": proc.stderr[-2000:]}
    ecmd = [sys.executable, "-m", "lmk.evaluate", f"model={run_dir}", *stage_overrides(scale, hub),
            "eval.in_training=all", f"hydra.run.dir={eval_dir}"]
    eproc, ewall = _run(ecmd, scale.env)
    eres = read_results(eval_dir)
    out["eval"] = {"command": " ".join(ecmd[1:]), "returncode": eproc.returncode, "wall_s": ewall,
                   "run_status": eres.get("status")}
    out.update(returncode=eproc.returncode, run_status=eres.get("status"),
               groups=(eres.get("eval") or {}).get("groups"))
    if eproc.returncode != 0:
        out["stderr_tail"] = eproc.stderr[-2000:]
    return out


def _section(fn: Callable[[bool, Path], dict[str, Any]], smoke: bool, work: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        out = {"status": "ok", **fn(smoke, work)}
    except Exception as exc:  # noqa: BLE001 - one failed section must not hide the others' figures
        out = {"status": "failed", "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=8)}
    if out["status"] == "ok" and (out.get("returncode") not in (None, 0) or out.get("run_status") not in (None, "done")):
        out["status"] = "failed"
    out["section_s"] = round(time.perf_counter() - t0, 1)
    return out


def job_overhead_s(report: dict[str, Any]) -> float | None:
    """Seconds of a training job that are not its steps (start-up, DDP, setup, data, checkpoints, export): the
    rehearsal row's training wall time less its steps at the train_step section's step time (both run the
    rehearsal's step in smoke mode; on a GPU the rehearsal's tiny steps are not the paper's and are not
    subtracted: an upper bound of the fixed cost)."""
    train, row = report.get("train_step") or {}, report.get("rehearsal") or {}
    if train.get("status") != "ok" or row.get("status") != "ok" or not row.get("global_step"):
        return None
    step_s = train["step_s_median"] if report.get("mode") == "cpu-smoke" else 0.0
    return round(max(row["wall_s"] - row["global_step"] * step_s, 0.0), 1)


def throughput(report: dict[str, Any]) -> dict[str, Any]:
    """The figures the cost estimate reads (tokens/s and FLOP/s measured on this device), with the shape
    they were measured at. Training: the train_step section (FLOPs counted with the passes the code runs);
    evaluation: forward-only encode tokens/s per length (the `encode_pipeline` section, when present, adds
    end-to-end figures that include tokenization; the estimate reads it from the report)."""
    train, enc = report.get("train_step", {}), report.get("encode", {})
    sdpa = enc.get("sdpa") or {}
    ok = train.get("status") == "ok"
    return {"device": report.get("device"), "mode": report.get("mode"),
            "model": "modernbert-base-shape" if report.get("mode") == "gpu" else "table2-rehearsal",
            "train_tokens_per_s": train.get("train_tokens_per_s") if ok else None,
            "train_flops_per_s": train.get("train_flops_per_s") if ok else None,
            "train_passes": train.get("passes") if ok else None,
            "train_shape": {k: train.get(k) for k in ("queries", "group_size", "query_len", "passage_len")} if ok
            else None,
            "torch_threads": train.get("torch_threads"),
            "encode_tokens_per_s": {k: v["tokens_per_s"] for k, v in sdpa.items() if isinstance(v, dict)}
            if enc.get("status") == "ok" else {},
            "job_overhead_s": job_overhead_s(report)}


def run(smoke: bool, sections: list[str], out: Path) -> dict[str, Any]:
    import torch

    report: dict[str, Any] = {"check": "gpu_check", "mode": "cpu-smoke" if smoke else "gpu",
                              "python": platform.python_version(), "torch": torch.__version__}
    if not smoke and not torch.cuda.is_available():
        report.update(status="skipped", reason="CUDA is not available on this machine: nothing to check, nothing "
                      "written. Run `make gpu-check` on a GPU node (or `python -m benchmarks.gpu_check --cpu-smoke` "
                      "for the code path at the rehearsal's sizes on the CPU).")
        return report
    report["device"] = "cpu" if smoke else torch.cuda.get_device_name(0)
    if not smoke:
        report["gpu_count"] = torch.cuda.device_count()
        report["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 1024**3, 1)
        report["flash_attn_installed"] = importlib.util.find_spec("flash_attn") is not None
    work = (out / "work").resolve()  # the jobs run in the repository root: their folders must not be relative
    t0 = time.perf_counter()
    for name in sections:
        report[name] = _section(SECTIONS[name], smoke, work)
    report["total_s"] = round(time.perf_counter() - t0, 1)
    report["throughput"] = throughput(report)
    failed = [s for s in sections if report[s]["status"] != "ok"]
    report["status"] = "failed" if failed else "ok"
    if failed:
        report["failed_sections"] = failed
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help="folder of gpu_check.json (default %(default)s)")
    parser.add_argument("--cpu-smoke", action="store_true", help="the same code at tiny sizes on the CPU")
    parser.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated: " + ", ".join(SECTIONS))
    args = parser.parse_args(argv)
    sections = [s for s in args.sections.split(",") if s]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown sections {unknown}; choose from {', '.join(SECTIONS)}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is built from configs in the repository
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out = Path(args.out)
    report = run(args.cpu_smoke, sections, out)
    text = json.dumps(report, indent=2, default=str)
    if report["status"] != "skipped":
        # fast path: the repository's JSON writer (atomic) once the check ran
        from lmk.run.files import write_json

        write_json(out / REPORT_FILE[report["mode"]], report)
    print(text)
    return 1 if report["status"] == "failed" else 0


if __name__ == "__main__":
    sys.exit(main())
