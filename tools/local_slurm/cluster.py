"""A real two-node SLURM cluster with accounting on this machine: `python -m local_slurm up|down|status` with
`tools/` on the path (`make slurm-up | slurm-down | slurm-status`), so scheduler behaviour (requeue, time limits, node loss, job
states, pending jobs) is tested on the scheduler paper-scale users run on. `lmk.run.cluster` stays the stand-in
for machines without SLURM.

Needs root on Debian (or a derivative with apt): `up` installs Debian's slurm-wlm, munge and MariaDB when missing,
then runs munged, MariaDB, slurmdbd (so `sacct` answers, as submitit expects), slurmctld and two slurmd daemons on
this host as nodes n1 and n2 (Debian builds slurmd with MULTIPLE_SLURMD). Idempotent: a second `up` finds every
daemon by its pid file and says "already up". `down` cancels every job, then stops what `up` started; the
packages, configs, accounting database and state stay, so the next `up` takes seconds. `up` also resumes a node
left DOWN or DRAINED (by a node-loss test) whose slurmd answers. Stdlib only, as is `local_slurm.conf`
(its one import of its own): the make targets run it with the system python3 before the project is installed.
A development tool: it lives outside the `lmk` package a cluster user installs.

Files: /etc/slurm/slurm.conf, /etc/slurm/slurmdbd.conf (mode 600), /etc/munge/munge.key; logs in /var/log/slurm
(MariaDB: /var/log/mysql/error.log, munged: /var/log/munge/munged.log); state in /var/spool/slurmctld and
/var/spool/slurmd/<node>; pid files in /run. What the cluster is (nodes, paths, config texts, the settings the
scheduler tests rely on) is in `local_slurm.conf`.
"""

from __future__ import annotations

import argparse
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from .conf import (
    CLUSTER,
    CTLD_STATE,
    DAEMONS,
    DB_NAME,
    DB_USER,
    DBD_CONF,
    HOSTS,
    LOG_DIR,
    MARIADB,
    MUNGE_KEY,
    MUNGED,
    MYSQL_DATA,
    MYSQL_LOG,
    MYSQL_RUN,
    MYSQL_SOCKET,
    NODES,
    PACKAGES,
    PARTITION,
    SLURM_CONF,
    SLURMCTLD,
    SLURMD_SPOOL,
    SLURMDBD,
    SLURMDS,
    Daemon,
    hosts_with_nodes,
    slurm_conf,
    slurmdbd_conf,
)

POLICY_RC = Path("/usr/sbin/policy-rc.d")
WAIT_S = 120  # a daemon's start or stop on a loaded machine (slurmdbd creates its tables on the first start)
PREFIX = "local SLURM:"


class ClusterError(RuntimeError):
    """What is wrong and the fix, printed as one line (no traceback) with a non-zero exit."""


# ---- what cannot work here (pure: tested with the facts) -------------------------------------------------------
def refusal(euid: int, os_ids: Sequence[str], has_apt: bool, multiple_slurmd: bool | None = None) -> str | None:
    """Why `up` cannot run here as one line (what is wrong; the fix), or None. `os_ids`: ID and ID_LIKE of
    /etc/os-release; `multiple_slurmd`: whether the installed slurmd can be several nodes (None: not installed)."""
    if euid != 0:
        return ("the local SLURM cluster needs root (it installs packages and starts daemons); "
                "run it as root, e.g. `sudo make slurm-up`")
    if "debian" not in os_ids or not has_apt:
        found = "/".join(os_ids) or "unknown"
        return (f"the local SLURM cluster needs Debian or a derivative with apt-get (found {found}); "
                "use a real SLURM cluster there, or `python -m lmk.run.cluster` (SLURM's variables, no scheduler)")
    if multiple_slurmd is False:
        return ("this slurmd is built without MULTIPLE_SLURMD (`slurmd -h` lists no `-N node`), so one host cannot "
                "be two nodes; install Debian's slurmd (`apt-get install --reinstall slurmd`) or use a real cluster")
    return None


def os_ids(text: str) -> list[str]:
    """ID and ID_LIKE of an /etc/os-release text, lower case."""
    ids: list[str] = []
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key in ("ID", "ID_LIKE"):
            ids += value.strip().strip('"').lower().split()
    return ids


def host_refusal(installed: bool) -> str | None:
    """`refusal` with this machine's facts (the slurmd build is asked only once it is installed)."""
    release = Path("/etc/os-release")
    ids = os_ids(release.read_text()) if release.exists() else []
    multiple = None
    if installed and shutil.which("slurmd"):
        usage = subprocess.run(["slurmd", "-h"], capture_output=True, text=True, timeout=60)
        multiple = "-N node" in usage.stdout + usage.stderr
    return refusal(os.geteuid(), ids, shutil.which("apt-get") is not None, multiple)


# ---- the files -------------------------------------------------------------------------------------------------
def _password() -> str:
    """The database password already in slurmdbd.conf (so `up` stays idempotent), else a new one."""
    if DBD_CONF.exists():
        for line in DBD_CONF.read_text().splitlines():
            if line.startswith("StoragePass="):
                return line.split("=", 1)[1].strip()
    return secrets.token_hex(16)


def _write(path: Path, text: str, mode: int = 0o644) -> bool:
    """Write `path` (with `mode`, from its first byte: slurmdbd.conf holds a password) when its text differs;
    whether it changed."""
    if path.exists() and path.read_text() == text:
        path.chmod(mode)
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "w") as out:
        out.write(text)
    tmp.chmod(mode)  # os.open's mode passes through the umask
    tmp.replace(path)
    return True


def _mem_mb() -> int:
    """Half of this machine's memory per node (each slurmd sees all of it; RealMemory must not exceed it)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return max(int(line.split()[1]) // 1024 // len(NODES), 1)
    raise ClusterError("no MemTotal in /proc/meminfo; run on Linux")


# ---- processes -------------------------------------------------------------------------------------------------
def pid_of(daemon: Daemon) -> int | None:
    """The daemon's pid when its pid file names a live process of that name, else None."""
    try:
        pid = int(daemon.pidfile.read_text().split()[0])
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError, IndexError):
        return None
    return pid if _name_and_state(stat)[0] in daemon.names and _alive(pid) else None


def _name_and_state(stat: str) -> tuple[str, str]:
    """The process name and state letter of a /proc/<pid>/stat text (the name may hold spaces and parentheses)."""
    return stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()[0]


def _alive(pid: int) -> bool:
    """Whether the process exists and has not ended (a zombie nobody reaped has ended)."""
    try:
        return _name_and_state(Path(f"/proc/{pid}/stat").read_text())[1] not in ("Z", "X")
    except (OSError, ValueError, IndexError):
        return False


def _env() -> dict[str, str]:
    """The environment daemons and commands start with: nothing of a SLURM job this may run inside."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_"))}


def run(cmd: Sequence[str], *, check: bool = True, stdin: str | None = None,
        timeout: float = WAIT_S) -> subprocess.CompletedProcess:
    """Run a command, capturing its output; a failure names the command and its last output."""
    proc = subprocess.run(list(cmd), input=stdin, capture_output=True, text=True, timeout=timeout, env=_env())
    if check and proc.returncode != 0:
        tail = " ".join((proc.stderr + proc.stdout).split())[-400:]
        raise ClusterError(f"`{' '.join(cmd)}` failed ({proc.returncode}): {tail}; see the logs that "
                           "`make slurm-status` names")
    return proc


def wait_for(check: Callable[[], bool], what: str, log: Path | str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise ClusterError(f"{what} did not happen within {timeout:.0f} s; read {log}")
        time.sleep(0.5)


def start(daemon: Daemon, cmd: Sequence[str], *, detach: bool = False) -> None:
    """Start a daemon (it forks into the background itself, unless `detach`: then it gets a session of its own
    so it outlives this command) and wait for its pid file."""
    daemon.log.parent.mkdir(parents=True, exist_ok=True)
    if detach:
        with open(os.devnull, "rb") as null_in, open(daemon.log, "ab") as out:
            subprocess.Popen(list(cmd), stdin=null_in, stdout=out, stderr=out, start_new_session=True, env=_env())
    else:
        run(cmd)
    wait_for(lambda: pid_of(daemon) is not None, f"{daemon.label} start", daemon.log)
    print(f"{PREFIX} started {daemon.label} (pid {pid_of(daemon)})", flush=True)


def stop(daemon: Daemon) -> bool:
    """SIGTERM the daemon and wait for it to end (SIGKILL after WAIT_S); whether it was running."""
    pid = pid_of(daemon)
    if pid is None:
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:  # it ended between the look and the signal
        return False
    try:  # the process, not its pid file (removed first): the next start must not meet it on its socket
        wait_for(lambda: not _alive(pid), f"{daemon.label} stop", daemon.log, timeout=WAIT_S)
    except ClusterError:
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not _alive(pid), f"{daemon.label} end after SIGKILL", daemon.log, timeout=30)
    print(f"{PREFIX} stopped {daemon.label} (pid {pid})", flush=True)
    return True


# ---- up ------------------------------------------------------------------------------------------------------
def missing_packages() -> list[str]:
    def installed(pkg: str) -> bool:
        proc = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg], capture_output=True, text=True)
        return proc.stdout.strip() == "install ok installed"
    return [p for p in PACKAGES if not installed(p)] if shutil.which("dpkg-query") else list(PACKAGES)


def install(packages: Sequence[str]) -> None:
    """apt-get install, with services kept from starting (policy-rc.d): `up` starts them itself."""
    print(f"{PREFIX} installing {' '.join(packages)} (apt-get, about a minute)", flush=True)
    own_policy = not POLICY_RC.exists()
    if own_policy:
        _write(POLICY_RC, "#!/bin/sh\nexit 101\n", 0o755)
    try:
        env = {**_env(), "DEBIAN_FRONTEND": "noninteractive"}
        for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", *packages]):
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
            if proc.returncode != 0:
                raise ClusterError(f"`{' '.join(cmd)}` failed: {' '.join(proc.stderr.split())[-400:]}; "
                                   "check the package sources (apt-get update) and run it again")
    finally:
        if own_policy:
            POLICY_RC.unlink()


def write_files(host: str) -> dict[str, bool]:
    """Every file the daemons read; which of them changed."""
    for folder in (LOG_DIR, CTLD_STATE, *(SLURMD_SPOOL / n for n in NODES)):
        folder.mkdir(parents=True, exist_ok=True)
    hosts = hosts_with_nodes(HOSTS.read_text() if HOSTS.exists() else "")
    if hosts is not None:
        HOSTS.write_text(hosts)  # in place: /etc/hosts may be a bind mount
    munge = pwd.getpwnam("munge")
    if not MUNGE_KEY.exists():
        MUNGE_KEY.write_bytes(secrets.token_bytes(1024))
    os.chown(MUNGE_KEY, munge.pw_uid, munge.pw_gid)
    MUNGE_KEY.chmod(0o400)
    return {"hosts": hosts is not None,
            "slurm.conf": _write(SLURM_CONF, slurm_conf(host, _mem_mb())),
            "slurmdbd.conf": _write(DBD_CONF, slurmdbd_conf(host, _password()), 0o600)}


def _run_dir(path: Path, user: str) -> None:
    """A /run folder owned by the daemon's user (/run is emptied at boot)."""
    path.mkdir(parents=True, exist_ok=True)
    entry = pwd.getpwnam(user)
    os.chown(path, entry.pw_uid, entry.pw_gid)


def start_munge() -> None:
    _run_dir(MUNGED.pidfile.parent, "munge")
    start(MUNGED, ["runuser", "-u", "munge", "--", "munged", f"--pid-file={MUNGED.pidfile}"])
    run(["sh", "-c", "munge -n | unmunge"])  # a credential round trip: the key and the socket work


def start_mariadb() -> None:
    _run_dir(MYSQL_RUN, "mysql")
    if not (MYSQL_DATA / "mysql").is_dir():  # the package's postinst normally did it
        run(["mariadb-install-db", "--user=mysql", f"--datadir={MYSQL_DATA}"], timeout=600)
    MYSQL_LOG.parent.mkdir(parents=True, exist_ok=True)
    # no TCP port (slurmdbd reaches it through the socket); slurmdbd's advised lock wait
    start(MARIADB, ["mariadbd", "--user=mysql", f"--pid-file={MARIADB.pidfile}", f"--socket={MYSQL_SOCKET}",
                    f"--log-error={MYSQL_LOG}", "--skip-networking", "--innodb-lock-wait-timeout=900"], detach=True)
    wait_for(lambda: run(["mariadb-admin", f"--socket={MYSQL_SOCKET}", "ping"], check=False).returncode == 0,
             "MariaDB answering", MYSQL_LOG)


def create_database(password: str) -> None:
    # root logs in through the socket (unix_socket auth); the password goes on stdin, not the command line
    sql = (f"CREATE DATABASE IF NOT EXISTS {DB_NAME};\n"
           f"CREATE USER IF NOT EXISTS '{DB_USER}'@'localhost' IDENTIFIED BY '{password}';\n"
           f"ALTER USER '{DB_USER}'@'localhost' IDENTIFIED BY '{password}';\n"
           f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'localhost';\nFLUSH PRIVILEGES;\n")
    run(["mariadb", f"--socket={MYSQL_SOCKET}"], stdin=sql)


def _answers(cmd: Sequence[str]) -> bool:
    proc = run(cmd, check=False, timeout=60)
    return proc.returncode == 0 and "error" not in proc.stderr.lower()


def start_accounting() -> None:
    start(SLURMDBD, ["slurmdbd"])
    wait_for(lambda: _answers(["sacctmgr", "-n", "list", "cluster"]), "slurmdbd answering sacctmgr", SLURMDBD.log)
    clusters = run(["sacctmgr", "-n", "-P", "list", "cluster", "format=cluster"]).stdout.split()
    if CLUSTER not in clusters:
        run(["sacctmgr", "-i", "add", "cluster", CLUSTER])
        print(f"{PREFIX} registered cluster {CLUSTER} with slurmdbd", flush=True)


def node_states() -> dict[str, str]:
    """Node -> state as `sinfo -N` shows it (`*`: not responding); {} when slurmctld does not answer."""
    proc = run(["sinfo", "-N", "-h", "-o", "%N %T"], check=False, timeout=60) if shutil.which("sinfo") else None
    if proc is None or proc.returncode != 0:
        return {}
    return dict(line.split(None, 1) for line in proc.stdout.splitlines() if len(line.split()) == 2)


def nodes_ready() -> bool:
    """Whether both nodes take jobs; a node left DOWN or DRAINED (by a test) whose slurmd answers is resumed."""
    states = node_states()
    for node, state in states.items():
        if state.rstrip("*~#!%$@^-") in ("down", "drained", "draining") and not state.endswith("*"):
            run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
    usable = ("idle", "mixed", "allocated", "completing")
    return all(states.get(n, "").rstrip("~#!%$@^-") in usable for n in NODES)


def start_slurm(restart: bool) -> None:
    """slurmctld and the two slurmd (restarted when slurm.conf changed under them)."""
    if restart:
        for daemon in (*SLURMDS, SLURMCTLD):
            stop(daemon)
    if pid_of(SLURMCTLD) is None:
        start(SLURMCTLD, ["slurmctld"])
    wait_for(lambda: "UP" in run(["scontrol", "ping"], check=False, timeout=60).stdout, "slurmctld answering",
             SLURMCTLD.log)
    for node, daemon in zip(NODES, SLURMDS):
        if pid_of(daemon) is None:
            start(daemon, ["slurmd", "-N", node])
    wait_for(nodes_ready, f"nodes {', '.join(NODES)} idle in sinfo -N", LOG_DIR)
    wait_for(lambda: _answers(["sacct", "-n", "-X", "-a"]), "sacct answering", SLURMDBD.log)


def up() -> int:
    problem = host_refusal(installed=False)
    if problem:
        raise ClusterError(problem)
    missing = missing_packages()
    if missing:
        install(missing)
    problem = host_refusal(installed=True)
    if problem:
        raise ClusterError(problem)
    host = socket.gethostname().split(".")[0]
    running = {d.label: pid_of(d) is not None for d in DAEMONS}
    changed = write_files(host)
    if all(running.values()) and not changed["slurm.conf"] and not changed["slurmdbd.conf"]:
        wait_for(nodes_ready, f"nodes {', '.join(NODES)} idle in sinfo -N", LOG_DIR)
        print(f"{PREFIX} already up", flush=True)
        return status()
    if not running[MUNGED.label]:
        start_munge()
    if not running[MARIADB.label]:
        start_mariadb()
    create_database(_password())
    if changed["slurmdbd.conf"]:
        stop(SLURMDBD)
    if pid_of(SLURMDBD) is None:
        start_accounting()
    start_slurm(restart=changed["slurm.conf"])
    print(f"{PREFIX} up: nodes {', '.join(NODES)} in partition {PARTITION}, accounting through slurmdbd",
          flush=True)
    return status()


# ---- down, status ----------------------------------------------------------------------------------------------
def cancel_jobs() -> None:
    """scancel every job (their slurmstepd and tasks would outlive the daemons) and wait until none is left."""
    def jobs() -> list[str]:
        return run(["squeue", "-h", "-o", "%A"], check=False, timeout=60).stdout.split()
    ids = jobs()
    if ids:
        run(["scancel", *ids], check=False)
        print(f"{PREFIX} cancelled jobs {' '.join(ids)}", flush=True)
        wait_for(lambda: not jobs(), "every job ending after scancel", SLURMCTLD.log)


def down() -> int:
    running = [d.label for d in DAEMONS if pid_of(d) is not None]
    if running and os.geteuid() != 0:
        raise ClusterError(f"stopping {', '.join(running)} needs root; run it as root, e.g. `sudo make slurm-down`")
    if pid_of(SLURMCTLD) is not None:
        cancel_jobs()
    stopped = [d.label for d in reversed(DAEMONS) if stop(d)]
    left = [d.label for d in DAEMONS if pid_of(d) is not None]
    if left:
        raise ClusterError(f"still running after down: {', '.join(left)}; read their logs (status) and stop them")
    print(f"{PREFIX} down" + ("" if stopped else " (nothing was running)"), flush=True)
    return 0


def status() -> int:
    """One line per daemon and the node states; 0 when everything runs, else 1."""
    for daemon in DAEMONS:
        pid = pid_of(daemon)
        state = f"running pid {pid}" if pid else "stopped"
        where = f"  state {daemon.where}" if daemon.where else ""
        print(f"{daemon.label:<10} {state:<18} log {daemon.log}{where}")
    states = node_states() if pid_of(SLURMCTLD) else {}
    print("nodes      " + (", ".join(f"{n} {s}" for n, s in states.items()) or "none (slurmctld is not running)"))
    print(f"config     {SLURM_CONF} {DBD_CONF}")
    return 0 if all(pid_of(d) for d in DAEMONS) else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m local_slurm",
                                     description="A two-node SLURM cluster with accounting on this machine.")
    parser.add_argument("action", choices=("up", "down", "status"))
    args = parser.parse_args(argv)
    try:
        return {"up": up, "down": down, "status": status}[args.action]()
    except ClusterError as err:
        print(f"{PREFIX} {err}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
