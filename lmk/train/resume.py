"""Exact resume: a run killed mid-epoch and resumed (`lmk.train.checkpoints.resume_point`) continues as if never
stopped.

What makes it exact, and where:
- data order: `EpochSampler`'s position in the epoch, checkpointed through `PairDataModule.state_dict`;
- negatives and variable chunk draws: seeded from each batch's sample keys (no state to save);
- dropout and anything else on the global generators: `ExactResume` saves the torch / numpy / python
  RNG states in the checkpoint and puts them back where the uninterrupted run had them. Creating an epoch's
  DataLoader iterator draws a seed from torch's generator, so where matters: a checkpoint taken mid-epoch was
  taken after its epoch's draw, and its states go back just before the first resumed batch (after the
  resumed run's iterator drew); a checkpoint taken at an epoch's last batch was taken before the next
  epoch's draw, and its states go back as the checkpoint loads, so the resumed run's first iterator draws
  what the uninterrupted run's next epoch drew. Under DDP each rank's states are kept and each rank gets its own;
- metrics.csv: rows the killed run logged after its last checkpoint are dropped, so each step is
  logged once;
- W&B: the run id is kept in `<run_dir>/wandb_run_id`; a resumed run continues it (`resume="allow"`).
"""

from __future__ import annotations

import csv
import logging
import os
import random
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch

from lmk.run.loggers import WANDB_ID_FILE
from lmk.train.checkpoints import RUN_KEY

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.csv"


def start_fresh(run_dir: str | os.PathLike) -> None:
    """Drop what a previous run left that a new (not resumed) run would otherwise append to."""
    for name in (METRICS_FILE, WANDB_ID_FILE):
        (Path(run_dir) / name).unlink(missing_ok=True)


def trim_metrics(run_dir: str | os.PathLike, from_step: int) -> int:
    """Remove metrics.csv rows logged at `step >= from_step` (after the checkpoint being resumed); returns how many."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return 0
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        fields, rows = reader.fieldnames or [], list(reader)
    keep = [r for r in rows if not r.get("step") or int(float(r["step"])) < from_step]
    if len(keep) == len(rows):
        return 0
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(keep)
    return len(rows) - len(keep)


def last_logged(run_dir: str | os.PathLike, key: str) -> float | None:
    """The last value of `key` in metrics.csv (a run resumed at its last step logs no new one)."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return None
    with open(path, newline="") as fh:
        values = [r[key] for r in csv.DictReader(fh) if r.get(key)]
    return float(values[-1]) if values else None


def _rng_states() -> dict[str, Any]:
    # Plain tensors / ints / lists only: Lightning loads checkpoints with torch.load(weights_only=True).
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    states: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate(),
                              "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(gauss)]}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    name, keys, pos, has_gauss, gauss = states["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
    random.setstate(states["python"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def _world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _every_ranks(states: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Each rank's `states`, gathered (every rank saves a checkpoint's state together; rank 0 writes it): under
    DDP the ranks' generators differ, and a rank resumed with rank 0's draws other dropout masks."""
    _, world = _world()
    if world == 1:
        return None
    gathered: list[Any] = [None] * world
    torch.distributed.all_gather_object(gathered, states)
    return gathered


def _this_ranks_states(state_dict: dict[str, Any]) -> dict[str, Any] | None:
    by_rank = state_dict.get("rng_by_rank")
    rank, world = _world()
    if by_rank and len(by_rank) == world:
        return by_rank[rank]
    return state_dict.get("rng")  # one process, or another world size: rank 0's states (as before)


class ExactResume(pl.Callback):
    """Checkpoints the global RNG states and the run's config hash (`lmk.train.checkpoints.RUN_KEY`, which the
    resume rule reads), and trims metrics.csv on resume (see the module docstring)."""

    def __init__(self, run_dir: str | os.PathLike, config_hash: str | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.config_hash = config_hash
        self._pending: dict[str, Any] | None = None
        self._resumed = False
        self._trainer: pl.Trainer | None = None

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        checkpoint[RUN_KEY] = {"config_hash": self.config_hash, "global_step": int(trainer.global_step)}

    @property
    def state_key(self) -> str:
        return "ExactResume"  # fixed, not the class name: a subclass still restores the state

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._trainer = trainer

    def state_dict(self) -> dict[str, Any]:
        trainer = self._trainer
        epoch_end = bool(trainer is not None and trainer.fit_loop.epoch_loop.batch_progress.is_last_batch)
        states = _rng_states()
        return {"rng": states, "rng_by_rank": _every_ranks(states), "epoch_end": epoch_end}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._resumed = True
        states = _this_ranks_states(state_dict)
        if state_dict.get("epoch_end") and states is not None:
            # before the resumed run creates its first DataLoader iterator (see the module docstring)
            _set_rng_states(states)
            self._pending = None
            return
        self._pending = states

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._resumed and trainer.is_global_zero:
            dropped = trim_metrics(self.run_dir, trainer.global_step)
            if dropped:
                log.info("resume at step %d: dropped %d metrics.csv rows logged after that checkpoint",
                         trainer.global_step, dropped)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self._pending is not None:
            _set_rng_states(self._pending)
            self._pending = None
