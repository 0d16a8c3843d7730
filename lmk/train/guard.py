"""Stop a run at the first non-finite loss or gradient norm, before the optimiser writes NaN into the weights.

`NonFiniteGuard` checks, before every optimiser step, the step's loss (`ContrastiveModule.window_loss`: the sum
over its accumulated micro-batches) and the norm of the gradients, on every rank; the ranks agree through one
all-reduce of a flag, so all of them stop at the same step (none waits at the next collective). It raises
`NonFiniteError` naming the step, what was not finite and the sample keys of the step's batches on every rank;
`lmk.train.fit` records it in results.json (`status: failed`, `error`, `non_finite`). The weights on disk stay
those of the last good checkpoint: the step is never taken, and a checkpoint holding a non-finite weight is
refused before it is written. Cost: one small all-reduce and one host sync per optimiser step.

Under fp16 with a GradScaler (`trainer.precision=16-mixed`) an overflowing gradient is the scaler's business (it
skips that step and lowers the scale): there only the loss is checked.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


class NonFiniteError(RuntimeError):
    """A non-finite loss, gradient norm or weight; `info` is what results.json records under `non_finite`."""

    def __init__(self, message: str, info: Mapping[str, Any]) -> None:
        super().__init__(message)
        self.info = dict(info)

    def __reduce__(self) -> tuple[Any, ...]:
        # a job's exception is pickled back to the sweeper (Hydra's and submitit's launchers)
        return type(self), (str(self), self.info)


def _grad_norm(module: torch.nn.Module) -> torch.Tensor | None:
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    if not grads:
        return None
    return torch.nn.utils.get_total_norm(grads, norm_type=2.0)


def _describe(trainer: pl.Trainer, keys: Sequence[Any] | None) -> list[str]:
    """The batch's sample keys, as the data module names them (source and row) when it can."""
    if not keys:
        return []
    describe = getattr(trainer.datamodule, "describe_keys", None) if trainer.datamodule is not None else None
    return list(describe(keys)) if describe is not None else [repr(tuple(k)) for k in keys]


def _all_ranks(value: Any) -> list[Any]:
    """Every rank's `value` (only on the rare failure path: a collective of Python objects)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [value]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


class NonFiniteGuard(pl.Callback):
    """Raise `NonFiniteError` before an optimiser step whose loss or gradient norm is not finite."""

    def __init__(self) -> None:
        super().__init__()
        self._keys: list[Any] = []  # sample keys of the batches of the current optimiser step (this rank)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        keys = batch.get("keys") if isinstance(batch, Mapping) else None
        if getattr(pl_module, "window_loss", None) is None:
            self._keys = []  # a new optimiser step (the guard resets the loss after each check)
        self._keys.extend(keys or [])

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        loss = getattr(pl_module, "window_loss", None)
        pl_module.window_loss = None
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        norm = None if scaler is not None else _grad_norm(pl_module)
        device = pl_module.device
        flags = torch.stack([
            torch.zeros((), device=device) if loss is None else (~torch.isfinite(loss.detach())).any().float(),
            torch.zeros((), device=device) if norm is None else (~torch.isfinite(norm)).float(),
        ]).to(device)
        total = trainer.strategy.reduce(flags.clone(), reduce_op="sum") if trainer.world_size > 1 else flags
        if not bool(total.any()):  # the one host sync per step
            return
        self._raise(trainer, flags, total, loss, norm)

    def _raise(self, trainer: pl.Trainer, flags: torch.Tensor, total: torch.Tensor, loss: torch.Tensor | None,
               norm: torch.Tensor | None) -> None:
        step = int(trainer.global_step)
        mine = {"rank": trainer.global_rank, "loss_finite": not bool(flags[0]),
                "loss": None if loss is None else float(loss.detach().float().sum()),
                "grad_norm": None if norm is None else float(norm), "keys": _describe(trainer, self._keys)}
        ranks = _all_ranks(mine)
        what = "loss" if bool(total[0]) else "gradient norm"
        bad_ranks = [r["rank"] for r in ranks if not r["loss_finite"]] if what == "loss" else \
            [r["rank"] for r in ranks]
        keys = [k for r in ranks if r["rank"] in bad_ranks for k in r["keys"]]
        ckpt = getattr(trainer.checkpoint_callback, "last_model_path", "") or None
        info = {"what": what, "step": step, "ranks": bad_ranks, "sample_keys": keys,
                "values": {str(r["rank"]): {"loss": r["loss"], "grad_norm": r["grad_norm"]} for r in ranks},
                "last_good_checkpoint": ckpt}
        shown = ", ".join(keys[:8]) + (f" (+{len(keys) - 8} more)" if len(keys) > 8 else "")
        raise NonFiniteError(
            f"non-finite {what} at step {step} (rank {', '.join(map(str, bad_ranks))}; samples: {shown or 'unknown'})"
            f"; the step was not taken and the last good checkpoint is {ckpt or 'none (no checkpoint yet)'}. A rerun "
            "of this config replays the same batches and stops here again (a sweep does not retry it): inspect those "
            "samples, or change the config (e.g. a lower train.lr, trainer.gradient_clip_val), which starts it over",
            info)

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        # Never overwrite a good checkpoint with NaN weights (however they got there).
        bad = [k for k, v in checkpoint.get("state_dict", {}).items()
               if torch.is_tensor(v) and v.is_floating_point() and not bool(torch.isfinite(v).all())]
        if bad:
            step = int(trainer.global_step)
            ckpt = getattr(trainer.checkpoint_callback, "last_model_path", "") or None
            raise NonFiniteError(
                f"non-finite weights at step {step} ({', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''}); the "
                f"checkpoint was not written, the last good one is {ckpt or 'none'}",
                {"what": "weights", "step": step, "ranks": [trainer.global_rank], "sample_keys": [],
                 "parameters": bad[:20], "last_good_checkpoint": ckpt})
