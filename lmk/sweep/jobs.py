"""Every job a sweep of a table's scale launches, composed by one set of functions.

A sweep runs in blocks, one Hydra multirun each (`hydra/sweeper=rows`): `train` (`lmk.train`, one job per row,
or per row and seed), `zeroshot` (`lmk.evaluate` of the untrained encoder, per row) and `eval` (the eval stage:
`lmk.evaluate` of each trained row, per shard of the suite). `plan(...)` gives the blocks; the overrides of a
job are `job_overrides(block.common, row overrides, row, seed)`, the formula the row sweeper applies to every
job it launches. The download (what the jobs load), the cost estimate, the eval stage and the sweep itself
therefore agree on every job's config.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from lmk.config import CONF_DIR
from lmk.config.eval import EvalConfig
from lmk.sweep.spec import RESCORE, Row, Scale, experiment_eval

ENTRY_CONFIG = {"lmk.train": "train", "lmk.evaluate": "evaluate"}  # entry point -> its root config (conf/)
SHARD_BY = ("group", "task")
SEP = "--"  # eval-stage job id: <row>--<shard>
STAGE_KEYS = ("overrides", "shard_by", "launcher_overrides")


def job_overrides(common: Sequence[str], row_overrides: Sequence[str], row: str, seed: int | None = None
                  ) -> list[str]:
    """The overrides of one job: the block's, the row's, its seed, and the row id the results are filed under."""
    return [*common, *row_overrides, *([] if seed is None else [f"seed={seed}"]), f"++row={row}"]


def job_id(row: str, seed: int | None = None) -> str:
    """The job's folder under its block: `<row>`, or `<row>/seed<k>` for one seed of a row."""
    return row if seed is None else f"{row}/seed{seed}"


@dataclass(frozen=True)
class Job:
    block: str
    entry: str
    id: str
    row: str
    seed: int | None
    overrides: tuple[str, ...]

    def compose(self) -> DictConfig:
        """The job's config as the job composes it (without Hydra's runtime)."""
        return compose_config(self.entry, self.overrides)


@dataclass(frozen=True)
class Block:
    """One multirun: `common` overrides on every job, `rows` (row id -> its overrides) one job each (per seed)."""

    name: str
    entry: str
    common: tuple[str, ...]
    rows: Mapping[str, Sequence[str]]
    seeds: tuple[int, ...] | None = None

    def jobs(self) -> list[Job]:
        return [Job(self.name, self.entry, job_id(row, seed), row, seed,
                    tuple(job_overrides(self.common, overrides, row, seed)))
                for row, overrides in self.rows.items() for seed in (self.seeds or (None,))]


def compose_config(entry: str, overrides: Sequence[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose(ENTRY_CONFIG[entry], overrides=list(overrides))


def trained_rows(rows: Sequence[Row]) -> list[Row]:
    """The rows that train a model (a `scoring_of` row evaluates another row's)."""
    return [r for r in rows if r.scoring_of is None]


def scoring_rows(rows: Sequence[Row]) -> list[Row]:
    """The `scoring_of` rows whose trained row is among `rows` (each evaluates that row's model, nothing trained)."""
    ids = {r.id for r in trained_rows(rows)}
    return [r for r in rows if r.scoring_of is not None and r.scoring_of in ids]


def zero_shot_rows(rows: Sequence[Row]) -> list[Row]:
    """The trained rows whose untrained model is a model of its own: a row that differs from an earlier one only in
    training and evaluation settings (`train.*`, `eval.*`: a MaxSim-trained row, scored by MaxSim) is that row
    untrained (its scorings are the `scoring_of` rows'), and lmk-variable (its chunk sizes differ at training time
    only) is lmk-fixed-32 untrained."""
    seen: set[tuple[str, ...]] = set()
    out = []
    for r in trained_rows(rows):
        untrained = tuple(o for o in r.overrides if not o.lstrip("+~").startswith(("train.", "eval.")))
        if r.pooling != "lmk-variable" and untrained not in seen:
            seen.add(untrained)
            out.append(r)
    return out


def train_block(scale: Scale, rows: Sequence[Row], hub: Sequence[str] = (), seeds: Sequence[int] | None = None
                ) -> Block:
    return Block("train", "lmk.train", (*scale.train_overrides, *hub),
                 {r.id: list(r.overrides) for r in trained_rows(rows)}, tuple(seeds) if seeds else None)


def zeroshot_block(scale: Scale, rows: Sequence[Row], hub: Sequence[str] = ()) -> Block | None:
    """The untrained encoder per row; a `scoring_of` row scores its row's untrained model its own way."""
    if not scale.zero_shot:
        return None
    untrained = {r.id: list(r.overrides) for r in zero_shot_rows(rows)}
    untrained.update({r.id: [*untrained[str(r.scoring_of)], *r.overrides] for r in scoring_rows(rows)
                      if r.scoring_of in untrained})
    return Block("zeroshot", "lmk.evaluate", (*scale.zero_shot_overrides, *hub), untrained)


def suite_overrides(scale: Scale, hub: Sequence[str] = ()) -> list[str]:
    """The overrides that give an `lmk.evaluate` job the suite the scale's trained rows are evaluated on: the eval
    stage's, or the suite the training jobs evaluate in training (their experiment's)."""
    if scale.eval_stage:
        return stage_overrides(scale, hub)
    suite = experiment_eval(scale)
    return [*([f"eval={suite}"] if suite else []), *hub]


def rescore_block(scale: Scale, rows: Sequence[Row], train_dir: Path, hub: Sequence[str] = (),
                  fingerprints: Mapping[str, str | None] | None = None) -> Block | None:
    """One `lmk.evaluate` job per `scoring_of` row: the trained model of its row (`<train_dir>/<row>`), the scale's
    suite, the row's evaluation overrides. With `fingerprints` (trained row -> model fingerprint, None: not trained),
    each job is tagged with its model, so a retrained row is scored again and a finished one is skipped."""
    jobs: dict[str, list[str]] = {}
    for row in scoring_rows(rows):
        trained = str(row.scoring_of)
        fp = (fingerprints or {}).get(trained)
        if fingerprints is not None and fp is None:
            continue
        jobs[row.id] = [f"model={train_dir / trained}", *row.overrides,
                        *fingerprint_override(fp), f"++train_row={trained}"]
    return Block(RESCORE, "lmk.evaluate", tuple(suite_overrides(scale, hub)), jobs) if jobs else None


def fingerprint_override(fingerprint: str | None) -> list[str]:
    """The override that tags an `lmk.evaluate` job with the model it scores; none without a fingerprint. Quoted:
    Hydra reads an unquoted value of decimal digits only (`1716311804438561`) as an int, which the eval stage then
    never found equal to the fingerprint string, and re-ran the row's shards as stale."""
    return [f"++model_fingerprint='{fingerprint}'"] if fingerprint else []


def stage_overrides(scale: Scale, hub: Sequence[str] = ()) -> list[str]:
    """The overrides every eval-stage job shares (its suite, the hub mirror, the launcher's sizes)."""
    stage = dict(scale.eval_stage or {})
    unknown = sorted(set(stage) - set(STAGE_KEYS))
    if unknown:
        raise ValueError(f"scale {scale.name!r}: unknown eval_stage keys {unknown}; allowed: {', '.join(STAGE_KEYS)}")
    return [*stage.get("overrides", []), *hub, *stage.get("launcher_overrides", [])]


@dataclass(frozen=True)
class StageSuite:
    """What a scale's eval stage evaluates: the suite, its shards (`plan_shards`, per the stage's `shard_by`) and
    the overrides every job of the stage shares (`stage_overrides`)."""

    suite: EvalConfig
    shards: dict[str, list[str]]
    overrides: list[str]


def stage_shards(scale: Scale, hub: Sequence[str] = ()) -> StageSuite:
    """The scale's eval suite and its shards, composed once."""
    overrides = stage_overrides(scale, hub)
    suite = EvalConfig.from_cfg(compose_config("lmk.evaluate", overrides).eval)
    return StageSuite(suite, plan_shards(suite, str(scale.eval_stage.get("shard_by", "group"))), overrides)


def plan_shards(suite: EvalConfig, shard_by: str = "group") -> dict[str, list[str]]:
    """{shard name: task names}, covering every task of the suite exactly once (a task listed by several
    groups runs once, in the first; `shard_by: task` gives one shard per task)."""
    if shard_by not in SHARD_BY:
        raise ValueError(f"eval stage shard_by={shard_by!r}: allowed {', '.join(SHARD_BY)}")
    if shard_by == "task":
        return {t: [t] for t in suite.tasks}
    shards: dict[str, list[str]] = {}
    placed: set[str] = set()
    for group, members in suite.groups.items():
        todo = [t for t in members if t not in placed]
        if todo:
            shards[group] = todo
            placed.update(todo)
    rest = [t for t in suite.tasks if t not in placed]
    if rest:
        shards["ungrouped"] = rest
    return shards


def shard_overrides(run: Path, tasks: Sequence[str], shard: str, row: str, fingerprint: str | None) -> list[str]:
    """One eval-stage job: the trained model of `run` on `tasks` (groups are merged per row afterwards)."""
    return [f"model={run}", f"eval.tasks=[{','.join(tasks)}]", "~eval.groups", "eval.in_training=all",
            *fingerprint_override(fingerprint), f"++eval_shard={shard}",
            f"++train_row={row}"]


def eval_block(scale: Scale, rows: Sequence[str], train_dir: Path, hub: Sequence[str] = (),
               fingerprints: Mapping[str, str | None] | None = None,
               row_evals: Mapping[str, Sequence[str]] | None = None) -> Block | None:
    """The eval stage's jobs for trained rows `rows` (`stage_block` over the scale's shards); None for a scale
    without an eval stage."""
    if not scale.eval_stage:
        return None
    return stage_block(scale, rows, train_dir, stage_shards(scale, hub).shards, hub, fingerprints, row_evals)


def stage_block(scale: Scale, rows: Sequence[str], train_dir: Path, shards: Mapping[str, Sequence[str]],
                hub: Sequence[str] = (), fingerprints: Mapping[str, str | None] | None = None,
                row_evals: Mapping[str, Sequence[str]] | None = None) -> Block:
    """The eval stage's jobs, one per (trained row of `rows`, shard of `shards`): rows are ids under `train_dir`,
    `<row>/seed<k>` with seeds; with `fingerprints`, one entry per row (None: not trained yet, no job) tags each job
    with its model; `row_evals` (row id -> its `eval.*` overrides, `Row.eval_overrides`) gives a row's jobs its own
    evaluation settings, such as eval.scoring=maxsim."""
    jobs: dict[str, list[str]] = {}
    for row in rows:
        fp = (fingerprints or {}).get(row)
        if fingerprints is not None and fp is None:
            continue
        own = list((row_evals or {}).get(row.split("/", 1)[0], ()))  # `<row>/seed<k>`: the row's settings
        for shard, tasks in shards.items():
            jobs[f"{row}{SEP}{shard}"] = [*own, *shard_overrides(train_dir / row, tasks, shard, row, fp)]
    return Block("eval", "lmk.evaluate", tuple(stage_overrides(scale, hub)), jobs)


def plan(scale: Scale, rows: Sequence[Row], out: Path, *, hub: Sequence[str] = (), seeds: Sequence[int] | None = None,
         zero_shot: bool = True, fingerprints: Mapping[str, str | None] | None = None) -> list[Block]:
    """Every block of a sweep of `scale` into `out` (train, zero-shot, eval stage), in launch order."""
    blocks: list[Any] = [train_block(scale, rows, hub, seeds), zeroshot_block(scale, rows, hub) if zero_shot else None]
    trained = [job_id(r.id, s) for r in trained_rows(rows) for s in (seeds or [None])]
    blocks.append(eval_block(scale, trained, out / "train", hub, fingerprints, {r.id: r.eval_overrides for r in rows}))
    # the rescore block (`rescore_block`) is not here: it evaluates trained models, and loads what their suite does
    return [b for b in blocks if b is not None]
