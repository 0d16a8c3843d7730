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


def _flat(node, prefix: str = "") -> dict:
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(node, resolve=False) if not isinstance(node, dict) else node
    out = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        out.update(_flat(value, name + ".") if isinstance(value, dict) and value else {name: value})
    return out


# What the rehearsal may change: sizes, and the CPU/offline stand-ins for cluster resources. Anything
# else that differs from the paper config fails here, so the rehearsal keeps exercising the paper's path.
REHEARSAL_CHANGES = {
    "name", "encoder.name", "encoder.source", "encoder.model_id", "encoder.config_overrides", "encoder.max_positions",
    "encoder.seed",
    "data.sources", "data.batch_size", "data.group_size", "data.query_max_length", "data.passage_max_length",
    "data.max_rows", "data.num_workers",
    "eval", "train.warmup_steps", "train.grad_cache_chunk", "train.checkpoint_every_n_steps",
    "trainer.accelerator", "trainer.devices", "trainer.num_nodes", "trainer.max_steps", "trainer.log_every_n_steps",
    "trainer.enable_model_summary", "trainer.enable_progress_bar",
    "launcher",
}


def test_rehearsal_differs_from_the_paper_config_only_in_sizes_and_stand_ins():
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        paper = compose("train", overrides=["experiment=table2-paper", "+row=x", "run_dir=/tmp/x"])
        rehearsal = compose("train", overrides=["experiment=table2-rehearsal", "+row=x", "run_dir=/tmp/x"])
    p, r = _flat(paper), _flat(rehearsal)
    changed = {k for k in set(p) | set(r) if p.get(k) != r.get(k)}
    allowed = {k for k in changed if any(k == a or k.startswith(a + ".") for a in REHEARSAL_CHANGES)}
    assert changed - allowed == set(), {k: (p.get(k), r.get(k)) for k in changed - allowed}
    assert r["data.sources"][0]["data_files"] == p["data.sources"][0]["data_files"]  # the same subset, a replica


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
