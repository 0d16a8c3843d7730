"""Training progress as one line: `step 40/200 (20%) | loss 1.234 | 2.1 steps/s | ETA 1m16s`.

Lightning's own bar reads "Epoch 0/-2" under `max_steps` (no epoch count) and fills log files with carriage
returns. This callback replaces it (the Trainer runs with `enable_progress_bar=False`): on a terminal the line
updates in place; otherwise (a SLURM log, a sweep's output) it prints every ~10% of the steps and at the end.
Rank 0 only.
"""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl

from lmk.run.console import console_stream, interactive


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def progress_line(step: int, total: int | None, loss: float | None, rate: float | None, label: str = "") -> str:
    """The line for `step` of `total` optimiser steps (rate in steps/s; None until measured)."""
    parts = [f"{label}step {step}/{total}" + (f" ({100 * step // total}%)" if total else "") if total
             else f"{label}step {step}"]
    if loss is not None:
        parts.append(f"loss {loss:.4g}")
    if rate:
        parts.append(f"{rate:.3g} steps/s")
        if total:
            parts.append(f"ETA {_duration((total - step) / rate)}")
    return " | ".join(parts)


class LineProgress(pl.Callback):
    """One progress line per training run (see the module docstring). `label`: a prefix such as the row name."""

    def __init__(self, label: str = "", every: float = 0.1) -> None:
        super().__init__()
        self.label, self.every = label, every
        self._start: tuple[float, int] | None = None
        self._printed = -1  # the last 10% bucket printed (not on a terminal)
        self._tty = False

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start = (time.perf_counter(), int(trainer.global_step))
        self._tty = interactive()

    def _emit(self, trainer: pl.Trainer, final: bool = False) -> None:
        if not trainer.is_global_zero or self._start is None:
            return
        step = int(trainer.global_step)
        total = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
        t0, s0 = self._start
        elapsed = time.perf_counter() - t0
        rate = (step - s0) / elapsed if step > s0 and elapsed > 0 else None
        metric = trainer.callback_metrics.get("train/loss")
        loss = float(metric) if metric is not None else None
        line = progress_line(step, total, loss, rate, self.label)
        stream = console_stream()
        if self._tty:
            print(f"\r\033[K{line}", end="\n" if final else "", file=stream, flush=True)
            return
        bucket = int(step / total / self.every) if total else step
        if final or bucket > max(self._printed, 0):  # every ~10% (not the first 0%), and the end
            self._printed = bucket
            print(line, file=stream, flush=True)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        total = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
        if total is None or int(trainer.global_step) < total:  # the last step is printed by on_train_end
            self._emit(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._emit(trainer, final=True)
