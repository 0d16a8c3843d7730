"""The cost estimate of a sweep before launch: per stage its jobs, tokens, device-hours, its longest job, how
many jobs run at once and so its wall time, and the longest job against the stage's time limit; every figure
printed with its source (measured, published or assumed; `lmk.sweep.cost.throughput`).

The training stage composes one job of the scale (rows differ in pooling only) exactly as the sweep launches it;
the eval stage composes the scale's `eval_stage` (its suite, shards and launcher). The dry run prints the table
(`check_sweep(show=True)`); before anything launches the sweep refuses a job whose estimate exceeds its limit
(`check_sweep`); after a run, `training_time_report` sets the prediction beside the measured time.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from lmk.config import CONF_DIR
from lmk.config.eval import EvalConfig
from lmk.model.shape import encoder_shape
from lmk.sweep.cost.evaluation import eval_cost
from lmk.sweep.cost.index import Layout
from lmk.sweep.cost.limits import TimeLimit, eval_verdict, training_verdict
from lmk.sweep.cost.measured import format_rows, row_hours
from lmk.sweep.cost.stage import StageCost, hours
from lmk.sweep.cost.throughput import GPU_CHECK_JSON, Rates, choose_rates, maxsim_throughput
from lmk.sweep.cost.training import training_cost, training_job
from lmk.sweep.jobs import ENTRY_CONFIG, compose_config, plan_shards, stage_overrides, train_block
from lmk.sweep.spec import Scale, load_spec
from lmk.train.memory import sections

STAGE_KEYS = " in the scale's eval_stage.launcher_overrides"


def _launch(scale: Scale) -> list[str]:
    """The launcher choice the sweep adds to every job of the scale (lmk.sweep.driver.sweep_command)."""
    return [f"launcher={scale.launcher}"] if scale.launcher and scale.launcher != "local" else []


def parallel_jobs(scale: Scale, overrides: Sequence[str], entry: str = "lmk.train") -> int | None:
    """Jobs the row sweeper runs at a time (`hydra.sweeper.max_batch_size`; the driver sets 1 for a local
    launcher); None: all at once."""
    if not scale.launcher or scale.launcher == "local":
        return 1
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(ENTRY_CONFIG[entry], overrides=list(overrides), return_hydra_config=True)
    return OmegaConf.select(cfg, "hydra.sweeper.max_batch_size", default=None)


def _devices(c: dict[str, Any]) -> int:
    launcher = c.get("launcher") or {}
    per_node = int(launcher.get("gpus_per_node", 1) or launcher.get("tasks_per_node", 1) or 1)
    return max(int(launcher.get("nodes", 1)) * per_node, 1)


def _eval_stage(scale: Scale, layouts: dict[str, Layout | None], c: dict[str, Any], shape: Any, rates: Rates
                ) -> StageCost | None:
    """The eval stage's cost (its own jobs and launcher), or the suite the training jobs evaluate themselves;
    `layouts`: each row's MaxSim layout (None: single-vector)."""
    stage, rows = scale.eval_stage or {}, len(layouts)
    if (scale.hub_mirror or {}).get("replicas"):
        return None  # small local replicas: the tasks' own sizes would mislead
    if not stage:
        suite = EvalConfig.from_cfg(c["eval"]).training_view() if c.get("eval") else None
        return eval_cost(suite, rows, None, shape, rates, layouts) if suite is not None and suite.enabled else None
    overrides = [*stage_overrides(scale), *_launch(scale)]
    cfg = compose_config("lmk.evaluate", overrides)
    ev, suite = sections(cfg), EvalConfig.from_cfg(cfg.eval)
    cost = eval_cost(suite, rows, plan_shards(suite, str(stage.get("shard_by", "group"))), shape, rates, layouts)
    cost.parallel = parallel_jobs(scale, overrides, "lmk.evaluate")
    limit = TimeLimit.of(ev, scale.launcher, STAGE_KEYS)
    if limit is not None:
        verdict = eval_verdict(cost, limit, rates.job_overhead_s, rates.train.source)
        cost.limit, cost.refusal = verdict.text, verdict.refusal
    return cost


def _row_config(scale: Scale, row: Any, by_id: dict[str, Any], composed: dict[str, Any]) -> Any:
    """A row's job composed as the sweep launches it (once per row: `composed` keeps them); a `scoring_of` row is
    its trained row's job under its own evaluation overrides."""
    if row.id not in composed:
        trained, extra = (row, []) if row.scoring_of is None else (by_id[row.scoring_of], list(row.overrides))
        composed[row.id] = compose_config("lmk.train", [*train_block(scale, [trained]).jobs()[0].overrides, *extra,
                                                        *_launch(scale)])
    return composed[row.id]


def _layout(cfg: Any, dim: int) -> Layout | None:
    """A row's MaxSim layout (its pooling and eval.maxsim_query; an eval stage's jobs carry the row's `eval.*`
    overrides) where its evaluation scores by MaxSim; None: single-vector."""
    return Layout.of({"eval": cfg.get("eval") or {}, "pooling": cfg.pooling}, dim)


def _per_row(trained: Sequence[str], configs: dict[str, Any], shape: Any, gpus: int, rates: Rates, wall_s: float,
             eval_s: float) -> list[str]:
    """The per-row block (padded and measured-length GPU-hours); one line saying why where it cannot be made."""
    unit = "CPU-hours" if rates.train.kind == "cpu" else "GPU-hours"

    def job(cfg: Any) -> dict[str, Any]:  # the estimate's sections and the row's pooling (its landmark layout)
        return {**sections(cfg), "pooling": OmegaConf.to_container(cfg.pooling, resolve=True)}
    try:
        rows = [row_hours(r, job(configs[r]), shape, gpus, rates, wall_s, eval_s) for r in trained]
        return format_rows(rows, job(configs[trained[0]]), unit)
    except (ValueError, KeyError, OSError) as err:
        return [f"training {unit} at measured lengths unavailable: {type(err).__name__}: {err}"]


def sweep_estimate(spec_path: str, scale_name: str, rows: Sequence[str], gpu: str | None = None,
                   gpu_check: Path | str = GPU_CHECK_JSON, throughput_file: Path | str | None = None,
                   launcher: str | None = None) -> tuple[list[StageCost], Rates]:
    """The estimate of a sweep: one training job of the scale (through `launcher`, one the scale declares, else
    its own) composed as the sweep launches it (rows differ in pooling only), and the eval stage's shards (or,
    without a stage, the training jobs' own evaluation). A `scoring_of` row among `rows` trains nothing: it adds
    one evaluation of the suite (its trained row's model, scored its own way) to the eval stage's work."""
    spec = load_spec(spec_path)
    scale = spec.scale(scale_name).on(launcher)
    by_id = {r.id: r for r in spec.rows}
    trained = [r for r in rows if by_id[r].scoring_of is None]
    rescored = [r for r in rows if by_id[r].scoring_of is not None]
    # the job every row shares but its pooling: a trained row's, or the trained row a scoring_of row evaluates
    base = by_id[trained[0]] if trained else by_id[str(by_id[rows[0]].scoring_of)]
    overrides = [*train_block(scale, [base]).jobs()[0].overrides, *_launch(scale)]
    cfg = compose_config("lmk.train", overrides)
    c = sections(cfg)
    c["eval"] = cfg.get("eval")
    shape = encoder_shape(c["encoder"])
    on_cpu = str((c.get("trainer") or {}).get("accelerator", "gpu")) == "cpu"
    rates = choose_rates(on_cpu, shape, throughput_file, gpu_check, gpu)
    configs: dict[str, Any] = {}
    layouts = {r: _layout(_row_config(scale, by_id[r], by_id, configs), shape.hidden) for r in rows}
    if any(layouts.values()):
        rates.maxsim = maxsim_throughput(rates, gpu)
    gpus = _devices(c)
    train = training_cost(c, len(trained), gpus)
    train.parallel = parallel_jobs(scale, overrides)
    ev = _eval_stage(scale, layouts, c, shape, rates)
    job = training_job(c, gpus, rates, eval_s=ev.job_wall_s if ev is not None and not ev.jobs else 0.0)
    limit = TimeLimit.of(c, scale.launcher)
    verdict = training_verdict(job, limit, rates.train.source) if limit is not None else None
    train.job_wall_s = verdict.wall_s if verdict else job.wall_s
    train.durations = [train.job_wall_s] * len(trained)
    train.device_s = train.job_wall_s * gpus * len(trained)
    train.per_row = _per_row(trained, configs, shape, gpus, rates, train.job_wall_s, job.eval_s)
    if ev is not None and rescored:
        ev.notes.append(f"{len(rescored)} of the {len(rows)} rows evaluate another row's trained model (scoring_of: "
                        f"{', '.join(rescored)}): counted here by shard, no training; they run as one job per row "
                        f"over the whole suite (<out>/rescore/jobs.json)")
    if verdict is not None:
        train.limit, train.refusal = verdict.text, verdict.refusal
    if (scale.hub_mirror or {}).get("replicas"):
        train.notes.append("eval not estimated: the scale evaluates small local replicas, not the tasks' own sizes")
    return [train, *([ev] if ev is not None else [])], rates


def _concurrency_note(s: StageCost) -> str:
    if s.jobs <= 1:
        return ""
    how = "all at once (hydra.sweeper.max_batch_size: null)" if not s.parallel else \
        "all at once" if s.parallel >= s.jobs else f"{s.parallel} at a time"
    return f"wall time assumes {how}; one at a time: {hours(s.serial_s())}"


def format_estimate(stages: Sequence[StageCost], rates: Rates) -> str:
    cpu = rates.train.kind == "cpu"
    unit, devices = ("CPU-hours", "ranks") if cpu else ("GPU-hours", "GPUs")
    lines = ["cost estimate (wall: each stage's jobs scheduled as the sweep runs them, the longest job included)",
             f"  {'stage':<6} {'jobs':>5} {'tokens':>10} {unit:>10} {'longest job':>22} {'at once':>18} "
             f"{'wall':>9}  time limit"]
    for s in stages:
        longest = f"{hours(s.job_wall_s)} ({s.longest})" if s.jobs else "-"
        lines.append(f"  {s.stage:<6} {s.jobs:>5} {s.tokens:>10.3g} {s.gpu_hours():>10.1f} {longest:>22} "
                     f"{s.at_once(devices) if s.jobs else '-':>18} {hours(s.wall_s()):>9}  {s.limit or '-'}")
    lines.append(f"  {'total':<6} {sum(s.jobs for s in stages):>5} {sum(s.tokens for s in stages):>10.3g} "
                 f"{sum(s.gpu_hours() for s in stages):>10.1f} {'':>22} {'':>18} "
                 f"{hours(sum(s.wall_s() for s in stages)):>9}")
    for s in stages:
        lines += [f"  {line}" for line in s.per_row]
    lines.append("  notes:")
    for s in stages:
        lines += [f"    {s.stage}: {note}" for note in [*s.notes, _concurrency_note(s)] if note]
        if s.refusal:
            lines.append(f"    {s.stage}: REFUSED: {s.refusal}")
    lines.append("  sources:")
    lines += [f"    {line}" for line in rates.sources()]
    return "\n".join(lines)


def _estimate(spec_path: str, scale_name: str, rows: Sequence[str], throughput_file: Path | str | None,
              unavailable: str, launcher: str | None = None) -> tuple[list[StageCost], Rates] | None:
    try:
        return sweep_estimate(spec_path, scale_name, rows, throughput_file=throughput_file, launcher=launcher)
    except (ValueError, KeyError) as err:
        print(f"[lmk.sweep] {unavailable}: {err}", flush=True)
        return None


def print_sweep_estimate(spec_path: str, scale_name: str, rows: Sequence[str],
                         throughput_file: Path | str | None = None) -> str | None:
    """Print the estimate; a scale it cannot size says why, never fails."""
    est = _estimate(spec_path, scale_name, rows, throughput_file, "cost estimate unavailable")
    if est is None:
        return None
    text = format_estimate(*est)
    print("[lmk.sweep] " + text, flush=True)
    return text


def check_sweep(spec_path: str, scale_name: str, rows: Sequence[str], throughput_file: Path | str | None = None,
                stages: Sequence[str] = ("train", "eval"), show: bool = False, launcher: str | None = None
                ) -> list[str]:
    """The refusals of a sweep before launch: one line per stage (of `stages`) whose longest job exceeds its
    launcher's time limit, with the fix; empty when every job fits, no limit applies (the local launcher) or the
    scale cannot be sized (said in one line). With `show` (the dry run) the estimate is printed first."""
    scale = load_spec(spec_path).scale(scale_name).on(launcher)
    if not show and (not scale.launcher or scale.launcher == "local"):
        return []
    est = _estimate(spec_path, scale_name, rows, throughput_file,
                    "cost estimate unavailable" if show else "time limits not checked", launcher)
    if est is None:
        return []
    if show:
        print("[lmk.sweep] " + format_estimate(*est), flush=True)
    return [f"{s.stage} stage: {s.refusal}" for s in est[0] if s.refusal and s.stage in stages]


def training_time_report(spec_path: str, scale_name: str, out: Path | str,
                         throughput_file: Path | str | None = None, launcher: str | None = None) -> str | None:
    """After a run: the training stage's predicted wall time beside the measured one (the row sweeper's
    `train/sweep_status.json`: seconds per completed row), for the rows this run trained."""
    path = Path(out) / "train" / "sweep_status.json"
    try:
        status = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, json.JSONDecodeError):
        return None  # nothing to compare: the table is what matters
    done = {row: s for row, s in status.items() if s.get("status") == "completed" and s.get("seconds") is not None}
    if not done:
        return None
    measured = sum(float(s["seconds"]) for s in done.values())  # per row: its batch's wall / the batch's rows
    spec = load_spec(spec_path)
    first = spec.rows_for(spec.scale(scale_name))[0].id  # rows differ in pooling only: any row sizes the jobs
    try:
        stages, rates = sweep_estimate(spec_path, scale_name, [first], throughput_file=throughput_file,
                                       launcher=launcher)
    except (ValueError, KeyError) as err:
        return f"training wall time: measured {hours(measured)} for {len(done)} rows; no prediction ({err})"
    train = replace(stages[0], jobs=len(done), durations=[stages[0].job_wall_s] * len(done))
    predicted = train.wall_s()
    return (f"training wall time: predicted {hours(predicted)}, measured {hours(measured)} for {len(done)} rows "
            f"(ratio {predicted / measured:.2f}; train throughput: {rates.train.source}; job overhead: "
            f"{rates.job_overhead_s:.0f} s, {rates.job_overhead_source})")
