"""Launching one batch of row jobs so that a job that dies without a Python exception is a failed row.

hydra-submitit-launcher's `launch` returns `[job.results()[0] for job in jobs]`: a task killed by a signal
(SIGKILL, the OOM killer, SLURM's time limit, an NCCL watchdog abort) leaves no result, and `results()` raises
`UncompletedJobError` out of the whole sweep. Here the same submission is made (the launcher's own job
function, its executor and parameters), the job ids are reported as soon as the jobs are queued, and each
job's outcome is read on its own: a job without a result becomes a failed `JobReturn` whose error names the
cause read from submitit's job state and the tasks' logs (`JobDied`).

The submitted callable is `ResumableTask`. Before Hydra writes anything into the job's folder (`.hydra/`, the
log), the task takes the folder's run lock: a duplicate job refused by a live owner touches nothing. When the
scheduler warns of a time limit or preemption, submitit calls its `checkpoint()` and requeues the same job:
it resumes through `ckpt_path=auto` (`lmk.train.checkpoints`), as SLURM's own requeue of the batch script does.
Jobs a previous sweep launched and the scheduler still holds are reattached (`reattach`): rebuilt from their
submitit folder and id and waited for like the new ones. Other launchers (Hydra's basic one) are called as
they are.
"""

import logging
import os
import re
import socket
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence  # noqa: UP035

import submitit
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra.plugins.launcher import Launcher
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher
from omegaconf import OmegaConf

from lmk.config.schema import UserError
from lmk.run import lock as run_lock
from lmk.run.scheduler import slurm_job

log = logging.getLogger(__name__)

SCHEDULER_POLL_S = 30.0  # how often a waiting sweep asks the scheduler about its jobs

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
    """What submitit runs for a row: the Hydra launcher's job function, after taking the job folder's lock; on
    a preemption or time limit submitit calls `checkpoint()` and requeues the same job, which resumes itself."""

    def __init__(self, launcher: BaseSubmititLauncher, job_dirs: Optional[Dict[int, str]] = None) -> None:  # noqa: UP006, UP045
        self.launcher, self.job_dirs = launcher, dict(job_dirs or {})

    def __call__(self, sweep_overrides: List[str], *args: Any) -> JobReturn:  # noqa: UP006
        job_dir = self.job_dirs.get(args[1]) if len(args) > 1 else None  # args: job_dir_key, job_num, ...
        if job_dir is None:
            return self.launcher(sweep_overrides, *args)
        try:  # before Hydra writes .hydra/ into the folder (lmk.train's own claim then finds it taken by itself)
            held = run_lock.claim(job_dir, check_finished=False)
        except run_lock.RunFolderBusy as err:
            ret = JobReturn(overrides=list(sweep_overrides), status=JobStatus.FAILED)
            ret._return_value = err
            return ret
        try:
            return self.launcher(sweep_overrides, *args)
        finally:
            if held is not None:
                run_lock.release(job_dir)

    def checkpoint(self, sweep_overrides: List[str], *args: Any) -> Any:  # noqa: UP006
        return submitit.helpers.DelayedSubmission(self, list(sweep_overrides), *args)


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
    if launcher._EXECUTOR == "slurm":
        # one task that dies (OOM, a lost node) ends the whole step at once, instead of leaving the other ranks
        # in a collective until the DDP timeout (SLURM's default is KillOnBadExit=0)
        executor.update_parameters(slurm_srun_args=["--kill-on-bad-exit=1"])
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
    if not isinstance(job, submitit.SlurmJob):
        # a local job is read once its processes have exited (`wait_all`): a task's result file is there or never
        # will be. submitit's grace for a slow shared file system (15 s a dead task) would only wait
        for task in [job, *(getattr(job, "_sub_jobs", None) or [])]:
            task._results_timeout_s = 0
    try:
        return job.results()[0]
    except (submitit.core.utils.UncompletedJobError, submitit.core.utils.FailedJobError) as err:
        ret = JobReturn(overrides=list(overrides), status=JobStatus.FAILED)
        ret._return_value = JobDied(death_cause(job, err))
        return ret


def _reattached(launcher: BaseSubmititLauncher, record: Dict[str, Any]) -> Any:  # noqa: UP006
    """The submitit job of a record (`job_id`, `scheduler`, `folder`, `tasks`) a previous sweep wrote."""
    folder, tasks = record["folder"], tuple(range(int(record.get("tasks") or 1)))
    if record.get("scheduler") == "slurm":
        return submitit.SlurmJob(folder=folder, job_id=str(record["job_id"]), tasks=tasks)
    return _LocalJobByPid(folder=folder, job_id=str(record["job_id"]), tasks=tasks)


class _LocalJobByPid(submitit.LocalJob):
    """A job of submitit's local executor launched by an earlier sweep: its job id is its controller's pid, which
    a new process can only watch (submitit keeps the process handle in the launching process alone)."""

    def done(self, force_check: bool = False) -> bool:  # noqa: ARG002
        try:
            os.kill(int(self.job_id), 0)
        except ProcessLookupError:
            return True
        except (PermissionError, ValueError):
            return False
        return False


def queued_record(launcher: BaseSubmititLauncher, job: Any) -> Dict[str, Any]:  # noqa: UP006
    """What a later sweep needs to judge the job and to reattach to it; `queued_at` dates its outcome against a
    newer run of the row (`lmk.sweep.rows.newer_holder`)."""
    tasks = len(getattr(job, "_sub_jobs", None) or []) or 1
    return {"job_id": str(job.job_id), "scheduler": launcher._EXECUTOR, "host": socket.gethostname(),
            "folder": str(launcher.params["submitit_folder"]), "tasks": tasks, "queued_at": time.time()}


def is_submitit(launcher: Launcher) -> bool:
    # by name: Hydra loads plugin modules apart from sys.modules, so the launcher's class is not the one imported
    return any(c.__name__ == BaseSubmititLauncher.__name__ for c in type(launcher).__mro__)


def launch(launcher: Launcher, job_overrides: Sequence[Sequence[str]], initial_job_idx: int,
           on_queued: Optional[Callable[[List[dict]], None]] = None,  # noqa: UP006, UP045
           job_dirs: Optional[Sequence[str]] = None,  # noqa: UP045
           reattach: Sequence[Dict[str, Any]] = ()) -> List[JobReturn]:  # noqa: UP006
    """Launch `job_overrides` through `launcher` and wait for them and for the jobs of `reattach` (records of
    jobs an earlier sweep launched, with their overrides under "overrides"); one JobReturn per job, launched
    ones first, a failed one for a job that died. `on_queued` gets `queued_record`s once submitit queued the
    new jobs (not for the basic launcher, whose jobs run in this process and cannot be reattached)."""
    if not is_submitit(launcher):
        assert not reattach, "only submitit's jobs outlive the sweep that launched them"
        return list(launcher.launch(job_overrides, initial_job_idx)) if job_overrides else []
    assert launcher.config is not None
    jobs: list[Any] = []
    if job_overrides:
        executor = _executor(launcher)
        Path(str(launcher.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        params = []
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            log.debug("\t#%d : %s", idx, " ".join(filter_overrides(overrides)))  # the row lines say it
            params.append((list(overrides), "hydra.sweep.dir", idx, f"job_id_for_{idx}", Singleton.get_state()))
        dirs = {idx: d for idx, d in enumerate(job_dirs or [], start=initial_job_idx)}
        try:
            jobs = executor.map_array(ResumableTask(launcher, dirs), *zip(*params, strict=True))
        except submitit.core.utils.FailedJobError as err:
            raise refused_submission(launcher, err) from err
        if on_queued is not None:
            on_queued([queued_record(launcher, j) for j in jobs])
    old = [_reattached(launcher, r) for r in reattach]
    every = [*zip(jobs, job_overrides, strict=True), *zip(old, [r["overrides"] for r in reattach], strict=True)]
    wait_all([job for job, _ in every])
    return [_outcome(job, overrides) for job, overrides in every]


def refused_submission(launcher: Launcher, err: Exception) -> UserError:
    """The scheduler refused the submission (sbatch's error, for example a GPU request on a partition without
    GPUs): nothing was queued; name what was asked for, so the fix is one override."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    why = next((ln for ln in lines if "error" in ln.lower()), lines[0] if lines else "no reason given")
    asked = {k: launcher.config.hydra.launcher.get(k) for k in ("partition", "nodes", "tasks_per_node",
                                                                "gpus_per_node", "cpus_per_task", "timeout_min")}
    wanted = ", ".join(f"{k}={v}" for k, v in asked.items() if v is not None)
    return UserError(f"the scheduler refused the jobs ({why}); asked for {wanted}",
                     fix="set launcher.* to what the partition has (`sinfo -o '%P %D %c %G'` lists nodes, CPUs "
                         "and GPUs), e.g. launcher.gpus_per_node=0 on a CPU partition")


def _results_written(job: Any) -> bool:
    return all(t.paths.result_pickle.exists() for t in (getattr(job, "_sub_jobs", None) or [job]))


def wait_all(jobs: Sequence[Any], poll_s: float = SCHEDULER_POLL_S) -> None:
    """Until every job is over. A job that writes its results is seen at once; one that dies without them is seen
    through the scheduler's live view (`lmk.run.scheduler`: squeue first), asked every `poll_s`. submitit's own
    watcher asks sacct every 10 minutes and keeps the first final-looking state it reads: a job requeued after a
    node failure showed NODE_FAIL there while it ran again."""
    pending, last = list(jobs), float("-inf")
    while pending:
        pending = [j for j in pending if not (_results_written(j) if isinstance(j, submitit.SlurmJob) else j.done())]
        if pending and time.monotonic() - last >= poll_s:
            last = time.monotonic()
            pending = [j for j in pending if not isinstance(j, submitit.SlurmJob)
                       or slurm_job(str(j.job_id)).verdict != "dead"]
        if pending:
            time.sleep(1)
    if any(isinstance(j, submitit.SlurmJob) for j in jobs):
        submitit.SlurmJob.watcher.update()  # fresh states for the outcomes (submitit reads its own cache)
