"""A job's estimated wall time against the time limit of its launcher (`launcher.timeout`, minutes).

The scheduler stops a job at its limit. A job whose estimate exceeds it is refused before anything of the sweep
launches (`lmk.sweep.cost.estimate.check_sweep`), the refusal naming the fixes: a longer limit, more GPUs at the
same effective batch, or resume across jobs: with `launcher.max_requeues` = N the scheduler requeues the job at
its limit up to N times and it resumes where it stopped, so it runs in up to N + 1 segments. A training segment
keeps the steps done before the scheduler's warning signal (`launcher.signal_delay_s` ahead of the limit:
`lmk.train.requeue` saves a checkpoint then) when a step fits in that lead time, else the steps up to its last
periodic checkpoint (`train.checkpoint_every_n_steps`). An eval shard resumes from the tasks it finished (the
row's mteb cache). The local launcher sets no limit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lmk.sweep.cost.stage import StageCost, hours
from lmk.sweep.cost.training import TrainingJob


@dataclass(frozen=True)
class TimeLimit:
    minutes: int
    requeues: int = 0  # launcher.max_requeues: requeues at the time limit
    signal_delay_s: float = 0.0  # launcher.signal_delay_s: the warning (a checkpoint is saved) before the limit
    where: str = ""  # where a stage's launcher keys are set, for the fix

    @property
    def seconds(self) -> float:
        return self.minutes * 60.0

    @classmethod
    def of(cls, c: Mapping[str, Any], launcher: str | None, where: str = "") -> TimeLimit | None:
        """The limit of a job config's launcher section; None where none applies (the local launcher)."""
        section = c.get("launcher") or {}
        if not launcher or launcher == "local" or section.get("timeout") is None:
            return None
        return cls(int(section["timeout"]), int(section.get("max_requeues") or 0),
                   float(section.get("signal_delay_s") or 0), where)


@dataclass(frozen=True)
class Verdict:
    text: str  # the table's cell: "43% of 12.0 h", "2 segments of 12.0 h", "16.4 h > 12.0 h"
    wall_s: float  # the job's wall time, requeued segments included
    refusal: str | None = None


def _kept_steps(job: TrainingJob, limit: TimeLimit, every: int) -> int:
    """Steps one segment keeps: those before the warning signal when a step fits in its lead time (saved then),
    else up to the last periodic checkpoint it reaches (one every `every` steps)."""
    if job.step_s <= 0:
        return job.steps
    run_s = limit.seconds - job.overhead_s
    if 0 < job.step_s < limit.signal_delay_s:
        return max(int((run_s - limit.signal_delay_s) // job.step_s), 0)
    return max(int(run_s // job.step_s), 0) // every * every


def _more_gpus(job: TrainingJob, limit_s: float) -> str | None:
    time_left_s = limit_s - job.overhead_s - job.eval_s
    if time_left_s <= 0:
        return None
    need = math.ceil(job.compute_s * job.gpus / time_left_s)
    q, per_node = job.queries_per_step, job.gpus_per_node
    first = math.ceil(need / per_node)
    for nodes in range(first, 8 * first + 1):
        if q % (nodes * per_node) == 0:
            return (f"more GPUs at the same effective batch (at least {need}: launcher.nodes={nodes} with "
                    f"data.batch_size={q // (nodes * per_node)} keeps {q:,} queries per step)")
    return f"more GPUs at the same effective batch (at least {need}, data.batch_size lowered to keep {q:,} per step)"


def _resume(job: TrainingJob, limit: TimeLimit, kept: int) -> str:
    s = limit.seconds
    how = "at each time limit the scheduler requeues the job and it resumes from the checkpoint it saved"
    if kept:
        segments = math.ceil(job.steps / kept)
        return (f"resume across jobs (launcher.max_requeues={segments - 1}{limit.where}: {how}; {segments} "
                f"segments of {hours(s)}, each keeping {kept} steps)")
    fit = max(int((s - job.overhead_s) // job.step_s), 0) if job.step_s > 0 else 0
    if fit < 2:
        return "not resume across jobs: the start-up and one step fill the limit"
    every = fit // 2  # half a segment: an estimate that is off by 2x still reaches a checkpoint
    segments = math.ceil(job.steps / (fit // every * every))
    return (f"resume across jobs (a step outlasts the warning signal, so each segment keeps its last periodic "
            f"checkpoint: train.checkpoint_every_n_steps={every}, now {job.checkpoint_every or 'at the end only'}, "
            f"and launcher.max_requeues={segments - 1}{limit.where}: {how})")


def training_verdict(job: TrainingJob, limit: TimeLimit, source: str) -> Verdict:
    """A training job against its limit: fits, runs in requeued segments, or is refused with the fixes."""
    s = limit.seconds
    if job.wall_s <= s:
        return Verdict(f"{job.wall_s / s:.0%} of {hours(s)}", job.wall_s)
    kept = _kept_steps(job, limit, job.checkpoint_every or job.steps)
    segments = math.ceil(job.steps / kept) if kept else 0
    if kept and limit.requeues and segments <= limit.requeues + 1:
        wall = (segments - 1) * s + job.overhead_s + (job.steps - (segments - 1) * kept) * job.step_s + job.eval_s
        return Verdict(f"{segments} segments of {hours(s)} (requeued, resumed)", wall)
    fixes = [f"a longer limit (launcher.timeout={math.ceil(job.wall_s / 60)} or more{limit.where})",
             _more_gpus(job, s), _resume(job, limit, kept)]
    requeued = f" and launcher.max_requeues={limit.requeues} allows {limit.requeues + 1} segments" if limit.requeues else ""
    return Verdict(f"{hours(job.wall_s)} > {hours(s)}", job.wall_s,
                   f"a training job needs {hours(job.wall_s)} by the estimate ({job.steps} steps on {job.gpus} devices; "
                   f"{source}) but launcher.timeout={limit.minutes} stops it at {hours(s)}{requeued}; fix: "
                   + "; or ".join(f for f in fixes if f))


def _segments(seconds: Sequence[float], capacity: float) -> int:
    """Segments of `capacity` the tasks fill in order, none split (0: a task alone exceeds it)."""
    if not seconds or max(seconds) > capacity:
        return 0
    count, used = 1, 0.0
    for sec in seconds:
        if used + sec > capacity:
            count, used = count + 1, 0.0
        used += sec
    return count


def eval_verdict(stage: StageCost, limit: TimeLimit, overhead_s: float, source: str) -> Verdict:
    """The eval stage's longest shard against its limit."""
    s, longest = limit.seconds, stage.job_wall_s
    if longest <= s:
        return Verdict(f"{longest / s:.0%} of {hours(s)}", longest)
    tasks = stage.shards.get(stage.longest) or []
    seconds = [sec for _, sec in tasks]
    segments = _segments(seconds, s - overhead_s)
    if segments and limit.requeues and segments <= limit.requeues + 1:
        return Verdict(f"{segments} segments of {hours(s)} (requeued, finished tasks kept)",
                       sum(seconds) + segments * overhead_s)
    fixes = [f"a longer limit (launcher.timeout={math.ceil(longest / 60)} or more{limit.where})"]
    if len(tasks) > 1 and max(seconds) + overhead_s <= s:
        name, sec = max(tasks, key=lambda t: t[1])
        fixes.append(f"smaller shards (eval_stage.shard_by: task; the longest task, {name}, needs {hours(sec + overhead_s)})")
    if segments:
        fixes.append(f"resume across jobs (launcher.max_requeues={segments - 1}{limit.where}: a shard requeued at "
                     "its limit skips the tasks it finished)")
    return Verdict(f"{hours(longest)} > {hours(s)}", longest,
                   f"eval shard {stage.longest} needs {hours(longest)} by the estimate ({len(tasks)} tasks on one "
                   f"device; {source}) but launcher.timeout={limit.minutes} stops it at {hours(s)}; fix: "
                   + "; or ".join(fixes))
