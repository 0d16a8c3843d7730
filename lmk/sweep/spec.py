"""A paper table as data: rows (pooling variants), columns (eval groups) and scales, from YAML.

Validation happens here, before any training: a row naming an unknown pooling option or a column
naming an eval group that the scale's suite does not define fails at once with the valid names.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from lmk.config import CONF_DIR, UserError, group_file, group_options
from lmk.run.cpu_kernels import switches

CONTEXTS = ("short", "long")
RESCORE = "rescore"  # the block (and sweep sub-folder) of the rows scored from another row's model (`scoring_of`)


class SpecError(UserError, ValueError):
    """A table spec that cannot be run; the message names the valid choices."""


@dataclass(frozen=True)
class Row:
    id: str
    label: str
    overrides: tuple[str, ...]
    optional: bool = False
    # another row's id: this row trains nothing; it evaluates that row's trained model with its own `overrides`
    # (evaluation settings only, e.g. eval.scoring=maxsim): one checkpoint, two scorings
    scoring_of: str | None = None

    @property
    def eval_overrides(self) -> list[str]:
        """The row's own evaluation settings (`eval.*` overrides, e.g. eval.scoring=maxsim): an eval stage's jobs of
        this row carry them too."""
        return [o for o in self.overrides if o.lstrip("+~").startswith("eval.")]

    @property
    def pooling(self) -> str | None:
        for o in self.overrides:
            key, _, value = o.lstrip("+~").partition("=")
            if key == "pooling":
                return value
        return None


@dataclass(frozen=True)
class Column:
    group: str
    label: str
    context: str
    # false: the column is left out of the table's averages (a column added to a pinned table keeps every earlier
    # cell, its averages included, as it was)
    average: bool = True


@dataclass
class Scale:
    name: str
    columns: list[Column]
    train_overrides: list[str] = field(default_factory=list)
    zero_shot: bool = False
    zero_shot_overrides: list[str] = field(default_factory=list)
    include_optional: bool = False
    launcher: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    # the CPU kernel set every job computes with (lmk.run.cpu_kernels; its switches are in `env`): the pinned scales
    cpu_kernels: str | None = None
    description: str = ""
    # The evaluation stage (lmk.sweep.eval_stage): {overrides: [lmk.evaluate overrides, e.g. eval=table2-paper],
    # shard_by: group | task, launcher_overrides: [...]}; empty: the training jobs evaluate.
    eval_stage: dict[str, Any] = field(default_factory=dict)
    # The folder of hub repos every job reads offline (lmk.sweep.hub_mirror): {path, replicas}.
    hub_mirror: dict[str, Any] = field(default_factory=dict)
    # Other launchers the scale runs on (`lmk.sweep --launcher NAME`): {NAME: {train: [...], eval: [...]}}, the
    # overrides that fit the scale's jobs to it (appended to the training jobs and to the eval stage's).
    launchers: dict[str, dict[str, list[str]]] = field(default_factory=dict)

    def on(self, launcher: str | None) -> Scale:
        """This scale run through `launcher` (one of `launchers`, or its own); SpecError names the choices."""
        if launcher in (None, self.launcher or "local"):
            return self
        if launcher not in self.launchers:
            raise SpecError(f"scale {self.name!r} does not run on launcher {launcher!r}; it runs on "
                            f"{', '.join([self.launcher or 'local', *self.launchers])} (spec: scales.{self.name}"
                            ".launchers)")
        extra = self.launchers[launcher]
        unknown = sorted(set(extra) - {"train", "eval"})
        if unknown:
            raise SpecError(f"scale {self.name!r}, launchers.{launcher}: unknown keys {unknown}; allowed: train, eval")
        stage = dict(self.eval_stage)
        if stage:
            stage["launcher_overrides"] = [*stage.get("launcher_overrides", []), *extra.get("eval", [])]
        return replace(self, launcher=launcher, train_overrides=[*self.train_overrides, *extra.get("train", [])],
                       eval_stage=stage)


@dataclass
class TableSpec:
    name: str
    title: str
    baseline: str
    alpha: float
    rows: list[Row]
    scales: dict[str, Scale]
    path: Path | None = None

    def rows_for(self, scale: Scale, with_optional: bool | None = None) -> list[Row]:
        keep_optional = scale.include_optional if with_optional is None else with_optional
        return [r for r in self.rows if keep_optional or not r.optional]

    def row(self, row_id: str) -> Row:
        return next(r for r in self.rows if r.id == row_id)

    def scale(self, name: str) -> Scale:
        if name not in self.scales:
            raise SpecError(f"unknown scale {name!r}; the spec defines: {', '.join(self.scales)}")
        return self.scales[name]


def _closest(name: str, options: list[str]) -> str:
    near = difflib.get_close_matches(name, options, n=3)
    return f" (did you mean {', '.join(near)}?)" if near else ""


def _kernel_env(path: str | Path, name: Any) -> dict[str, str]:
    try:
        return switches(None if name is None else str(name))
    except ValueError as exc:
        raise SpecError(f"{path}: {exc}") from exc


def load_spec(path: str | Path) -> TableSpec:
    path = Path(path)
    if not path.exists():
        raise SpecError(f"table spec {path} does not exist")
    raw: dict[str, Any] = yaml.safe_load(path.read_text())
    try:
        rows = [Row(id=str(r["id"]), label=str(r.get("label", r["id"])),
                    overrides=tuple(str(o) for o in r.get("overrides", [])),
                    optional=bool(r.get("optional", False)),
                    scoring_of=str(r["scoring_of"]) if r.get("scoring_of") is not None else None) for r in raw["rows"]]
        scales = {}
        for name, s in raw["scales"].items():
            cols = [Column(group=str(c["group"]), label=str(c.get("label", c["group"])),
                           context=str(c.get("context", "short")), average=bool(c.get("average", True)))
                    for c in s["columns"]]
            scales[name] = Scale(
                name=name, columns=cols, train_overrides=list(s.get("train_overrides", [])),
                zero_shot=bool(s.get("zero_shot", False)),
                zero_shot_overrides=list(s.get("zero_shot_overrides", [])),
                include_optional=bool(s.get("include_optional", False)),
                launcher=s.get("launcher"),
                env={**_kernel_env(path, s.get("cpu_kernels")), **{str(k): str(v) for k, v in (s.get("env") or {}).items()}},
                cpu_kernels=s.get("cpu_kernels"),
                description=str(s.get("description", "")).strip(),
                eval_stage=dict(s.get("eval_stage") or {}),
                hub_mirror=dict(s.get("hub_mirror") or {}),
                launchers={str(k): {str(b): [str(o) for o in v] for b, v in (d or {}).items()}
                           for k, d in (s.get("launchers") or {}).items()},
            )
    except (KeyError, TypeError) as exc:
        raise SpecError(f"{path}: malformed spec ({exc}); see experiments/table2/spec.yaml") from exc
    ids = [r.id for r in rows]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise SpecError(f"{path}: duplicate row ids {dupes}")
    spec = TableSpec(name=str(raw.get("name", path.stem)), title=str(raw.get("title", "")),
                     baseline=str(raw.get("baseline", rows[0].id if rows else "")),
                     alpha=float(raw.get("alpha", 0.05)), rows=rows, scales=scales, path=path)
    if spec.baseline not in ids:
        raise SpecError(f"{path}: baseline {spec.baseline!r} is not a row; rows: {', '.join(ids)}")
    return spec


def suite_groups(eval_name: str, conf_dir: Path = CONF_DIR) -> list[str]:
    """The group names an eval suite config defines (`groups:` mapping in conf/eval/<name>.yaml)."""
    path = conf_dir / "eval" / f"{eval_name}.yaml"
    if not path.exists():
        raise SpecError(f"eval suite {eval_name!r} not found; options: {', '.join(group_options('eval', conf_dir))}")
    return sorted((group_file("eval", eval_name, conf_dir).get("groups") or {}).keys())


def experiment_eval(scale: Scale, conf_dir: Path = CONF_DIR) -> str | None:
    """The eval suite a scale's experiment selects (its `- override /eval: X` default), or its eval stage's."""
    for o in [*(scale.eval_stage or {}).get("overrides", []), *scale.train_overrides]:
        key, _, value = o.partition("=")
        if key == "eval":
            return value
        if key == "experiment":
            data = yaml.safe_load((conf_dir / "experiment" / f"{value}.yaml").read_text()) or {}
            for d in data.get("defaults", []):
                if isinstance(d, dict):
                    for k, v in d.items():
                        if k.strip().endswith("/eval"):
                            return str(v)
    return None


def validate_spec(spec: TableSpec, scale_name: str, conf_dir: Path = CONF_DIR,
                  with_optional: bool | None = None) -> None:
    """Fail before any compute if a row's pooling or a column's eval group does not exist."""
    scale = spec.scale(scale_name)
    poolings = group_options("pooling", conf_dir)
    for row in spec.rows_for(scale, with_optional):
        if row.scoring_of is not None:
            check_scoring_row(spec, row, conf_dir)
            continue
        if row.pooling is None:
            raise SpecError(f"row {row.id!r} has no pooling=... override; poolings: {', '.join(poolings)}")
        if row.pooling not in poolings:
            raise SpecError(f"row {row.id!r}: unknown pooling {row.pooling!r}{_closest(row.pooling, poolings)}; "
                            f"valid: {', '.join(poolings)}")
    for col in scale.columns:
        if col.context not in CONTEXTS:
            raise SpecError(f"column {col.group!r}: context must be one of {CONTEXTS}, got {col.context!r}")
    eval_name = experiment_eval(scale, conf_dir)
    if eval_name is not None:
        groups = suite_groups(eval_name, conf_dir)
        for col in scale.columns:
            if col.group not in groups:
                raise SpecError(f"scale {scale_name!r}: column {col.group!r} is not an eval group of suite "
                                f"{eval_name!r}{_closest(col.group, groups)}; valid: {', '.join(groups)}")


def pooler_of(pooling: str, conf_dir: Path = CONF_DIR) -> str:
    """The pooler a `conf/pooling/` option uses (lmk: landmark states, which MaxSim scores)."""
    return str(group_file("pooling", pooling, conf_dir).get("pooler", "lmk"))


def check_scoring_row(spec: TableSpec, row: Row, conf_dir: Path = CONF_DIR) -> None:
    """A `scoring_of` row: it names a trained row of the spec with landmarks, and changes evaluation settings only."""
    ids = [r.id for r in spec.rows if r.scoring_of is None]
    if row.scoring_of not in ids:
        raise SpecError(f"row {row.id!r}: scoring_of={row.scoring_of!r} is not a trained row{_closest(str(row.scoring_of), ids)}"
                        f"; trained rows: {', '.join(ids)}")
    bad = [o for o in row.overrides if not o.lstrip("+~").startswith("eval.")]
    if bad:
        raise SpecError(f"row {row.id!r}: a scoring_of row evaluates {row.scoring_of!r}'s trained model, so its overrides "
                        f"are evaluation settings (eval.*) only; move {bad} to a row of its own")
    sibling = spec.row(row.scoring_of).pooling
    maxsim = any(o in row.overrides for o in ("eval.scoring=maxsim", "eval.scoring=maxsim-compressed"))
    if maxsim and sibling is not None and pooler_of(sibling, conf_dir) != "lmk":
        raise SpecError(f"row {row.id!r}: eval.scoring=maxsim scores landmark states, and {row.scoring_of!r} (pooling "
                        f"{sibling!r}) has none; name an LMK row in scoring_of")
