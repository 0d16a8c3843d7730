"""The gpu-check's model sections (train_step, padded, encode, encode_pipeline) and the section registry.

Each section is `fn(smoke, work) -> figures`, registered in run order with the dependency group it needs
(benchmarks.wheelhouse: `light` = the model layer and the training module, `full` = evaluation, logging and
the cluster stack too). Imports of lmk and of the packages a node may lack sit inside the sections: the check
first looks whether a section's packages are installed and reports "skipped: needs X" instead of failing.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.wheelhouse import group_names

ROOT = Path(__file__).resolve().parent.parent

# Paper sizes (the batch and lengths come from conf/experiment/table2-paper.yaml itself).
PAPER = {"experiment": "table2-paper", "encoder": "modernbert-base-shape",
         "encoder_overrides": {"vocab_size": 50368},  # ModernBERT-base's vocabulary: the full 149M shape
         "steps": 3, "encode": {512: 64, 8192: 4}, "encode_repeats": 3,
         "padded": {"train": (20, 150, 512), "encode": (100, 3000, 8192)},
         # max length -> texts, each filling it: at 8192 two tokenization windows (WINDOW = 128 texts) and the
         # workers that tokenize the second while the model runs the first
         "pipeline": {512: 512, 8192: 160}, "pipeline_repeats": 3}
# CPU smoke: the rehearsal's own config (its encoder, batch and lengths), so that the step it times is the
# step the rehearsal runs: this machine's throughput for the rehearsal's cost estimate.
SMOKE = {"experiment": "table2-rehearsal", "encoder": None, "encoder_overrides": None,
         "steps": 4, "encode": {64: 4, 256: 2}, "encode_repeats": 1,
         "padded": {"train": (8, 40, 192), "encode": (8, 100, 512)},
         "pipeline": {64: 8, 256: 136}, "pipeline_repeats": 1}

Section = Callable[[bool, Path], dict[str, Any]]
# name -> check, in run order; name -> the dependency group it needs. A new section is one decorated function
# (and, if the cost estimate should read it, a line in gpu_check.throughput).
SECTIONS: dict[str, Section] = {}
NEEDS: dict[str, str] = {}


def section(name: str, needs: str = "light") -> Callable[[Section], Section]:
    def register(fn: Section) -> Section:
        if name in SECTIONS:
            raise ValueError(f"gpu-check section {name!r} is registered twice")
        SECTIONS[name], NEEDS[name] = fn, needs
        return fn
    return register


def missing_packages(name: str) -> list[str]:
    """The distributions section `name` needs that this Python lacks (empty: it can run)."""
    missing = []
    for dist in group_names(NEEDS[name]):
        try:
            importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            missing.append(dist)
    return missing


def _compose(overrides: list[str]) -> Any:
    # hydra is a package the node may lack: imported once the section's needs were checked
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        return compose("train", overrides=overrides)


def paper_config(smoke: bool, run_dir: Path, sizes: dict[str, Any] | None = None) -> Any:
    """table2-paper with the encoder swapped for its offline shape (the rehearsal's config in smoke mode); `sizes`
    another experiment's (the decoder section's), whose gradient checkpointing stays as it sets it."""
    from omegaconf import OmegaConf, open_dict  # a package the node may lack (checked first)

    own = sizes is None
    sizes = sizes or (SMOKE if smoke else PAPER)
    cfg = _compose([f"experiment={sizes['experiment']}", "pooling=lmk-variable", "+row=gpu-check",
                    *([f"encoder={sizes['encoder']}"] if sizes["encoder"] else []),
                    "launcher=local", "logger=none", "eval=none", f"run_dir={run_dir}"])
    with open_dict(cfg):
        if sizes["encoder_overrides"]:
            cfg.encoder.config_overrides = OmegaConf.create(sizes["encoder_overrides"])
        if own:
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
    from omegaconf import OmegaConf  # a package the node may lack (checked first)

    return int(OmegaConf.load(ROOT / "conf/experiment/table2-rehearsal.yaml").launcher.tasks_per_node)


def words(n: int, seed: int) -> str:
    rng = random.Random(seed)
    vocab = ("the retrieval model encodes passages and queries into dense vectors while landmark tokens "
             "summarise each chunk of text for pooling at training and inference time across long documents").split()
    return " ".join(rng.choice(vocab) for _ in range(n))


def paper_batch(model: Any, cfg: Any) -> dict[str, Any]:
    """One collated batch of the paper's shape, every text long enough to fill its max length."""
    from lmk.data.collator import PairCollator  # lmk loads hydra (checked first)

    d = cfg.data
    examples = [{"query": words(2 * d.query_max_length, i), "key": (0, i),
                 "passages": [words(2 * d.passage_max_length, 1000 * i + j) for j in range(d.group_size)],
                 "scores": [float(d.group_size - j) for j in range(d.group_size)]}
                for i in range(d.batch_size)]
    batch = PairCollator(model.landmark_tokenizer, d.query_max_length, d.passage_max_length)(examples)
    assert isinstance(batch["teacher_scores"], torch.Tensor)
    return batch


def sync(device: str | torch.device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def memory(device: str) -> dict[str, float | None]:
    """Peak memory since the last reset: allocated (tensors) and reserved (what the allocator holds)."""
    if device != "cuda":
        return {"peak_memory_gib": None, "peak_reserved_gib": None}
    return {"peak_memory_gib": round(torch.cuda.max_memory_allocated() / 1024**3, 2),
            "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 1024**3, 2)}


def _timed_fit(module: Any, batch: dict[str, Any], cfg: Any, device: str, work: Path) -> tuple[Any, list[float], int]:
    """Lightning's fit over `max_steps` copies of `batch`: the trainer, each step's seconds, torch's threads."""
    import lightning.pytorch as pl  # the node's (imported with the section, like every heavy package here)
    from torch.utils.data import DataLoader

    steps, times = int(cfg.trainer.max_steps), []

    class Timer(pl.Callback):
        def on_train_batch_start(self, *args: Any) -> None:
            sync(device)
            self.t = time.perf_counter()

        def on_train_batch_end(self, *args: Any) -> None:
            sync(device)
            times.append(time.perf_counter() - self.t)

    trainer = pl.Trainer(accelerator=cfg.trainer.accelerator, devices=1, precision=cfg.trainer.precision,
                         max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[Timer()], use_distributed_sampler=False,
                         gradient_clip_val=None if cfg.train.grad_cache else cfg.trainer.gradient_clip_val,
                         deterministic=cfg.trainer.deterministic, default_root_dir=str(work / "train_step"))
    trainer.fit(module, train_dataloaders=DataLoader([batch] * steps, batch_size=None))
    return trainer, times, torch.get_num_threads()


@section("train_step")
def check_train_step(smoke: bool, work: Path) -> dict[str, Any]:
    """A paper-shaped step through the ContrastiveModule and Lightning's Trainer, as `lmk.train` runs it."""
    return timed_steps(paper_config(smoke, work / "train_step"), "cpu" if smoke else "cuda", work, smoke)


def timed_steps(cfg: Any, device: str, work: Path, smoke: bool) -> dict[str, Any]:
    """`cfg.trainer.max_steps` steps of a composed training config through the ContrastiveModule and Lightning's
    Trainer, as `lmk.train` runs them (gradient checkpointing as the job decides it): step time, training tokens/s
    and FLOP/s (passes counted as the code runs them, LoRA's too), peak memory next to lmk.train.memory's estimate."""
    import lightning.pytorch as pl  # the node's (imported with the section, like every heavy package here)

    # lmk loads hydra and omegaconf: imported once the section's needs were checked
    from lmk.model.embedding import EmbeddingModel
    from lmk.model.shape import encoder_shape
    from lmk.train.memory import decide_checkpointing, job_lora, job_memory
    from lmk.train.module import build_module
    from lmk.train.trainer_args import validate_training

    typed = validate_training(cfg)
    ckpt, lora = decide_checkpointing(cfg).on, job_lora(cfg)
    pl.seed_everything(0)
    t0 = time.perf_counter()
    model = EmbeddingModel.build(cfg.encoder, cfg.pooling, query_max_length=cfg.data.query_max_length,
                                 passage_max_length=cfg.data.passage_max_length, seed=0)
    build_s = time.perf_counter() - t0
    module = build_module(typed, model, ckpt)
    batch = paper_batch(model, cfg)
    if smoke and "OMP_NUM_THREADS" not in os.environ:
        # one rank's share of the cores, as Lightning gives each of the rehearsal's DDP ranks (restored after)
        torch.set_num_threads(max(1, cpu_cores() // rehearsal_ranks()))
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    trainer, times, used_threads = _timed_fit(module, batch, cfg, device, work)
    tokens = int(batch["query"]["attention_mask"].sum() + batch["passage"]["attention_mask"].sum())
    # the first step includes warm-up (allocator, kernels): report the median of the rest
    step_s = statistics.median(times[1:] or times)
    shape = encoder_shape(cfg.encoder)
    q_len, p_len = cfg.data.query_max_length, cfg.data.passage_max_length
    cache = bool(cfg.train.grad_cache)
    flops = sum(n * shape.train_flops_per_token(t, checkpointing=ckpt, grad_cache=cache, lora=lora)
                for n, t in ((int(batch["query"]["attention_mask"].sum()), q_len),
                             (int(batch["passage"]["attention_mask"].sum()), p_len)))
    loss = float(trainer.callback_metrics.get("train/loss", float("nan")))
    return {
        "model_params": sum(p.numel() for p in model.parameters()), "model_build_s": round(build_s, 2),
        "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "queries": int(cfg.data.batch_size), "group_size": int(cfg.data.group_size), "query_len": q_len,
        "passage_len": p_len, "precision": str(cfg.trainer.precision), "gradient_checkpointing": ckpt,
        "deterministic": cfg.trainer.deterministic, "torch_threads": used_threads,
        "grad_cache": cache, "grad_cache_chunk": int(cfg.train.grad_cache_chunk),
        "passes": shape.train_passes(checkpointing=ckpt, grad_cache=cache, frozen=lora is not None),
        "teacher_scores": True, "steps": len(times), "step_s": [round(t, 3) for t in times],
        "step_s_median": round(step_s, 3), "tokens_per_step": tokens, "train_tokens_per_s": round(tokens / step_s, 1),
        "train_flops_per_s": flops / step_s, "loss_finite": bool(torch.isfinite(torch.tensor(loss))),
        **memory(device), "estimated_memory_gib": job_memory(cfg).gib(),
    }


def _texts_of_lengths(model: Any, lengths: tuple[int, ...], max_length: int) -> tuple[list[str], list[int]]:
    """Texts whose tokenized lengths are about `lengths` (the last fills `max_length`), and those lengths."""
    texts = [words(max(n // 2 - 1, 1), n) if n < max_length else words(2 * max_length, n) for n in lengths]
    mask = model.tokenize(texts, max_length=max_length)["attention_mask"]
    return texts, [int(n) for n in mask.sum(dim=1)]


@section("padded")
def check_padded(smoke: bool, work: Path) -> dict[str, Any]:
    """Mixed-length padded batches through the paper's model on this device: a training forward and backward
    under bf16 autocast (SDPA, gradient checkpointing as trained) and an 8192-token encode. Sliding-window
    layers leave padded query rows with no valid key; a kernel that returns NaN there (pytorch#110213) would
    spread it to every token at the next global layer, which the guard every built model carries prevents
    (lmk.model.long_attention.guard_padded_rows). Raises (the section fails) on any non-finite value."""
    from lmk.model.embedding import EmbeddingModel  # lmk loads hydra (checked first)

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
             "padded_rows_guarded": bool(getattr(model.backbone, "_lmk_padded_rows_guarded", False)),
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
    # lmk loads hydra (checked first)
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
                    sync(device)
                    t0 = time.perf_counter()
                    backbone(input_ids=ids, attention_mask=mask)
                    sync(device)
                    if i:
                        times.append(time.perf_counter() - t0)
            per_len[str(length)] = {"batch": batch_size, "tokens_per_s": round(ids.numel() / statistics.median(times), 1),
                                    "times_s": [round(t, 4) for t in times]}
        out[impl] = per_len
        del backbone
        if device == "cuda":
            torch.cuda.empty_cache()
    return out


def _other_device(model: Any, texts: list[str], length: int) -> dict[str, Any]:
    """Encode on the last GPU while the current device is the first: the embeddings' copies and their events
    must run on the embeddings' own device (lmk.model.pipeline.copy_to_host); equal to the first GPU's."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count < 2:
        return {"status": "skipped", "reason": "single GPU: encoding on a device other than the current one "
                "not exercised" if count == 1 else "cpu smoke"}
    kwargs = {"max_length": length, "max_tokens_per_batch": 32768, "precision": "bf16"}
    here = model.encode(texts, **kwargs)
    last = f"cuda:{count - 1}"
    with torch.cuda.device(0):
        there = model.to(last).encode(texts, **kwargs)
    model.to("cuda:0")
    diff = float(abs(here - there).max())
    if not diff < 1e-2:  # bf16 on two identical GPUs: equal up to rounding; a read before the copy ended is not
        raise RuntimeError(f"embeddings encoded on {last} differ from cuda:0's by {diff}: a copy read early?")
    return {"status": "ok", "device": last, "max_abs_diff": diff}


@section("encode_pipeline")
def check_encode_pipeline(smoke: bool, work: Path) -> dict[str, Any]:
    """Per length: end_to_end_tokens_per_s (EmbeddingModel.encode as lmk.evaluate runs it, tokenization workers
    overlapping the forward), forward_only_tokens_per_s (the same batches pre-tokenized, on the device) and their
    ratio (goal >= 0.9); the cost estimate reads these."""
    from benchmarks.encode_pipeline import full_texts, measure  # lmk loads hydra (checked first)
    from lmk.model.embedding import EmbeddingModel
    from lmk.model.pipeline import WINDOW, resolve_workers

    sizes = SMOKE if smoke else PAPER
    cfg = paper_config(smoke, work / "encode_pipeline")
    model = EmbeddingModel.build(cfg.encoder, cfg.pooling, passage_max_length=max(sizes["pipeline"]), seed=0)
    model.to("cpu" if smoke else "cuda").eval()
    out: dict[str, Any] = {"model": "modernbert-base-shape", "pooling": model.pooling_cfg.label,
                           "precision": "fp32" if smoke else "bf16", "max_tokens_per_batch": 32768}
    for length, n in sizes["pipeline"].items():
        texts = full_texts(n, int(length * 1.3) + 8, seed=length)
        m = measure(model, texts, length, 32768, repeats=sizes["pipeline_repeats"], precision=out["precision"])
        m.pop("ratio_samples")
        m["windows"] = -(-n // WINDOW)
        m["workers"] = resolve_workers("auto", model.device, chars=sum(map(len, texts)))
        out[str(length)] = {k: round(v, 4) if isinstance(v, float) else v for k, v in m.items()}
    longest = max(sizes["pipeline"])
    out["other_device"] = _other_device(model, full_texts(8, int(longest * 1.3) + 8), longest)
    return out
