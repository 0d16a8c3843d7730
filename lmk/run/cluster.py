"""Lightning's view of a job started by submitit's *local* executor (`launcher=submitit_local`).

On SLURM, submitit starts one task per GPU and Lightning's SLURMEnvironment reads the ranks. submitit's
local executor (the same launcher keys, on one machine: the rehearsal of a cluster run) also starts
`tasks_per_node` processes itself, but Lightning does not know it: it would spawn processes of its own
in every task. `SubmititEnvironment` reads submitit's JobEnvironment (global/local rank, world size)
so each task is one rank and Lightning spawns nothing. The rendezvous address is this machine; the
port is derived from the job id, so every task of a job agrees on it without talking first.
"""

from __future__ import annotations

import os
import zlib

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
