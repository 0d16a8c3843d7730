"""tools/local_slurm: a real two-node SLURM cluster with accounting on this machine.

The refusals, the files it writes and `status` of a stopped cluster run everywhere; the `slurm`-marked tests
(`make test-slurm`, as root on Debian) start the cluster and run real jobs on it: a 2-node x 1-task batch job
with its ranks on n1 and n2, accounted COMPLETED by sacct, a requeue, and submitit's SLURM executor."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import submitit

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "tools"  # the rig is a development tool outside the library, run with tools/ on the path
sys.path.insert(0, str(TOOLS))
from local_slurm import cluster as ls  # noqa: E402
from local_slurm import conf  # noqa: E402

ROOT_DEBIAN = {"euid": 0, "os_ids": ["debian"], "has_apt": True}


# ---- refusals: one line, what is wrong and the fix -------------------------------------------------------------
@pytest.mark.parametrize(("facts", "what", "fix"), [
    ({"euid": 1000}, "needs root", "sudo make slurm-up"),
    ({"os_ids": ["fedora"]}, "needs Debian or a derivative with apt-get (found fedora)", "lmk.run.cluster"),
    ({"os_ids": []}, "(found unknown)", "a real SLURM cluster"),
    ({"has_apt": False}, "with apt-get", "a real SLURM cluster"),
    ({"multiple_slurmd": False}, "without MULTIPLE_SLURMD", "apt-get install --reinstall slurmd"),
])
def test_refusal_names_what_is_wrong_and_the_fix(facts, what, fix):
    line = ls.refusal(**{**ROOT_DEBIAN, **facts})
    assert line is not None and "\n" not in line
    assert what in line and fix in line.split("; ", 1)[1]


@pytest.mark.parametrize("facts", [{}, {"multiple_slurmd": True}, {"os_ids": ["ubuntu", "debian"]}])
def test_no_refusal_as_root_on_debian(facts):
    assert ls.refusal(**{**ROOT_DEBIAN, **facts}) is None


def test_os_ids_reads_id_and_id_like():
    assert ls.os_ids('NAME="Ubuntu"\nID=ubuntu\nID_LIKE=debian\n') == ["ubuntu", "debian"]
    assert ls.os_ids('ID="rocky"\nID_LIKE="rhel centos fedora"\n') == ["rocky", "rhel", "centos", "fedora"]
    assert ls.os_ids("") == []


def test_up_without_root_refuses_in_one_line_before_touching_anything(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(ls, "missing_packages", lambda: pytest.fail("up went on to the packages"))
    assert ls.main(["up"]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.splitlines() == [
        "local SLURM: the local SLURM cluster needs root (it installs packages and starts daemons); "
        "run it as root, e.g. `sudo make slurm-up`"]


def test_the_library_holds_no_code_that_installs_system_packages():
    """The rig is a development tool: what a cluster user installs (lmk/) never runs a system package manager."""
    found = [f"{path.relative_to(ROOT)}:{n}" for path in sorted((ROOT / "lmk").rglob("*.py"))
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"\b(apt-get|apt|dpkg|dpkg-query|yum|dnf)\b", line)]
    assert found == [], f"system package management inside the library: {found}"


# ---- the files it writes ---------------------------------------------------------------------------------------
def _settings(text: str) -> dict[str, str]:
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    return {line.split("=", 1)[0]: line.split("=", 1)[1] for line in lines
            if not line.startswith(("NodeName=", "PartitionName="))}


def test_slurm_conf_has_what_the_scheduler_tests_rely_on():
    text = conf.slurm_conf("vm", 12000)
    settings = _settings(text)
    assert settings["JobRequeue"] == "1" and settings["ReturnToService"] == "2"
    assert settings["AccountingStorageType"] == "accounting_storage/slurmdbd"
    assert settings["JobAcctGatherType"] == "jobacct_gather/linux"
    assert int(settings["KillWait"]) <= 10 and int(settings["MinJobAge"]) >= 600
    assert settings["AuthInfo"] == "cred_expire=10"  # a requeued job's BeginTime hold (default 120 s)
    assert settings["SlurmctldHost"] == "vm" and settings["ClusterName"] == conf.CLUSTER
    # two daemons on one host: every per-node file carries the node name (%n) or they clobber each other
    assert all("%n" in settings[key] for key in ("SlurmdSpoolDir", "SlurmdPidFile", "SlurmdLogFile"))
    nodes = [line.split() for line in text.splitlines() if line.startswith("NodeName=")]
    assert [n[0] for n in nodes] == ["NodeName=n1", "NodeName=n2"]
    assert len({n[2] for n in nodes}) == 2 and all("CPUs=1" in n and "RealMemory=12000" in n for n in nodes)
    assert "PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP" in text.splitlines()


def test_slurmdbd_conf_names_the_database_and_the_pid_file_status_reads():
    settings = _settings(conf.slurmdbd_conf("vm", "secret"))
    assert settings["StorageType"] == "accounting_storage/mysql" and settings["StoragePass"] == "secret"
    assert settings["StorageLoc"] == conf.DB_NAME and settings["PidFile"] == str(conf.SLURMDBD.pidfile)
    # both daemons hide other users' jobs: with slurm.conf's alone, sacct still shows them (the lock-verdict test)
    assert settings["PrivateData"] == "jobs" == _settings(conf.slurm_conf("vm", 12000))["PrivateData"]


def test_hosts_gain_the_node_names_once():
    hosts = "127.0.0.1 localhost\n127.0.0.1 vm"
    added = conf.hosts_with_nodes(hosts)
    assert added is not None and added.startswith(hosts + "\n") and "\n127.0.0.1 n1 n2  #" in added
    assert conf.hosts_with_nodes(added) is None
    assert conf.hosts_with_nodes("10.0.0.5 n1\n").endswith("127.0.0.1 n2  # nodes of the local SLURM cluster "
                                                          "(tools/local_slurm)\n")
    assert conf.hosts_with_nodes("127.0.0.1 localhost # n1 n2\n") is not None  # a comment names nothing


# ---- status of a stopped cluster (pid files of another root, so a running cluster here is left alone) ---------
def _daemons_under(root: Path, monkeypatch) -> tuple[conf.Daemon, ...]:
    daemons = tuple(conf.Daemon(d.label, d.names, root / d.pidfile.name, root / d.log.name, d.where)
                    for d in ls.DAEMONS)
    monkeypatch.setattr(ls, "SLURMCTLD", daemons[ls.DAEMONS.index(ls.SLURMCTLD)])
    monkeypatch.setattr(ls, "DAEMONS", daemons)
    return daemons


def test_status_of_a_stopped_cluster_says_so_and_fails(tmp_path, monkeypatch, capsys):
    daemons = _daemons_under(tmp_path, monkeypatch)
    daemons[0].pidfile.write_text(f"{os.getpid()}\n")  # a live pid of another program: not munged
    assert ls.status() == 1
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[:6]] == ["munged", "mariadb", "slurmdbd", "slurmctld", "slurmd",
                                                        "slurmd"]
    assert all(" stopped " in line and f"log {tmp_path}/" in line for line in lines[:6])
    assert lines[6] == "nodes      none (slurmctld is not running)"
    assert lines[7] == f"config     {ls.SLURM_CONF} {ls.DBD_CONF}"


def test_down_with_nothing_running_is_safe(tmp_path, monkeypatch, capsys):
    _daemons_under(tmp_path, monkeypatch)
    assert ls.down() == 0
    assert capsys.readouterr().out == "local SLURM: down (nothing was running)\n"


def test_down_refuses_without_root_and_stops_a_daemon_found_by_its_pid_file(tmp_path, monkeypatch):
    sleeper = subprocess.Popen(["sleep", "300"])  # stands for a daemon: found by pid file and process name
    try:
        daemon = conf.Daemon("sleeper", ("sleep",), tmp_path / "sleeper.pid", tmp_path / "sleeper.log")
        daemon.pidfile.write_text(f"{sleeper.pid}\n")
        monkeypatch.setattr(ls, "DAEMONS", (daemon,))
        monkeypatch.setattr(ls, "SLURMCTLD", conf.Daemon("slurmctld", ("slurmctld",), tmp_path / "none.pid",
                                                         tmp_path / "slurmctld.log"))
        assert ls.pid_of(daemon) == sleeper.pid
        monkeypatch.setattr(os, "geteuid", lambda: 1000)
        with pytest.raises(ls.ClusterError, match=r"stopping sleeper needs root; .*sudo make slurm-down"):
            ls.down()
        assert sleeper.poll() is None
        monkeypatch.undo()
        assert ls.stop(daemon) is True
        assert sleeper.wait(timeout=60) == -15 and ls.pid_of(daemon) is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_make_slurm_status_needs_nothing_beyond_the_standard_library():
    # -S: no site-packages, as the system python3 of `make slurm-up` before `make install`; the make target as
    # typed, so the rig's place outside the library stays the Makefile's business
    proc = subprocess.run(["make", "-s", "slurm-status", f"PYTHON={sys.executable} -S"], cwd=ROOT, text=True,
                          capture_output=True, timeout=120, env={"PATH": os.environ["PATH"]})
    assert proc.returncode == 0 or proc.stderr.strip().endswith("slurm-status] Error 1"), proc.stderr
    assert proc.stdout.splitlines()[3].startswith("slurmctld ") and "Traceback" not in proc.stderr


# ---- on the real cluster (make test-slurm) ---------------------------------------------------------------------
def _local_slurm(action: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", f"slurm-{action}", f"PYTHON={sys.executable}"], cwd=ROOT, text=True,
                          capture_output=True, timeout=1800)


def _processes(names: tuple[str, ...]) -> list[int]:
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        if text[text.index("(") + 1:text.rindex(")")] in names:
            pids.append(int(stat.parent.name))
    return pids


def _wait(check, what: str, timeout: float = 300):
    deadline = time.monotonic() + timeout
    while (value := check()) in (None, False, "", []):
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(1)
    return value


def _final_state(job_id: str) -> str:
    """The job's state in sacct once it has ended ("" before)."""
    out = subprocess.run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State"], capture_output=True,
                         text=True, timeout=60).stdout.split()
    return out[0] if out and out[0] not in ("PENDING", "RUNNING", "REQUEUED") else ""


@pytest.fixture(scope="module")
def cluster():
    proc = _local_slurm("up")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.mark.slurm
def test_up_twice_leaves_one_set_of_daemons(cluster):
    pids = {d.label: ls.pid_of(d) for d in ls.DAEMONS}
    assert all(pids.values()), cluster.stdout
    again = _local_slurm("up")
    assert again.returncode == 0 and "local SLURM: already up" in again.stdout, again.stdout + again.stderr
    assert {d.label: ls.pid_of(d) for d in ls.DAEMONS} == pids
    assert sorted(_processes(("slurmd", "slurmd-wlm"))) == sorted(pids[d.label] for d in ls.SLURMDS)
    assert len(_processes(("slurmctld", "slurmctld-wlm"))) == 1
    assert "nodes      n1 idle, n2 idle" in again.stdout


@pytest.mark.slurm
def test_two_node_job_has_rank_0_on_n1_and_rank_1_on_n2_and_sacct_says_completed(cluster, tmp_path):
    script = tmp_path / "ranks.sh"
    script.write_text("#!/bin/bash\nsrun bash -c 'echo \"rank=$SLURM_PROCID node=$SLURM_NODEID "
                      "host=$SLURMD_NODENAME list=$SLURM_JOB_NODELIST\"'\n")
    proc = subprocess.run(["sbatch", "--wait", "--parsable", "--nodes=2", "--ntasks-per-node=1",
                           f"--output={tmp_path}/out.txt", str(script)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().split(";")[0]
    lines = sorted((tmp_path / "out.txt").read_text().split("\n"))
    assert [line for line in lines if line] == ["rank=0 node=0 host=n1 list=n[1-2]",
                                                "rank=1 node=1 host=n2 list=n[1-2]"]
    # the controller sends the end of a job to slurmdbd on its own schedule
    assert _wait(lambda: _final_state(job_id), "sacct records the end of the job") == "COMPLETED"


@pytest.mark.slurm
def test_a_requeued_job_runs_its_batch_script_again(cluster, tmp_path):
    script = tmp_path / "requeue.sh"
    script.write_text("#!/bin/bash\necho restart=${SLURM_RESTART_COUNT:-0} >> " + str(tmp_path / "runs.txt") +
                      "\nif [ \"${SLURM_RESTART_COUNT:-0}\" = 0 ]; then sleep 600; fi\n")
    job_id = subprocess.run(["sbatch", "--parsable", "--nodes=1", "--output=/dev/null", str(script)],
                            capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    _wait(lambda: (tmp_path / "runs.txt").exists(), "the job starts")
    subprocess.run(["scontrol", "requeue", job_id], check=True, timeout=60)
    assert _wait(lambda: _final_state(job_id), "the requeued job runs again and ends") == "COMPLETED"
    assert (tmp_path / "runs.txt").read_text().split() == ["restart=0", "restart=1"]


@pytest.mark.slurm
def test_submitit_slurm_executor_runs_a_two_node_job_and_reads_its_state(cluster, tmp_path):
    def where() -> tuple[int, str]:  # nested: pickled by value, the job cannot import this test module
        return submitit.JobEnvironment().global_rank, os.environ["SLURMD_NODENAME"]

    executor = submitit.AutoExecutor(folder=tmp_path / "%j", cluster="slurm")
    executor.update_parameters(slurm_partition="debug", nodes=2, tasks_per_node=1, cpus_per_task=1,
                               timeout_min=10)
    job = executor.submit(where)
    assert job.results() == [(0, "n1"), (1, "n2")]
    assert _wait(lambda: job.state if job.state not in ("RUNNING", "PENDING", "UNKNOWN") else "",
                 "submitit reads the job's end from sacct") == "COMPLETED"
