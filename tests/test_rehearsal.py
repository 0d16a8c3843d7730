"""The rehearsal scale end to end, offline on CPU, through the paper's path: lmk.sweep -> row sweeper ->
submitit's local executor (2 DDP ranks, gloo) -> bf16-mixed training with checkpointing and grad cache ->
evaluation -> the table with the paper's columns."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import forked_cli
import pytest

from lmk.run.results import read_results
from lmk.sweep import pinned

ROOT = Path(__file__).resolve().parent.parent
COLUMNS = ["MS MARCO dev", "BEIR-15", "MTEB v2", "COIR", "MLDR-eng", "LongEmbed-6"]
GROUPS = ["msmarco-dev", "beir15", "mteb-v2-retrieval", "coir", "mldr-eng", "longembed6"]


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_rehearsal_composes_to_the_paper_config_with_only_sizes_changed():
    from hydra import compose, initialize_config_dir

    from lmk.train.trainer_args import validate_training

    def load(experiment: str, launcher: str):
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
            return compose("train", overrides=[f"experiment={experiment}", "pooling=lmk-variable", "+row=x",
                                               f"launcher={launcher}", "run_dir=/tmp/x"])

    paper, rehearsal = load("table2-paper", "submitit_slurm"), load("table2-rehearsal", "submitit_local")
    validate_training(rehearsal)
    for key in ("tau", "lr", "gather_across_devices", "grad_cache", "use_teacher_scores", "in_batch_negatives"):
        assert rehearsal.train[key] == paper.train[key], key
    assert rehearsal.trainer.precision == paper.trainer.precision == "bf16-mixed"
    assert rehearsal.trainer.strategy == paper.trainer.strategy == "ddp"
    # the paper decides per GPU (auto: off at 80 GB); on the CPU auto is off, so the rehearsal turns it on
    assert rehearsal.encoder.gradient_checkpointing is True and paper.encoder.gradient_checkpointing == "auto"
    assert rehearsal.encoder.architecture == "modernbert" and rehearsal.encoder.config == "modernbert-base"
    assert rehearsal.pooling == paper.pooling
    assert rehearsal.trainer.devices == rehearsal.launcher.tasks_per_node == 2
    assert set(rehearsal.launcher) >= set(paper.launcher) - {"tasks_per_node"}  # the same launcher keys
    assert set(rehearsal.eval.groups) == set(paper.eval.groups)  # the paper's columns
    for group, tasks in rehearsal.eval.groups.items():  # each column: some of the paper's own tasks
        assert set(tasks) <= set(paper.eval.groups[group]), group
    assert rehearsal.eval.in_training == paper.eval.in_training == "none"


def test_rehearsal_scale_evaluates_in_a_stage_like_the_paper_reading_its_mirror():
    from lmk.sweep.spec import load_spec

    spec = load_spec(ROOT / "experiments" / "table2" / "spec.yaml")
    paper, rehearsal = spec.scale("paper"), spec.scale("rehearsal")
    assert rehearsal.eval_stage["overrides"] == ["eval=table2-rehearsal"]
    assert rehearsal.eval_stage["shard_by"] == paper.eval_stage["shard_by"] == "group"
    assert [c.label for c in rehearsal.columns] == [c.label for c in paper.columns] == COLUMNS
    assert rehearsal.hub_mirror["replicas"] and rehearsal.env["HF_HUB_OFFLINE"] == "1"


def test_sweep_writes_missing_replicas_into_the_scales_mirror_once(tmp_path):
    from lmk.hub import mirror
    from lmk.sweep.hub_mirror import prepare
    from lmk.sweep.spec import Scale, SpecError

    scale = Scale(name="s", columns=[], eval_stage={"overrides": ["eval=table2-rehearsal"]},
                  hub_mirror={"path": "m", "replicas": {"n_queries": 2, "n_docs": 4, "lengths": [256]}})
    assert prepare(scale, tmp_path, dry_run=True) == tmp_path / "m" and not (tmp_path / "m").exists()
    root = prepare(scale, tmp_path)
    assert root == tmp_path / "m"
    repos = {e["repo_id"] for e in mirror.read_manifest(root)["artifacts"]}
    assert {"mteb/scifact", "mteb/arguana", "CoIR-Retrieval/apps", "dwzhu/LongEmbed"} <= repos
    stamp = (root / mirror.MANIFEST).stat().st_mtime_ns
    assert prepare(scale, tmp_path) == root
    assert (root / mirror.MANIFEST).stat().st_mtime_ns == stamp  # present: nothing rewritten
    # a user-filled mirror (replicas: false) must exist; the error names the command that fills it
    user = Scale(name="paper", columns=[], hub_mirror={"path": str(tmp_path / "none")})
    with pytest.raises(SpecError, match="make download SCALE=paper MIRROR="):
        prepare(user, tmp_path)
    with pytest.raises(SpecError, match="unknown hub_mirror keys"):
        prepare(Scale(name="s", columns=[], hub_mirror={"dir": "x"}), tmp_path)


def test_download_of_the_rehearsal_writes_its_replicas_and_downloads_nothing(tmp_path):
    from lmk.hub import mirror
    from lmk.sweep.scale_artifacts import main

    assert main(["experiments/table2/spec.yaml", "--scale", "rehearsal", "--mirror", str(tmp_path / "m"),
                 "--dry-run"]) == 0
    assert not (tmp_path / "m").exists()  # a dry run writes nothing
    assert main(["experiments/table2/spec.yaml", "--scale", "rehearsal", "--mirror", str(tmp_path / "m")]) == 0
    repos = {e["repo_id"] for e in mirror.read_manifest(tmp_path / "m")["artifacts"]}
    assert {"mteb/msmarco", "mteb/MultiLongDocRetrieval", "CoIR-Retrieval/apps", "dwzhu/LongEmbed"} <= repos


@pytest.mark.slow  # a rehearsal dry run end to end (12 s); the row end to end below runs from the mirror, and the mirror
# written once is checked fast above
def test_sweep_passes_the_mirror_to_every_job(tmp_path):
    out = tmp_path / "dry"
    proc = forked_cli.run([sys.executable, "-m", "lmk.sweep", "experiments/table2/spec.yaml", "--scale", "rehearsal",
                           "--out", str(out), "--rows", "cls", "--dry-run"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    flag = f"hub.mirror={out / 'hub-mirror'}"
    train = json.loads((out / "train" / "jobs.json").read_text())
    assert flag in json.dumps(train)
    jobs = json.loads((out / "eval" / "jobs.json").read_text())["jobs"]
    assert len(jobs) == 6 and all(flag in j["overrides"] for j in jobs)
    assert not (out / "hub-mirror").exists()  # a dry run writes nothing


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
    "encoder.seed", "encoder.architecture", "encoder.config", "encoder.tokenizer",  # how the random stand-in is built
    "encoder.gradient_checkpointing",  # paper: auto (per GPU); on the CPU auto is off, the rehearsal keeps it on
    "data.sources", "data.batch_size", "data.group_size", "data.query_max_length", "data.passage_max_length",
    "data.max_rows", "data.num_workers",
    "eval", "train.warmup_steps", "train.grad_cache_chunk", "train.grad_cache_tokens", "train.checkpoint_every_n_steps",
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


# In the slow suite (over a minute on 2 quiet cores: two DDP ranks, then the eval stage's jobs); the rest of this
# file checks the rehearsal's composition in `make test`.
@pytest.mark.slow
def test_rehearsal_row_runs_end_to_end(tmp_path):
    out = tmp_path / "rehearsal"
    proc = forked_cli.run([sys.executable, "-m", "lmk.sweep", "experiments/table2/spec.yaml", "--scale", "rehearsal",
                           "--out", str(out), "--rows", "cls"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    header = next(line for line in proc.stdout.splitlines() if line.startswith("| Pooling"))
    assert all(c in header for c in COLUMNS)
    cells = dict(zip(_cells(header), _cells(next(line for line in proc.stdout.splitlines()
                                                 if line.startswith("| CLS |"))), strict=True))
    for column in COLUMNS:  # a number in each of the paper's six columns, not "-"
        assert re.fullmatch(r"\**\d+\.\d\**[†]?", cells[column]), (column, cells[column])
    # the row prints what docs/results.md's rehearsal table (experiments/table2/pinned.json) shows for it
    spec = ROOT / "experiments" / "table2" / "spec.yaml"
    drifts = pinned.compare(pinned.load_pinned(spec)["rehearsal"], pinned.measured_rows(
        json.loads((out / "table2.json").read_text())), rows=["cls"])
    assert not drifts, pinned.drift_message(drifts, spec, "rehearsal", out)
    res = read_results(out / "train" / "cls")
    assert res["status"] == "done" and res["metrics"]["global_step"] == 3
    # the eval stage, as at paper scale: training evaluated nothing, one lmk.evaluate job per group merged
    assert res["config"]["eval"]["in_training"] == "none"
    assert set(res["eval"]["groups"]) == set(GROUPS)
    assert set(res["eval"]["stage"]["shards"].values()) == {"done"}
    assert {"ArguAna", "CQADupstackUnixRetrieval", "AppsRetrieval", "LEMBWikimQARetrieval"} <= set(res["eval"]["tasks"])
    # ... reading the replicas the sweep wrote into the scale's hub mirror (hub.mirror, HF_HUB_OFFLINE=1)
    shard = read_results(out / "eval" / "cls--coir")
    assert shard["status"] == "done" and shard["config"]["hub"]["mirror"] == str(out / "hub-mirror")
    assert (out / "hub-mirror" / "datasets" / "CoIR-Retrieval" / "apps" / "README.md").is_file()
    # two ranks started by submitit (not by Lightning), talking over gloo
    logs = sorted((out / "train" / ".submitit").glob("*/*_log.out"))
    assert len(logs) == 2
    # submitit's task logs, and the run's own log file that the job's Lightning output goes to (lmk.run.console)
    text = "".join(p.read_text() for p in [*logs, *sorted((out / "train" / "cls").glob("*.log"))])
    assert "global_rank=0(2)" in text and "global_rank=1(2)" in text and "distributed_backend=gloo" in text
    assert "bfloat16 Automatic Mixed Precision" in text
    plan = json.loads((out / "train" / "jobs.json").read_text())
    assert plan["launcher"]["_target_"].endswith("LocalLauncher") and plan["launcher"]["tasks_per_node"] == 2
