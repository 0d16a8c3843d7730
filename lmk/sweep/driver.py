"""Table-2 driver: spec -> Hydra multirun sweep(s) -> aggregated table.

`python -m lmk.sweep experiments/table2/spec.yaml --scale mini --out outputs/table2/mini`

1. validates the spec (unknown pooling / eval group fails here, before any training);
2. runs the fine-tuning sweep as ONE Hydra multirun (`hydra/sweeper=rows`, one job per row, through the
   scale's launcher: local, or SLURM via submitit) into `<out>/train/<row>/`;
3. optionally evaluates each pooling on the untrained encoder (`<out>/zeroshot/<row>/`);
4. at scales with an eval stage, evaluates every trained row per shard of the suite (`lmk.sweep.eval_stage`);
   rows with `scoring_of` (e.g. the MaxSim rows) evaluate their trained row's model under their own evaluation
   settings into `<out>/rescore/<row>/`: nothing is trained twice;
5. aggregates `results.json` files into `<out>/table2.{md,tex,csv,json,png}` and prints the Markdown.

The jobs of every block come from `lmk.sweep.jobs`. Re-running skips rows whose results exist with the same
config hash; `--force` recomputes all. `--seeds 0,1,2` trains every row once per seed
(`<out>/train/<row>/seed<k>/`); the table then shows mean +- std over seeds and tests significance over seeds
as well as over queries. `--dry-run` composes and validates every job and writes the exact commands to
`<out>/*/jobs.json` without launching anything (the way to check a cluster sweep from a laptop).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lmk.config import UserError
from lmk.hub import mirror
from lmk.run import faults
from lmk.run.cli import full_errors, report
from lmk.run.results import STATUS_DONE, Results
from lmk.run.umask_files import write_json
from lmk.sharing.push_rows import publish_rows, push_target
from lmk.sweep.eval_stage import run_stage, trained_fingerprint
from lmk.sweep.jobs import (
    Block,
    job_id,
    rescore_block,
    scoring_rows,
    train_block,
    trained_rows,
    zeroshot_block,
)
from lmk.sweep.spec import RESCORE, Row, Scale, SpecError, TableSpec, load_spec, validate_spec

# Each entry point's check before compute, run by the row sweeper on every job before the sweep launches.
VALIDATORS = {"lmk.train": "lmk.train.command.validate_job", "lmk.evaluate": "lmk.eval.command.validate_config"}


def sweep_command(block: Block, folder: Path, scale: Scale, group: str, force: bool, dry_run: bool,
                  retry_nonfinite: bool = False) -> list[str]:
    """The multirun command line for one block of jobs (`lmk.sweep.jobs.Block`: what a user could type)."""
    folder.mkdir(parents=True, exist_ok=True)
    rows_file = folder / "rows.yaml"
    rows_file.write_text(yaml.safe_dump({k: list(v) for k, v in block.rows.items()}, sort_keys=False))
    cmd = [sys.executable, "-m", block.entry, "-m", *block.common,
           "hydra/sweeper=rows", f"hydra.sweeper.rows_file={rows_file}", f"hydra.sweep.dir={folder}",
           f"++logger.group={group}", f"hydra.sweeper.validate={VALIDATORS[block.entry]}"]
    if scale.launcher and scale.launcher != "local":
        cmd.append(f"launcher={scale.launcher}")
    else:
        cmd.append("hydra.sweeper.max_batch_size=1")  # one row at a time locally: progress per row
    if block.seeds:
        cmd.append(f"hydra.sweeper.seeds=[{','.join(map(str, block.seeds))}]")
    if force:
        cmd.append("hydra.sweeper.force=true")
    if retry_nonfinite:
        cmd.append("hydra.sweeper.retry_nonfinite=true")
    if dry_run:
        cmd.append("hydra.sweeper.dry_run=true")
    return cmd


def run_block(cmd: list[str], env: dict[str, str]) -> int:
    print(f"\n$ {shlex.join(cmd)}\n", flush=True)
    return subprocess.run(cmd, env={**os.environ, **env}).returncode


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lmk.sweep", description="Run a paper table's sweep and aggregate it.")
    parser.add_argument("spec")
    parser.add_argument("--scale", default="mini")
    parser.add_argument("--out", default=None, help="sweep folder (default outputs/<table>/<scale>)")
    parser.add_argument("--force", action="store_true", help="recompute rows that already have results")
    parser.add_argument("--dry-run", action="store_true", help="compose + validate + print jobs, launch nothing")
    parser.add_argument("--with-optional", action="store_true", default=None, help="include control rows")
    parser.add_argument("--rows", default=None, help="comma-separated row ids (default: all)")
    parser.add_argument("--no-zero-shot", action="store_true")
    parser.add_argument("--stage", choices=("all", "train", "eval", "table"), default="all",
                        help="run one stage: train (and zero-shot), eval (the scale's eval stage), table")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds: each fine-tuned row once per seed")
    parser.add_argument("--throughput", default=None, help="a gpu-check JSON the cost estimate reads as measured "
                        "(a CPU scale needs one: python -m benchmarks.gpu_check --cpu-smoke writes it)")
    parser.add_argument("--launcher", default=None, help="run the scale through another launcher it declares "
                        "(spec: scales.<scale>.launchers), e.g. submitit_slurm on the cluster of `make slurm-up`")
    parser.add_argument("--retry-nonfinite", action="store_true",
                        help="launch rows the non-finite guard stopped again under the same config")
    parser.add_argument("--faults", default=None,
                        help="a fault plan (a name of <spec dir>/faults/ or a YAML path): rehearse a bad day")
    parser.add_argument("--push-to-hub", type=push_target, default=None, metavar="ORG/PREFIX",
                        help="once the table is built, push each row to <org>/<prefix>-<row> (HF_TOKEN)")
    return parser


@dataclass
class Sweep:
    """One invocation: the spec, the scale, the rows chosen and where they go."""

    args: argparse.Namespace
    spec: TableSpec
    scale: Scale
    rows: list[Row]
    seeds: list[int] | None
    out: Path

    @property
    def group(self) -> str:
        return f"{self.spec.name}-{self.args.scale}"


def _load(parser: argparse.ArgumentParser, argv: list[str] | None) -> Sweep:
    """Parse and validate everything before compute; SpecError for a bad spec, parser errors exit 2."""
    args = parser.parse_args(argv)
    try:
        seeds = sorted({int(s) for s in args.seeds.split(",")}) if args.seeds else None
    except ValueError:
        parser.error(f"--seeds={args.seeds!r} is not valid; allowed values: comma-separated integers, e.g. 0,1,2")
    spec = load_spec(args.spec)
    validate_spec(spec, args.scale, with_optional=args.with_optional)
    scale = spec.scale(args.scale).on(args.launcher)
    rows = spec.rows_for(scale, args.with_optional)
    if args.rows:
        wanted = args.rows.split(",")
        unknown = sorted(set(wanted) - {r.id for r in rows})
        if unknown:
            parser.error(f"unknown rows {unknown}; rows: {', '.join(r.id for r in rows)}")
        rows = [r for r in rows if r.id in wanted]
    out = Path(args.out or f"outputs/{spec.name}/{args.scale}").resolve()
    if args.faults:
        try:  # every job inherits the plan through the environment: the configs (and hashes) stay as they are
            faults.activate(faults.resolve_plan(args.faults, Path(args.spec).parent), out / "faults",
                            rows=[r.id for r in spec.rows])
        except ValueError as exc:
            raise SpecError(str(exc)) from exc
    return Sweep(args, spec, scale, rows, seeds, out)


def _run_training_blocks(sweep: Sweep, hub: list[str]) -> tuple[int, int | None]:
    """The train (and zero-shot) blocks; returns (failures, exit code when nothing could launch)."""
    args = sweep.args
    blocks = [train_block(sweep.scale, sweep.rows, hub, sweep.seeds)]
    if not args.no_zero_shot:
        blocks.append(zeroshot_block(sweep.scale, sweep.rows, hub))
    failures = 0
    for block in (b for b in blocks if b is not None):
        cmd = sweep_command(block, sweep.out / block.name, sweep.scale, f"{sweep.group}-{block.name}", args.force,
                            args.dry_run, args.retry_nonfinite)
        block_started = time.time()
        code = run_block(cmd, sweep.scale.env)
        status_file = sweep.out / block.name / "sweep_status.json"
        if code != 0:
            print(f"[lmk.sweep] {block.name} sweep exited with {code}; see the error above", file=sys.stderr)
            failures += 1
            launched = status_file.exists() and status_file.stat().st_mtime >= block_started
            if args.dry_run or not launched:
                return failures, code  # nothing launched (a bad row config): no table to build
        if status_file.exists():
            failed = [r for r, s in json.loads(status_file.read_text()).items() if s["status"] in ("failed", "busy")]
            if failed:
                print(f"[lmk.sweep] failed rows in {block.name}: {', '.join(failed)} (recorded; others kept)",
                      file=sys.stderr)
                failures += 1  # the table is still built from the rows that finished
    return failures, None


def _run_rescore(sweep: Sweep, hub: list[str]) -> int:
    """The `scoring_of` rows: each trained row's model evaluated again under the row's evaluation settings (e.g.
    eval.scoring=maxsim) into `<out>/rescore/<row>`, nothing trained. Returns the number of failures."""
    rows = scoring_rows(sweep.rows)
    if not rows:
        return 0
    if sweep.seeds:
        print(f"[lmk.sweep] --seeds: the rows scored from another row's model ({', '.join(r.id for r in rows)}) are "
              "evaluated for the unseeded sweep only; not run", file=sys.stderr)
        return 0
    train_dir, folder = sweep.out / "train", sweep.out / RESCORE
    if sweep.args.dry_run:
        block = rescore_block(sweep.scale, sweep.rows, train_dir, hub)
        if block is None:
            return 0
        folder.mkdir(parents=True, exist_ok=True)
        write_json(folder / "jobs.json", {"jobs": [{"row": j.row, "overrides": list(j.overrides)} for j in block.jobs()]})
        print(f"[lmk.sweep] {len(block.rows)} rows scored from trained rows' models (nothing trained): jobs in "
              f"{folder / 'jobs.json'}", flush=True)
        return 0
    fingerprints = {str(r.scoring_of): trained_fingerprint(train_dir / str(r.scoring_of)) for r in rows}
    untrained = sorted(row for row, fp in fingerprints.items() if fp is None)
    if untrained:
        print(f"[lmk.sweep] rows whose trained model is missing (their scoring_of rows not evaluated): "
              f"{', '.join(untrained)}", file=sys.stderr)
    failures = int(bool(untrained))
    block = rescore_block(sweep.scale, sweep.rows, train_dir, hub, fingerprints)
    if block is None:
        return failures
    cmd = sweep_command(block, folder, sweep.scale, f"{sweep.group}-{RESCORE}", sweep.args.force, False)
    if run_block(cmd, sweep.scale.env) != 0:
        print(f"[lmk.sweep] {RESCORE} sweep failed; see the error above", file=sys.stderr)
        failures += 1
    return failures


def _table_to_wandb(sweep: Sweep, table: Any) -> None:
    """With W&B on for the sweep's runs, the table also goes to a run of their group (one line says where)."""
    # fast path: wandb loads only once the sweep ran with it
    from lmk.sweep.wandb_table import log_row_summaries, log_table, sweep_wandb

    info = sweep_wandb(sweep.out)
    if info is None:
        return
    where = log_table(table, sweep.spec.name, sweep.out, info)
    # each row's own run gets its cells in its summary (also the eval stage's merged scores); offline: a new
    # segment of the run's id, which the row's `wandb sync <run>/wandb/offline-run-*-<id>` hint already covers
    rows = log_row_summaries(table, sweep.spec.name)
    summaries = f"; {rows} row runs hold their cells in their summaries ({sweep.spec.name}/<column>)" if rows else ""
    if where and info["mode"] == "offline":  # one line for the table and the rows (a console line per event)
        print(f"[lmk.sweep] W&B offline: the table is in {where}{summaries}; upload with `wandb sync {where}` "
              "and the rows' `wandb sync <run>/wandb/offline-run-*`")
    elif where or summaries:
        print(f"[lmk.sweep] W&B: the table is in {where or '(not logged)'}{summaries}")


def _build_table(sweep: Sweep, started: float, failures: int) -> int:
    # fast path: matplotlib and the tables load only once the sweep ran
    from lmk.sweep.table_renderer import aggregate, table_commits

    try:
        table, paths = aggregate(sweep.args.spec, sweep.args.scale, sweep.out, sweep.args.with_optional)
    except FileNotFoundError as exc:
        print(f"[lmk.sweep] {exc}", file=sys.stderr)
        return 1
    print(paths["md"].read_text())
    _table_to_wandb(sweep, table)
    minutes = (time.time() - started) / 60
    print(f"[lmk.sweep] table written to {paths['md']} (+ .tex .csv .json .png); commit "
          f"{', '.join(table_commits(table)) or '?'}; wall time {minutes:.1f} min")
    failures += publish_rows(paths["json"], sweep.args.push_to_hub)
    # fast path: the cost model (mteb's task statistics) loads only after a run
    from lmk.sweep.cost import training_time_report

    timing = training_time_report(sweep.args.spec, sweep.args.scale, sweep.out, sweep.args.throughput,
                                  sweep.args.launcher)
    if timing:
        print(f"[lmk.sweep] {timing}")
    return 1 if failures else 0


def finished(run_dir: Path) -> bool:
    return Results.read(run_dir).status == STATUS_DONE


def refused(sweep: Sweep, show: bool) -> bool:
    """Whether a job of the stages this run launches would outlive its launcher's time limit (each refusal
    printed with its fix); with `show` (the dry run) the cost estimate is printed first."""
    if not show and (not sweep.scale.launcher or sweep.scale.launcher == "local"):
        return False  # jobs run here, under no time limit
    # fast path: the cost model (model shapes, mteb's task statistics) loads only for a check or a dry run
    from lmk.sweep.cost import check_sweep

    stages = ("train", "eval") if sweep.args.stage == "all" else (sweep.args.stage,)
    rows = [*trained_rows(sweep.rows), *scoring_rows(sweep.rows)]  # a scoring_of row's evaluation costs too
    refusals = check_sweep(sweep.args.spec, sweep.args.scale, [r.id for r in rows],
                           sweep.args.throughput,
                           stages, show=show, launcher=sweep.args.launcher)
    for line in refusals:
        print(f"[lmk.sweep] refused before launch: {line}", file=sys.stderr, flush=True)
    return bool(refusals)


def mark_interrupted(folder: Path, repo: str) -> None:
    """A fault plan's interrupted download: the start marker a download into the mirror writes first, so the
    jobs see the copy as partial and the next sweep's mirror preparation writes it again."""
    mirror.mark_started(folder, repo, None)


def main(argv: list[str] | None = None) -> int:
    started = time.time()
    try:
        sweep = _load(_parser(), argv)
        # fast path: the replicas' data code (datasets, mteb) loads only once the spec validated
        from lmk.sweep.hub_mirror import prepare

        # the scale's hub mirror, filled before any job starts; every job reads it (hub.mirror)
        mirror_dir = prepare(sweep.scale, sweep.out, sweep.args.dry_run) if sweep.args.stage != "table" else None
        if not sweep.args.dry_run:
            faults.note_sweep_process()  # a driver_kill fault's target
            for fault in [*faults.inject_mirror_faults(mirror_dir, mark_interrupted),
                          *faults.inject_checkpoint_faults(sweep.out / "train", finished)]:
                print(f"[lmk.sweep] {fault}", file=sys.stderr, flush=True)
    except UserError as exc:  # a bad spec, scale or mirror: what is wrong and the fix (lmk.run.cli)
        if full_errors():  # the full trace on request (HYDRA_FULL_ERROR=1 or LMK_DEBUG=1)
            raise
        report(exc)
        return 2
    args = sweep.args
    print(f"[lmk.sweep] {sweep.spec.name} at scale {args.scale!r}: {len(sweep.rows)} rows -> {sweep.out}", flush=True)
    hub = [f"hub.mirror={mirror_dir}"] if mirror_dir else []
    if not args.dry_run and args.stage != "table" and refused(sweep, show=False):
        return 2  # a job its time limit would kill: nothing launched
    failures = 0
    if args.stage in ("all", "train"):
        failures, stop = _run_training_blocks(sweep, hub)
        if stop is not None:
            return stop
    if sweep.scale.eval_stage and args.stage in ("all", "eval"):
        # with --seeds every seed's trained run (train/<row>/seed<k>) is evaluated
        trained = [job_id(r.id, s) for r in trained_rows(sweep.rows) for s in (sweep.seeds or [None])]
        failures += run_stage(sweep.scale, trained, sweep.out, f"{sweep.group}-eval", args.force, args.dry_run,
                              sweep_command, run_block, hub, {r.id: r.eval_overrides for r in sweep.rows})
    if args.stage in ("all", "eval"):
        failures += _run_rescore(sweep, hub)
    if args.dry_run:
        for name in ("train", "zeroshot"):
            if (sweep.out / name / "jobs.json").is_file():
                print(f"[lmk.sweep] dry run: jobs in {sweep.out / name / 'jobs.json'}")
        return 2 if refused(sweep, show=True) else 0
    if args.stage in ("train", "eval"):
        return 1 if failures else 0
    return _build_table(sweep, started, failures)
