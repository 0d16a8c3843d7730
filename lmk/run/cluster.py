"""Lightning's view of a job started by submitit's *local* executor (`launcher=submitit_local`).

On SLURM, submitit starts one task per GPU and Lightning's SLURMEnvironment reads the ranks. submitit's
local executor (the same launcher keys, on one machine: the rehearsal of a cluster run) also starts
`tasks_per_node` processes itself, but Lightning does not know it: it would spawn processes of its own
in every task. `SubmititEnvironment` reads submitit's JobEnvironment (global/local rank, world size)
so each task is one rank and Lightning spawns nothing. The rendezvous address is this machine; the
port is derived from the job id, so every task of a job agrees on it without talking first.

`python -m lmk.run.cluster --nodes 2 --tasks-per-node 2 -- <command>` rehearses a multi-node SLURM job on one
machine: it starts nodes x tasks_per_node copies of the command, each with the environment SLURM gives a task
on its node (SLURM_JOB_ID, SLURM_NTASKS, SLURM_NTASKS_PER_NODE, SLURM_JOB_NUM_NODES, SLURM_NODEID,
SLURM_LOCALID, SLURM_PROCID, a node list that resolves to localhost, MASTER_PORT), so Lightning's own
SLURMEnvironment reads node rank, local rank and world size as on the cluster (gloo on CPU). See docs/paper-scale.md,
"Several nodes, rehearsed".
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import zlib
from collections.abc import Mapping, Sequence

import submitit
from lightning.fabric.plugins.environments import ClusterEnvironment

PORT_BASE, PORT_RANGE = 20000, 20000


def under_submitit_local() -> bool:
    """True inside a task of submitit's local executor (and not inside a SLURM job)."""
    return os.environ.get("SUBMITIT_EXECUTOR") == "local" and "SLURM_JOB_ID" not in os.environ \
        and "SUBMITIT_LOCAL_JOB_ID" in os.environ


def submitit_rank() -> int | None:
    """This task's global rank under submitit's local executor; None elsewhere (then Lightning decides)."""
    if not under_submitit_local():
        return None
    return int(submitit.JobEnvironment().global_rank)


class SubmititEnvironment(ClusterEnvironment):
    """Ranks and world size from submitit's JobEnvironment; processes are created by submitit."""

    def __init__(self) -> None:
        super().__init__()
        self._job = submitit.JobEnvironment()
        self._world_size = int(self._job.num_tasks)
        self._global_rank = int(self._job.global_rank)

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")  # the local executor runs on one machine

    @property
    def main_port(self) -> int:
        if "MASTER_PORT" in os.environ:
            return int(os.environ["MASTER_PORT"])
        # stable per job (all its tasks share the job id), spread across jobs
        return PORT_BASE + zlib.crc32(str(self._job.job_id).encode()) % PORT_RANGE

    @staticmethod
    def detect() -> bool:
        return under_submitit_local()

    def world_size(self) -> int:
        return self._world_size

    def set_world_size(self, size: int) -> None:
        pass  # submitit decided it (tasks_per_node x nodes); validate_settings checks the trainer agrees

    def global_rank(self) -> int:
        return self._global_rank

    def set_global_rank(self, rank: int) -> None:
        pass

    def local_rank(self) -> int:
        return int(self._job.local_rank)

    def node_rank(self) -> int:
        return int(self._job.node)

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        if num_devices * num_nodes != self._world_size:
            raise ValueError(
                f"submitit started {self._world_size} tasks but the trainer expects {num_devices} devices x "
                f"{num_nodes} nodes; set trainer.devices to launcher.tasks_per_node (conf/trainer/ddp-cpu.yaml "
                "does) and trainer.num_nodes to launcher.nodes"
            )


def cluster_plugins() -> list[ClusterEnvironment]:
    """The environment plugin a Trainer needs in this process ([] when Lightning detects it itself)."""
    return [SubmititEnvironment()] if under_submitit_local() else []


# ---- a multi-node SLURM job on one machine (rehearsal) --------------------------------------------------------
def slurm_task_env(node: int, local: int, nodes: int, tasks_per_node: int, job_id: str, port: int) -> dict[str, str]:
    """The variables SLURM (srun) gives task `local` of node `node`; every node is this machine (localhost)."""
    hosts = ",".join(["localhost"] * nodes)  # Lightning takes the first entry as the rendezvous address
    return {
        "SLURM_JOB_ID": job_id, "SLURM_JOB_NAME": "lmk-rehearsal",  # not bash/interactive: SLURM is detected
        "SLURM_NTASKS": str(nodes * tasks_per_node), "SLURM_NTASKS_PER_NODE": str(tasks_per_node),
        "SLURM_JOB_NUM_NODES": str(nodes), "SLURM_NNODES": str(nodes), "SLURM_NODEID": str(node),
        "SLURM_LOCALID": str(local), "SLURM_PROCID": str(node * tasks_per_node + local),
        "SLURM_JOB_NODELIST": hosts, "SLURM_NODELIST": hosts, "SLURMD_NODENAME": "localhost",
        "MASTER_PORT": str(port),
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def emulate_slurm(command: Sequence[str], nodes: int = 2, tasks_per_node: int = 2, *,
                  env: Mapping[str, str] | None = None, cwd: str | None = None, timeout: float | None = None,
                  log_dir: str | None = None) -> list[int]:
    """Run `command` as the nodes x tasks_per_node tasks of one SLURM job on this machine; their exit codes.

    Task output goes to `<log_dir>/task<rank>.log` (else it is inherited). A task that fails makes the others
    stop (SIGTERM), as SLURM ends a job step whose task failed; a timeout ends every task."""
    base = {k: v for k, v in (env or os.environ).items()
            if not k.startswith(("SLURM_", "SUBMITIT_")) and k not in ("MASTER_ADDR", "MASTER_PORT", "RANK",
                                                                         "LOCAL_RANK", "WORLD_SIZE")}
    job_id, port = str(os.getpid()), free_port()
    procs = []
    for rank in range(nodes * tasks_per_node):
        node, local = divmod(rank, tasks_per_node)
        out = open(os.path.join(log_dir, f"task{rank}.log"), "w") if log_dir else None  # noqa: SIM115
        task_env = {**base, **slurm_task_env(node, local, nodes, tasks_per_node, job_id, port)}
        procs.append((subprocess.Popen(list(command), env=task_env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT
                                       if out else None), out))
    try:
        return _wait_all([p for p, _ in procs], timeout)
    finally:
        for _, out in procs:
            if out is not None:
                out.close()


def _wait_all(procs: list[subprocess.Popen], timeout: float | None) -> list[int]:
    deadline = None if timeout is None else time.monotonic() + timeout
    while any(p.poll() is None for p in procs):
        failed = any(p.poll() not in (None, 0) for p in procs)
        if failed or (deadline is not None and time.monotonic() > deadline):
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
            break
        time.sleep(0.2)
    return [int(p.wait()) for p in procs]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lmk.run.cluster",
                                     description="Run a command as the tasks of a multi-node SLURM job, here.")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--tasks-per-node", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=None, help="seconds before every task is stopped")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command of every task")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or args.nodes < 1 or args.tasks_per_node < 1:
        parser.error("give --nodes >= 1, --tasks-per-node >= 1 and a command after --")
    codes = emulate_slurm(command, args.nodes, args.tasks_per_node, timeout=args.timeout)
    print(f"tasks exited with {codes}", file=sys.stderr)
    return max(codes, key=abs) if any(codes) else 0


if __name__ == "__main__":
    raise SystemExit(main())
