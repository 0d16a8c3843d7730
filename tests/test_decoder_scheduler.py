"""The decoder recipe on a real scheduler (`make test-slurm`): two LoRA rows of the decoder table's smoke scale through
the row sweeper and submitit onto the two-node SLURM of this machine, each row on 2 nodes x 1 task (gloo). One row
is requeued by SLURM itself (`scontrol requeue`, the fault plan's `requeue`) mid-training: the batch script runs
again, the row resumes from its newest checkpoint, which holds the adapters and their optimizer state only, and ends
with the uninterrupted row's losses and adapter weights, bit for bit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lmk.run.results import read_results

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_scheduler import ENV, _cluster_up, _losses, _weights  # noqa: E402  (ENV: one torch thread per rank)

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(1800)]  # two two-node rows, one requeued: about 2 min here
ROOT = Path(__file__).resolve().parents[1]
STEPS = 6
ROWS = "".join(f"{row}: [pooling=lmk-fixed, pooling.chunk_size=16]\n" for row in ("ref", "requeued"))
PLAN = "faults:\n  - {kind: requeue, row: requeued, step: 3}\n"
LAUNCH = ("launcher=submitit_slurm", "trainer=ddp-cpu", "launcher.nodes=2", "launcher.tasks_per_node=1",
          "launcher.gpus_per_node=0", "launcher.cpus_per_task=1", "launcher.partition=debug",
          f"trainer.max_steps={STEPS}", "train.checkpoint_every_n_steps=2", "eval=none")


@pytest.fixture(scope="module")
def lora_rows(tmp_path_factory) -> Path:
    if not _cluster_up():
        pytest.fail("no idle SLURM cluster here: run `make slurm-up` first (make test-slurm does)")
    tmp = tmp_path_factory.mktemp("lora-requeue")
    (tmp / "plan.yaml").write_text(PLAN)
    (tmp / "rows.yaml").write_text(ROWS)
    out = tmp / "sweep"
    env = {**ENV, "LMK_FAULTS": str(tmp / "plan.yaml"), "LMK_FAULTS_STATE": str(tmp / "state"), "LMK_SWEEP_PIDS": ""}
    cmd = [sys.executable, "-m", "lmk.train", "-m", "experiment=decoder-tiny", "hydra/sweeper=rows",
           f"hydra.sweeper.rows_file={tmp / 'rows.yaml'}", f"hydra.sweep.dir={out}", "hydra.sweeper.report=null",
           *LAUNCH]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    # the sweep returns once the results are in, while SLURM may still hold the last job's nodes for a moment: the
    # cluster is left idle, as the next test expects it (tests/test_local_slurm.py reads the node states)
    assert _cluster_up(), "the nodes did not come back idle after the LoRA rows"
    return out


def test_a_requeued_lora_row_resumes_and_ends_with_the_uninterrupted_loss_and_adapters(lora_rows):
    ref, requeued = read_results(lora_rows / "ref"), read_results(lora_rows / "requeued")
    assert ref["status"] == requeued["status"] == "done", (ref.get("error"), requeued.get("error"))
    assert not ref.get("interruptions")  # absent when nothing stopped it
    # SLURM's own requeue: the same batch script ran again (SLURM_RESTART_COUNT), recorded with the step it reached
    assert any(i.get("scheduler_restarts") for i in requeued["interruptions"]), requeued["interruptions"]
    assert requeued["metrics"]["global_step"] == ref["metrics"]["global_step"] == STEPS
    assert [s for s, _ in _losses(lora_rows / "requeued")] == list(range(STEPS))  # every step logged once
    assert _losses(lora_rows / "requeued") == _losses(lora_rows / "ref")  # the final loss included
    assert requeued["metrics"]["train/loss"] == ref["metrics"]["train/loss"]
    a, b = _weights(lora_rows / "ref"), _weights(lora_rows / "requeued")  # a LoRA run's: its adapters
    # 2 layers x 7 target modules x (A, B): the frozen base is not in the checkpoint
    assert len(a) == 2 * 7 * 2 and all(".lora_A." in k or ".lora_B." in k for k in a)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
