"""`make gpu-check`: does the paper scale run on this GPU, how fast, in how much memory? One JSON report.

Sections (each timed, each in the report even when it fails):
  train_step   a paper-shaped training step: ModernBERT-base-shaped random weights (the shipped config,
               149M parameters), the paper config's batch (256 queries x 8 passages at 128/512 tokens,
               teacher scores), bf16-mixed, gradient checkpointing and grad cache as table2-paper sets
               them, through the same ContrastiveModule and Lightning Trainer as `lmk.train`; step time,
               training tokens/s, peak memory next to lmk.sweep.cost's estimate.
  encode       inference tokens/s at 512 and 8192 tokens, SDPA (and flash_attention_2 when installed).
  encode_pipeline  lmk.evaluate's encode end to end (tokenization workers, bf16 autocast, 32768-token batches) vs
               the forward alone on the same pre-tokenized batches, tokens/s at 512 and 8192, ModernBERT-base shape.
  rehearsal    the rehearsal scale's first row (experiment=table2-rehearsal) on this GPU, one process.
Needs no network and nothing outside the repository: every model is built from its config.

    python -m benchmarks.gpu_check [--out outputs/gpu_check] [--sections train_step,encode,rehearsal]
    python -m benchmarks.gpu_check --cpu-smoke      # the same code at tiny sizes on the CPU (tests)

Without CUDA (and without --cpu-smoke) it prints a "skipped" report and exits 0. The report is also
written to <out>/gpu_check.json; its "throughput" section is what the cost estimate reads.
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
SECTIONS = ("train_step", "encode", "encode_pipeline", "rehearsal")
DEFAULT_OUT = "outputs/gpu_check"

# Paper sizes (the batch and lengths come from conf/experiment/table2-paper.yaml itself).
PAPER = {"encoder_overrides": {"vocab_size": 50368},  # ModernBERT-base's vocabulary: the full 149M shape
         "steps": 3, "encode": {512: 64, 8192: 4}, "encode_repeats": 3}
SMOKE = {"encoder_overrides": {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 96,
                               "num_attention_heads": 2},
         "data": {"batch_size": 4, "group_size": 2, "query_max_length": 16, "passage_max_length": 32},
         "grad_cache_chunk": 3, "steps": 2, "encode": {64: 4, 256: 2}, "encode_repeats": 1}


def _compose(overrides: list[str]) -> Any:
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        return compose("train", overrides=overrides)


def paper_config(smoke: bool, run_dir: Path) -> Any:
    """table2-paper with the encoder swapped for its offline shape (and tiny sizes in smoke mode)."""
    from omegaconf import OmegaConf, open_dict

    cfg = _compose(["experiment=table2-paper", "pooling=lmk-variable", "+row=gpu-check", "encoder=modernbert-base-shape",
                    "launcher=local", "logger=none", "eval=none", f"run_dir={run_dir}"])
    sizes = SMOKE if smoke else PAPER
    with open_dict(cfg):
        cfg.encoder.config_overrides = OmegaConf.create(sizes["encoder_overrides"])
        cfg.encoder.gradient_checkpointing = True
        cfg.trainer.devices = 1
        cfg.trainer.num_nodes = 1
        cfg.trainer.strategy = "auto"
        cfg.trainer.accelerator = "cpu" if smoke else "gpu"
        cfg.trainer.max_steps = sizes["steps"]
        if smoke:
            cfg.data.update(sizes["data"])
            cfg.train.grad_cache_chunk = sizes["grad_cache_chunk"]
    return cfg


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

    trainer = pl.Trainer(accelerator=cfg.trainer.accelerator, devices=1, precision=cfg.trainer.precision,
                         max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[Timer()], use_distributed_sampler=False,
                         gradient_clip_val=None if cfg.train.grad_cache else cfg.trainer.gradient_clip_val,
                         deterministic=False, default_root_dir=str(work / "train_step"))
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    trainer.fit(module, train_dataloaders=DataLoader([batch] * steps, batch_size=None))
    peak = torch.cuda.max_memory_allocated() / 1024**3 if device == "cuda" else None
    tokens = int(batch["query"]["attention_mask"].sum() + batch["passage"]["attention_mask"].sum())
    # the first step includes warm-up (allocator, kernels): report the median of the rest
    steady = times[1:] or times
    step_s = statistics.median(steady)
    shape = encoder_shape(cfg.encoder)
    q_len, p_len = cfg.data.query_max_length, cfg.data.passage_max_length
    flops = sum(n * shape.train_flops_per_token(t, checkpointing=True, grad_cache=bool(cfg.train.grad_cache))
                for n, t in ((int(batch["query"]["attention_mask"].sum()), q_len),
                             (int(batch["passage"]["attention_mask"].sum()), p_len)))
    estimate = job_memory(cfg)
    return {
        "model_params": sum(p.numel() for p in model.parameters()), "model_build_s": round(build_s, 2),
        "queries": int(cfg.data.batch_size), "group_size": int(cfg.data.group_size), "query_len": q_len,
        "passage_len": p_len, "precision": str(cfg.trainer.precision), "gradient_checkpointing": True,
        "grad_cache": bool(cfg.train.grad_cache), "grad_cache_chunk": int(cfg.train.grad_cache_chunk),
        "teacher_scores": True, "steps": len(times), "step_s": [round(t, 3) for t in times],
        "step_s_median": round(step_s, 3), "tokens_per_step": tokens, "train_tokens_per_s": round(tokens / step_s, 1),
        "train_flops_per_s": flops / step_s, "loss_finite": bool(torch.isfinite(
            torch.tensor(float(trainer.callback_metrics.get("train/loss", float("nan")))))),
        "peak_memory_gib": None if peak is None else round(peak, 2),
        "estimated_memory_gib": estimate.gib(),
    }


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


def check_rehearsal(smoke: bool, work: Path) -> dict[str, Any]:
    """The rehearsal's first row through `lmk.train` on this device (one process: one GPU here)."""
    from lmk.run.results import read_results
    from lmk.sweep.hub_mirror import prepare
    from lmk.sweep.spec import load_spec

    spec = load_spec(ROOT / "experiments/table2/spec.yaml")
    scale = spec.scale("rehearsal")
    row = spec.rows_for(scale)[0]
    run_dir = work / "rehearsal" / row.id
    # The sweep evaluates in a stage of its own; one process here evaluates at fit end instead, reading the
    # replicas the sweep would write into its hub mirror (offline, like a compute node).
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries only the JSON report
        mirror = prepare(scale, work / "rehearsal")
    accel = ["trainer.accelerator=cpu"] if smoke else ["trainer.accelerator=gpu"]
    cmd = [sys.executable, "-m", "lmk.train", *scale.train_overrides, *row.overrides, f"++row={row.id}",
           "launcher=local", "trainer.devices=1", "trainer.num_nodes=1", "trainer.strategy=auto", *accel,
           "logger=csv", f"hydra.run.dir={run_dir}", "eval.in_training=all",
           *([f"hub.mirror={mirror}"] if mirror else [])]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, **scale.env})
    wall = time.perf_counter() - t0
    res = read_results(run_dir)
    out = {"row": row.id, "command": " ".join(cmd[1:]), "returncode": proc.returncode, "wall_s": round(wall, 1),
           "run_status": res.get("status"), "global_step": (res.get("metrics") or {}).get("global_step"),
           "groups": (res.get("eval") or {}).get("groups")}
    if proc.returncode != 0:
        out["stderr_tail"] = proc.stderr[-2000:]
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


def throughput(report: dict[str, Any]) -> dict[str, Any]:
    """The figures the cost estimate reads (tokens/s and FLOP/s measured on this GPU)."""
    train, enc = report.get("train_step", {}), report.get("encode", {})
    sdpa = enc.get("sdpa") or {}
    return {"device": report.get("device"), "model": "modernbert-base-shape",
            "train_tokens_per_s": train.get("train_tokens_per_s"), "train_flops_per_s": train.get("train_flops_per_s"),
            "encode_tokens_per_s": {k: v["tokens_per_s"] for k, v in sdpa.items() if isinstance(v, dict)}}


def run(smoke: bool, sections: list[str], out: Path) -> dict[str, Any]:
    import torch

    report: dict[str, Any] = {"check": "gpu_check", "mode": "cpu-smoke" if smoke else "gpu",
                              "python": platform.python_version(), "torch": torch.__version__}
    if not smoke and not torch.cuda.is_available():
        report.update(status="skipped", reason="CUDA is not available on this machine: nothing to check. Run "
                      "`make gpu-check` on a GPU node (or `python -m benchmarks.gpu_check --cpu-smoke` for the "
                      "code path at tiny sizes on the CPU).")
        return report
    report["device"] = "cpu" if smoke else torch.cuda.get_device_name(0)
    if not smoke:
        report["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 1024**3, 1)
        report["flash_attn_installed"] = importlib.util.find_spec("flash_attn") is not None
    work = out / "work"
    t0 = time.perf_counter()
    fns = {"train_step": check_train_step, "encode": check_encode, "encode_pipeline": check_encode_pipeline,
           "rehearsal": check_rehearsal}
    for name in sections:
        report[name] = _section(fns[name], smoke, work)
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
        out.mkdir(parents=True, exist_ok=True)
        (out / "gpu_check.json").write_text(text + "\n")
    print(text)
    return 1 if report["status"] == "failed" else 0


if __name__ == "__main__":
    sys.exit(main())
