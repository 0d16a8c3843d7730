"""One stage of a sweep as the estimate sees it: its jobs' tokens, FLOPs, device-time, each job's wall time and
how many run at once, so the stage's wall time is the schedule of its real jobs, not a mean job."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


def hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


def makespan(durations: Sequence[float], parallel: int | None) -> float:
    """Wall time of jobs started in order on `parallel` slots, each as soon as one frees (None: all at once)."""
    if not durations:
        return 0.0
    if not parallel or parallel >= len(durations):
        return max(durations)
    slots = [0.0] * parallel
    for d in durations:
        heapq.heappush(slots, heapq.heappop(slots) + d)
    return max(slots)


@dataclass
class StageCost:
    stage: str
    jobs: int
    tokens: float
    flops: float
    notes: list[str] = field(default_factory=list)
    device_s: float = 0.0  # device-seconds of all jobs (GPU-seconds; rank-seconds on a CPU)
    job_wall_s: float = 0.0  # the longest job's wall time
    parallel: int | None = None  # jobs at a time (None: all at once)
    devices_per_job: int = 1
    durations: list[float] = field(default_factory=list)  # each job's wall time, in launch order
    shards: dict[str, list[tuple[str, float]]] = field(default_factory=dict)  # eval: each shard's tasks' seconds
    longest: str = ""  # which job is the longest ("each row", a shard's name)
    limit: str = ""  # the longest job against the launcher's time limit ("" where none applies)
    refusal: str | None = None  # why the longest job cannot finish within its time limit, with the fix
    maxsim: dict[str, list[Any]] = field(default_factory=dict)  # eval: a MaxSim row's index and search per task
    per_row: list[str] = field(default_factory=list)  # train: each row's GPU-hours padded and at measured lengths

    def gpu_hours(self) -> float:
        return self.device_s / 3600.0

    def wall_s(self) -> float:
        """The stage's wall time: its jobs `parallel` at a time, in launch order."""
        return makespan(self.durations or [self.job_wall_s] * self.jobs, self.parallel)

    def serial_s(self) -> float:
        return sum(self.durations or [self.job_wall_s] * self.jobs)

    def at_once(self, unit: str = "GPUs") -> str:
        """The concurrency the wall time assumes, e.g. "all 10 (200 GPUs)" or "2 (2 GPUs)"."""
        n = self.jobs if not self.parallel else min(self.parallel, self.jobs)
        label = f"all {n}" if n == self.jobs and n > 1 else str(n)
        return f"{label} ({n * self.devices_per_job} {unit})"
