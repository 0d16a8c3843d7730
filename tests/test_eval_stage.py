"""Evaluation as a sweep stage: shards per (row, eval group) through the row sweeper, merged into
the row's results.json; a failed shard reruns alone, finished ones are skipped."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import forked_cli
import pytest
import yaml

from lmk.config.eval import EvalConfig
from lmk.run.results import read_results, update_results
from lmk.sweep.jobs import plan_shards

ROOT = Path(__file__).resolve().parent.parent


def test_shards_cover_every_task_once() -> None:
    suite = EvalConfig.from_cfg(yaml.safe_load((ROOT / "conf" / "eval" / "table2-paper.yaml").read_text()))
    shards = plan_shards(suite)
    flat = [t for tasks in shards.values() for t in tasks]
    assert sorted(flat) == sorted(suite.tasks) and len(flat) == len(set(flat))
    assert shards["msmarco-dev"] == ["MSMARCO"] and "MSMARCO" not in shards["beir15"]  # shared task runs once
    assert set(shards) == {"msmarco-dev", "beir15", "mteb-v2-retrieval", "coir", "mldr-eng", "longembed6"}
    assert plan_shards(suite, "task") == {t: [t] for t in suite.tasks}
    with pytest.raises(ValueError, match="shard_by"):
        plan_shards(suite, "row")


def test_training_view_follows_in_training() -> None:
    suite = EvalConfig.from_cfg(yaml.safe_load((ROOT / "conf" / "eval" / "table2-paper.yaml").read_text()))
    assert suite.training_view() is suite
    suite.in_training = "none"
    assert not suite.training_view().enabled
    suite.in_training = ["mldr-eng"]
    dev = suite.training_view()
    assert dev.tasks == ["MultiLongDocRetrieval"] and list(dev.groups) == ["mldr-eng"]
    assert dev.task_options == {"MultiLongDocRetrieval": {"eval_splits": ["test"], "hf_subsets": ["en"]}}
    with pytest.raises(ValueError, match="in_training"):
        EvalConfig.from_cfg({**yaml.safe_load((ROOT / "conf" / "eval" / "table2-tiny.yaml").read_text()),
                             "in_training": ["beir15"]})


def test_paper_dry_run_lists_the_eval_jobs(tmp_path: Path) -> None:
    out = tmp_path / "paper"
    proc = forked_cli.run([sys.executable, "-m", "lmk.sweep", "experiments/table2/spec.yaml", "--scale", "paper",
                           "--dry-run", "--out", str(out), "--stage", "eval"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plan = json.loads((out / "eval" / "jobs.json").read_text())
    from lmk.sweep.spec import load_spec

    spec = load_spec(ROOT / "experiments" / "table2" / "spec.yaml")
    # the paper scale includes the optional control rows; a MaxSim row is scored from its LMK row's model instead
    rows = [r for r in spec.rows_for(spec.scale("paper"), None) if r.scoring_of is None]
    assert len(plan["jobs"]) == len(rows) * 6  # trained rows x 6 eval groups
    assert f"eval stage: {len(rows) * 6} jobs" in proc.stdout
    assert "cost estimate" in proc.stdout and "GPU-hours" in proc.stdout and "total" in proc.stdout
    # every job reads the suite's hub datasets prepared once before launch, none converts them itself
    assert all(f"hub.prepared={out / 'eval-data'}" in job["overrides"] for job in plan["jobs"])
    assert f"prepared once into {out / 'eval-data'}" in proc.stdout and not (out / "eval-data").exists()
    assert not (out / "train").exists()  # --stage eval: the train stage is not planned


def _staged_spec(tmp_path: Path) -> Path:
    spec = yaml.safe_load((ROOT / "experiments" / "table2" / "spec.yaml").read_text())
    tiny = spec["scales"]["tiny"]
    tiny["train_overrides"] = ["experiment=table2-tiny", "eval.in_training=none"]
    tiny["eval_stage"] = {"overrides": ["eval=table2-tiny"], "shard_by": "group"}
    spec["scales"] = {"tiny": tiny}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@pytest.mark.slow
def test_tiny_eval_stage_runs_as_jobs_and_reruns_only_a_failed_shard(tmp_path: Path) -> None:
    spec, out = _staged_spec(tmp_path), tmp_path / "out"

    def sweep(*extra: str) -> subprocess.CompletedProcess:
        return forked_cli.run([sys.executable, "-m", "lmk.sweep", str(spec), "--scale", "tiny", "--rows", "cls",
                               "--out", str(out), *extra], cwd=ROOT, capture_output=True, text=True, timeout=900)

    proc = sweep()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    train = read_results(out / "train" / "cls")
    assert train["status"] == "done"
    assert set(train["eval"]["tasks"]) == {"LocalShort", "LocalPasskey"}  # merged from two shard jobs
    assert set(train["eval"]["groups"]) == {"local-short", "local-passkey"}
    assert train["eval"]["stage"]["shards"] == {"local-short": "done", "local-passkey": "done"}
    per_query = json.loads((out / "train" / "cls" / "per_query.json").read_text())
    assert set(per_query) == {"LocalShort", "LocalPasskey"}
    for shard in ("local-short", "local-passkey"):  # each shard was its own lmk.evaluate job
        res = read_results(out / "eval" / f"cls--{shard}")
        assert res["command"] == "evaluate" and res["status"] == "done"
    assert "Docstrings" in (out / "table2.md").read_text()
    passkey = train["eval"]["groups"]["local-passkey"]

    # a crashed shard: only it reruns; the finished one (same model fingerprint, same tasks) is skipped
    update_results(out / "eval" / "cls--local-passkey", status="failed", error="killed")
    stamp = (out / "eval" / "cls--local-short" / "results.json").stat().st_mtime_ns
    proc = sweep("--stage", "eval")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    status = json.loads((out / "eval" / "sweep_status.json").read_text())
    assert status["cls--local-short"]["status"] == "skipped"
    assert status["cls--local-passkey"]["status"] == "completed"
    assert (out / "eval" / "cls--local-short" / "results.json").stat().st_mtime_ns == stamp
    assert read_results(out / "train" / "cls")["eval"]["groups"]["local-passkey"] == passkey
    assert "lmk.train" not in proc.stdout  # --stage eval launched no training


@pytest.mark.slow
def test_eval_stage_offline_from_replicas_in_the_mirror(tmp_path: Path) -> None:
    """The rehearsal's evaluation path: training, then the paper suite's own mteb task classes as eval-stage
    jobs, offline (HF_HUB_OFFLINE=1), reading replicas found through `hub.mirror`; then the table."""
    from lmk.eval.replicas import Sizes, write_replicas

    mirror = tmp_path / "mirror"
    write_replicas(mirror, sizes=Sizes(n_queries=3, n_docs=6, lengths=(256, 512)))
    spec = yaml.safe_load(_staged_spec(tmp_path).read_text())
    tiny = spec["scales"]["tiny"]
    tiny["eval_stage"] = {"overrides": ["eval=table2-rehearsal", f"hub.mirror={mirror}"]}
    tiny["columns"] = [{"group": g, "label": g, "context": c} for g, c in
                       (("msmarco-dev", "short"), ("beir15", "short"), ("mldr-eng", "long"), ("longembed6", "long"))]
    path = tmp_path / "rehearsal.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    out = tmp_path / "out"
    env = {**__import__("os").environ, "HF_HUB_OFFLINE": "1"}
    proc = forked_cli.run([sys.executable, "-m", "lmk.sweep", str(path), "--scale", "tiny", "--rows", "cls",
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    ev = read_results(out / "train" / "cls")["eval"]
    assert set(ev["stage"]["shards"]) == {"msmarco-dev", "beir15", "mteb-v2-retrieval", "coir", "mldr-eng", "longembed6"}
    assert set(ev["tasks"]) >= {"SciFact", "MSMARCO", "ArguAna", "CQADupstackUnixRetrieval", "AppsRetrieval",
                                "MultiLongDocRetrieval", "LEMBNeedleRetrieval"}
    assert all(0 <= v <= 1 for v in ev["groups"].values())
    shard = read_results(out / "eval" / "cls--beir15")
    assert shard["config"]["hub"]["mirror"] == str(mirror) and shard["status"] == "done"
    table = (out / "table2.md").read_text()
    assert "longembed6" in table and "| CLS |" in table
    # the suite's hub datasets were prepared once, before the jobs, and every job read them from there
    data = out / "eval-data"
    assert shard["config"]["hub"]["prepared"] == str(data)
    assert proc.stdout.count("-m lmk.eval.prepared") == 1 and proc.stdout.count(" prepared ") == 12
    assert sorted(p.name for p in data.iterdir()) == sorted(ev["tasks"])
    assert "eval data of 2 hub tasks read from" in (out / "eval" / "cls--beir15" / "evaluate.log").read_text()
    # a rerun of the stage (one shard failed) converts nothing again: every task reused, the folder unchanged
    stamp = {p: p.stat().st_mtime_ns for p in data.rglob("*")}
    update_results(out / "eval" / "cls--coir", status="failed", error="killed")
    proc = forked_cli.run([sys.executable, "-m", "lmk.sweep", str(path), "--scale", "tiny", "--rows", "cls",
                           "--out", str(out), "--stage", "eval"], cwd=ROOT, capture_output=True, text=True,
                          timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.stdout.count(" reused ") == 12 and " prepared " not in proc.stdout
    assert {p: p.stat().st_mtime_ns for p in data.rglob("*")} == stamp
    assert read_results(out / "eval" / "cls--coir")["status"] == "done"


def test_stage_plans_prepares_launches_and_merges_in_turn(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The stage's four steps with the launcher's two commands recorded (a job "runs" by writing its results): the
    data is prepared once before the launch, a failed preparation still launches, a row without a finished training
    gets no job and fails the stage, the trained row's shards are merged; a dry run writes the plan only."""
    from lmk.sweep.eval_stage import model_fingerprint, run_stage
    from lmk.sweep.spec import Scale

    out = tmp_path / "out"
    for row, status in (("cls", "done"), ("mean", "failed")):
        (out / "train" / row / "export").mkdir(parents=True)
        (out / "train" / row / "export" / "model.safetensors").write_bytes(b"weights")
        update_results(out / "train" / row, status=status, command="train")
    scale = Scale(name="s", columns=[], eval_stage={"overrides": ["eval=table2-rehearsal"], "shard_by": "group"})
    calls: list[list[str]] = []
    blocks: list = []

    def sweep_command(block, eval_dir, *_):
        blocks.append((block, eval_dir))
        return ["launch"]

    def run_block(cmd: list[str], env: dict) -> int:
        calls.append(cmd)
        if cmd != ["launch"]:
            return 3  # the preparation fails: its tasks' jobs fail naming why, the others run
        for block, eval_dir in blocks:
            for job in block.jobs():
                fp = next(o for o in job.overrides if o.startswith("++model_fingerprint=")).split("=", 1)[1]
                update_results(eval_dir / job.id, status="done", config={"model_fingerprint": fp.strip("'")},
                               eval={"tasks": {job.id: {"main_score": 0.5}}, "timings": {}, "scoring": "single"})
        return 0

    data = out / "eval-data"
    assert run_stage(scale, ["cls", "mean"], out, "g", False, True, sweep_command, run_block) == 0
    plan = json.loads((out / "eval" / "jobs.json").read_text())
    assert calls == [] and len(plan["jobs"]) == 2 * 6 and not any("model_fingerprint" in o for j in plan["jobs"]
                                                                   for o in j["overrides"])
    assert run_stage(scale, ["cls", "mean"], out, "g", False, False, sweep_command, run_block) == 1
    err = capsys.readouterr().err
    assert "training did not finish (not evaluated; rerun the sweep to finish them): mean" in err
    assert "the eval data of some tasks was not prepared (exit 3" in err
    prepare, launch = calls
    assert prepare[1:5] == ["-m", "lmk.eval.prepared", "--out", str(data)] and "eval=table2-rehearsal" in prepare
    assert not any(o.startswith("hub.prepared") for o in prepare) and launch == ["launch"]
    (block, _), = blocks
    assert sorted(block.rows) == sorted(f"cls--{s}" for s in plan["shards"])  # no job for the untrained row
    fp = model_fingerprint(out / "train" / "cls")
    assert all(f"hub.prepared={data}" in j.overrides and f"++model_fingerprint='{fp}'" in j.overrides
               for j in block.jobs())
    merged = read_results(out / "train" / "cls")["eval"]
    assert merged["stage"] == {"shards": {s: "done" for s in plan["shards"]}, "model_fingerprint": fp}
    assert set(merged["tasks"]) == set(block.rows) and "eval" not in read_results(out / "train" / "mean")
