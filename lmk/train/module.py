"""ContrastiveModule: the LightningModule that trains an EmbeddingModel with InfoNCE.

Batch layout (PairCollator): {"query": features [B], "passage": features [B*G] (positive first in
each group), "teacher_scores": [B, G] (optional)}. Passages of every rank are gathered with
gradients so each query sees all in-batch and hard negatives of the global batch.

Optimisation follows the authors' scripts (docs/method.md): AdamW, weight decay 0, DeepSpeed
`WarmupDecayLR`'s warm-up (log by default) then linear decay (`warmup_decay`), and `grad_scale` to
reproduce the gradient magnitude their gradient clipping saw.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor

from lmk.config import RootConfig
from lmk.model.long_attention import guard_padded_rows
from lmk.train.gradcache import grad_cache_step
from lmk.train.losses import info_nce

log = logging.getLogger(__name__)


WARMUP_SHAPES = ("log", "linear")


def warmup_decay(warmup_steps: int, max_steps: int, shape: str = "log"):  # noqa: ANN201 - a lr lambda
    """lr multiplier of optimiser step k (0-based), as DeepSpeed's `WarmupDecayLR` gives it.

    That scheduler (the authors' `config/ds_config.json`) warms up over W = max(2, warmup_steps) steps
    with gamma(i) = log(i + 1) / log(W) (its default `warmup_type: log`) or i / W (`linear`), then decays
    linearly: gamma(i) = (T - i) / (T - W) for i >= W, clamped at 0. Its lr is set at construction to the
    minimum (0) and advanced after each optimiser step, so step k runs at gamma(k - 1): step 0 at 0.
    DeepSpeed refuses 0 warm-up steps; here 0 means no warm-up: (T - k) / T from step 0.
    """
    if shape not in WARMUP_SHAPES:
        raise ValueError(f"warmup shape {shape!r} is not valid; allowed values: {', '.join(WARMUP_SHAPES)}")
    total = int(max_steps)
    if int(warmup_steps) <= 0:
        return lambda step: max(0.0, (total - step) / max(1, total))
    warm = max(2, int(warmup_steps))  # DeepSpeed's own floor (log(1) would divide by zero)

    def gamma(i: int) -> float:
        if i < 0:
            return 0.0
        if i < warm:
            return math.log(i + 1) / math.log(warm) if shape == "log" else i / warm
        return max(0.0, (total - i) / max(1.0, total - warm))

    return lambda step: gamma(step - 1)


def _no_decay(name: str) -> bool:
    # Biases and norm weights are not decayed (the usual AdamW practice for transformers).
    lowered = name.lower()
    return name.endswith(".bias") or "norm" in lowered or lowered.endswith("bias")


class ContrastiveModule(pl.LightningModule):
    """InfoNCE training of an EmbeddingModel (in-batch + hard negatives, cross-device, grad cache)."""

    def __init__(
        self,
        model: torch.nn.Module,
        tau: float = 0.02,
        lr: float = 2e-5,
        weight_decay: float = 0.0,
        warmup_steps: int = 250,
        warmup_shape: str = "log",
        grad_scale: float = 1.0,
        max_steps: int = 5000,
        grad_cache: bool = False,
        grad_cache_chunk: int = 32,
        gather_across_devices: bool = True,
        in_batch_negatives: bool = True,
        use_teacher_scores: bool = True,
        teacher_temperature: float = 1.0,
        gradient_checkpointing: bool = False,
        gradient_clip_val: float | None = None,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        super().__init__()
        if tau <= 0:
            raise ValueError(f"tau must be > 0, got {tau}")
        if warmup_shape not in WARMUP_SHAPES:
            raise ValueError(f"warmup_shape={warmup_shape!r} is not valid; allowed values: {', '.join(WARMUP_SHAPES)}")
        if not grad_scale > 0:
            raise ValueError(f"grad_scale={grad_scale!r} is not valid; allowed values: a number > 0")
        self.model = model
        # HF from_pretrained returns eval mode; Lightning keeps each module's mode, so train (dropout) here.
        self.model.train()
        # padded rows of sliding-window layers attend to themselves (CUDA kernels can return NaN for a keyless row)
        guard_padded_rows(getattr(model, "backbone", None))
        self.tau, self.lr, self.weight_decay = tau, lr, weight_decay
        self.warmup_steps, self.max_steps, self.warmup_shape = warmup_steps, max_steps, warmup_shape
        # Multiplies the loss before backward only (the logged loss is unscaled). 1.0 = the gradient of the
        # mean loss over the global batch; the authors' distillation loss reached 1/20 of that (docs/method.md).
        self.grad_scale = float(grad_scale)
        self.grad_cache, self.grad_cache_chunk = grad_cache, grad_cache_chunk
        self.gather_across_devices, self.in_batch_negatives = gather_across_devices, in_batch_negatives
        self.use_teacher_scores, self.teacher_temperature = use_teacher_scores, teacher_temperature
        self.gradient_clip_val = gradient_clip_val
        self.betas, self.eps = tuple(betas), eps
        # Grad cache backprops chunk by chunk, which Lightning's automatic optimisation cannot express;
        # gradient clipping then happens here (Trainer(gradient_clip_val=...) is refused in manual mode).
        self.automatic_optimization = not grad_cache
        if gradient_checkpointing:
            self.enable_gradient_checkpointing()
        self.save_hyperparameters(ignore=["model"])
        self._last_step_time: float | None = None
        # The loss of the optimiser step in progress (summed over accumulated batches), read and reset by
        # lmk.train.guard.NonFiniteGuard before the step.
        self.window_loss: Tensor | None = None
        self.fit_start_step = 0  # global step when fit started (after a checkpoint restore)

    # ---- model helpers -------------------------------------------------------------------------
    def enable_gradient_checkpointing(self) -> None:
        backbone = getattr(self.model, "backbone", self.model)
        if not hasattr(backbone, "gradient_checkpointing_enable"):
            raise ValueError(f"{type(backbone).__name__} has no gradient_checkpointing_enable(); cannot checkpoint")
        # Non-reentrant checkpointing works with frozen inputs and DDP.
        backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    def embed(self, features: Mapping[str, Tensor]) -> Tensor:
        return self.model(dict(features))

    # ---- loss ----------------------------------------------------------------------------------
    def _world(self) -> int:
        return self.trainer.world_size if self._trainer is not None else 1

    def _gather(self, p: Tensor) -> tuple[Tensor, int]:
        """All passages of the global batch (with gradients) and this rank's offset into them."""
        world = self._world()
        if world == 1 or not self.gather_across_devices or not self.in_batch_negatives:
            return p, 0
        gathered = self.all_gather(p, sync_grads=True)  # [W, N, d]; needs equal N on every rank
        if self._trainer is not None and self.global_step == self.fit_start_step:
            log.info("rank %d scores its queries against %d passages gathered from %d ranks", self.global_rank,
                     gathered.shape[0] * gathered.shape[1], gathered.shape[0])
        return gathered.reshape(-1, p.shape[-1]), self.global_rank * p.shape[0]

    def compute_loss(self, q: Tensor, p: Tensor, teacher_scores: Tensor | None = None) -> Tensor:
        b = q.shape[0]
        if p.shape[0] % b:
            raise ValueError(f"{p.shape[0]} passages for {b} queries: the batch must hold B*G passages")
        group = p.shape[0] // b
        p_all, offset = self._gather(p)
        scores = teacher_scores if self.use_teacher_scores else None
        return info_nce(
            q, p_all, tau=self.tau, group_size=group, in_batch=self.in_batch_negatives,
            teacher_scores=scores, offset=offset, teacher_temperature=self.teacher_temperature,
        )

    def forward_loss(self, batch: Mapping[str, Any]) -> Tensor:
        """Uncached loss of one batch (with graph)."""
        return self.compute_loss(self.embed(batch["query"]), self.embed(batch["passage"]), batch.get("teacher_scores"))

    # ---- training ------------------------------------------------------------------------------
    def training_step(self, batch: Mapping[str, Any], batch_idx: int) -> Tensor | None:
        if self.grad_cache:
            loss = self._grad_cache_step(batch)
        else:
            loss = self.forward_loss(batch)
            self._note_loss(loss)
        self._log_step(batch, loss)
        return None if self.grad_cache else loss * self.grad_scale

    def _grad_cache_step(self, batch: Mapping[str, Any]) -> Tensor:
        opt = self.optimizers()
        sched = self.lr_schedulers()
        opt.zero_grad(set_to_none=True)
        teacher = batch.get("teacher_scores")
        wrapped = self.trainer.model
        # DDP: skip the all-reduce on every chunk but the last, which then reduces the sum.
        no_sync = getattr(wrapped, "no_sync", None) if self._world() > 1 else None
        loss = grad_cache_step(
            self.embed, batch["query"], batch["passage"],
            lambda q, p: self.compute_loss(q, p, teacher) * self.grad_scale,
            chunk_size=self.grad_cache_chunk, backward=self.manual_backward,
            no_sync=no_sync or (lambda: contextlib.nullcontext()),
        )
        self._note_loss(loss / self.grad_scale)
        if self.gradient_clip_val:
            self.clip_gradients(opt, gradient_clip_val=self.gradient_clip_val, gradient_clip_algorithm="norm")
        opt.step()
        if sched is not None:
            sched.step()
        return loss / self.grad_scale

    def _note_loss(self, loss: Tensor) -> None:
        loss = loss.detach()
        self.window_loss = loss if self.window_loss is None else self.window_loss + loss

    def _log_step(self, batch: Mapping[str, Any], loss: Tensor) -> None:
        b = batch["query"]["input_ids"].shape[0]
        self.log("train/loss", loss.detach(), on_step=True, on_epoch=False, prog_bar=True, sync_dist=True,
                 batch_size=b)
        opt = self.optimizers()
        optimizer = opt.optimizer if hasattr(opt, "optimizer") else opt
        self.log("train/lr", float(optimizer.param_groups[0]["lr"]), on_step=True, on_epoch=False, batch_size=b)
        # Throughput from host wall time between steps (no device sync); the first step has no interval.
        now = time.perf_counter()
        if self._last_step_time is not None:
            dt = max(now - self._last_step_time, 1e-9)
            world = self._world()
            tokens = batch["query"]["attention_mask"].sum() + batch["passage"]["attention_mask"].sum()
            self.log("train/samples_per_s", b * world / dt, on_step=True, on_epoch=False, batch_size=b)
            # A device tensor: converted only when Lightning logs it, not per step here.
            self.log("train/tokens_per_s", tokens.float() * world / dt, on_step=True, on_epoch=False, batch_size=b)
        self._last_step_time = now

    def on_train_start(self) -> None:
        self.fit_start_step = int(self.global_step)

    def on_train_epoch_start(self) -> None:
        self._last_step_time = None  # the epoch boundary (loader start-up) is not a training interval

    # ---- optimisation --------------------------------------------------------------------------
    def _total_steps(self) -> int:
        if self.max_steps and self.max_steps > 0:
            return int(self.max_steps)
        return int(self.trainer.estimated_stepping_batches)

    def configure_optimizers(self) -> dict[str, Any]:
        decay, no_decay = [], []
        for name, param in self.model.named_parameters():
            if param.requires_grad:
                (no_decay if _no_decay(name) else decay).append(param)
        groups = [{"params": decay, "weight_decay": self.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        groups = [g for g in groups if g["params"]]
        optimizer = torch.optim.AdamW(groups, lr=self.lr, betas=self.betas, eps=self.eps)
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, warmup_decay(int(self.warmup_steps), self._total_steps(), self.warmup_shape)
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step", "frequency": 1}}


def build_module(typed: RootConfig, model: Any, gradient_checkpointing: bool | None = None) -> ContrastiveModule:
    """The ContrastiveModule of a validated config around `model` (training's settings, its clipping rule), with
    gradient checkpointing as the job decided it (`lmk.train.memory.decide_checkpointing`; None: only if `true`)."""
    t = typed.train
    if gradient_checkpointing is None:
        gradient_checkpointing = getattr(typed.encoder, "gradient_checkpointing", False) is True
    return ContrastiveModule(
        model, tau=t.tau, lr=t.lr, weight_decay=t.weight_decay, warmup_steps=t.warmup_steps,
        warmup_shape=t.warmup_shape, grad_scale=t.grad_scale,
        max_steps=typed.trainer.max_steps, grad_cache=t.grad_cache, grad_cache_chunk=t.grad_cache_chunk,
        gather_across_devices=t.gather_across_devices, in_batch_negatives=t.in_batch_negatives,
        use_teacher_scores=t.use_teacher_scores, teacher_temperature=t.teacher_temperature,
        gradient_checkpointing=gradient_checkpointing,
        # manual optimisation (grad cache) clips in the module; otherwise the Trainer clips
        gradient_clip_val=typed.trainer.gradient_clip_val if t.grad_cache else None,
    )
