"""Exact resume: SIGKILLed mid-epoch at step 13 and run again with the same command, a run logs every step
once, with the losses and final weights of an uninterrupted run, and continues the same W&B run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import forked_cli
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_train import ENV, ROOT, in_process, losses, overrides, results, write_pairs  # noqa: E402

# lmk.train with a callback that SIGKILLs the process at the end of step KILL_AT (no cleanup at all).
KILLER = """
import os, runpy, signal, sys
import lmk.train.fit, lmk.train.resume

KILL_AT = int(sys.argv.pop(1))

class Kill(lmk.train.resume.ExactResume):
    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == KILL_AT:
            os.kill(os.getpid(), signal.SIGKILL)

lmk.train.resume.ExactResume = lmk.train.fit.ExactResume = Kill  # where the job's callbacks take it from
runpy.run_module("lmk.train", run_name="__main__", alter_sys=True)
"""

# 24 pairs / batch 4 = 6 batches an epoch: checkpoints at steps 5, 10, 15; killed at 13 (epoch 2, batch 1),
# so the resume starts mid-epoch (epoch 1, batch 4) from step 10 and replays 10..12.
SETUP = ("pooling=lmk-variable", "trainer.max_steps=16", "train.checkpoint_every_n_steps=5", "seed=5",
         "+encoder.config_overrides.embedding_dropout=0.1", "logger=wandb", "logger.mode=offline")


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]


# token-budget mini-batches (lmk.train.chunks) under grad cache: chunks of their own widths, each chunk's dropout
# masks replayed, and the run's fill counts carried by the checkpoint
TOKEN_BUDGET = ("train.grad_cache=true", "train.grad_cache_tokens=24")


@pytest.fixture(scope="module")
def padded_ref(tmp_path_factory) -> tuple[Path, Path]:
    """(pairs, run folder) of the uninterrupted SETUP run: the reference of the mid-epoch (padded) and the epoch
    boundary tests, trained once."""
    folder = tmp_path_factory.mktemp("padded-ref")
    pairs = write_pairs(folder / "pairs.jsonl")
    in_process(folder / "ref", pairs, *SETUP)
    return pairs, folder / "ref"


@pytest.mark.slow  # three tiny 16-step runs (the padded one's reference shared): about 40 s on 2 busy cores
@pytest.mark.parametrize("mini_batches", [(), TOKEN_BUDGET], ids=["padded", "token-budget"])
def test_killed_mid_epoch_resume_matches_uninterrupted_run(tmp_path, mini_batches, request):
    setup = (*SETUP, *mini_batches)
    run = tmp_path / "run"
    if mini_batches:
        pairs, ref = write_pairs(tmp_path / "pairs.jsonl"), tmp_path / "ref"
        in_process(ref, pairs, *setup)
    else:
        pairs, ref = request.getfixturevalue("padded_ref")

    cmd = [sys.executable, "-c", KILLER, "13", *overrides(run, pairs, *setup)]
    killed = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert results(run)["status"] == "running" and max(s for s, _ in losses(run)) >= 11  # past step 10
    wandb_id = results(run)["wandb"]["id"]  # recorded at start, before the kill

    with pytest.warns() as caught:
        in_process(run, pairs, *setup)  # the same command: ckpt_path=auto takes the newest valid checkpoint
    assert not [w for w in caught if "not resumable" in str(w.message)]
    res = results(run)
    assert res["status"] == "done" and res["checkpoints"]["resumed_from"].endswith("last.ckpt")
    assert res["timings"]["fit_steps"] == 6  # steps 10..15 ran again

    # Every step logged once, with the uninterrupted run's loss (exact: same batches, dropout masks, draws).
    assert [s for s, _ in losses(run)] == list(range(16))
    assert losses(run) == losses(ref)
    a, b = final_weights(ref), final_weights(run)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the run's fill counts every step once: the checkpoint's counts, then the steps after it
    assert res["fill"] == results(ref)["fill"] and res["fill"]["batches"] == 16

    # The same W&B run continues: one id in the folder, both segments' offline runs carry it.
    assert res["wandb"]["id"] == wandb_id == (run / "wandb_run_id").read_text()
    segments = sorted((run / "wandb").glob(f"offline-run-*-{wandb_id}/run-{wandb_id}.wandb"))
    assert len(segments) == 2, list((run / "wandb").iterdir())
    assert res["wandb"]["sync"] == f"wandb sync {run / 'wandb'}/offline-run-*-{wandb_id}"  # both segments


def test_the_maxsim_objective_resumes_exactly(tmp_path):
    """train.objective=maxsim (landmark states, grad cache over chunks of their own width), dropout on: SIGKILLed at
    step 3 and run again, it logs the uninterrupted run's losses and ends with its weights."""
    pairs = write_pairs(tmp_path / "pairs.jsonl", n=16)
    setup = ("pooling=lmk-fixed", "train.objective=maxsim", "train.grad_cache=true", "train.grad_cache_chunk=3",
             "trainer.max_steps=4", "train.checkpoint_every_n_steps=2", "seed=5",
             "+encoder.config_overrides.embedding_dropout=0.1")
    ref, run = tmp_path / "ref", tmp_path / "run"
    in_process(ref, pairs, *setup)
    killed = forked_cli.run_code(KILLER, ["3", *overrides(run, pairs, *setup)], cwd=ROOT, env=ENV, timeout=600)
    assert killed.returncode == -9, killed.stderr[-3000:]
    in_process(run, pairs, *setup)
    res = results(run)
    assert res["status"] == "done" and res["resume"]["step"] == 2 and res["config"]["train"]["objective"] == "maxsim"
    assert losses(run) == losses(ref) and [s for s, _ in losses(run)] == [0, 1, 2, 3]
    a, b = final_weights(ref), final_weights(run)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resume_state_is_in_the_checkpoint(tmp_path):
    pairs = write_pairs(tmp_path / "pairs.jsonl")
    in_process(tmp_path / "r", pairs, "trainer.max_steps=2")
    ckpt = torch.load(tmp_path / "r" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert ckpt["PairDataModule"]["sampler"] == {"seed": 0, "epoch": 0, "consumed": 2 * 4}
    assert set(ckpt["callbacks"]["ExactResume"]["rng"]) >= {"torch", "numpy", "python"}
    assert json.loads((tmp_path / "r" / "results.json").read_text())["status"] == "done"


@pytest.mark.slow  # four tiny 16-step runs (the reference shared with the mid-epoch test): about a minute
def test_killed_at_an_epoch_boundary_resume_matches_uninterrupted_run(tmp_path, padded_ref):
    """24 pairs / batch 4 = 6 batches an epoch. Killed right after a checkpoint at the epoch's last batch (step 6)
    and right after one at the next epoch's first batch (step 7), dropout on: each resumed run logs the
    uninterrupted run's loss at every step and ends with its weights. (Creating an epoch's DataLoader iterator draws
    from torch's generator: the RNG states go back before that draw at an epoch's end, after it mid-epoch.)"""
    pairs, ref = padded_ref  # its checkpoints (every 5) change no draw: the same losses as any cadence
    for every, kill_at in ((6, 7), (7, 8)):
        run = tmp_path / f"run-{every}"
        setup = [*SETUP[:2], f"train.checkpoint_every_n_steps={every}", *SETUP[3:]]
        cmd = [sys.executable, "-c", KILLER, str(kill_at), *overrides(run, pairs, *setup)]
        killed = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
        assert killed.returncode == -9, killed.stderr[-3000:]
        in_process(run, pairs, *setup)
        res = results(run)
        assert res["status"] == "done" and res["resume"]["step"] == every, (every, res.get("resume"))
        assert losses(run) == losses(ref), every
        a, b = final_weights(ref), final_weights(run)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), every


def test_the_checkpoint_says_whether_it_ends_an_epoch(tmp_path):
    """The state the resume reads: a checkpoint at an epoch's last batch says so, one mid-epoch does not."""
    pairs = write_pairs(tmp_path / "pairs.jsonl")  # 6 batches an epoch
    for steps, at_end in ((6, True), (4, False)):
        in_process(tmp_path / f"r{steps}", pairs, f"trainer.max_steps={steps}")
        ckpt = torch.load(tmp_path / f"r{steps}" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
        assert ckpt["callbacks"]["ExactResume"]["epoch_end"] is at_end, steps


@pytest.mark.slow  # three 2-rank submitit jobs, then two resumed: about 4 min on 2 quiet cores
@pytest.mark.timeout(1500)
def test_ddp_ranks_killed_mid_epoch_and_after_an_epoch_end_resume_as_uninterrupted(tmp_path):
    """Two DDP ranks (submitit's local executor), dropout on, 24 pairs / (2 ranks x batch 4) = 3 steps an epoch:
    rank 1 of row `mid` is SIGKILLed once step 2's checkpoint is written (mid-epoch), rank 1 of row `end` once step
    3's (the epoch's last batch); the same command again resumes both, and each logs the losses and ends with the
    weights of row `ref`, the same config never interrupted (every rank restores its own RNG states)."""
    from test_sweep_faults import _row_sweep

    from lmk.run import faults

    pairs = write_pairs(tmp_path / "pairs.jsonl")
    plan = tmp_path / "plan.yaml"
    plan.write_text("faults:\n  - {kind: kill, row: mid, rank: 1, step: 2}\n  - {kind: kill, row: end, rank: 1, step: 3}\n")
    env = {**ENV, faults.ENV_PLAN: str(plan), faults.ENV_STATE: str(tmp_path / "state")}
    out = tmp_path / "sweep"
    rows = {"ref": ["pooling=lmk-variable"], "mid": ["pooling=lmk-variable"], "end": ["pooling=lmk-variable"]}
    args = ("launcher=submitit_local", "trainer=ddp-cpu", "launcher.tasks_per_node=2", "trainer.max_steps=7",
            "train.checkpoint_every_n_steps=1", "trainer.log_every_n_steps=1", "eval.in_training=none",
            f"data.sources=[{{path:'{pairs}'}}]", "data.max_rows=null", "seed=5",
            "+encoder.config_overrides.embedding_dropout=0.1")
    first = _row_sweep(out, rows, *args, env=env)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert [results(out / r)["status"] for r in ("ref", "mid", "end")] == ["done", "failed", "failed"]
    again = _row_sweep(out, rows, *args, env=env)  # the same command: each fault fired once
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    for row, at in (("mid", 2), ("end", 3)):
        res = results(out / row)
        assert res["status"] == "done" and res["resume"]["step"] == at and res["timings"]["fit_steps"] == 7 - at
        assert [s for s, _ in losses(out / row)] == list(range(7))
        assert losses(out / row) == losses(out / "ref"), row
        a, b = final_weights(out / "ref"), final_weights(out / row)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), row
