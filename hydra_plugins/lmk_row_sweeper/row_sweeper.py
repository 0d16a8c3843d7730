"""A Hydra sweeper whose jobs are named rows, each with its own overrides.

The basic sweeper only builds cartesian products; a paper table is a list of heterogeneous rows
(`pooling=cls`, `pooling=lmk-fixed pooling.chunk_size=64`, ...). This sweeper launches one job per
row through whatever launcher is configured (local, submitit/SLURM), so the same sweep runs on a
laptop and on a cluster. It also makes the sweep resumable: a row whose job folder already holds a
completed `results.json` with the same config hash is skipped (`force=true` reruns everything), and
a failed job is recorded while the other rows go on.
"""
# No `from __future__ import annotations` here: Hydra imports plugin modules outside sys.modules and
# dataclasses then cannot resolve string annotations.

import json
import logging
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional  # noqa: UP035 (OmegaConf needs typing generics)

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

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
    # Run every row once per seed (`seed=<k>`) into <row>/seed<k>; None: once, into <row>.
    seeds: Optional[List[int]] = None  # noqa: UP006, UP045


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


def _entry_point() -> list[str]:
    """How this program was started (`python -m lmk.train`), for the printed per-job commands."""
    argv = list(getattr(sys, "orig_argv", sys.argv))
    if len(argv) >= 3 and argv[1] == "-m":
        return ["python", "-m", argv[2]]
    return ["python", sys.argv[0]]


class RowSweeper(Sweeper):
    def __init__(
        self,
        rows: dict[str, list[str]] | None = None,
        rows_file: str | None = None,
        force: bool = False,
        dry_run: bool = False,
        max_batch_size: int | None = None,
        validate: str | None = None,
        seeds: list[int] | None = None,
    ) -> None:
        super().__init__()
        self.rows = load_rows(dict(rows or {}), rows_file)
        self.force, self.dry_run, self.max_batch_size = force, dry_run, max_batch_size
        self.validate = validate
        self.seeds = [int(s) for s in seeds] if seeds else None
        self.config: DictConfig | None = None
        self.launcher: Launcher | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        self.config, self.hydra_context = config, hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    # -- planning -------------------------------------------------------------------------------
    def plan(self, arguments: list[str]) -> list[dict[str, Any]]:
        """Every row's job: overrides, folder, config hash and whether it is already done."""
        from lmk.results import STATUS_DONE, config_hash_of, read_results

        assert self.config is not None and self.hydra_context is not None
        for arg in arguments:
            key, _, value = arg.partition("=")
            if "," in value and not value.startswith(("[", "{", "'", '"')):
                raise ValueError(
                    f"hydra/sweeper=rows takes no value sweeps on the command line ({arg!r}); "
                    "put each variant in its own row"
                )
        sweep_dir = Path(self.config.hydra.sweep.dir)
        check = None
        if self.validate:
            from hydra.utils import get_method

            check = get_method(self.validate)
        jobs = []
        for row, row_overrides in self.rows.items():
            for seed in self.seeds or [None]:
                job = row if seed is None else f"{row}/seed{seed}"
                overrides = [*arguments, *row_overrides, *([] if seed is None else [f"seed={seed}"]),
                             f"++row={row}", f"hydra.sweep.subdir={job}"]
                job_cfg = self.hydra_context.config_loader.load_sweep_config(
                    master_config=self.config, sweep_overrides=list(overrides)
                )
                digest = config_hash_of(job_cfg)
                if check is not None:
                    self._check_job(check, job_cfg, sweep_dir / job, job, row_overrides)
                job_dir = sweep_dir / job
                previous = read_results(job_dir)
                done = (
                    not self.force
                    and previous.get("status") == STATUS_DONE
                    and previous.get("config_hash") == digest
                )
                if previous and previous.get("config_hash") not in (None, digest) and not self.force:
                    log.info("row %s: config changed since the last run (%s -> %s), recomputing",
                             job, previous.get("config_hash"), digest)
                if not done and previous.get("status") == STATUS_DONE and "overwrite" in job_cfg:
                    overrides.append("overwrite=true")  # rerunning a finished folder is this sweep's decision
                jobs.append({"row": row, "job": job, "seed": seed, "overrides": overrides,
                             "job_dir": str(job_dir), "config_hash": digest, "skip": done})
        return jobs

    def _check_job(self, check: Any, job_cfg: DictConfig, job_dir: Path, row: str, row_overrides: list[str]) -> None:
        """Run `check` on the job's config as the job would see it (Hydra runtime set to its folder)."""
        from hydra.core.hydra_config import HydraConfig
        from omegaconf import open_dict

        with open_dict(job_cfg):
            job_cfg.hydra.runtime.output_dir = str(job_dir)
            job_cfg.hydra.job.num = 0
        previous = HydraConfig.instance().cfg
        HydraConfig.instance().set_config(job_cfg)
        try:
            task_cfg = OmegaConf.masked_copy(job_cfg, [k for k in job_cfg if k != "hydra"])
            check(task_cfg)
        except Exception as exc:
            raise ValueError(f"row {row!r} ({' '.join(row_overrides)}): {exc}") from exc
        finally:
            if previous is not None:
                HydraConfig.instance().cfg = previous

    # -- sweeping -------------------------------------------------------------------------------
    def sweep(self, arguments: list[str]) -> list[JobReturn]:
        from lmk.results import update_results

        assert self.config is not None and self.launcher is not None
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        jobs = self.plan(list(arguments))
        launcher_cfg = OmegaConf.to_container(self.config.hydra.launcher, resolve=True)
        entry = _entry_point()
        plan = {"sweep_dir": str(sweep_dir), "launcher": launcher_cfg, "jobs": jobs,
                "command": [shlex.join([*entry, *j["overrides"]]) for j in jobs]}
        with open(sweep_dir / "jobs.json", "w") as fh:
            json.dump(plan, fh, indent=2, default=str)
        pending = [j for j in jobs if not j["skip"]]
        for j in jobs:
            log.info("row %-16s %s  %s", j["job"], "skip (done, same config)" if j["skip"] else "run ",
                     " ".join(j["overrides"]))
        if self.dry_run:
            log.info("dry run: %d jobs planned, %d to launch; plan in %s", len(jobs), len(pending),
                     sweep_dir / "jobs.json")
            return []

        batch_size = self.max_batch_size or max(len(pending), 1)
        returns: list[JobReturn] = []
        status: dict[str, Any] = {j["job"]: {"status": "skipped", "job_dir": j["job_dir"]}
                                  for j in jobs if j["skip"]}
        started = time.perf_counter()
        for first in range(0, len(pending), batch_size):
            batch = pending[first:first + batch_size]
            done_n = first
            if done_n:
                eta = (time.perf_counter() - started) / done_n * (len(pending) - done_n)
                eta_txt = f", ETA {eta / 60:.1f} min"
            else:
                eta_txt = ""
            log.info("launching row %d/%d: %s%s", first + 1, len(pending),
                     ", ".join(j["job"] for j in batch), eta_txt)
            tic = time.perf_counter()
            results = self.launcher.launch([j["overrides"] for j in batch], initial_job_idx=first)
            for job, ret in zip(batch, results):
                ok = ret.status == JobStatus.COMPLETED
                entry = {"status": "completed" if ok else "failed", "job_dir": job["job_dir"],
                         "seconds": round((time.perf_counter() - tic) / len(batch), 1)}
                if not ok:
                    # Record, keep going: one broken row must not cost the other rows.
                    err = ret._return_value
                    entry["error"] = f"{type(err).__name__}: {err}"
                    log.error("row %s failed: %s", job["job"], entry["error"])
                    update_results(job["job_dir"], status="failed", error=entry["error"],
                                   config_hash=job["config_hash"], row=job["row"])
                status[job["job"]] = entry
            returns.extend(results)
        with open(sweep_dir / "sweep_status.json", "w") as fh:
            json.dump(status, fh, indent=2)
        failed = [r for r, s in status.items() if s["status"] == "failed"]
        log.info("sweep finished: %d run, %d skipped, %d failed%s", len(pending),
                 len(jobs) - len(pending), len(failed), f" ({', '.join(failed)})" if failed else "")
        return returns
