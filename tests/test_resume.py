"""Exact resume: SIGKILLed mid-epoch at step 13 and run again with the same command, a run logs every step
once, with the losses and final weights of an uninterrupted run, and continues the same W&B run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_train import ENV, ROOT, in_process, losses, overrides, results, write_pairs  # noqa: E402

# lmk.train with a callback that SIGKILLs the process at the end of step KILL_AT (no cleanup at all).
KILLER = """
import os, runpy, signal, sys
import lmk.train.resume

KILL_AT = int(sys.argv.pop(1))

class Kill(lmk.train.resume.ExactResume):
    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == KILL_AT:
            os.kill(os.getpid(), signal.SIGKILL)

lmk.train.resume.ExactResume = Kill  # lmk.train.fit imports it when the job starts (after this)
runpy.run_module("lmk.train", run_name="__main__", alter_sys=True)
"""

# 24 pairs / batch 4 = 6 batches an epoch: checkpoints at steps 5, 10, 15; killed at 13 (epoch 2, batch 1),
# so the resume starts mid-epoch (epoch 1, batch 4) from step 10 and replays 10..12.
SETUP = ("pooling=lmk-variable", "trainer.max_steps=16", "train.checkpoint_every_n_steps=5", "seed=5",
         "+encoder.config_overrides.embedding_dropout=0.1", "logger=wandb", "logger.mode=offline")


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]


@pytest.mark.slow  # three tiny 16-step runs: about 40 s on 2 busy cores
def test_killed_mid_epoch_resume_matches_uninterrupted_run(tmp_path):
    pairs = write_pairs(tmp_path / "pairs.jsonl")
    ref, run = tmp_path / "ref", tmp_path / "run"
    in_process(ref, pairs, *SETUP)

    cmd = [sys.executable, "-c", KILLER, "13", *overrides(run, pairs, *SETUP)]
    killed = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert results(run)["status"] == "running" and max(s for s, _ in losses(run)) >= 11  # past step 10
    wandb_id = results(run)["wandb"]["id"]  # recorded at start, before the kill

    with pytest.warns() as caught:
        in_process(run, pairs, *SETUP)  # the same command: ckpt_path=auto takes the newest valid checkpoint
    assert not [w for w in caught if "not resumable" in str(w.message)]
    res = results(run)
    assert res["status"] == "done" and res["checkpoints"]["resumed_from"].endswith("last.ckpt")
    assert res["timings"]["fit_steps"] == 6  # steps 10..15 ran again

    # Every step logged once, with the uninterrupted run's loss (exact: same batches, dropout masks, draws).
    assert [s for s, _ in losses(run)] == list(range(16))
    assert losses(run) == losses(ref)
    a, b = final_weights(ref), final_weights(run)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    # The same W&B run continues: one id in the folder, both segments' offline runs carry it.
    assert res["wandb"]["id"] == wandb_id == (run / "wandb_run_id").read_text()
    segments = sorted((run / "wandb").glob(f"offline-run-*-{wandb_id}/run-{wandb_id}.wandb"))
    assert len(segments) == 2, list((run / "wandb").iterdir())
    assert res["wandb"]["sync"] == f"wandb sync {run / 'wandb'}/offline-run-*-{wandb_id}"  # both segments


def test_resume_state_is_in_the_checkpoint(tmp_path):
    pairs = write_pairs(tmp_path / "pairs.jsonl")
    in_process(tmp_path / "r", pairs, "trainer.max_steps=2")
    ckpt = torch.load(tmp_path / "r" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert ckpt["PairDataModule"]["sampler"] == {"seed": 0, "epoch": 0, "consumed": 2 * 4}
    assert set(ckpt["callbacks"]["ExactResume"]["rng"]) >= {"torch", "numpy", "python"}
    assert json.loads((tmp_path / "r" / "results.json").read_text())["status"] == "done"
