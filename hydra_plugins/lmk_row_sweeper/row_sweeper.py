"""A Hydra sweeper whose jobs are named rows, each with its own overrides.

The basic sweeper only builds cartesian products; a paper table is a list of heterogeneous rows
(`pooling=cls`, `pooling=lmk-fixed pooling.chunk_size=64`, ...). This sweeper launches one job per
row through whatever launcher is configured (local, submitit/SLURM), so the same sweep runs on a
laptop and on a cluster. What it does with each row (skip a finished one, reattach to a job an earlier sweep
launched, leave a folder another run holds, not retry a NaN, launch) is decided by `lmk.sweep.rows`; this
plugin gathers the facts and adapts the answer to Hydra's launcher. A failed job, one killed without a Python
exception too (`launching.py`), is recorded while the other rows go on. The sweep's record of its jobs
(`sweep_status.json`: job ids, scheduler, submitit folder) lets a restarted sweep find them again.
"""
# No `from __future__ import annotations` here: Hydra imports plugin modules outside sys.modules and
# dataclasses then cannot resolve string annotations.

import difflib
import json
import logging
import shlex
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional  # noqa: UP035 (OmegaConf needs typing generics)

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from hydra.utils import get_method
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from hydra_plugins.lmk_row_sweeper.launching import is_submitit, launch
from lmk.config import ConfigError, effective_batch
from lmk.run import faults
from lmk.run import lock as run_lock
from lmk.run.checkpoint_dir import candidates, move_aside
from lmk.run.cli import error_line
from lmk.run.console import verbose
from lmk.run.results import Results, config_hash_of, update_results
from lmk.run.umask_files import write_json
from lmk.sweep import rows as row_rules
from lmk.sweep.jobs import job_id, job_overrides
from lmk.sweep.report import print_line, quiet_launcher, result_line, start_line

log = logging.getLogger(__name__)


@dataclass
class RowSweeperConf:
    _target_: str = "hydra_plugins.lmk_row_sweeper.row_sweeper.RowSweeper"
    # row id -> list of overrides; or a YAML file with that mapping (written by `lmk.sweep`).
    rows: Dict[str, List[str]] = field(default_factory=dict)  # noqa: UP006
    rows_file: Optional[str] = None  # noqa: UP045
    force: bool = False
    dry_run: bool = False
    # None: launch all pending rows at once (a cluster runs them in parallel); 1: one at a time.
    max_batch_size: Optional[int] = None  # noqa: UP045
    # Dotted path of a function called with each job's config before anything launches (e.g.
    # lmk.config.validate): a bad row fails the whole sweep in seconds, not after the first row.
    validate: Optional[str] = None  # noqa: UP045
    # Dotted path of a function called with each job's config that returns a dict with a "summary"
    # line (printed per row, stored in jobs.json): by default the per-device memory estimate against
    # launcher.gpu_memory_gb. Null to turn it off.
    report: Optional[str] = "lmk.sweep.cost.job_report"  # noqa: UP045
    # Run every row once per seed (`seed=<k>`) into <row>/seed<k>; None: once, into <row>.
    seeds: Optional[List[int]] = None  # noqa: UP006, UP045
    # Launch rows the non-finite guard stopped under the same config again (they replay the same batches).
    retry_nonfinite: bool = False


ConfigStore.instance().store(group="hydra/sweeper", name="rows", node=RowSweeperConf, provider="lmk")


def load_rows(rows: dict[str, list[str]] | None, rows_file: str | None) -> dict[str, list[str]]:
    merged: dict[str, list[str]] = {}
    if rows_file:
        loaded = OmegaConf.to_container(OmegaConf.load(rows_file), resolve=True)
        if not isinstance(loaded, dict):
            raise ValueError(f"{rows_file}: expected a mapping row -> list of overrides")
        merged.update({str(k): [str(o) for o in v] for k, v in loaded.items()})
    merged.update({str(k): [str(o) for o in v] for k, v in (rows or {}).items()})
    if not merged:
        raise ValueError("hydra/sweeper=rows needs rows: set hydra.sweeper.rows or hydra.sweeper.rows_file")
    return merged


def _effective_batch(job_cfg: DictConfig) -> Optional[Dict[str, Any]]:  # noqa: UP006, UP045
    """Queries per optimiser step of a training job (lmk.config.effective_batch); None for other jobs."""
    if "trainer" not in job_cfg or "data" not in job_cfg:
        return None
    try:
        # read key by key: interpolations (trainer.devices: ${launcher.gpus_per_node}) resolve in the job's config
        trainer = {k: job_cfg.trainer.get(k) for k in ("devices", "num_nodes", "accumulate_grad_batches")}
        return effective_batch({"data": {"batch_size": job_cfg.data.get("batch_size")}, "trainer": trainer})
    except Exception as exc:  # a value that only resolves inside the job: say so, plan anyway
        log.warning("effective batch not computable before launch: %s", exc)
        return None


def _entry_point() -> list[str]:
    """How this program was started (`python -m lmk.train`), for the printed per-job commands."""
    argv = list(getattr(sys, "orig_argv", sys.argv))
    if len(argv) >= 3 and argv[1] == "-m":
        return ["python", "-m", argv[2]]
    return ["python", sys.argv[0]]


def _row_error(row: str, row_overrides: list[str], exc: Exception, config: Any) -> Exception:
    """A compact error naming the row whose overrides do not compose, with the nearest valid key."""
    # Hydra's first line ("Could not override 'x.y'.") without its advice to append with `+` (a typo is
    # the likely cause in a spec row), then OmegaConf's reason ("Key 'y' is not in struct").
    reason = str(exc).splitlines()[0].rstrip(".") if str(exc) else type(exc).__name__
    cause = exc.__cause__
    if cause is not None and str(cause):
        reason += f": {str(cause).splitlines()[0]}"
    full_key = getattr(cause, "full_key", None)
    if full_key:
        parent, _, key = str(full_key).rpartition(".")
        node = OmegaConf.select(config, parent) if parent else config
        if isinstance(node, DictConfig):
            near = difflib.get_close_matches(key, [str(k) for k in node.keys()], n=3)
            if near:
                reason += f" (did you mean {', '.join(f'{parent}.{k}' if parent else k for k in near)}?)"
    return ConfigError(f"row {row!r} ({' '.join(row_overrides)}): {reason}")


STATUS_FILE = row_rules.STATUS_FILE


def _read_status(sweep_dir: Path) -> Dict[str, Any]:  # noqa: UP006
    """The previous sweep's record of this folder's jobs ({} when there is none or it is unreadable)."""
    try:
        return json.loads((sweep_dir / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return {}


def _check_launcher(job_cfg: DictConfig, job: str) -> None:
    """One key for processes per node: hydra.launcher.tasks_per_node must follow launcher.tasks_per_node (set
    apart, every job fails in Lightning with "devices=2 ... --ntasks-per-node=1 does not match")."""
    hydra_launcher = job_cfg.get("hydra", {}).get("launcher")
    if hydra_launcher is None or "tasks_per_node" not in hydra_launcher or "launcher" not in job_cfg:
        return
    try:
        mine, theirs = job_cfg.launcher.get("tasks_per_node"), hydra_launcher.get("tasks_per_node")
    except Exception:  # noqa: BLE001 - a value that resolves only inside the job: the job checks itself
        return
    if mine is not None and theirs != mine:
        raise ConfigError(f"row {job!r}: hydra.launcher.tasks_per_node={theirs} but launcher.tasks_per_node={mine}; "
                          "set launcher.tasks_per_node alone (the launcher config reads it)")


class RowSweeper(Sweeper):
    def __init__(
        self,
        rows: dict[str, list[str]] | None = None,
        rows_file: str | None = None,
        force: bool = False,
        dry_run: bool = False,
        max_batch_size: int | None = None,
        validate: str | None = None,
        report: str | None = None,
        seeds: list[int] | None = None,
        retry_nonfinite: bool = False,
    ) -> None:
        super().__init__()
        self.retry_nonfinite = retry_nonfinite
        self.rows = load_rows(dict(rows or {}), rows_file)
        self.force, self.dry_run, self.max_batch_size = force, dry_run, max_batch_size
        self.validate, self.report = validate, report
        self.seeds = [int(s) for s in seeds] if seeds else None
        self.config: DictConfig | None = None
        self.launcher: Launcher | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context = config, hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    # -- planning -------------------------------------------------------------------------------
    def plan(self, arguments: list[str]) -> list[dict[str, Any]]:
        """Every row's job: overrides, folder, config hash and whether it is already done."""
        assert self.config is not None and self.hydra_context is not None
        for arg in arguments:
            key, _, value = arg.partition("=")
            if "," in value and not value.startswith(("[", "{", "'", '"')):
                raise ValueError(
                    f"hydra/sweeper=rows takes no value sweeps on the command line ({arg!r}); "
                    "put each variant in its own row"
                )
        sweep_dir = Path(self.config.hydra.sweep.dir)
        record = _read_status(sweep_dir)
        check = get_method(self.validate) if self.validate else None
        report = get_method(self.report) if self.report else None
        jobs = []
        for row, row_overrides in self.rows.items():
            for seed in self.seeds or [None]:
                job = job_id(row, seed)  # the same job as lmk.sweep.jobs plans (download, cost estimate)
                overrides = [*job_overrides(arguments, row_overrides, row, seed), f"hydra.sweep.subdir={job}"]
                try:
                    job_cfg = self.hydra_context.config_loader.load_sweep_config(
                        master_config=self.config, sweep_overrides=list(overrides)
                    )
                except Exception as exc:
                    raise _row_error(job, row_overrides, exc, self.config) from exc
                digest = config_hash_of(job_cfg)
                if check is not None:
                    self._check_job(check, job_cfg, sweep_dir / job, job, row_overrides)
                _check_launcher(job_cfg, job)
                job_report = self._report_job(report, job_cfg, sweep_dir / job) if report is not None else None
                if job_report and job_report.get("refusal") and not self.dry_run:
                    # a job the time limit would stop before it can finish: refused before anything launches
                    raise ConfigError(f"row {job!r}: {job_report['refusal']}")
                job_dir = sweep_dir / job
                previous = Results.read(job_dir)
                state = row_rules.gather(job, job_dir, digest, previous, record.get(job) or {},
                                         bool(candidates(job_dir)))
                decision = row_rules.decide(state, self.force, self.retry_nonfinite)
                if previous.config_hash not in (None, digest) and not self.force:
                    log.info("row %s: config changed since the last run (%s -> %s), recomputing",
                             job, previous.config_hash, digest)
                if decision.overwrite and "overwrite" in job_cfg:
                    overrides.append("overwrite=true")  # rerunning a finished folder is this sweep's decision
                if state.lock == "dead" and not self.dry_run and run_lock.remove_stale(job_dir, state.lock_owner):
                    log.warning("row %s: removed the stale lock of pid %s on %s (job %s is over)", job,
                                state.lock_owner.get("pid"), state.lock_owner.get("host"),
                                state.lock_owner.get("job_id"))
                entry = {"row": row, "job": job, "seed": seed, "overrides": overrides, "job_dir": str(job_dir),
                         "config_hash": digest, "action": decision.action, "why": decision.why,
                         "skip": decision.action == "skip", "start_over": decision.start_over,
                         "effective_batch": _effective_batch(job_cfg),
                         "record": dict(record.get(job) or {}), "ended_jobs": row_rules.ended_jobs(record.get(job) or {})}
                if job_report is not None:
                    entry["report"] = job_report
                jobs.append(entry)
        return jobs

    def _check_job(self, check: Any, job_cfg: DictConfig, job_dir: Path, row: str, row_overrides: list[str]) -> None:
        """Run `check` on the job's config as the job would see it (Hydra runtime set to its folder)."""
        try:
            self._call_on_job(check, job_cfg, job_dir)
        except Exception as exc:
            # ConfigError is a compact Hydra error: one line naming the row, no traceback
            raise ConfigError(f"row {row!r} ({' '.join(row_overrides)}): {exc}") from exc

    def _report_job(self, report: Any, job_cfg: DictConfig, job_dir: Path) -> Optional[Dict[str, Any]]:  # noqa: UP006, UP045
        """The job's report (memory estimate); a failure to estimate is logged, never fatal."""
        try:
            return self._call_on_job(report, job_cfg, job_dir)
        except Exception as exc:  # noqa: BLE001 - an estimate must not stop a sweep
            log.warning("row %s: no report from %s (%s: %s)", job_dir.name, self.report, type(exc).__name__, exc)
            return None

    @staticmethod
    def _call_on_job(fn: Any, job_cfg: DictConfig, job_dir: Path) -> Any:
        # set_config makes the config read-only: a second call on the same job must reopen it
        with read_write(job_cfg), open_dict(job_cfg):
            with read_write(job_cfg.hydra.runtime):
                job_cfg.hydra.runtime.output_dir = str(job_dir)
            with read_write(job_cfg.hydra.job):
                job_cfg.hydra.job.num = 0
        previous = HydraConfig.instance().cfg
        HydraConfig.instance().set_config(job_cfg)
        try:
            task_cfg = OmegaConf.masked_copy(job_cfg, [k for k in job_cfg if k != "hydra"])
            return fn(task_cfg)
        finally:
            if previous is not None:
                HydraConfig.instance().cfg = previous

    # -- sweeping -------------------------------------------------------------------------------
    def sweep(self, arguments: list[str]) -> list[JobReturn]:
        assert self.config is not None and self.launcher is not None
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        jobs = self.plan(list(arguments))
        launcher_cfg = OmegaConf.to_container(self.config.hydra.launcher, resolve=True)
        program = _entry_point()
        plan = {"sweep_dir": str(sweep_dir), "launcher": launcher_cfg, "jobs": jobs,
                "command": [shlex.join([*program, *j["overrides"]]) for j in jobs]}
        write_json(sweep_dir / "jobs.json", plan)
        self._print_plan(jobs)
        if self.dry_run:
            log.info("dry run: %d jobs planned, %d to launch; plan in %s", len(jobs),
                     sum(j["action"] == "launch" for j in jobs), sweep_dir / "jobs.json")
            return []
        status = self._settled(jobs)
        pending = [j for j in jobs if j["action"] == "launch"]
        waiting = [j for j in jobs if j["action"] == "reattach"]
        if waiting and not is_submitit(self.launcher):
            raise ConfigError(f"rows {', '.join(j['job'] for j in waiting)} are still running as jobs of an earlier "
                              "sweep with a submitit launcher: run this sweep with that launcher (or wait for them)")
        for j in (j for j in pending if j["start_over"]):
            move_aside(j["job_dir"], "the sweep was forced (--force): the row starts over")
        faults.note_sweep_process()  # a driver_kill fault's target (its jobs inherit the list)
        returns = self._run_batches(sweep_dir, pending, waiting, status, program)
        write_json(sweep_dir / STATUS_FILE, status)
        failed = [r for r, s in status.items() if s["status"] in ("failed", "busy", "not_retried")]
        print_line(f"sweep finished: {len(pending)} run, {len(waiting)} waited for, "
                   f"{len(jobs) - len(pending) - len(waiting)} not launched, {len(failed)} failed"
                   + (f" ({', '.join(failed)})" if failed else ""))
        return returns

    def _print_plan(self, jobs: List[Dict[str, Any]]) -> None:  # noqa: UP006
        """One line per row not launched; the plan in full (effective batch, memory estimate, every override)
        for a dry run or LMK_VERBOSE=1 (otherwise jobs.json holds it)."""
        plan_log = log.info if self.dry_run or verbose() else log.debug
        for j in jobs:
            if j["action"] in ("skip", "not_retried", "reattach"):
                print_line(f"row {j['job']}: {j['action'].replace('_', ' ')} ({j['why']}) -> {j['job_dir']}")
            plan_log("row %-16s %s  %s", j["job"], j["action"], " ".join(j["overrides"]))
            batch = j["effective_batch"]
            if batch and batch["queries"] is None:
                plan_log("row %-16s effective batch %s per device x the devices found at launch (trainer.devices "
                         "is auto)", j["job"], batch["per_device"])
            elif batch:
                plan_log("row %-16s effective batch %s queries (%s per device x %s devices x %s nodes x %s "
                         "accumulation)", j["job"], batch["queries"], batch["per_device"], batch["devices"],
                         batch["nodes"], batch["accumulation"])
            if j.get("report") and j["report"].get("summary"):
                plan_log("row %-16s %s", j["job"], j["report"]["summary"])

    @staticmethod
    def _settled(jobs: List[Dict[str, Any]]) -> Dict[str, Any]:  # noqa: UP006
        """The status of the rows this sweep does not launch (skipped, busy, not retried, being waited for)."""
        status: dict[str, Any] = {}
        for j in jobs:
            base = {"job_dir": j["job_dir"], "ended_jobs": j["ended_jobs"]}
            if j["action"] == "skip":
                status[j["job"]] = {**base, "status": "skipped"}
            elif j["action"] == "busy":  # another run owns the folder: leave its results.json alone
                log.warning("row %s not launched: %s", j["job"], j["why"])
                status[j["job"]] = {**base, "status": "busy", "error": j["why"]}
            elif j["action"] == "not_retried":
                status[j["job"]] = {**base, "status": "not_retried", "error": j["why"]}
            elif j["action"] == "reattach":
                status[j["job"]] = {**j["record"], **base, "status": "reattached"}
        return status

    def _run_batches(self, sweep_dir: Path, pending: List[Dict[str, Any]], waiting: List[Dict[str, Any]],  # noqa: UP006
                     status: Dict[str, Any], program: List[str]) -> List[JobReturn]:  # noqa: UP006
        """Launch `pending` in batches (the first batch also waits for the reattached jobs of `waiting`)."""
        batch_size = self.max_batch_size or max(len(pending), 1)
        returns: list[JobReturn] = []
        started = time.perf_counter()
        for first in range(0, max(len(pending), 1), batch_size):
            batch, old = pending[first:first + batch_size], waiting if first == 0 else []
            if not batch and not old:
                break
            eta = (time.perf_counter() - started) / first * (len(pending) - first) if first else None
            for i, job in enumerate(batch, first + 1):
                print_line(start_line(job, self.rows[job["row"]], i, len(pending), program,
                                      f", ETA {eta / 60:.1f} min" if eta else ""))
            tic, since = time.perf_counter(), time.time()

            def queued(infos: list[dict], batch: list[dict] = batch) -> None:
                for job, info in zip(batch, infos):  # what a later sweep judges and reattaches this job by
                    status[job["job"]] = {"status": "launched", "job_dir": job["job_dir"], **info,
                                          "ended_jobs": job["ended_jobs"]}
                write_json(sweep_dir / STATUS_FILE, status)

            with quiet_launcher(), self._held(batch, status) as runnable:
                results = launch(self.launcher, [j["overrides"] for j in runnable], first, queued,
                                 [j["job_dir"] for j in runnable],
                                 [{**j["record"], "overrides": j["overrides"]} for j in old])
            on_record = _read_status(sweep_dir)  # as other sweeps of this folder left it while these jobs ran
            for job, ret in zip([*runnable, *old], results, strict=True):
                mine, now = status.get(job["job"], {"ended_jobs": job["ended_jobs"]}), on_record.get(job["job"]) or {}
                holder = row_rules.newer_holder(mine, now, Results.read(job["job_dir"]), job["config_hash"])
                if holder is not None:
                    status[job["job"]] = self._stale(job, mine, now, holder)
                    continue
                entry = {**mine, **self._outcome(job, ret, since), "job_dir": job["job_dir"],
                         "seconds": round((time.perf_counter() - tic) / max(len(runnable) + len(old), 1), 1)}
                print_line(result_line(job, entry["seconds"], entry.get("error")))
                status[job["job"]] = entry
            write_json(sweep_dir / STATUS_FILE, status)
            returns.extend(results)
        return returns

    @contextmanager
    def _held(self, batch: List[Dict[str, Any]], status: Dict[str, Any]) -> Iterator[List[Dict[str, Any]]]:  # noqa: UP006
        """Jobs that run in this process (Hydra's basic launcher): each folder's lock is taken here, before Hydra
        writes .hydra/ into it; a folder another live run took meanwhile is busy. submitit's jobs take their
        own (`launching.ResumableTask`)."""
        if is_submitit(self.launcher):
            yield batch
            return
        held = []
        for job in batch:
            try:
                run_lock.claim(job["job_dir"], check_finished=False)
                held.append(job)
            except run_lock.RunFolderBusy as err:
                status[job["job"]] = {"status": "busy", "job_dir": job["job_dir"], "error": error_line(err),
                                      "ended_jobs": job["ended_jobs"]}
        try:
            yield held
        finally:
            for job in held:
                run_lock.release(job["job_dir"])

    @staticmethod
    def _stale(job: Dict[str, Any], mine: Dict[str, Any], on_record: Dict[str, Any], holder: str) -> Dict[str, Any]:  # noqa: UP006
        """The row's entry when its job's outcome is stale (`row_rules.newer_holder`): the outcome is written
        nowhere (a cancelled old job's death once marked a row failed that its newer job had finished), the row
        keeps the newer job's record, and the old job counts as ended (its lock, if left, is dead)."""
        old = str(mine.get("job_id") or "")
        log.warning("row %s: the outcome of job %s is stale (%s holds the row now): ignored", job["job"], old, holder)
        newer = on_record if on_record.get("job_id") not in (None, old) else {**mine, "status": "stale"}
        return {**newer, "job_dir": job["job_dir"],
                "ended_jobs": sorted({*row_rules.ended_jobs(newer), *row_rules.ended_jobs(mine), old} - {""})}

    @staticmethod
    def _outcome(job: Dict[str, Any], ret: JobReturn, since: float) -> Dict[str, Any]:  # noqa: UP006
        """A launched job's status entry; a failure is recorded in its results.json (the others go on)."""
        if ret.status == JobStatus.COMPLETED:
            return {"status": "completed"}
        err = ret._return_value
        if isinstance(err, run_lock.RunFolderBusy) or type(err).__name__ == "RunFolderBusy":
            # refused by another run's lock: that run's results.json is not this job's to write
            return {"status": "busy", "error": error_line(err)}
        if row_rules.finished_after_all(Path(job["job_dir"]), job["config_hash"]):
            return {"status": "completed"}
        error = error_line(err)
        injected = [f["cause"] for f in faults.fired(job["row"], since) if f.get("row") == job["row"]]
        if injected:
            error += f" ({'; '.join(injected)})"
        # Record, keep going: one broken row must not cost the other rows (the console line: result_line).
        update_results(job["job_dir"], status="failed", error=error, config_hash=job["config_hash"], row=job["row"])
        return {"status": "failed", "error": error}
