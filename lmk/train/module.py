"""ContrastiveModule: the LightningModule that trains an EmbeddingModel with InfoNCE.

Batch layout (PairCollator): {"query": features [B], "passage": features [B*G] (positive first in
each group), "teacher_scores": [B, G] (optional)}. Passages of every rank are gathered with
gradients so each query sees all in-batch and hard negatives of the global batch. What a text is embedded into and
the loss on it are the objective's (`train.objective`, lmk.train.objectives): the pooled vector (single) or the
landmark states (maxsim), gathered padded to the widest rank's. A step's rows are embedded as the whole padded batch,
in grad-cache chunks of rows, or (`train.grad_cache_tokens`) in token-budget chunks each padded to its own longest row
(lmk.train.chunks); each batch's fill (real tokens / tokens computed) is logged as `train/fill` and summed for
results.json (`fill_record`).

Optimisation follows the authors' scripts (docs/method.md): AdamW, weight decay 0, DeepSpeed
`WarmupDecayLR`'s warm-up (log by default) then linear decay (`warmup_decay`), and `grad_scale` to
reproduce the gradient magnitude their gradient clipping saw.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor

from lmk.config import RootConfig, TrainSection
from lmk.model.long_attention import guard_padded_rows
from lmk.train.chunks import ChunkPlan, plan_chunks
from lmk.train.embeddings import Embedding, concat, pad_width, rows
from lmk.train.gradcache import cached_step
from lmk.train.objectives import Objective, build_objective

log = logging.getLogger(__name__)


# The warm-up curves by `train.warmup_shape` (the schema allows exactly these names): gamma(i) for i < W
WARMUP_CURVES: dict[str, Callable[[int, int], float]] = {
    "log": lambda i, warm: math.log(i + 1) / math.log(warm),
    "linear": lambda i, warm: i / warm,
}


def warmup_decay(warmup_steps: int, max_steps: int, shape: str = "log"):  # noqa: ANN201 - a lr lambda
    """lr multiplier of optimiser step k (0-based), as DeepSpeed's `WarmupDecayLR` gives it.

    That scheduler (the authors' `config/ds_config.json`) warms up over W = max(2, warmup_steps) steps
    with gamma(i) = log(i + 1) / log(W) (its default `warmup_type: log`) or i / W (`linear`), then decays
    linearly: gamma(i) = (T - i) / (T - W) for i >= W, clamped at 0. Its lr is set at construction to the
    minimum (0) and advanced after each optimiser step, so step k runs at gamma(k - 1): step 0 at 0.
    DeepSpeed refuses 0 warm-up steps; here 0 means no warm-up: (T - k) / T from step 0.
    """
    curve = WARMUP_CURVES[shape]  # the name was checked with the config (TrainSection.warmup_shape)
    total = int(max_steps)
    if int(warmup_steps) <= 0:
        return lambda step: max(0.0, (total - step) / max(1, total))
    warm = max(2, int(warmup_steps))  # DeepSpeed's own floor (log(1) would divide by zero)

    def gamma(i: int) -> float:
        if i < 0:
            return 0.0
        if i < warm:
            return curve(i, warm)
        return max(0.0, (total - i) / max(1.0, total - warm))

    return lambda step: gamma(step - 1)


def _no_decay(name: str) -> bool:
    # Biases and norm weights are not decayed (the usual AdamW practice for transformers).
    lowered = name.lower()
    return name.endswith(".bias") or "norm" in lowered or lowered.endswith("bias")


# the token counts of the fill (lmk.train.chunks), summed over batches and ranks
FILL_KEYS = ("real", "computed", "batches", "fill_sum")


class ContrastiveModule(pl.LightningModule):
    """InfoNCE training of an EmbeddingModel (in-batch + hard negatives, cross-device, grad cache), on the pooled
    vector or the landmark states as `train.objective` says."""

    def __init__(
        self,
        model: torch.nn.Module,
        train: TrainSection | Mapping[str, Any] | None = None,
        max_steps: int = 5000,
        gradient_checkpointing: bool = False,
        gradient_clip_val: float | None = None,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        **settings: Any,
    ) -> None:
        """`train`: the validated `train.*` section as it is; or its keys as keyword arguments (`tau=0.05`), or a
        mapping of them (a checkpoint's hyperparameters), checked by the same schema (TrainSection)."""
        super().__init__()
        if train is not None and settings:
            raise TypeError(f"ContrastiveModule: give `train` or its keys ({', '.join(sorted(settings))}), not both")
        self.cfg: TrainSection = TrainSection.coerce(settings if train is None else train)
        self.model = model
        # HF from_pretrained returns eval mode; Lightning keeps each module's mode, so train (dropout) here.
        self.model.train()
        # padded rows of sliding-window layers attend to themselves (CUDA kernels can return NaN for a keyless row)
        guard_padded_rows(getattr(model, "backbone", None))
        self.max_steps = max_steps
        # Trainer-side settings the module applies itself under manual optimisation (grad cache clips here:
        # Trainer(gradient_clip_val=...) is refused in manual mode)
        self.gradient_clip_val = gradient_clip_val
        self.betas, self.eps = tuple(betas), eps
        # Grad cache backprops chunk by chunk, which Lightning's automatic optimisation cannot express.
        self.automatic_optimization = not self.cfg.grad_cache
        if gradient_checkpointing:
            self.enable_gradient_checkpointing()
        # Flat, plain values (the keys checkpoints always carried): `load_from_checkpoint(path, model=...)` passes
        # them back as keyword arguments
        self.save_hyperparameters({**self.cfg.to_dict(), "max_steps": max_steps,
                                   "gradient_checkpointing": gradient_checkpointing,
                                   "gradient_clip_val": gradient_clip_val, "betas": self.betas, "eps": eps})
        self._last_step_time: float | None = None
        # The loss of the optimiser step in progress (summed over accumulated batches), read and reset by
        # lmk.train.guard.NonFiniteGuard before the step.
        self.window_loss: Tensor | None = None
        self.fit_start_step = 0  # global step when fit started (after a checkpoint restore)
        # this rank's token counts since this fit started: real tokens, tokens computed, batches, and the sum of the
        # batches' fills; device tensors until read (no sync per step)
        self.fill_totals: dict[str, Any] = dict.fromkeys(FILL_KEYS, 0)
        # every rank's counts up to the checkpoint this fit resumed from; every rank's over the run, once fit ended
        self._fill_restored: dict[str, float] = dict.fromkeys(FILL_KEYS, 0.0)
        self._fill_final: dict[str, float] | None = None
        self._batch_fill: Tensor | None = None

    # ---- model helpers -------------------------------------------------------------------------
    def enable_gradient_checkpointing(self) -> None:
        backbone = getattr(self.model, "backbone", self.model)
        if not hasattr(backbone, "gradient_checkpointing_enable"):
            raise ValueError(f"{type(backbone).__name__} has no gradient_checkpointing_enable(); cannot checkpoint")
        # Non-reentrant checkpointing works with frozen inputs and DDP.
        backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    @property
    def objective(self) -> Objective:
        """The training objective of the current settings (`train.objective`)."""
        return build_objective(self.cfg)

    def embed(self, features: Mapping[str, Tensor], side: str = "passage") -> Embedding:
        """What the objective trains on for one side (query / passage) of a batch, with gradients."""
        return self.objective.embed(self.model, features, side)

    # ---- loss ----------------------------------------------------------------------------------
    def _world(self) -> int:
        return self.trainer.world_size if self._trainer is not None else 1

    def _gather(self, p: Embedding) -> tuple[Embedding, int]:
        """All passages of the global batch (with gradients) and this rank's offset into them."""
        world = self._world()
        if world == 1 or not self.cfg.gather_across_devices or not self.cfg.in_batch_negatives:
            return p, 0
        gathered = self._gather_states(p) if isinstance(p, tuple) else self._gather_vectors(p)
        n = rows(gathered)
        if self._trainer is not None and self.global_step == self.fit_start_step:
            log.info("rank %d scores its queries against %d passages gathered from %d ranks", self.global_rank, n, world)
        return gathered, self.global_rank * rows(p)

    def _gather_vectors(self, p: Tensor) -> Tensor:
        gathered = self.all_gather(p, sync_grads=True)  # [W, N, d]; needs equal N on every rank
        return gathered.reshape(-1, p.shape[-1])

    def _gather_states(self, p: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """Multi-vector passages of every rank: each rank pads its states to the widest rank's first (all_gather needs
        one shape), the mask travels as uint8 (gloo has no bool all_gather)."""
        width = int(self.all_gather(torch.tensor(p[0].shape[1], device=p[0].device)).max())
        states, mask = pad_width(p, width)
        gathered = self.all_gather(states, sync_grads=True)  # [W, N, L, H]
        masks = self.all_gather(mask.to(torch.uint8))  # [W, N, L]
        return gathered.reshape(-1, width, states.shape[-1]), masks.reshape(-1, width).bool()

    def compute_loss(self, q: Embedding, p: Embedding, teacher_scores: Tensor | None = None) -> Tensor:
        b = rows(q)
        if rows(p) % b:
            raise ValueError(f"{rows(p)} passages for {b} queries: the batch must hold B*G passages")
        group = rows(p) // b
        p_all, offset = self._gather(p)
        scores = teacher_scores if self.cfg.use_teacher_scores else None
        return self.objective.loss(q, p_all, group_size=group, in_batch=self.cfg.in_batch_negatives,
                                   teacher_scores=scores, offset=offset)

    def forward_loss(self, batch: Mapping[str, Any]) -> Tensor:
        """Uncached loss of one batch (with graph): the whole padded batch, or token-budget sub-batches."""
        return self._planned_loss(self.plan(batch["query"], cached=False), self.plan(batch["passage"], cached=False),
                                  batch.get("teacher_scores"))

    def _planned_loss(self, q_plan: ChunkPlan, p_plan: ChunkPlan, teacher_scores: Tensor | None) -> Tensor:
        return self.compute_loss(self._embed_plan(q_plan, "query"), self._embed_plan(p_plan, "passage"),
                                 teacher_scores)

    def plan(self, features: Mapping[str, Tensor], cached: bool | None = None) -> ChunkPlan:
        """The chunks one side of a batch is embedded in (lmk.train.chunks): by the token budget, else grad cache's
        rows (`cached`, default: whether grad cache is on), else the whole batch."""
        cached = self.cfg.grad_cache if cached is None else cached
        return plan_chunks(features, self.cfg.grad_cache_chunk if cached else None, self.cfg.grad_cache_tokens)

    def _embed_plan(self, plan: ChunkPlan, side: str) -> Embedding:
        if len(plan.chunks) == 1 and plan.order is None:
            return self.embed(plan.chunks[0], side)
        return plan.restore(concat([self.embed(chunk, side) for chunk in plan.chunks]))

    def _count_fill(self, *plans: ChunkPlan) -> None:
        real = sum(p.real for p in plans)
        computed = sum(p.computed for p in plans)
        self._batch_fill = real.float() / max(computed, 1)
        totals = self.fill_totals
        totals["real"] = totals["real"] + real
        totals["computed"] += computed
        totals["batches"] += 1
        totals["fill_sum"] = totals["fill_sum"] + self._batch_fill

    def _fill_all_ranks(self) -> dict[str, float]:
        """The run's counts over every rank: the restored ones plus this fit's, summed over the ranks (a collective
        under DDP: every rank calls it, as every rank takes part in a checkpoint save and ends fit)."""
        own = torch.tensor([float(self.fill_totals[k]) for k in FILL_KEYS], dtype=torch.float64, device=self.device)
        trainer = self._trainer  # None outside a Trainer (`self.trainer` would raise)
        if trainer is not None and trainer.world_size > 1:
            own = trainer.strategy.reduce(own, reduce_op="sum")
        return {k: self._fill_restored[k] + v for k, v in zip(FILL_KEYS, own.tolist(), strict=True)}

    def on_fit_end(self) -> None:
        self._fill_final = self._fill_all_ranks()

    def fill_record(self) -> dict[str, Any]:
        """results.json's `fill`: the real tokens of every rank against the tokens their forward passes computed
        (rows x width), over the run (a resumed run's included), their ratio and the mean of the batches' ratios.
        Before fit ends (no collective then): this process's counts and the restored ones."""
        t = self._fill_final or {k: self._fill_restored[k] + float(self.fill_totals[k]) for k in FILL_KEYS}
        real, computed, batches = int(t["real"]), int(t["computed"]), int(t["batches"])
        return {"real_tokens": real, "computed_tokens": computed,
                "fill": round(real / computed, 6) if computed else None,
                "mean_batch_fill": round(float(t["fill_sum"]) / batches, 6) if batches else None,
                "batches": batches, "grad_cache_tokens": self.cfg.grad_cache_tokens,
                "chunks": "tokens" if self.cfg.grad_cache_tokens else ("rows" if self.cfg.grad_cache else "batch")}

    # ---- training ------------------------------------------------------------------------------
    def training_step(self, batch: Mapping[str, Any], batch_idx: int) -> Tensor | None:
        if self.cfg.grad_cache:
            loss = self._grad_cache_step(batch)
        else:
            q_plan, p_plan = self.plan(batch["query"]), self.plan(batch["passage"])
            self._count_fill(q_plan, p_plan)
            loss = self._planned_loss(q_plan, p_plan, batch.get("teacher_scores"))
            self._note_loss(loss)
        self._log_step(batch, loss)
        return None if self.cfg.grad_cache else loss * self.cfg.grad_scale

    def _grad_cache_step(self, batch: Mapping[str, Any]) -> Tensor:
        opt = self.optimizers()
        sched = self.lr_schedulers()
        opt.zero_grad(set_to_none=True)
        teacher = batch.get("teacher_scores")
        wrapped = self.trainer.model
        # DDP: skip the all-reduce on every chunk but the last, which then reduces the sum.
        no_sync = getattr(wrapped, "no_sync", None) if self._world() > 1 else None
        q_plan, p_plan = self.plan(batch["query"]), self.plan(batch["passage"])
        self._count_fill(q_plan, p_plan)
        loss = cached_step(
            lambda f: self.embed(f, "query"), q_plan, p_plan,
            lambda q, p: self.compute_loss(q, p, teacher) * self.cfg.grad_scale,
            backward=self.manual_backward, no_sync=no_sync or (lambda: contextlib.nullcontext()),
            passage_embed=lambda f: self.embed(f, "passage"),
        )
        self._note_loss(loss / self.cfg.grad_scale)
        if self.gradient_clip_val:
            self.clip_gradients(opt, gradient_clip_val=self.gradient_clip_val, gradient_clip_algorithm="norm")
        opt.step()
        if sched is not None:
            sched.step()
        return loss / self.cfg.grad_scale

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
        if self._batch_fill is not None:  # real tokens / tokens computed (a device tensor, read when logged)
            self.log("train/fill", self._batch_fill, on_step=True, on_epoch=False, batch_size=b)
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

    # ---- checkpoints ---------------------------------------------------------------------------
    def _frozen_keys(self) -> set[str]:
        """State-dict keys of the weights that do not train (a LoRA run's base model): rebuilt from the config on
        every load (a seeded init or the hub's weights), so a checkpoint need not carry them."""
        return {name for name, param in self.named_parameters() if not param.requires_grad}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # the run's token counts so far, every rank's: a resumed run's results.json counts every batch once, on any
        # number of ranks
        totals = self._fill_all_ranks()
        checkpoint["fill_totals"] = {k: totals[k] if k == "fill_sum" else int(totals[k]) for k in FILL_KEYS}
        # a 7B LoRA run's checkpoint is megabytes: the adapters (and any trained head), not the frozen base
        frozen = self._frozen_keys()
        if frozen:
            checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k not in frozen}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Lightning loads the state dict strictly after this hook: the frozen weights this module was built with
        # fill in what the checkpoint left out, and any other missing or unexpected key still fails the load
        if "fill_totals" in checkpoint:  # (a checkpoint of before holds rank 0's alone: taken as it is)
            self._fill_restored = {k: float(checkpoint["fill_totals"][k]) for k in FILL_KEYS}
            self.fill_totals = dict.fromkeys(FILL_KEYS, 0)
        state, own = checkpoint["state_dict"], self.state_dict()
        for key in self._frozen_keys() - set(state):
            state[key] = own[key]

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
        groups = [{"params": decay, "weight_decay": self.cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        groups = [g for g in groups if g["params"]]
        optimizer = torch.optim.AdamW(groups, lr=self.cfg.lr, betas=self.betas, eps=self.eps)
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, warmup_decay(self.cfg.warmup_steps, self._total_steps(), self.cfg.warmup_shape)
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step", "frequency": 1}}


def build_module(typed: RootConfig, model: Any, gradient_checkpointing: bool | None = None) -> ContrastiveModule:
    """The ContrastiveModule of a validated config around `model` (training's settings, its clipping rule), with
    gradient checkpointing as the job decided it (`lmk.train.memory.decide_checkpointing`; None: only if `true`)."""
    if gradient_checkpointing is None:
        gradient_checkpointing = getattr(typed.encoder, "gradient_checkpointing", False) is True
    # manual optimisation (grad cache) clips in the module; otherwise the Trainer clips
    clip = typed.trainer.gradient_clip_val if typed.train.grad_cache else None
    return ContrastiveModule(model, typed.train, max_steps=typed.trainer.max_steps,
                             gradient_checkpointing=gradient_checkpointing, gradient_clip_val=clip)
