"""Launching one batch of row jobs so that a job that dies without a Python exception is a failed row.

hydra-submitit-launcher's `launch` returns `[job.results()[0] for job in jobs]`: a task killed by a signal
(SIGKILL, the OOM killer, SLURM's time limit, an NCCL watchdog abort) leaves no result, and `results()` raises
`UncompletedJobError` out of the whole sweep. Here the same submission is made (the launcher's own job
function, its executor and parameters), the job ids are reported as soon as the jobs are queued, and each
job's outcome is read on its own: a job without a result becomes a failed `JobReturn` whose error names the
cause read from submitit's job state and the tasks' logs (`JobDied`).

The submitted callable is `ResumableTask`: submitit calls its `checkpoint()` when the scheduler signals a
preemption or time limit, and the requeued job resumes from `ckpt_path=last` instead of starting over.
Other launchers (Hydra's basic one) are called as they are.
"""

import logging
import re
import socket
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence  # noqa: UP035

import submitit
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra.plugins.launcher import Launcher
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher
from omegaconf import OmegaConf

log = logging.getLogger(__name__)

# What a task's log or the scheduler's state says about a death without a Python exception, most specific first.
_CAUSES = (
    ("timed out", re.compile(r"TIMEOUT|DUE TO TIME LIMIT|timed-out too many times|this job is timed-out")),
    ("out of memory", re.compile(r"OUT_OF_MEMORY|oom[-_ ]kill|Out Of Memory|CUDA out of memory", re.I)),
    ("NCCL abort", re.compile(r"NCCL.*(watchdog|abort|timeout)|ProcessGroupNCCL", re.I)),
    ("preempted", re.compile(r"PREEMPTED|this job is preempted")),
    ("node failure", re.compile(r"NODE_FAIL")),
    ("cancelled", re.compile(r"CANCELLED")),
)


class JobDied(RuntimeError):
    """A job that ended without returning: killed by a signal, out of memory, timed out, ..."""


class ResumableTask:
    """What submitit runs for a row: the Hydra launcher's job function; on preemption or time limit
    submitit calls `checkpoint()` and requeues what it returns: the same job, resuming from `last`."""

    def __init__(self, launcher: BaseSubmititLauncher, resume_override: Optional[str]) -> None:  # noqa: UP045
        self.launcher, self.resume_override = launcher, resume_override

    def __call__(self, sweep_overrides: List[str], *args: Any) -> JobReturn:  # noqa: UP006
        return self.launcher(sweep_overrides, *args)

    def checkpoint(self, sweep_overrides: List[str], *args: Any) -> Any:  # noqa: UP006
        overrides = list(sweep_overrides)
        if self.resume_override:
            key = self.resume_override.partition("=")[0]
            overrides = [o for o in overrides if o.lstrip("+~").partition("=")[0] != key] + [self.resume_override]
        return submitit.helpers.DelayedSubmission(self, overrides, *args)


def _executor(launcher: BaseSubmititLauncher) -> Any:
    """The executor hydra-submitit-launcher's `launch` builds, with the same parameters."""
    params = dict(launcher.params)
    init_params = {"folder": params["submitit_folder"]}
    if "max_num_timeout" in params:
        init_params[f"{launcher._EXECUTOR}_max_num_timeout"] = params["max_num_timeout"]
    executor = submitit.AutoExecutor(cluster=launcher._EXECUTOR, **init_params)
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    executor.update_parameters(**{k if k in base else f"{launcher._EXECUTOR}_{k}": v for k, v in params.items()
                                  if k not in ("max_num_timeout", "submitit_folder")})
    return executor


def _tail(path: Path, size: int = 4000) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(fh.tell() - size, 0))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def death_cause(job: Any, error: BaseException) -> str:
    """Why `job` ended without a result, from submitit's job state and its tasks' logs (one line)."""
    tasks = list(getattr(job, "_sub_jobs", None) or [job])
    dead = [t for t in tasks if not t.paths.result_pickle.exists()]
    state = str(job.state)
    logs = " ".join(_tail(t.paths.stderr) + _tail(t.paths.stdout) for t in dead or tasks)
    text = f"{state} {logs} {error}"
    kind = next((name for name, pattern in _CAUSES if pattern.search(text)), None)
    who = f"task {', '.join(str(t.task_id) for t in dead)}" if dead else "the job"
    if kind is None:
        kind = "killed by a signal or exited without a Python exception (SIGKILL, the OOM killer, ...)"
    where = dead[0].paths.stderr if dead else tasks[0].paths.stderr
    return (f"{who} of job {job.job_id} ended without a result: {kind} (scheduler state {state}; log {where})"
            + "".join(f"; task {t.task_id} raised {e}" for t, e in _task_errors(tasks, dead)[:1]))


def _task_errors(tasks: List[Any], dead: List[Any]) -> List[Any]:  # noqa: UP006
    """(task, "Type: message") of the tasks that returned a failure (e.g. the rank whose CUDA OOM made the
    others abort): the first of them is often the root cause of the deaths."""
    out = []
    for task in (t for t in tasks if t not in dead):
        try:
            ret = task.result()
        except Exception:  # noqa: BLE001 - an unreadable result says nothing more
            continue
        err = getattr(ret, "_return_value", None)
        if getattr(ret, "status", None) == JobStatus.FAILED and isinstance(err, BaseException):
            out.append((task, f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"))
    return out


def _outcome(job: Any, overrides: Sequence[str]) -> JobReturn:
    try:
        return job.results()[0]
    except (submitit.core.utils.UncompletedJobError, submitit.core.utils.FailedJobError) as err:
        ret = JobReturn(overrides=list(overrides), status=JobStatus.FAILED)
        ret._return_value = JobDied(death_cause(job, err))
        return ret


def launch(launcher: Launcher, job_overrides: Sequence[Sequence[str]], initial_job_idx: int,
           resume_override: Optional[str] = None,  # noqa: UP045
           on_queued: Optional[Callable[[List[dict]], None]] = None) -> List[JobReturn]:  # noqa: UP006, UP045
    """Launch `job_overrides` through `launcher`; one JobReturn per job, a failed one for a job that died.
    `on_queued` gets [{"job_id", "scheduler", "host"}] per job once submitit queued them (not for the basic
    launcher, whose jobs run in this process)."""
    # by name: Hydra loads plugin modules apart from sys.modules, so the launcher's class is not the one imported
    if not any(c.__name__ == BaseSubmititLauncher.__name__ for c in type(launcher).__mro__):
        return list(launcher.launch(job_overrides, initial_job_idx))
    assert launcher.config is not None
    executor = _executor(launcher)
    Path(str(launcher.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
    params = []
    for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
        log.info("\t#%d : %s", idx, " ".join(filter_overrides(overrides)))
        params.append((list(overrides), "hydra.sweep.dir", idx, f"job_id_for_{idx}", Singleton.get_state()))
    jobs = executor.map_array(ResumableTask(launcher, resume_override), *zip(*params, strict=True))
    if on_queued is not None:
        on_queued([{"job_id": str(j.job_id), "scheduler": launcher._EXECUTOR, "host": socket.gethostname()}
                   for j in jobs])
    return [_outcome(job, overrides) for job, overrides in zip(jobs, job_overrides, strict=True)]
