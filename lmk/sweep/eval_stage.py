"""Evaluation as a sweep stage: one `lmk.evaluate` job per (row, shard of the suite), merged per row.

At paper scale the suite is as costly as training (BEIR-15 alone is tens of millions of documents, MLDR runs
at 8192 tokens), so the training jobs evaluate nothing (`eval.in_training: none`) and `lmk.sweep` runs this
stage after them, through the same row sweeper and Hydra launcher (SLURM array, local GPUs, CPU):

`run_stage` walks four stages once, each taking the previous one's output:

    plan_stage -> StagePlan          the suite's shards (`lmk.sweep.jobs.stage_shards`: one per eval group by default),
                                     each trained row's model fingerprint (`trained_fingerprint`), and the jobs
                                     (`lmk.sweep.jobs.stage_block`): one `<row>--<shard>` per (trained row, shard),
                                     each `lmk.evaluate model=<train run dir> eval.tasks=[...]` on one device, tagged
                                     with the row's model fingerprint
    prepare_stage -> StagePrepared   the suite's hub datasets prepared once into `<out>/eval-data`
    launch_stage -> StageLaunched    the jobs through the row sweeper: a finished shard of the same model is skipped
                                     (same config hash, status done), a crashed one (status failed / no results)
                                     reruns alone, a retrained row reruns all its shards
    merge_stage -> exit status       `merge(...)`: every finished shard's scores and per-query scores go into the
                                     training row's `results.json` "eval" section and `per_query.json` (groups
                                     recomputed over the whole suite), which the table reads as before

The shards of a row share the row's mteb cache (`<train run>/mteb_cache`, one file per task), so a shard
killed half-way resumes from the tasks it finished.

The prepared hub datasets (`python -m lmk.eval.prepared`, in the scale's environment, as the jobs would load them)
are what every job reads, with `hub.prepared=<it>`: no job converts a corpus or writes and locks a `datasets` cache
on the shared file system. A rerun finds them prepared (fingerprinted) and converts nothing. A dry run plans,
says where the data would be prepared and writes the jobs to `<out>/eval/jobs.json`; it launches and merges
nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmk.config.eval import LOCAL_TASK_NAMES, EvalConfig
from lmk.config.registry import declared_scorings
from lmk.run.results import STATUS_DONE, Results, update_results
from lmk.run.umask_files import write_json
from lmk.sweep.jobs import SEP, Block, StageSuite, stage_block, stage_shards
from lmk.sweep.spec import Scale

log = logging.getLogger(__name__)


def model_fingerprint(run_dir: str | Path) -> str | None:
    """A cheap identity of a training run's final weights (names, sizes and mtimes of export/ or the last
    checkpoint); None when the run has no model yet."""
    run_dir = Path(run_dir)
    files = sorted(p for p in (run_dir / "export").rglob("*") if p.is_file()) if (run_dir / "export").is_dir() else []
    if not files and (run_dir / "checkpoints" / "last.ckpt").is_file():
        files = [run_dir / "checkpoints" / "last.ckpt"]
    if not files:
        return None
    h = hashlib.sha256()
    for p in files:
        st = p.stat()
        h.update(f"{p.relative_to(run_dir)}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def trained_fingerprint(run_dir: str | Path) -> str | None:
    """The model fingerprint of a training run that finished (results.json `status: done`); None for a run
    that failed, was killed or still runs, even when it left `export/` or a checkpoint."""
    try:
        finished = Results.read(run_dir).status == STATUS_DONE
    except ValueError:  # unreadable results.json: not a finished run
        finished = False
    return model_fingerprint(run_dir) if finished else None


def _read(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except json.JSONDecodeError:
        log.warning("eval stage: %s is not valid JSON; treated as missing", path)
        return {}


def merge(rows: Sequence[str], train_dir: str | Path, eval_dir: str | Path, suite: EvalConfig,
          shards: Mapping[str, Sequence[str]]) -> dict[str, dict[str, Any]]:
    """Merge every row's finished shards into `<train_dir>/<row>/results.json` ("eval") and its
    `per_query.json`; returns {row: {shard: status}}. Shards of another model fingerprint are ignored."""
    from lmk.eval.score_stats import group_scores  # fast path: scipy.stats loads only when shards are merged

    report: dict[str, dict[str, Any]] = {}
    for row in rows:
        run = Path(train_dir) / row
        fp = trained_fingerprint(run)
        if fp is None:
            continue
        tasks: dict[str, Any] = {}
        per_query: dict[str, Any] = {}
        timings: dict[str, float] = {}
        status: dict[str, str] = {}
        meta: dict[str, Any] = {}
        summed: dict[str, float] = {}
        for shard in shards:
            folder = Path(eval_dir) / f"{row}{SEP}{shard}"
            raw = _read(folder / "results.json")
            if not raw:
                status[shard] = "missing"
                continue
            res = Results.from_dict(raw)
            if str(res.config.get("model_fingerprint")) != fp:  # str: an int where a sweep's override was unquoted
                status[shard] = "stale (other weights)"
                continue
            if res.status != STATUS_DONE:
                status[shard] = str(res.status or "unknown")
                continue
            section = res.eval
            tasks.update(section.tasks)
            timings.update(section.timings)
            if section.per_query:
                per_query.update(_read(folder / section.per_query))
            meta = {k: getattr(section, k) for k in ("model", "fingerprint", "query_max_length", "passage_max_length",
                                                     "scoring") if getattr(section, k) is not None}
            # the scoring's own record (its declared settings, e.g. which states a query was) and its timings summed
            # over every shard (e.g. the MaxSim search)
            declared = declared_scorings().get(section.scoring) or {}
            meta.update({k: section.extra.get(k) for k in declared.get("settings", ())})
            for key in declared.get("summed", ()):
                summed[key] = summed.get(key, 0.0) + float(section.extra.get(key) or 0.0)
            status[shard] = STATUS_DONE
        report[row] = status
        if not tasks:
            continue
        groups = group_scores({t: e["main_score"] for t, e in tasks.items()}, suite.groups)
        write_json(run / "per_query.json", per_query, indent=1)
        section = {"suite": suite.name, "tasks": tasks, "groups": groups,
                   "group_tasks": {g: list(m) for g, m in suite.groups.items()}, "per_query": "per_query.json",
                   "timings": timings, "stage": {"shards": status, "model_fingerprint": fp}, **meta,
                   **{k: round(v, 3) for k, v in summed.items()}}
        update_results(run, eval=section)
        missing = [s for s, st in status.items() if st != STATUS_DONE]
        log.info("eval stage: row %s merged %d/%d shards%s", row, len(shards) - len(missing), len(shards),
                 f" (not done: {', '.join(missing)})" if missing else "")
    return report


PREPARED_DIR = "eval-data"  # under the sweep folder: the suite's hub datasets, prepared once for every job


def run_stage(scale: Scale, rows: Sequence[str], out: Path, group: str, force: bool, dry_run: bool,
              sweep_command: Any, run_block: Any, hub: Sequence[str] = (),
              row_evals: Mapping[str, Sequence[str]] | None = None) -> int:
    """The eval stage of a sweep (`scale.eval_stage`): plan, prepare, launch, merge, each stage taking the previous
    one's output. Returns 1 when a shard of a trained row is not merged or a row has no model, else 0 (a dry run:
    the plan in `<out>/eval/jobs.json`, nothing launched)."""
    plan = plan_stage(scale, rows, out, dry_run, hub, row_evals)
    prepared = prepare_stage(plan, run_block)
    launched = launch_stage(prepared, sweep_command, run_block, group, force)
    return merge_stage(launched)


@dataclass(frozen=True)
class StagePlan:
    """The plan stage's output: the suite and its shards, each trained row's model fingerprint (None: a dry run,
    which reads no trained row), where the suite's hub datasets are prepared (None: local tasks only), the jobs."""

    scale: Scale
    rows: list[str]
    out: Path
    stage: StageSuite
    fingerprints: dict[str, str | None] | None
    data: Path | None
    block: Block
    dry_run: bool

    @property
    def untrained(self) -> list[str]:
        return [row for row, fp in (self.fingerprints or {}).items() if fp is None]


@dataclass(frozen=True)
class StagePrepared:
    """The prepare stage's output: the plan and the exit code of the data preparation (0: none needed)."""

    plan: StagePlan
    code: int


@dataclass(frozen=True)
class StageLaunched:
    """The launch stage's output: the plan and the row sweeper's exit code (0: nothing launched)."""

    plan: StagePlan
    code: int


def plan_stage(scale: Scale, rows: Sequence[str], out: Path, dry_run: bool, hub: Sequence[str] = (),
               row_evals: Mapping[str, Sequence[str]] | None = None) -> StagePlan:
    """The suite and its shards (`lmk.sweep.jobs.stage_shards`), the trained rows' model fingerprints, and the jobs
    (`lmk.sweep.jobs.stage_block`, each row's with its own `eval.*` overrides from `row_evals`), which read the
    suite's hub datasets from `<out>/eval-data` once prepared."""
    stage = stage_shards(scale, hub)
    (out / "eval").mkdir(parents=True, exist_ok=True)
    # the local tasks' declared names (lmk.eval.tasks registers none other): mteb is not loaded to plan
    data = None if all(t in LOCAL_TASK_NAMES for t in stage.suite.tasks) else out / PREPARED_DIR
    fingerprints = None if dry_run else {row: trained_fingerprint(out / "train" / row) for row in rows}
    jobs_hub = [*hub, f"hub.prepared={data}"] if data else list(hub)
    block = stage_block(scale, rows, out / "train", stage.shards, jobs_hub, fingerprints, row_evals)
    plan = StagePlan(scale, list(rows), out, stage, fingerprints, data, block, dry_run)
    if plan.untrained:
        print(f"[lmk.sweep] eval stage: rows whose training did not finish (not evaluated; rerun the sweep to "
              f"finish them): {', '.join(plan.untrained)}", file=sys.stderr)
    return plan


def prepare_stage(plan: StagePlan, run_block: Any) -> StagePrepared:
    """Prepare the suite's hub datasets once, before the jobs (`python -m lmk.eval.prepared` in the scale's
    environment, composing what the jobs compose); nothing for a suite of local tasks or without jobs."""
    if plan.data is None:
        return StagePrepared(plan, 0)
    if plan.dry_run:
        print(f"[lmk.sweep] eval stage: the suite's hub datasets are prepared once into {plan.data} before the jobs "
              "launch; every job reads them (hub.prepared)", flush=True)
        return StagePrepared(plan, 0)
    if not plan.block.rows:
        return StagePrepared(plan, 0)
    cmd = [sys.executable, "-m", "lmk.eval.prepared", "--out", str(plan.data), *plan.stage.overrides]
    code = run_block(cmd, plan.scale.env)
    if code:  # the jobs of the tasks it could not prepare fail naming why; the others run
        print(f"[lmk.sweep] eval stage: the eval data of some tasks was not prepared (exit {code}, see above); "
              "their jobs will fail naming why, the others run", file=sys.stderr)
    return StagePrepared(plan, code)


def launch_stage(prepared: StagePrepared, sweep_command: Any, run_block: Any, group: str, force: bool
                 ) -> StageLaunched:
    """The jobs through the row sweeper (`sweep_command`, `run_block`: lmk.sweep.driver's); a dry run validates one
    job per shard and writes the plan to `<out>/eval/jobs.json` instead."""
    plan = prepared.plan
    block, shards, eval_dir = plan.block, plan.stage.shards, plan.out / "eval"
    if plan.dry_run:
        for job in block.jobs()[:len(shards)]:  # one job per shard validates its suite subset before launch
            EvalConfig.from_cfg(job.compose().eval)
        jobs = [{"row": j.row, "train_row": j.row.split(SEP)[0], "shard": j.row.split(SEP)[1],
                 "tasks": shards[j.row.split(SEP)[1]], "overrides": list(j.overrides)} for j in block.jobs()]
        write_json(eval_dir / "jobs.json", {"suite": plan.stage.suite.name, "shards": shards, "jobs": jobs})
        print(f"[lmk.sweep] eval stage: {len(jobs)} jobs ({len(plan.rows)} rows x {len(shards)} shards: "
              f"{', '.join(f'{s} ({len(t)} tasks)' for s, t in shards.items())}), one device each; "
              f"plan in {eval_dir / 'jobs.json'}", flush=True)
        return StageLaunched(plan, 0)
    if not block.rows:
        return StageLaunched(plan, 0)
    cmd = sweep_command(block, eval_dir, plan.scale, group, force, False)
    return StageLaunched(plan, run_block(cmd, plan.scale.env))


def merge_stage(launched: StageLaunched) -> int:
    """Every row's finished shards merged into it (`merge`); 1 when a shard of a trained row is not done, a row
    has no model or the launch failed, else 0. A dry run merges nothing."""
    plan = launched.plan
    if plan.dry_run:
        return 0
    report = merge(plan.rows, plan.out / "train", plan.out / "eval", plan.stage.suite, plan.stage.shards)
    failed = [f"{r}{SEP}{s}" for r, st in report.items() for s, v in st.items() if v != "done"]
    if failed:
        print(f"[lmk.sweep] eval stage: shards not done: {', '.join(failed)} (rerun: only they run)", file=sys.stderr)
    return int(bool(launched.code or failed or plan.untrained))
