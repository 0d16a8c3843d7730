"""A cluster's bad day: rows whose job dies without a Python exception are recorded and the others go
on; reruns resume interrupted rows from `last`; locks of dead jobs are judged from the sweep's record; the eval
stage skips rows whose training did not finish; fault plans fire each fault once."""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import forked_cli
import pytest

from lmk.hub.mirror import STARTED, incomplete, mark_complete
from lmk.run import faults
from lmk.run import lock as run_lock
from lmk.run.results import read_results, update_results
from lmk.sweep import load_spec, mark_interrupted
from lmk.sweep import main as sweep_main

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_train import ENV, in_process, write_pairs  # noqa: E402


def _row_sweep(out: Path, rows: dict[str, list[str]], *extra: str, wait: bool = True, env: dict | None = None):
    rows_file = out.parent / f"{out.name}-rows.yaml"
    rows_file.write_text("".join(f"{k}: [{', '.join(v)}]\n" for k, v in rows.items()))
    cmd = [sys.executable, "-m", "lmk.train", "-m", "experiment=table2-tiny", "hydra/sweeper=rows",
           f"hydra.sweeper.rows_file={rows_file}", f"hydra.sweep.dir={out}", "hydra.sweeper.max_batch_size=1",
           "hydra.sweeper.report=null", *extra]
    if not wait:
        return subprocess.Popen(cmd, cwd=ROOT, env=env or ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
    return forked_cli.run(cmd, cwd=ROOT, env=env or ENV, capture_output=True, text=True, timeout=900)


def _steps(run_dir: Path) -> list[int]:
    rows = list(csv.DictReader(open(run_dir / "metrics.csv")))
    return [int(r["step"]) for r in rows if r.get("train/loss")]


@pytest.mark.slow  # three submitit jobs (a Python start each): about a minute
def test_sigkilled_row_is_recorded_others_finish_and_the_rerun_resumes(tmp_path):
    """A row's process SIGKILLed from outside under submitit's local executor."""
    out = tmp_path / "sweep"
    rows = {"victim": ["pooling=cls"], "other": ["pooling=mean"]}
    # short steps: the kill lands right after the first checkpoint (step 10), 50 steps before the end; the rows'
    # training evaluates nothing (what is checked is the jobs' fate, not their scores)
    args = ("launcher=submitit_local", "launcher.tasks_per_node=1", "trainer.max_steps=60",
            "train.checkpoint_every_n_steps=10", "trainer.log_every_n_steps=1", "eval.in_training=none")
    sweep = _row_sweep(out, rows, *args, wait=False)
    try:
        ckpt, deadline = out / "victim" / "checkpoints" / "last.ckpt", time.time() + 600
        while not ckpt.exists():
            assert sweep.poll() is None and time.time() < deadline, sweep.communicate()[0][-3000:]
            time.sleep(0.05)
        owner = json.loads((out / "victim" / run_lock.LOCK_FILE).read_text())
        assert owner["scheduler"] == "local" and owner["job_id"]
        os.kill(owner["pid"], signal.SIGKILL)  # from outside: no Python exception, no cleanup (an OOM kill)
        log, _ = sweep.communicate(timeout=900)
    finally:
        if sweep.poll() is None:
            sweep.kill()
    assert sweep.returncode == 0, log[-3000:]  # the sweep ended by itself
    status = json.loads((out / "sweep_status.json").read_text())
    assert status["other"]["status"] == "completed" and read_results(out / "other")["status"] == "done"
    assert status["victim"]["status"] == "failed", status
    assert "ended without a result" in status["victim"]["error"] and "killed by a signal" in status["victim"]["error"]
    victim = read_results(out / "victim")
    assert victim["status"] == "failed" and "ended without a result" in victim["error"]
    assert status["victim"]["job_id"] == owner["job_id"]  # the record a later sweep judges the lock by
    assert (out / "victim" / run_lock.LOCK_FILE).exists()  # left behind by the kill

    again = _row_sweep(out, rows, *args)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    status = json.loads((out / "sweep_status.json").read_text())
    assert status["other"]["status"] == "skipped" and status["victim"]["status"] == "completed"
    plan = {j["job"]: j for j in json.loads((out / "jobs.json").read_text())["jobs"]}
    assert plan["victim"]["action"] == "launch" and plan["victim"]["why"] == "resumes from its last checkpoint"
    victim = read_results(out / "victim")
    assert victim["status"] == "done" and victim["checkpoints"]["resumed_from"].endswith("last.ckpt")
    assert 0 < victim["timings"]["fit_steps"] < 60  # only the steps after the last checkpoint ran again
    assert victim["error"] is None and "ended without a result" in victim["interruptions"][0]["error"]
    assert _steps(out / "victim") == list(range(60))  # every step logged once
    assert status["victim"]["ended_jobs"] == [owner["job_id"]]


def _plan(out: Path) -> dict[str, dict]:
    return {j["job"]: j for j in json.loads((out / "jobs.json").read_text())["jobs"]}


def test_sweeper_plan_resumes_starts_over_and_leaves_a_live_run_alone(tmp_path):
    out = tmp_path / "sweep"
    rows = {"resume": ["pooling=cls"], "changed": ["pooling=mean"], "live": ["pooling=cls"], "gone": ["pooling=mean"],
            "nan": ["pooling=cls"]}
    dry = ("hydra.sweeper.dry_run=true",)
    assert _row_sweep(out, rows, *dry).returncode == 0
    digest = {job: j["config_hash"] for job, j in _plan(out).items()}
    for job in rows:  # each row was interrupted after a checkpoint
        (out / job / "checkpoints").mkdir(parents=True)
        (out / job / "checkpoints" / "last.ckpt").write_bytes(b"")
        update_results(out / job, status="running", config_hash=digest[job])
    update_results(out / "changed", config_hash="older")  # a changed config starts over
    update_results(out / "nan", status="failed", non_finite={"what": "loss", "step": 2})
    me = run_lock._owner_record()  # a live run (this test) owns "live"
    (out / "live" / run_lock.LOCK_FILE).write_text(json.dumps(me))
    # "gone": a job on another host that an earlier sweep of this folder saw end
    gone = {"host": "node-gone", "pid": 4242, "job_id": "777", "scheduler": "slurm", "started": "then",
            "user": "someone-else"}
    (out / "gone" / run_lock.LOCK_FILE).write_text(json.dumps(gone))
    (out / "sweep_status.json").write_text(json.dumps({"gone": {"status": "failed", "job_id": "777"}}))

    assert _row_sweep(out, rows, *dry).returncode == 0
    plan = _plan(out)
    assert (plan["resume"]["action"], plan["resume"]["why"]) == ("launch", "resumes from its last checkpoint")
    assert (plan["changed"]["action"], plan["changed"]["why"]) == ("launch", "changed config: starts over")
    assert plan["live"]["action"] == "busy" and f"pid {os.getpid()}" in plan["live"]["why"]
    assert plan["gone"]["action"] == "launch" and plan["gone"]["ended_jobs"] == ["777"]
    assert plan["nan"]["action"] == "not_retried" and "non-finite guard (loss at step 2)" in plan["nan"]["why"]
    assert not any("ckpt_path" in o for j in plan.values() for o in j["overrides"])  # every job start decides
    assert (out / "gone" / run_lock.LOCK_FILE).exists()  # a dry run removes nothing


def test_sweep_record_judges_locks_this_host_cannot(tmp_path, monkeypatch):
    from lmk.run import scheduler
    from lmk.sweep.rows import lock_verdict

    # where SLURM's commands are installed but no controller runs, each waits out its timeout: an answer of nothing
    # either way (the verdict below), sooner
    monkeypatch.setattr(scheduler, "TIMEOUT_S", 3)

    # another user's SLURM job on another host: where the scheduler shows nothing of it, it cannot be judged
    owner = {"host": "node-gone", "pid": 4242, "job_id": "777", "scheduler": "slurm", "user": "someone-else"}
    (tmp_path / run_lock.LOCK_FILE).write_text(json.dumps(owner))
    assert lock_verdict(tmp_path, {})[0] == "unknown"  # no record either: honoured
    assert lock_verdict(tmp_path, {"status": "completed", "job_id": "777"})[0] == "dead"
    assert lock_verdict(tmp_path, {"status": "launched", "ended_jobs": ["777"]})[0] == "dead"
    # a job this sweep queued on submitit's local executor here lives as long as its controller process
    local = {**owner, "scheduler": "local", "job_id": str(os.getpid())}
    (tmp_path / run_lock.LOCK_FILE).write_text(json.dumps(local))
    queued = {"status": "launched", "job_id": str(os.getpid()), "scheduler": "local", "host": socket.gethostname()}
    assert lock_verdict(tmp_path, queued)[0] == "alive"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / run_lock.LOCK_FILE).write_text(json.dumps({**local, "job_id": str(dead.pid)}))
    assert lock_verdict(tmp_path, {**queued, "job_id": str(dead.pid)})[0] == "dead"


def test_eval_stage_skips_rows_whose_training_did_not_finish(tmp_path):
    from lmk.config.eval import EvalConfig
    from lmk.sweep.eval_stage import merge, model_fingerprint, trained_fingerprint

    train, ev = tmp_path / "train", tmp_path / "eval"
    for row, status in (("done", "done"), ("killed", "failed")):
        (train / row / "export").mkdir(parents=True)
        (train / row / "export" / "model.safetensors").write_bytes(b"weights")
        update_results(train / row, status=status)
        update_results(ev / f"{row}--s", status="done", config={"model_fingerprint": model_fingerprint(train / row)},
                       eval={"tasks": {"LocalShort": {"main_score": 0.5}}})
    assert trained_fingerprint(train / "killed") is None and trained_fingerprint(train / "done")
    suite = EvalConfig.from_cfg({"name": "x", "tasks": ["LocalShort"], "groups": {"g": ["LocalShort"]}})
    report = merge(["done", "killed"], train, ev, suite, {"s": ["LocalShort"]})
    assert report == {"done": {"s": "done"}}
    assert "eval" in read_results(train / "done") and "eval" not in read_results(train / "killed")


def test_a_fault_plan_naming_a_row_the_table_lacks_is_refused_before_anything_runs(tmp_path, capsys, monkeypatch):
    """A fault for a row that is not in the spec would never fire, and the rehearsal would pass without it."""
    plan = tmp_path / "plan.yaml"
    plan.write_text("faults:\n  - {kind: requeue, row: lmk-fixed64, step: 1}\n")
    for var in (faults.ENV_PLAN, faults.ENV_STATE):  # restored after the test (a plan that loads sets them)
        monkeypatch.setenv(var, "")
    code = sweep_main([str(ROOT / "experiments/decoder/spec.yaml"), "--scale", "tiny", "--faults", str(plan),
                       "--out", str(tmp_path / "out"), "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and "names rows ['lmk-fixed64'] that" in err and "lmk-fixed-64" in err, err
    assert not (tmp_path / "out").exists() and not os.environ.get(faults.ENV_PLAN)


def test_fault_plan_is_validated_and_each_fault_fires_once(tmp_path, monkeypatch):
    plan = tmp_path / "plan.yaml"
    plan.write_text("faults:\n  - {kind: kil, row: a, step: 1}\n")
    with pytest.raises(ValueError, match="fault kind 'kil' is not valid; allowed: kill"):
        faults.load_plan(plan)
    plan.write_text("faults:\n  - {kind: kill, row: a}\n")
    with pytest.raises(ValueError, match="needs `row` and `step`"):
        faults.load_plan(plan)
    assert faults.resolve_plan("bad-day", ROOT / "experiments" / "table2") == \
        ROOT / "experiments" / "table2" / "faults" / "bad-day.yaml"
    assert {f.kind for f in faults.load_plan(ROOT / "experiments/table2/faults/bad-day.yaml")} == set(faults.KINDS)
    for shipped in sorted(ROOT.glob("experiments/*/faults/*.yaml")):  # each names rows its table has
        spec_rows = {r.id for r in load_spec(shipped.parents[1] / "spec.yaml").rows}
        named = {f.row for f in faults.load_plan(shipped) if f.row}
        assert named and named <= spec_rows, (shipped, named - spec_rows)

    plan.write_text("faults:\n  - {kind: kill, row: a, step: 1, rank: 1}\n"
                    "  - {kind: partial_download, repo: mteb/scifact}\n")
    for var in (faults.ENV_PLAN, faults.ENV_STATE):  # restored after the test (activate sets them)
        monkeypatch.setenv(var, "")
    faults.activate(plan, tmp_path / "state")
    kill, partial = faults.active()
    assert faults.armed_step_faults("a") == [kill] and faults.armed_step_faults("b") == []
    assert faults.fire_once(kill, step=1) and not faults.fire_once(kill, step=1)
    assert faults.armed_step_faults("a") == []  # fired: a rerun meets it no more
    assert [r["id"] for r in faults.fired("a")] == [kill.id] and faults.fired("a", since=time.time() + 60) == []

    repo = tmp_path / "mirror" / "datasets" / "mteb" / "scifact"
    (repo / "corpus").mkdir(parents=True)
    for name in ("README.md", "corpus/test-00000.parquet", "qrels.parquet"):
        (repo / name).write_text("x")
    mark_complete(repo, "mteb/scifact", None)  # as the sweep's mirror preparation leaves it
    assert incomplete(repo) is None
    assert faults.inject_mirror_faults(tmp_path / "mirror", mark_interrupted) == [partial.describe()]
    left = sorted(str(p.relative_to(repo)) for p in repo.rglob("*") if p.is_file())
    assert left == sorted(["README.md", STARTED])  # the cut download, seen as such by the mirror's availability check
    assert incomplete(repo) == "a download into it started and did not finish"
    (repo / "qrels.parquet").write_text("x")  # refilled: the fault does not fire again
    assert faults.inject_mirror_faults(tmp_path / "mirror") == [] and (repo / "qrels.parquet").exists()


def test_nan_loss_fault_poisons_the_step_once(tmp_path, monkeypatch):
    """What this module injects: the loss of the step after `step` is non-finite, once; the training guard
    (lmk.train.guard) stops the run there, and a run after the fault fired trains with finite losses."""
    pairs = write_pairs(tmp_path / "pairs.jsonl")
    plan = tmp_path / "plan.yaml"
    plan.write_text("faults:\n  - {kind: nan_loss, row: r, step: 1}\n")
    for var in (faults.ENV_PLAN, faults.ENV_STATE):  # restored after the test (activate sets them)
        monkeypatch.setenv(var, "")
    faults.activate(plan, tmp_path / "state")
    run = tmp_path / "run"
    with pytest.raises(Exception, match="non-finite"):  # the training guard stops the run at the poisoned step
        in_process(run, pairs, "trainer.max_steps=3", "trainer.log_every_n_steps=1", "row=r")
    assert [r["step"] for r in faults.fired("r")] == [1]
    res = json.loads((run / "results.json").read_text())
    # the guard names the step and the batch's samples, and records the run as failed with that cause
    assert res["status"] == "failed" and res["non_finite"]["step"] == 1 and res["non_finite"]["what"] == "loss"
    assert res["non_finite"]["sample_keys"] and "non-finite loss at step 1" in res["error"]
    in_process(tmp_path / "again", pairs, "trainer.max_steps=3", "trainer.log_every_n_steps=1", "row=r")
    rows = list(csv.DictReader(open(tmp_path / "again" / "metrics.csv")))
    assert all(float(r["train/loss"]) == float(r["train/loss"]) for r in rows if r.get("train/loss"))


def test_a_job_killed_without_a_python_exception_is_a_failed_return_with_its_cause(tmp_path):
    import submitit

    from hydra_plugins.lmk_row_sweeper.launching import JobDied, ResumableTask, _outcome

    executor = submitit.AutoExecutor(folder=tmp_path / "%j", cluster="local")
    job = executor.submit(os.system, "kill -9 $PPID")  # the task SIGKILLed (as the OOM killer does)
    job._results_timeout_s = 1  # submitit's grace for a slow file system: none needed here
    with pytest.raises(submitit.core.utils.UncompletedJobError):
        job.results()  # what hydra-submitit-launcher's launch calls: it raised out of the whole sweep
    ret = _outcome(job, ["pooling=cls"])
    assert ret.status.name == "FAILED" and isinstance(ret._return_value, JobDied)
    assert f"task 0 of job {job.job_id} ended without a result: killed by a signal" in str(ret._return_value)

    # submitit's requeue (preemption, time limit) resubmits the same job: its start resumes (ckpt_path=auto)
    task = ResumableTask(launcher=None, job_dirs={3: str(tmp_path / "r")})
    again = task.checkpoint(["pooling=cls"], "hydra.sweep.dir", 3, "id", {})
    assert again.function is task and again.args == (["pooling=cls"], "hydra.sweep.dir", 3, "id", {})


def test_a_job_refused_by_a_live_runs_lock_leaves_that_runs_results_alone(tmp_path):
    """Restarting a sweep while an old job still runs: the new job is refused by the lock, and the sweeper must
    not write "failed" into the live run's results.json."""
    from hydra.core.utils import JobReturn, JobStatus

    from hydra_plugins.lmk_row_sweeper.row_sweeper import RowSweeper

    update_results(tmp_path, status="running", config_hash="abc")
    before = (tmp_path / "results.json").read_text()
    refused = JobReturn(status=JobStatus.FAILED)
    refused._return_value = run_lock.RunFolderBusy(f"run folder {tmp_path} is in use by another run")
    job = {"job": "r", "row": "r", "job_dir": str(tmp_path), "config_hash": "abc"}
    assert RowSweeper._outcome(job, refused, time.time())["status"] == "busy"
    assert (tmp_path / "results.json").read_text() == before
    crashed = JobReturn(status=JobStatus.FAILED)
    crashed._return_value = ValueError("bad data")
    assert RowSweeper._outcome(job, crashed, time.time()) == {"status": "failed", "error": "ValueError: bad data"}
    assert read_results(tmp_path)["status"] == "failed"


def test_an_old_jobs_death_read_after_a_newer_job_finished_the_row_is_stale_and_ignored(tmp_path, caplog):
    """A sweep reattached the rows' old jobs (queued by an earlier sweep, cancelled while its driver was killed);
    while it waited, newer jobs finished the rows. The old jobs' deaths, read last, are stale: each row keeps the
    newer results and record, and one line names both jobs. Row `mean`: another sweep relaunched it (its record
    names the new job); row `cls`: a run of another config finished in its folder (results.json alone says so)."""
    import logging

    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import LocalLauncher
    from omegaconf import OmegaConf

    from hydra_plugins.lmk_row_sweeper.launching import JobDied
    from hydra_plugins.lmk_row_sweeper.row_sweeper import STATUS_FILE, RowSweeper

    sweep_dir, folder = tmp_path / "sweep", tmp_path / "submitit"
    folder.mkdir()
    jobs, before = [], {}
    for row in ("mean", "cls"):
        controller = subprocess.Popen(["true"])  # the old job's controller (its id): gone, no result written
        controller.wait()
        old = str(controller.pid)
        (folder / f"{old}_0_log.err").write_text(f"slurmstepd: error: *** JOB {old} ON n1 CANCELLED AT 18:01 ***\n")
        record = {"status": "launched", "job_id": old, "scheduler": "local", "host": socket.gethostname(),
                  "folder": str(folder), "tasks": 1, "queued_at": time.time() - 600}
        jobs.append({"row": row, "job": row, "overrides": [f"pooling={row}", f"hydra.sweep.subdir={row}"],
                     "job_dir": str(sweep_dir / row), "config_hash": "the-old-config", "action": "reattach",
                     "record": record, "ended_jobs": []})
        # the newer job finished the row under a changed config (training and export written)
        before[row] = update_results(sweep_dir / row, status="done", config_hash="a-newer-config", row=row,
                                     export=str(sweep_dir / row / "export"))
    newer = {"status": "completed", "job_id": "48_1", "scheduler": "slurm", "job_dir": jobs[0]["job_dir"]}
    (sweep_dir / STATUS_FILE).write_text(json.dumps({"mean": newer}))  # what the sweep that relaunched `mean` wrote
    status = RowSweeper._settled(jobs)  # this sweep's record: the old jobs, reattached (its first write)

    launcher = LocalLauncher(submitit_folder=str(folder))
    launcher.config = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep_dir)}}})
    sweeper = RowSweeper(rows={"mean": ["pooling=mean"], "cls": ["pooling=cls"]})
    sweeper.launcher = launcher
    with caplog.at_level(logging.WARNING):
        returns = sweeper._run_batches(sweep_dir, [], jobs, status, ["python", "-m", "lmk.train"])

    deaths = [r._return_value for r in returns]  # the reattach path read each old job's death for real
    assert all(isinstance(d, JobDied) and "cancelled" in str(d) for d in deaths), deaths
    recorded = json.loads((sweep_dir / STATUS_FILE).read_text())
    for job in jobs:
        old = job["record"]["job_id"]
        assert read_results(job["job_dir"]) == before[job["row"]]  # done, the newer results: nothing written over
        stale = [r.getMessage() for r in caplog.records if old in r.getMessage()]
        assert len(stale) == 1 and "stale" in stale[0], [r.getMessage() for r in caplog.records]
        assert old in recorded[job["row"]]["ended_jobs"] and recorded[job["row"]]["status"] != "failed"
    assert "48_1" in next(r.getMessage() for r in caplog.records if jobs[0]["record"]["job_id"] in r.getMessage())
    assert {k: recorded["mean"][k] for k in newer} == newer  # the newer job holds the row on record


@pytest.mark.slow  # five 2-rank submitit jobs, one requeued: about 10 min on 2 busy cores (an uninterrupted run of
# the same rows logs the same losses at every step: checked by hand, by comparing the rows' metrics.csv)
@pytest.mark.timeout(1800)
def test_fault_plan_under_ddp_kill_timeout_and_stale_lock_then_rerun_resumes(tmp_path):
    plan = tmp_path / "plan.yaml"
    plan.write_text("faults:\n  - {kind: kill, row: a, rank: 1, step: 2}\n  - {kind: timeout, row: b, step: 1}\n"
                    "  - {kind: stale_lock, row: c, step: 1, host: node-gone-17}\n")
    state = tmp_path / "state"
    env = {**ENV, faults.ENV_PLAN: str(plan), faults.ENV_STATE: str(state)}
    out, rows = tmp_path / "sweep", {"a": ["pooling=cls"], "b": ["pooling=mean"], "c": ["pooling=lmk-fixed"]}
    # training under DDP evaluates nothing (as at paper scale: the eval stage does): validation refuses an
    # in-training eval on rank 0 while the other ranks wait, and every row would fail before any fault fires
    args = ("launcher=submitit_local", "trainer=ddp-cpu", "launcher.tasks_per_node=2", "trainer.max_steps=4",
            "train.checkpoint_every_n_steps=1", "trainer.log_every_n_steps=1", "eval.in_training=none")
    first = _row_sweep(out, rows, *args, env=env)  # the sweeper and its jobs inherit the plan
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    # every fault of the plan fired, once, in the job it names (its marker is written before it acts)
    fired = {p.stem: json.loads(p.read_text()) for p in state.glob("*.json")}
    assert sorted(fired) == ["kill-a-step2-rank1", "stale_lock-c-step1", "timeout-b-step1"], sorted(fired)
    assert fired["kill-a-step2-rank1"]["signal"] == fired["stale_lock-c-step1"]["signal"] == "SIGKILL"
    status = json.loads((out / "sweep_status.json").read_text())
    assert "task 1 of job" in status["a"]["error"] and "SIGKILL of rank 1 at step 2" in status["a"]["error"]
    assert "task 0 of job" in status["c"]["error"] and "node-gone-17" in status["c"]["error"]
    assert json.loads((out / "c" / run_lock.LOCK_FILE).read_text())["host"] == "node-gone-17"
    assert (read_results(out / "a")["status"], read_results(out / "c")["status"]) == ("failed", "failed")
    # the time-limit signal: a checkpoint at the end of step 2, submitit requeued the job, which resumed there
    assert status["b"]["status"] == "completed", status["b"]
    b = read_results(out / "b")
    assert b["status"] == "done" and b["checkpoints"]["resumed_from"].endswith("last.ckpt")
    assert b["resume"]["step"] == 2 and b["timings"]["fit_steps"] == 2 and _steps(out / "b") == [0, 1, 2, 3]
    assert [(i["status"], i["step"]) for i in b["interruptions"]] == [("interrupted", 2)]
    assert "SIGUSR2" in b["interruptions"][0]["error"] and "requeued" in b["interruptions"][0]["error"]

    again = _row_sweep(out, rows, *args, env=env)  # the same command: no fault fires twice
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "removed the stale lock of pid" in again.stdout + again.stderr
    assert sorted(p.stem for p in state.glob("*.json")) == sorted(fired)
    for row, resumed_at in (("a", 2), ("c", 1)):
        res = read_results(out / row)
        assert res["status"] == "done" and res["resume"]["step"] == resumed_at, row
        assert res["timings"]["fit_steps"] == 4 - resumed_at, row
        assert _steps(out / row) == [0, 1, 2, 3]
    assert json.loads((out / "sweep_status.json").read_text())["b"]["status"] == "skipped"


def test_a_resumed_run_that_finishes_shows_no_error_but_keeps_its_interruptions(tmp_path):
    pairs = write_pairs(tmp_path / "pairs.jsonl")
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    in_process(run, pairs, "trainer.max_steps=2", "train.checkpoint_every_n_steps=1")
    update_results(run, status="failed", error="JobDied: task 0 of job 7 ended without a result")  # the sweeper
    in_process(run, pairs, "trainer.max_steps=2", "train.checkpoint_every_n_steps=1")  # the same command again
    res = read_results(run)
    assert res["status"] == "done" and res["error"] is None and res["metrics"]["global_step"] == 2
    assert [i["error"] for i in res["interruptions"]] == ["JobDied: task 0 of job 7 ended without a result"]
    assert res["interruptions"][0]["step"] == 2 and res["timings"]["fit_steps"] == 0


def test_a_job_takes_its_folders_lock_before_hydra_writes_into_it(tmp_path):
    """A duplicate job (two sweeps racing for one row) must not touch the live run's folder: the submitted task
    claims the run lock first, and only then calls the launcher's job function (which writes .hydra/)."""
    from hydra_plugins.lmk_row_sweeper.launching import ResumableTask

    run = tmp_path / "row"
    run.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = {**run_lock._owner_record(), "pid": holder.pid, "proc_start": run_lock._proc_start(holder.pid)[1]}
        (run / run_lock.LOCK_FILE).write_text(json.dumps(live))
        called = []
        task = ResumableTask(launcher=lambda *args: called.append(args), job_dirs={0: str(run)})
        ret = task(["pooling=cls"], "hydra.sweep.dir", 0, "job_id_for_0", {})
        assert not called and ret.status.name == "FAILED"
        assert isinstance(ret._return_value, run_lock.RunFolderBusy) and str(holder.pid) in str(ret._return_value)
        assert json.loads((run / run_lock.LOCK_FILE).read_text()) == live and not (run / ".hydra").exists()
    finally:
        holder.kill()
    # once the owner is gone, the job takes the folder, runs, and gives the lock back
    holder.wait()
    task(["pooling=cls"], "hydra.sweep.dir", 0, "job_id_for_0", {})
    assert len(called) == 1 and not (run / run_lock.LOCK_FILE).exists()
