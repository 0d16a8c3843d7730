"""What the local SLURM cluster is (`local_slurm.cluster` runs it): its nodes, the paths of its daemons' pid files,
logs and state, and the text of its config files. Pure and stdlib-only, so the tests read the settings the
scheduler tests rely on without a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

NODES, PORTS = ("n1", "n2"), (17001, 17002)
CLUSTER, PARTITION = "lmk", "debug"
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge", "slurmdbd", "mariadb-server")
SLURM_CONF, DBD_CONF = Path("/etc/slurm/slurm.conf"), Path("/etc/slurm/slurmdbd.conf")
MUNGE_KEY, HOSTS = Path("/etc/munge/munge.key"), Path("/etc/hosts")
LOG_DIR, CTLD_STATE, SLURMD_SPOOL = Path("/var/log/slurm"), Path("/var/spool/slurmctld"), Path("/var/spool/slurmd")
MYSQL_RUN, MYSQL_DATA, MYSQL_LOG = Path("/run/mysqld"), Path("/var/lib/mysql"), Path("/var/log/mysql/error.log")
MYSQL_SOCKET = MYSQL_RUN / "mysqld.sock"
DB_NAME, DB_USER = "slurm_acct_db", "slurm"


@dataclass(frozen=True)
class Daemon:
    """One daemon `up` starts, found again by its pid file (and its process name, so a reused pid is not it)."""

    label: str
    names: tuple[str, ...]  # /proc/<pid>/comm of the daemon (Debian's slurm binaries are *-wlm behind links)
    pidfile: Path
    log: Path
    where: str = ""  # its state or spool folder, shown by `status`


MUNGED = Daemon("munged", ("munged",), Path("/run/munge/munged.pid"), Path("/var/log/munge/munged.log"))
MARIADB = Daemon("mariadb", ("mariadbd", "mysqld"), MYSQL_RUN / "mysqld.pid", MYSQL_LOG, str(MYSQL_DATA))
SLURMDBD = Daemon("slurmdbd", ("slurmdbd", "slurmdbd-wlm"), Path("/run/slurmdbd.pid"), LOG_DIR / "slurmdbd.log")
SLURMCTLD = Daemon("slurmctld", ("slurmctld", "slurmctld-wlm"), Path("/run/slurmctld.pid"),
                   LOG_DIR / "slurmctld.log", str(CTLD_STATE))
SLURMDS = tuple(Daemon(f"slurmd {n}", ("slurmd", "slurmd-wlm"), Path(f"/run/slurmd.{n}.pid"),
                       LOG_DIR / f"slurmd.{n}.log", str(SLURMD_SPOOL / n)) for n in NODES)
DAEMONS = (MUNGED, MARIADB, SLURMDBD, SLURMCTLD, *SLURMDS)  # start order; `down` stops in reverse


def slurm_conf(host: str, mem_mb: int) -> str:
    """slurm.conf of the two-node cluster on `host` (each node claims `mem_mb` of its memory)."""
    nodes = "\n".join(f"NodeName={n} NodeHostname={host} Port={p} CPUs=1 RealMemory={mem_mb} State=UNKNOWN"
                      for n, p in zip(NODES, PORTS))
    return f"""\
# Written by `make slurm-up` (tools/local_slurm), which rewrites it: edit the module instead.
# Two nodes on one host: two slurmd daemons (-N n1, -N n2), each with its own port, spool, log and pid file (%n).
ClusterName={CLUSTER}
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# A requeued job waits in PENDING (BeginTime) for the credential lifetime + 1 s (default 120 s; 5 is the least
# accepted): 10 s keeps requeue tests short and still covers a step launch on a loaded machine.
AuthInfo=cred_expire=10
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# Pending jobs are looked at every 5 s (defaults 60 s and 30 s): a requeued job starts soon after its BeginTime.
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=5,bf_interval=5
# Batch jobs are requeueable (scontrol requeue, a node failure), as on most sites; a node back is used again.
JobRequeue=1
ReturnToService=2
# A time limit's SIGTERM is followed by SIGKILL 5 s later (default 30 s). slurmctld looks at time limits every
# 30 s, so a job ends up to 30 s past its --time, and `--signal=SIG@S` may come up to 60 s early (man sbatch).
KillWait=5
# Finished jobs stay in squeue --states=all / scontrol show job for an hour (default 5 min).
MinJobAge=3600
# A node whose slurmd stops answering is DOWN after 30 s (default 300 s): node-loss tests wait on it.
SlurmdTimeout=30
# Users see only their own jobs, as on many sites (root, the SlurmUser, sees all): a run lock of another user's
# job must read "unknown" there, never "dead".
PrivateData=jobs
InactiveLimit=0
Waittime=0
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobAcctGatherType=jobacct_gather/linux
JobCompType=jobcomp/none
MailProg=/bin/true
StateSaveLocation={CTLD_STATE}
SlurmctldPidFile={SLURMCTLD.pidfile}
SlurmctldLogFile={SLURMCTLD.log}
SlurmdSpoolDir={SLURMD_SPOOL}/%n
SlurmdPidFile=/run/slurmd.%n.pid
SlurmdLogFile={LOG_DIR}/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
# CPUs=1 per node: any machine has it, and a 2-node x 1-task job then fills the cluster, so a second one pends
# as on a busy site (jobs ask --cpus-per-task=1; launcher.cpus_per_task=1).
{nodes}
PartitionName={PARTITION} Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP
"""


def slurmdbd_conf(host: str, password: str) -> str:
    """slurmdbd.conf (mode 600: it holds the database password)."""
    return f"""\
# Written by `make slurm-up` (tools/local_slurm), which rewrites it.
AuthType=auth/munge
DbdHost={host}
SlurmUser=root
LogFile={SLURMDBD.log}
PidFile={SLURMDBD.pidfile}
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser={DB_USER}
StoragePass={password}
StorageLoc={DB_NAME}
# slurm.conf's PrivateData binds squeue only; sacct asks slurmdbd, which shows every user's jobs unless told too
PrivateData=jobs
"""


def hosts_with_nodes(text: str) -> str | None:
    """/etc/hosts with the node names added on 127.0.0.1 (None when every one is there): Lightning takes the
    rendezvous address from the first host of SLURM_JOB_NODELIST, so n1 must resolve."""
    names = {name for line in text.splitlines() for name in line.split("#")[0].split()[1:]}
    missing = [n for n in NODES if n not in names]
    if not missing:
        return None
    sep = "\n" if text and not text.endswith("\n") else ""
    return f"{text}{sep}127.0.0.1 {' '.join(missing)}  # nodes of the local SLURM cluster (tools/local_slurm)\n"
