"""The rehearsal scale end to end, offline on CPU, through the paper's path: lmk.sweep -> row sweeper ->
submitit's local executor (2 DDP ranks, gloo) -> bf16-mixed training with checkpointing and grad cache ->
evaluation -> the table with the paper's columns."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lmk.results import read_results

ROOT = Path(__file__).resolve().parent.parent
COLUMNS = ["MS MARCO dev", "BEIR-15", "MTEB v2", "COIR", "MLDR-eng", "LongEmbed-6"]


def test_rehearsal_composes_to_the_paper_config_with_only_sizes_changed():
    from hydra import compose, initialize_config_dir

    from lmk.config import validate

    def load(experiment: str, launcher: str):
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
            return compose("train", overrides=[f"experiment={experiment}", "pooling=lmk-variable", "+row=x",
                                               f"launcher={launcher}", "run_dir=/tmp/x"])

    paper, rehearsal = load("table2-paper", "submitit_slurm"), load("table2-rehearsal", "submitit_local")
    validate(rehearsal)
    for key in ("tau", "lr", "gather_across_devices", "grad_cache", "use_teacher_scores", "in_batch_negatives"):
        assert rehearsal.train[key] == paper.train[key], key
    assert rehearsal.trainer.precision == paper.trainer.precision == "bf16-mixed"
    assert rehearsal.trainer.strategy == paper.trainer.strategy == "ddp"
    assert rehearsal.encoder.gradient_checkpointing and paper.encoder.gradient_checkpointing
    assert rehearsal.encoder.architecture == "modernbert" and rehearsal.encoder.config == "modernbert-base"
    assert rehearsal.pooling == paper.pooling
    assert rehearsal.trainer.devices == rehearsal.launcher.tasks_per_node == 2
    assert set(rehearsal.launcher) >= set(paper.launcher) - {"tasks_per_node"}  # the same launcher keys
    assert set(rehearsal.eval.groups) == set(paper.eval.groups)  # the paper's columns


@pytest.mark.slow
def test_rehearsal_row_runs_end_to_end(tmp_path):
    out = tmp_path / "rehearsal"
    proc = subprocess.run([sys.executable, "-m", "lmk.sweep", "experiments/table2/spec.yaml", "--scale", "rehearsal",
                           "--out", str(out), "--rows", "cls"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    header = next(line for line in proc.stdout.splitlines() if line.startswith("| Pooling"))
    assert all(c in header for c in COLUMNS)
    res = read_results(out / "train" / "cls")
    assert res["status"] == "done" and res["metrics"]["global_step"] == 3
    assert set(res["eval"]["groups"]) >= {"msmarco-dev", "longembed6"}
    # two ranks started by submitit (not by Lightning), talking over gloo
    logs = sorted((out / "train" / ".submitit").glob("*/*_log.out"))
    assert len(logs) == 2
    text = "".join(p.read_text() for p in logs)
    assert "global_rank=0(2)" in text and "global_rank=1(2)" in text and "distributed_backend=gloo" in text
    assert "bfloat16 Automatic Mixed Precision" in text
    plan = json.loads((out / "train" / "jobs.json").read_text())
    assert plan["launcher"]["_target_"].endswith("LocalLauncher") and plan["launcher"]["tasks_per_node"] == 2
