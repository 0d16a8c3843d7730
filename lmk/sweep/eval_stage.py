"""Evaluation as a sweep stage: one `lmk.evaluate` job per (row, shard of the suite), merged per row.

At paper scale the suite is as costly as training (BEIR-15 alone is tens of millions of documents, MLDR runs
at 8192 tokens), so the training jobs evaluate nothing (`eval.in_training: none`) and `lmk.sweep` runs this
stage after them, through the same row sweeper and Hydra launcher (SLURM array, local GPUs, CPU):

- the jobs (`lmk.sweep.jobs.eval_block`): the suite's tasks split into shards (`plan_shards`: one per eval
  group by default), one job `<row>--<shard>` per (training row, shard), each `lmk.evaluate model=<train run
  dir> eval.tasks=[...]` on one device, tagged with the trained model's fingerprint (`model_fingerprint`): a
  finished shard of the same model is skipped by the sweeper (same config hash, status done), a crashed one
  (status failed / no results) reruns alone, a retrained row reruns all its shards;
- `merge(...)`: every finished shard's scores and per-query scores go into the training row's
  `results.json` "eval" section and `per_query.json` (groups recomputed over the whole suite), which the
  table reads as before.

The shards of a row share the row's mteb cache (`<train run>/mteb_cache`, one file per task), so a shard
killed half-way resumes from the tasks it finished.

Before any job launches, the suite's hub datasets are prepared once into `<out>/eval-data`
(`python -m lmk.eval.prepared`, in the scale's environment, as the jobs would load them) and every job reads
them with `hub.prepared=<it>`: no job converts a corpus or writes and locks a `datasets` cache on the shared
file system. A rerun finds them prepared (fingerprinted) and converts nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lmk.config.eval import EvalConfig
from lmk.eval.score_stats import group_scores
from lmk.eval.tasks import LOCAL_TASKS
from lmk.run.results import STATUS_DONE, Results, update_results
from lmk.run.umask_files import write_json
from lmk.sweep.jobs import SEP, eval_block, plan_shards, stage_overrides, stage_suite
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
        search_s = 0.0
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
            if section.scoring == "maxsim":  # which states a query was, and the search time over every shard
                meta["maxsim_query"] = section.extra.get("maxsim_query")
                search_s += float(section.extra.get("maxsim_search_seconds") or 0.0)
            status[shard] = STATUS_DONE
        report[row] = status
        if not tasks:
            continue
        groups = group_scores({t: e["main_score"] for t, e in tasks.items()}, suite.groups)
        write_json(run / "per_query.json", per_query, indent=1)
        section = {"suite": suite.name, "tasks": tasks, "groups": groups,
                   "group_tasks": {g: list(m) for g, m in suite.groups.items()}, "per_query": "per_query.json",
                   "timings": timings, "stage": {"shards": status, "model_fingerprint": fp}, **meta,
                   **({"maxsim_search_seconds": round(search_s, 3)} if meta.get("scoring") == "maxsim" else {})}
        update_results(run, eval=section)
        missing = [s for s, st in status.items() if st != STATUS_DONE]
        log.info("eval stage: row %s merged %d/%d shards%s", row, len(shards) - len(missing), len(shards),
                 f" (not done: {', '.join(missing)})" if missing else "")
    return report


PREPARED_DIR = "eval-data"  # under the sweep folder: the suite's hub datasets, prepared once for every job


def prepared_data(scale: Scale, suite: EvalConfig, out: Path, hub: Sequence[str], dry_run: bool,
                  run_block: Any) -> tuple[list[str], int]:
    """Prepare the suite's hub datasets once, before the jobs (`lmk.eval.prepared` in the scale's environment);
    returns the hub overrides the jobs then take (`hub.prepared=...`) and the preparation's exit code. A suite of
    local tasks only needs nothing."""
    if all(t in LOCAL_TASKS for t in suite.tasks):
        return list(hub), 0
    folder = out / PREPARED_DIR
    overrides = [*hub, f"hub.prepared={folder}"]
    if dry_run:
        print(f"[lmk.sweep] eval stage: the suite's hub datasets are prepared once into {folder} before the jobs "
              "launch; every job reads them (hub.prepared)", flush=True)
        return overrides, 0
    cmd = [sys.executable, "-m", "lmk.eval.prepared", "--out", str(folder), *stage_overrides(scale, hub)]
    return overrides, run_block(cmd, scale.env)


def run_stage(scale: Scale, rows: Sequence[str], out: Path, group: str, force: bool, dry_run: bool,
              sweep_command: Any, run_block: Any, hub: Sequence[str] = (),
              row_evals: Mapping[str, Sequence[str]] | None = None) -> int:
    """The eval stage of a sweep (`scale.eval_stage`): plan (`lmk.sweep.jobs.eval_block`, each row's jobs with its
    own `eval.*` overrides from `row_evals`), launch through the row sweeper, merge. Returns 1 when a shard of a
    trained row is not merged or a row has no model, else 0."""
    suite = stage_suite(scale, hub)
    shards = plan_shards(suite, str(scale.eval_stage.get("shard_by", "group")))
    train_dir, eval_dir = out / "train", out / "eval"
    eval_dir.mkdir(parents=True, exist_ok=True)
    if dry_run:
        hub, _ = prepared_data(scale, suite, out, hub, True, run_block)
        block = eval_block(scale, rows, train_dir, hub, row_evals=row_evals)
        for job in block.jobs()[:len(shards)]:  # one job per shard validates its suite subset before launch
            EvalConfig.from_cfg(job.compose().eval)
        jobs = [{"row": j.row, "train_row": j.row.split(SEP)[0], "shard": j.row.split(SEP)[1],
                 "tasks": shards[j.row.split(SEP)[1]], "overrides": list(j.overrides)} for j in block.jobs()]
        write_json(eval_dir / "jobs.json", {"suite": suite.name, "shards": shards, "jobs": jobs})
        print(f"[lmk.sweep] eval stage: {len(jobs)} jobs ({len(rows)} rows x {len(shards)} shards: "
              f"{', '.join(f'{s} ({len(t)} tasks)' for s, t in shards.items())}), one device each; "
              f"plan in {eval_dir / 'jobs.json'}", flush=True)
        return 0
    fingerprints = {row: trained_fingerprint(train_dir / row) for row in rows}
    untrained = [row for row, fp in fingerprints.items() if fp is None]
    if untrained:
        print(f"[lmk.sweep] eval stage: rows whose training did not finish (not evaluated; rerun the sweep to "
              f"finish them): {', '.join(untrained)}", file=sys.stderr)
    block = eval_block(scale, rows, train_dir, hub, fingerprints, row_evals)
    code = 0
    if block.rows:
        hub, code = prepared_data(scale, suite, out, hub, False, run_block)
        if code:  # the jobs of the tasks it could not prepare fail naming why; the others run
            print(f"[lmk.sweep] eval stage: the eval data of some tasks was not prepared (exit {code}, see above); "
                  "their jobs will fail naming why, the others run", file=sys.stderr)
        block = eval_block(scale, rows, train_dir, hub, fingerprints, row_evals)
        cmd = sweep_command(block, eval_dir, scale, group, force, False)
        code = run_block(cmd, scale.env)
    report = merge(rows, train_dir, eval_dir, suite, shards)
    failed = [f"{r}{SEP}{s}" for r, st in report.items() for s, v in st.items() if v != "done"]
    if failed:
        print(f"[lmk.sweep] eval stage: shards not done: {', '.join(failed)} (rerun: only they run)", file=sys.stderr)
    return int(bool(code or failed or untrained))
