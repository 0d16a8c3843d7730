"""One live run per run folder: a second run refuses (naming the owner), stale locks are taken over,
a finished folder is reused only through overwrite=true (or a named checkpoint file)."""

from __future__ import annotations

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

from lmk.run import lock as run_lock
from lmk.run.results import update_results

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_train import ENV, ROOT, in_process, overrides, results, write_pairs  # noqa: E402


@pytest.fixture()
def pairs(tmp_path: Path) -> Path:
    return write_pairs(tmp_path / "pairs.jsonl")


def _train(run_dir: Path, pairs: Path, *extra: str, wait: bool = False):
    """`python -m lmk.train`: started (a Popen), or run to its end (forked from a warm interpreter: a separate
    process with its own pid, as the lock sees it)."""
    cmd = [sys.executable, "-m", "lmk.train", *overrides(run_dir, pairs, *extra)]
    if wait:
        return forked_cli.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    return subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow  # three real training processes: about 50 s on 2 busy cores
def test_second_run_in_a_live_folder_refuses_and_a_killed_owner_is_stale(tmp_path, pairs):
    run_dir = tmp_path / "run"
    owner = _train(run_dir, pairs, "trainer.max_steps=100000", "seed=1")
    try:
        deadline = time.time() + 300
        while not (run_dir / "metrics.csv").exists():  # A is training (its lock and .hydra/ are written)
            if owner.poll() is not None or time.time() > deadline:  # A's log, without waiting out its 100000 steps
                owner.kill()
                pytest.fail(f"A did not start training: {owner.communicate()[1][-3000:]}")
            time.sleep(0.5)
        # A stays alive but paused (SIGSTOP): the lock is judged by the owner's process, not by its progress, and a
        # paused A trains no steps on the cores the refused run needs
        owner.send_signal(signal.SIGSTOP)
        lock = json.loads((run_dir / run_lock.LOCK_FILE).read_text())
        assert lock["pid"] == owner.pid and lock["host"] == socket.gethostname()
        hydra_overrides = (run_dir / ".hydra" / "overrides.yaml").read_text()
        second = _train(run_dir, pairs, "trainer.max_steps=2", "seed=2", wait=True)
        err = second.stderr
        assert second.returncode != 0
        assert f"in use by another run: pid {owner.pid} on this host" in err, err[-3000:]
        # B was refused before Hydra wrote its config: A's folder is untouched.
        assert (run_dir / ".hydra" / "overrides.yaml").read_text() == hydra_overrides
        assert results(run_dir)["status"] == "running" and owner.poll() is None
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.communicate()
    # A died without releasing: its lock is stale, the next run takes the folder over.
    third = _train(run_dir, pairs, "trainer.max_steps=1", "seed=3", wait=True)
    err = third.stderr
    assert third.returncode == 0, err[-3000:]
    assert "stale lock" in err and results(run_dir)["status"] == "done"
    assert "seed=3" in (run_dir / ".hydra" / "overrides.yaml").read_text()
    assert not (run_dir / run_lock.LOCK_FILE).exists()  # released at the end


def test_finished_folder_needs_resume_or_overwrite(tmp_path, pairs):
    run_dir = tmp_path / "run"
    in_process(run_dir, pairs, "trainer.max_steps=1")
    with pytest.raises(run_lock.RunFolderBusy, match="finished run.*overwrite=true"):
        in_process(run_dir, pairs, "trainer.max_steps=1")
    assert results(run_dir)["status"] == "done"  # the refused run wrote nothing
    # (ckpt_path=last on a finished folder: test_train.py::test_same_seed_same_metrics_and_resume_continues)
    (run_dir / "metrics.csv").write_text("step,train/loss\n0,99.0\n")  # the old run's log: not appended to
    in_process(run_dir, pairs, "trainer.max_steps=1", "overwrite=true")
    assert results(run_dir)["metrics"]["global_step"] == 1 and results(run_dir)["status"] == "done"
    assert "99.0" not in (run_dir / "metrics.csv").read_text()


def _fake_lock(run_dir: Path, **record) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / run_lock.LOCK_FILE).write_text(json.dumps(record))


def test_lock_of_a_dead_pid_is_stale_and_another_host_is_honoured(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _fake_lock(tmp_path / "a", host=socket.gethostname(), pid=dead.pid, proc_start=1, started="then")
    with pytest.warns(UserWarning, match="stale lock"):
        assert run_lock.acquire(tmp_path / "a") == (tmp_path / "a" / run_lock.LOCK_FILE).resolve()
    assert json.loads((tmp_path / "a" / run_lock.LOCK_FILE).read_text())["pid"] == os.getpid()
    run_lock.acquire(tmp_path / "a")  # the owner taking it again is a no-op
    run_lock.release(tmp_path / "a")
    assert not (tmp_path / "a" / run_lock.LOCK_FILE).exists()
    # A live pid whose start time differs is a reused pid: stale too.
    _fake_lock(tmp_path / "b", host=socket.gethostname(), pid=os.getppid(), proc_start=1, started="then")
    with pytest.warns(UserWarning, match="stale lock"):
        run_lock.acquire(tmp_path / "b")
    # Another host's lock cannot be checked from here: refused, with how to clear it.
    _fake_lock(tmp_path / "c", host="node-17", pid=os.getpid(), started="then")
    with pytest.raises(run_lock.RunFolderBusy, match=r"pid \d+ on host node-17 \(cannot be checked.*delete"):
        run_lock.acquire(tmp_path / "c")


def test_lock_being_written_is_not_stale_but_an_old_unreadable_one_is(tmp_path):
    path = tmp_path / run_lock.LOCK_FILE
    path.write_text("")  # another run between creating the lock and writing its record
    with pytest.raises(run_lock.RunFolderBusy, match="another run is taking this folder right now"):
        run_lock.acquire(tmp_path)
    assert path.read_text() == ""
    os.utime(path, (time.time() - 60, time.time() - 60))  # left half-written by a run that died long ago
    with pytest.warns(UserWarning, match="stale lock"):
        run_lock.acquire(tmp_path)
    assert json.loads(path.read_text())["pid"] == os.getpid()


def _as_task(monkeypatch, rank: int, job: str = "4242") -> None:
    """This process as task `rank` of submitit local job `job` (the environment the executor gives a task)."""
    for var in ("SLURM_JOB_ID", "SLURM_PROCID", "RANK", "LOCAL_RANK", run_lock.TOKEN_VAR):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "local")
    monkeypatch.setenv("SUBMITIT_LOCAL_JOB_ID", job)
    monkeypatch.setenv("SUBMITIT_LOCAL_GLOBALID", str(rank))


@pytest.mark.parametrize("var", ["LOCAL_RANK", "SLURM_PROCID", "SUBMITIT_LOCAL_GLOBALID"])
def test_non_zero_ranks_never_lock(tmp_path, monkeypatch, var):
    _as_task(monkeypatch, 0)
    monkeypatch.setenv(var, "1")  # Lightning's DDP children, SLURM tasks, submitit's local tasks
    _fake_lock(tmp_path, host="node-3", pid=1, job_id="4242", scheduler="local")  # rank 0 of this job owns it
    update_results(tmp_path, status="done")
    lock = (tmp_path / run_lock.LOCK_FILE).read_text()
    assert run_lock.claim(tmp_path) is None and (tmp_path / run_lock.LOCK_FILE).read_text() == lock


def test_other_ranks_exit_at_once_when_rank_zero_refuses(tmp_path, monkeypatch):
    """Rank 0 refuses before any process group forms and records it: the job's other ranks raise the same
    refusal at once instead of waiting 30 minutes at the rendezvous for a rank 0 that is gone."""
    _fake_lock(tmp_path, host=socket.gethostname(), pid=os.getppid(), started="then")  # a live foreign run
    _as_task(monkeypatch, 0)
    with pytest.raises(run_lock.RunFolderBusy, match="in use by another run"):
        run_lock.claim(tmp_path)
    _as_task(monkeypatch, 1)
    t0 = time.monotonic()
    with pytest.raises(run_lock.RunFolderBusy, match="in use by another run"):
        run_lock.claim(tmp_path)
    assert time.monotonic() - t0 < 5
    _as_task(monkeypatch, 1, job="999")  # another job's refusal is not this job's: it waits (here 0.5 s)
    with pytest.raises(run_lock.RunFolderBusy, match="did not claim"):
        run_lock.follow_rank_zero(tmp_path, timeout_s=0.5)


def test_lock_names_its_job_and_is_judged_from_any_host(tmp_path, monkeypatch):
    _as_task(monkeypatch, 0, job="31337")
    path = run_lock.acquire(tmp_path / "a")
    record = json.loads(path.read_text())
    assert record["job_id"] == "31337" and record["scheduler"] == "local"
    run_lock.release(tmp_path / "a")
    # A requeued job landing on another host finds its earlier incarnation's lock: stale, taken over.
    _fake_lock(tmp_path / "b", host="node-9", pid=77, job_id="31337", scheduler="local", started="then")
    with pytest.warns(UserWarning, match="stale lock"):
        run_lock.acquire(tmp_path / "b")
    # A SLURM job on another host: the scheduler decides; on a host without one it cannot be judged. (The
    # scheduler's own verdicts, on a real cluster: tests/test_scheduler.py.)
    owner = {"host": "node-9", "pid": 77, "job_id": "555", "scheduler": "slurm", "user": "someone"}
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))
    assert run_lock.judge(owner) == "unknown"
    with pytest.raises(run_lock.RunFolderBusy, match="cannot be checked"):
        _fake_lock(tmp_path / "c", **owner, started="then")
        run_lock.acquire(tmp_path / "c")
