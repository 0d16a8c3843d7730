"""The scheduler's warning signal (a time limit or preemption, USR2 under submitit): the step in progress finishes,
every rank saves last.ckpt at its end, the step is logged, and the job stops for its requeue; the same command
then continues exactly (lmk.train.requeue). On the real scheduler, with submitit's requeue: tests/test_scheduler.py."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import forked_cli
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_train import ENV, ROOT, in_process, overrides, results, write_pairs  # noqa: E402

# lmk.train with a callback that sends the process the warning signal in the middle of step SIGNAL_AT
SIGNALLER = """
import os, runpy, signal, sys
import lmk.train.fit, lmk.train.resume

SIGNAL_AT = int(sys.argv.pop(1))
if os.environ.get("HANDLER_EXIT"):  # the scheduler's handler (submitit's local requeue exits with its own code)
    signal.signal(signal.SIGUSR2, lambda *_: sys.exit(int(os.environ["HANDLER_EXIT"])))

class Signal(lmk.train.resume.ExactResume):
    def on_before_optimizer_step(self, trainer, *args):
        if trainer.global_step == SIGNAL_AT:
            os.kill(os.getpid(), signal.SIGUSR2)  # as SLURM's --signal=USR2@<delay> before the time limit

lmk.train.resume.ExactResume = lmk.train.fit.ExactResume = Signal  # where the job's callbacks take it from
runpy.run_module("lmk.train", run_name="__main__", alter_sys=True)
"""
SETUP = ("trainer.max_steps=8", "train.checkpoint_every_n_steps=5", "seed=2", "trainer.log_every_n_steps=1",
         "+encoder.config_overrides.embedding_dropout=0.1")


def _losses(run_dir: Path) -> list[tuple[int, float]]:
    with open(run_dir / "metrics.csv", newline="") as fh:
        return [(int(r["step"]), float(r["train/loss"])) for r in csv.DictReader(fh) if r.get("train/loss")]


def test_the_warning_signal_saves_at_the_step_end_and_the_rerun_continues_exactly(tmp_path):
    pairs = write_pairs(tmp_path / "pairs.jsonl")
    ref, run = tmp_path / "ref", tmp_path / "run"
    in_process(ref, pairs, *SETUP)

    stopped = forked_cli.run_code(SIGNALLER, ["3", *overrides(run, pairs, *SETUP)], cwd=ROOT, env=ENV, timeout=600)
    assert stopped.returncode != 0, stopped.stderr[-3000:]
    res = results(run)
    assert res["status"] == "interrupted" and "stopped at step 4 by SIGUSR2" in res["error"], res.get("error")
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert ckpt["global_step"] == 4  # saved at the end of the signalled step, not at the periodic step 5
    assert [s for s, _ in _losses(run)] == [0, 1, 2, 3]  # the signalled step is logged before the stop

    in_process(run, pairs, *SETUP)  # the requeued job: the same command
    res = results(run)
    assert res["status"] == "done" and res["interruptions"][0]["step"] == 4
    assert _losses(run) == _losses(ref)  # every step once, with the uninterrupted run's loss
    a = torch.load(ref / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    b = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_job_exits_with_the_code_the_schedulers_handler_chose(tmp_path):
    """submitit's local executor requeues a job only when a task exits with its requeue code: the stop at the
    step boundary keeps the exit status of the handler it hands over to."""
    pairs = write_pairs(tmp_path / "pairs.jsonl")
    run = tmp_path / "run"
    stopped = forked_cli.run_code(SIGNALLER, ["1", *overrides(run, pairs, *SETUP)], cwd=ROOT,
                                  env={**ENV, "HANDLER_EXIT": "173"}, timeout=600)
    assert stopped.returncode == 173, stopped.stderr[-3000:]
    res = results(run)
    assert res["status"] == "interrupted" and res["error"].endswith("; requeued"), res.get("error")
