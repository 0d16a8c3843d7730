"""Table-2 driver: spec -> Hydra multirun sweep(s) -> aggregated table.

`python -m lmk.sweep experiments/table2/spec.yaml --scale mini --out outputs/table2/mini`

1. validates the spec (unknown pooling / eval group fails here, before any training);
2. runs the fine-tuning sweep as ONE Hydra multirun (`hydra/sweeper=rows`, one job per row, through the
   scale's launcher: local, or SLURM via submitit) into `<out>/train/<row>/`;
3. optionally evaluates each pooling on the untrained encoder (`<out>/zeroshot/<row>/`);
4. aggregates `results.json` files into `<out>/table2.{md,tex,csv,json,png}` and prints the Markdown.

Re-running skips rows whose results exist with the same config hash; `--force` recomputes all.
`--seeds 0,1,2` trains every row once per seed (`<out>/train/<row>/seed<k>/`); the table then shows
mean +- std over seeds and tests significance over seeds as well as over queries.
`--dry-run` composes and validates every job and writes the exact commands to `<out>/*/jobs.json`
without launching anything (the way to check a cluster sweep from a laptop).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import yaml

from lmk.sweep.spec import Row, Scale, SpecError, load_spec, validate_spec

# Each entry point's structured-config check, run on every job before the sweep launches.
VALIDATORS = {"lmk.train": "lmk.train.command.validate_job", "lmk.evaluate": "lmk.eval.command.validate_config"}


def sweep_command(entry: str, overrides: list[str], rows: list[Row] | dict[str, list[str]], folder: Path,
                  scale: Scale, group: str, force: bool, dry_run: bool,
                  seeds: list[int] | None = None) -> list[str]:
    """The multirun command line for one block of rows (what a user could type themselves)."""
    folder.mkdir(parents=True, exist_ok=True)
    rows_file = folder / "rows.yaml"
    plain = rows if isinstance(rows, dict) else {r.id: list(r.overrides) for r in rows}
    rows_file.write_text(yaml.safe_dump(plain, sort_keys=False))
    cmd = [sys.executable, "-m", entry, "-m", *overrides,
           "hydra/sweeper=rows", f"hydra.sweeper.rows_file={rows_file}", f"hydra.sweep.dir={folder}",
           f"++logger.group={group}", f"hydra.sweeper.validate={VALIDATORS[entry]}"]
    if scale.launcher and scale.launcher != "local":
        cmd.append(f"launcher={scale.launcher}")
    else:
        cmd.append("hydra.sweeper.max_batch_size=1")  # one row at a time locally: progress per row
    if seeds:
        cmd.append(f"hydra.sweeper.seeds=[{','.join(map(str, seeds))}]")
    if force:
        cmd.append("hydra.sweeper.force=true")
    if dry_run:
        cmd.append("hydra.sweeper.dry_run=true")
    return cmd


def run_block(cmd: list[str], env: dict[str, str]) -> int:
    print(f"\n$ {shlex.join(cmd)}\n", flush=True)
    return subprocess.run(cmd, env={**os.environ, **env}).returncode


def zero_shot_rows(rows: list[Row]) -> list[Row]:
    # lmk-variable only differs from lmk-fixed at training time; untrained it IS lmk-fixed-32.
    return [r for r in rows if r.pooling != "lmk-variable"]


def main(argv: list[str] | None = None) -> int:
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
    args = parser.parse_args(argv)
    try:
        seeds = sorted({int(s) for s in args.seeds.split(",")}) if args.seeds else None
    except ValueError:
        parser.error(f"--seeds={args.seeds!r} is not valid; allowed values: comma-separated integers, e.g. 0,1,2")

    started = time.time()
    try:
        spec = load_spec(args.spec)
        validate_spec(spec, args.scale, with_optional=args.with_optional)
    except SpecError as exc:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":  # the full trace on request, as Hydra does
            raise
        print(f"[lmk.sweep] {exc}", file=sys.stderr)
        return 2
    scale = spec.scale(args.scale)
    rows = spec.rows_for(scale, args.with_optional)
    if args.rows:
        wanted = args.rows.split(",")
        unknown = sorted(set(wanted) - {r.id for r in rows})
        if unknown:
            parser.error(f"unknown rows {unknown}; rows: {', '.join(r.id for r in rows)}")
        rows = [r for r in rows if r.id in wanted]
    out = Path(args.out or f"outputs/{spec.name}/{args.scale}").resolve()
    group = f"{spec.name}-{args.scale}"
    print(f"[lmk.sweep] {spec.name} at scale {args.scale!r}: {len(rows)} rows -> {out}", flush=True)

    try:  # the scale's hub mirror, filled before any job starts; every job reads it (hub.mirror)
        from lmk.sweep.hub_mirror import prepare

        mirror_dir = prepare(scale, out, args.dry_run) if args.stage != "table" else None
    except SpecError as exc:
        print(f"[lmk.sweep] {exc}", file=sys.stderr)
        return 2
    hub = [f"hub.mirror={mirror_dir}"] if mirror_dir else []
    if hub and scale.eval_stage:
        scale = dataclasses.replace(scale, eval_stage={**scale.eval_stage,
                                                       "overrides": [*scale.eval_stage.get("overrides", []), *hub]})

    blocks = [("train", "lmk.train", [*scale.train_overrides, *hub], rows)] if args.stage in ("all", "train") else []
    if scale.zero_shot and not args.no_zero_shot and args.stage in ("all", "train"):
        blocks.append(("zeroshot", "lmk.evaluate", [*scale.zero_shot_overrides, *hub], zero_shot_rows(rows)))
    failures = 0
    for name, entry, overrides, block_rows in blocks:
        # Seeds vary training; the zero-shot block evaluates the untrained encoder once per row.
        cmd = sweep_command(entry, overrides, block_rows, out / name, scale, f"{group}-{name}",
                            args.force, args.dry_run, seeds if name == "train" else None)
        block_started = time.time()
        code = run_block(cmd, scale.env)
        status_file = out / name / "sweep_status.json"
        if code != 0:
            print(f"[lmk.sweep] {name} sweep exited with {code}; see the error above", file=sys.stderr)
            failures += 1
            launched = status_file.exists() and status_file.stat().st_mtime >= block_started
            if args.dry_run or not launched:
                return code  # nothing launched (a bad row config): no table to build
        if status_file.exists():
            failed = [r for r, s in json.loads(status_file.read_text()).items() if s["status"] == "failed"]
            if failed:
                print(f"[lmk.sweep] failed rows in {name}: {', '.join(failed)} (recorded; others kept)",
                      file=sys.stderr)
                failures += 1  # the table is still built from the rows that finished
    if scale.eval_stage and args.stage in ("all", "eval"):
        from lmk.sweep.eval_stage import run_stage

        # with --seeds every seed's trained run (train/<row>/seed<k>) is evaluated
        trained = [f"{r.id}/seed{s}" for r in rows for s in seeds] if seeds else [r.id for r in rows]
        failures += run_stage(scale, trained, out, f"{group}-eval", args.force, args.dry_run,
                              sweep_command, run_block)
    if args.dry_run:
        for name, *_ in blocks:
            print(f"[lmk.sweep] dry run: jobs in {out / name / 'jobs.json'}")
        from lmk.sweep.estimate import print_sweep_estimate

        print_sweep_estimate(args.spec, args.scale, [r.id for r in rows])
        return 0
    if args.stage in ("train", "eval"):
        return 1 if failures else 0

    from lmk.sweep.tables import aggregate

    try:
        _, paths = aggregate(args.spec, args.scale, out, args.with_optional)
    except FileNotFoundError as exc:
        print(f"[lmk.sweep] {exc}", file=sys.stderr)
        return 1
    print(paths["md"].read_text())
    minutes = (time.time() - started) / 60
    print(f"[lmk.sweep] table written to {paths['md']} (+ .tex .csv .json .png); wall time {minutes:.1f} min")
    return 1 if failures else 0

