"""Figure 3: training-step throughput of ContrastiveModule under a Lightning Trainer vs a raw PyTorch loop.

Both sides train an identically initialised tiny-modernbert (no dropout, so runs are deterministic) on
the same pre-tokenized batches (the PairCollator layout of docs/architecture.md) with the same InfoNCE
loss, AdamW parameter groups and warm-up/decay schedule; their per-step losses must be equal. Throughput
comes from per-step wall times (median), the first `warmup_steps` excluded, so Lightning's one-off fit
set-up is not counted but every per-step hook, closure and logging call is.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from benchmarks.common import build_model, check_size, figure, mixed_texts, paired_ratios

SECTION = "train_step"
SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"steps": 3, "warmup_steps": 1, "batch_size": 2, "group_size": 2, "query_len": 16, "passage_len": 48,
             "rounds": 1},
    # many short rounds: each round is one paired sample (Lightning fit and the raw loop, in turn first)
    "full": {"steps": 8, "warmup_steps": 2, "batch_size": 8, "group_size": 2, "query_len": 32, "passage_len": 128,
             "rounds": 6},
}
# no warm-up: with DeepSpeed's schedule (lmk.train.module.warmup_decay) the first two warm-up steps run at lr 0
LR, TAU, WEIGHT_DECAY, SCHEDULE_WARMUP = 1e-4, 0.02, 0.01, 0


def make_batches(model: Any, n_batches: int, batch_size: int, group_size: int, query_len: int,
                 passage_len: int, seed: int = 3) -> list[dict[str, Any]]:
    """Pre-tokenized training batches: B queries and B*G passages (positive first in each group)."""
    texts = mixed_texts(n_batches * batch_size * (1 + group_size), 4, 3 * passage_len, seed=seed)
    batches = []
    per = batch_size * (1 + group_size)
    for i in range(n_batches):
        chunk = texts[i * per : (i + 1) * per]
        queries, passages = chunk[:batch_size], chunk[batch_size:]
        batches.append({
            "query": model.tokenize(queries, side="query", train=True, max_length=query_len),
            "passage": model.tokenize(passages, side="passage", train=True, max_length=passage_len),
        })
    return batches


def fresh_model() -> Any:
    """tiny-modernbert + LMK pooling; the encoder config's seed makes every call the same weights."""
    model = build_model("tiny-modernbert", "lmk", "fixed", chunk_size=32)
    return model.train()


def _param_groups(model: torch.nn.Module) -> list[dict[str, Any]]:
    # what any transformers training script does: no weight decay on biases and norm weights
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            plain = name.endswith(".bias") or "norm" in name.lower() or name.lower().endswith("bias")
            (no_decay if plain else decay).append(param)
    groups = [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def _loader(batches: list[dict[str, Any]]) -> torch.utils.data.DataLoader:
    # batch_size=None: each item already is a batch; both sides read through the same kind of loader
    return torch.utils.data.DataLoader(batches, batch_size=None, shuffle=False)


def raw_loop(model: torch.nn.Module, batches: list[dict[str, Any]], group_size: int) -> dict[str, Any]:
    """The minimal hand-written loop: forward, InfoNCE, backward, AdamW step, schedule step."""
    from lmk.train.losses import info_nce
    from lmk.train.module import warmup_decay

    opt = torch.optim.AdamW(_param_groups(model), lr=LR)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_decay(SCHEDULE_WARMUP, len(batches)))  # the module's default schedule
    model.train()
    losses, stamps = [], [time.perf_counter()]
    for batch in _loader(batches):
        q = model(batch["query"])
        p = model(batch["passage"])
        loss = info_nce(q, p, tau=TAU, group_size=group_size)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        stamps.append(time.perf_counter())
    return {"losses": losses, "step_s": [b - a for a, b in zip(stamps, stamps[1:], strict=False)]}


def lightning_loop(model: torch.nn.Module, batches: list[dict[str, Any]]) -> dict[str, Any]:
    """ContrastiveModule under a plain CPU Trainer: no logger, progress bar, checkpointing or summary."""
    import lightning.pytorch as pl

    from lmk.train.module import ContrastiveModule

    class _Clock(pl.Callback):
        def __init__(self) -> None:
            self.losses: list[float] = []
            self.stamps: list[float] = []

        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
            if not self.stamps:
                self.stamps.append(time.perf_counter())

        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            self.losses.append(float(outputs["loss"]))
            self.stamps.append(time.perf_counter())

    module = ContrastiveModule(model, tau=TAU, lr=LR, weight_decay=WEIGHT_DECAY, warmup_steps=SCHEDULE_WARMUP,
                               max_steps=len(batches), gather_across_devices=False)
    clock = _Clock()
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=len(batches), max_epochs=1, logger=False,
        enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
        num_sanity_val_steps=0, callbacks=[clock],
    )
    start = time.perf_counter()
    trainer.fit(module, train_dataloaders=_loader(batches))
    fit_s = time.perf_counter() - start
    # the first interval also covers the first batch fetch, as in the raw loop
    step_s = [b - a for a, b in zip(clock.stamps, clock.stamps[1:], strict=False)]
    return {"losses": clock.losses, "step_s": step_s, "fit_s": fit_s}


def run(size: str = "tiny") -> list[dict[str, Any]]:
    import logging

    p = SIZES[check_size(size)]
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # no GPU/TPU banner per fit
    probe = fresh_model()
    batches = make_batches(probe, p["steps"], p["batch_size"], p["group_size"], p["query_len"], p["passage_len"])
    del probe
    light_steps: list[float] = []
    raw_steps: list[float] = []
    light_losses = raw_losses = None
    fit_s = []
    light_round_s: list[float] = []
    raw_round_s: list[float] = []
    loops = {"light": lambda: lightning_loop(fresh_model(), batches),
             "raw": lambda: raw_loop(fresh_model(), batches, p["group_size"])}
    for r in range(p["rounds"]):  # AB BA...: drift and the first-in-round slowdown hit both sides alike
        ran = {side: loops[side]() for side in (("light", "raw") if r % 2 == 0 else ("raw", "light"))}
        light, raw = ran["light"], ran["raw"]
        light_steps += light["step_s"][p["warmup_steps"]:]
        raw_steps += raw["step_s"][p["warmup_steps"]:]
        light_round_s.append(statistics.median(light["step_s"][p["warmup_steps"]:]))
        raw_round_s.append(statistics.median(raw["step_s"][p["warmup_steps"]:]))
        light_losses, raw_losses = light["losses"], raw["losses"]
        fit_s.append(light["fit_s"])
    samples = p["batch_size"]  # queries per step (each with its group of passages)
    ours = samples / statistics.median(light_steps)
    peer = samples / statistics.median(raw_steps)
    diff = max(abs(a - b) for a, b in zip(light_losses, raw_losses, strict=True))
    return [figure(
        SECTION, "lightning_vs_raw_loop", unit="samples/s", ours=ours, peer=peer,
        peer_name="raw PyTorch loop (same model, batches, AdamW, schedule)",
        ratio_def="ours_samples_per_s / peer_samples_per_s (overhead = 1/ratio - 1)", goal=(">=", 1 / 1.05),
        details={**{k: p[k] for k in ("steps", "batch_size", "group_size", "query_len", "passage_len")},
                 "overhead": peer / ours - 1, "lightning_losses": light_losses, "raw_losses": raw_losses,
                 "max_loss_diff": diff, "lightning_fit_s": fit_s,
                 "lightning_step_s": light_steps, "raw_step_s": raw_steps,
                 "lightning_round_step_s": light_round_s, "raw_round_step_s": raw_round_s},
        # samples/s ratio per round = raw step time / Lightning step time
        ratio_samples=paired_ratios(raw_round_s, light_round_s),
    )]
