"""Models for the probes: trained runs of a sweep folder, or untrained encoders from conf/.

`choose_models` is what the notebook calls: the trained runs of the most meaningful `make reproduce-table2`
sweep present (`<table2_root>/<scale>/train/<row>/` with export/ or checkpoints/; paper > mini > rehearsal > tiny,
newest within a scale, or the scale named) when there are some, else untrained encoders; it says which it used.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmk.analysis.common import RunName
from lmk.config import CONF_DIR, TrainSection, group_file, group_options
from lmk.config.model import pooling_label
from lmk.config.paths import in_repo
from lmk.model.embedding import EmbeddingModel
from lmk.model.loading import load_model

if TYPE_CHECKING:  # imported lazily at run time: analysis sits above model / data in the layering
    from lmk.model.embedding import EmbeddingModel


def _conf_dir(conf_dir: str | Path | None) -> Path:
    if conf_dir is not None:
        return Path(conf_dir)
    return CONF_DIR


def _load_cfg(conf: Path, group: str, name: str) -> Any:
    path = conf / group / f"{name}.yaml"
    if not path.is_file():
        avail = group_options(group, conf)
        raise ValueError(
            f"unknown {group} {name!r}; allowed: {', '.join(avail) or '(none found in ' + str(conf) + ')'}"
        )
    return group_file(group, name, conf)  # with its `_base` defaults, as Hydra composes it


def _run_name(run_dir: Path) -> RunName:
    """A run's pooling row ("encoder/pooling" from its results.json, else the folder name) and its objective
    (`train.objective`; a run from before that key trained with the schema's default)."""
    try:
        cfg = json.loads((run_dir / "results.json").read_text()).get("config", {})
        enc = cfg.get("encoder", {}).get("name")
        pool = cfg.get("pooling", {})
        pname = pooling_label(pool) if pool.get("name") else None  # the one row label (chunked: with the chunk size)
        objective = (cfg.get("train") or {}).get("objective") or TrainSection.objective
        return RunName(f"{enc}/{pname}" if enc and pname else run_dir.name, objective)
    except (OSError, ValueError, AttributeError):
        return RunName(run_dir.name, TrainSection.objective)


def _has_weights(run_dir: Path) -> bool:
    return (run_dir / "export").is_dir() or (run_dir / "checkpoints" / "last.ckpt").is_file()


def _load_run(run_dir: Path, device: str) -> EmbeddingModel:
    """A run folder's model (lmk.model.loading: its export/, else its last checkpoint) on `device`, in eval mode."""
    model, _ = load_model(run_dir)
    return model.to(device).eval()


def _done(run_dir: Path) -> bool:
    try:
        return json.loads((run_dir / "results.json").read_text()).get("status") == "done"
    except (OSError, ValueError):
        return False


def trained_runs(sweep_dir: str | Path) -> list[Path]:
    """The finished fine-tuning runs of a Table 2 sweep folder (`<sweep>/train/<row>/`) that hold weights."""
    train = Path(sweep_dir) / "train"
    if not train.is_dir():
        return []
    return sorted(p for p in train.iterdir() if p.is_dir() and _done(p) and _has_weights(p))


def default_table2_root() -> Path:
    """Where `make reproduce-table2` writes its sweeps: <repo>/outputs/table2/<scale>/."""
    return in_repo("outputs", "table2")


def _newest_finished(sweep: Path) -> float | None:
    runs = trained_runs(sweep)
    return max((r / "results.json").stat().st_mtime for r in runs) if runs else None


def latest_table2_sweep(root: str | Path | None = None) -> Path | None:
    """The sweep folder (`<root>/<scale>`, any scale) whose newest finished trained run is the most recent."""
    root = Path(root) if root is not None else default_table2_root()
    if not root.is_dir():
        return None
    newest = {p: t for p in root.iterdir() if p.is_dir() and (t := _newest_finished(p)) is not None}
    return max(newest, key=newest.get) if newest else None


# The scales whose trained runs mean most, first: the paper's sweep, then the laptop one (a pretrained encoder,
# real scores); the rehearsal trains random weights for 3 steps and tiny is a smoke test (numbers mean nothing).
SCALE_PREFERENCE = ("paper", "mini", "rehearsal", "tiny")


def sweep_scale(sweep: Path) -> str:
    """A sweep folder's scale: its name (`outputs/table2/<scale>`), or the known scale it starts with."""
    for scale in SCALE_PREFERENCE:
        if sweep.name == scale or sweep.name.startswith((f"{scale}-", f"{scale}_")):
            return scale
    return sweep.name


def pick_table2_sweep(root: str | Path | None = None, scale: str | None = None) -> Path | None:
    """The sweep folder under `root` (default <repo>/outputs/table2) the analysis should use: among those with
    finished trained runs, the most meaningful scale (`SCALE_PREFERENCE`: paper > mini > rehearsal > tiny, any
    other name last), the newest within a scale; `scale` given: only sweeps of that scale (ValueError if none)."""
    root = Path(root) if root is not None else default_table2_root()
    found = {p: t for p in (root.iterdir() if root.is_dir() else []) if p.is_dir()
             and (t := _newest_finished(p)) is not None}
    if scale is not None:
        found = {p: t for p, t in found.items() if sweep_scale(p) == scale}
        if not found:
            raise ValueError(f"no finished trained runs of scale {scale!r} under {root}; run `make reproduce-table2 "
                             f"SCALE={scale}` first, or leave SCALE unset to use the best sweep present")
    if not found:
        return None

    def rank(sweep: Path) -> tuple[int, float]:
        known = sweep_scale(sweep)
        order = SCALE_PREFERENCE.index(known) if known in SCALE_PREFERENCE else len(SCALE_PREFERENCE)
        return order, -found[sweep]

    return min(found, key=rank)


@dataclass
class ModelChoice:
    """The models the probes compare and where they came from (printed by the notebook)."""

    models: dict[str, EmbeddingModel]
    source: str               # "trained" or "untrained"
    sweep_dir: Path | None    # the Table 2 sweep folder of trained runs (None for untrained models)
    description: str
    scale: str | None = None  # the sweep's scale (None for untrained models)
    runs: dict[str, RunName] = field(default_factory=dict)  # label -> its pooling row and training objective

    def __str__(self) -> str:
        return self.description

    @property
    def label(self) -> str:
        """What the figures show, in a few words: `<scale> sweep, N trained runs` or the untrained fallback."""
        if self.source == "trained":
            where = self.scale or (self.sweep_dir.name if self.sweep_dir else "?")
            return f"{where} sweep, {len(self.models)} trained runs"
        return f"untrained encoders ({len(self.models)} models): mechanics only"

    def title(self, text: str) -> str:
        """A figure title naming which scale and runs it shows."""
        return f"{text} [{self.label}]"


def choose_models(
    results_dir: str | Path | None = None,
    table2_root: str | Path | None = None,
    *,
    prefer_trained: bool = True,
    encoders: Sequence[str] = ("minilm-l6", "tiny-modernbert"),
    poolings: Sequence[str] = ("cls", "mean", "lmk-fixed"),
    device: str = "cpu",
    scale: str | None = None,
) -> ModelChoice:
    """results_dir given: its runs. Else, with `prefer_trained`, the most meaningful Table 2 sweep under
    `table2_root` (default <repo>/outputs/table2; `pick_table2_sweep`: paper > mini > rehearsal > tiny, newest
    within a scale, or the `scale` named) when it has finished runs; else untrained encoders."""
    sweep = None
    if results_dir is not None:
        sweep = Path(results_dir)
    elif prefer_trained or scale is not None:
        sweep = pick_table2_sweep(table2_root, scale)
    if sweep is not None:
        runs_root = sweep / "train" if trained_runs(sweep) else sweep
        models = load_models(runs_root, device=device)
        folders = _runs(runs_root)
        where = "".join(f"\n  {label} <- {folder}" for label, (folder, _) in folders.items())
        picked = "named by `scale`" if scale is not None else "the most meaningful scale present" \
            if results_dir is None else "given as results_dir"
        name = sweep_scale(sweep)
        return ModelChoice(models, "trained", sweep, f"scale {name!r} ({picked}): {len(models)} trained runs of "
                           f"{sweep}:{where}", scale=name,
                           runs={label: run for label, (_, run) in folders.items()})
    models = load_models(None, encoders, poolings, device=device)
    looked = "" if not prefer_trained else (
        f" (no finished `make reproduce-table2` run under {Path(table2_root) if table2_root else default_table2_root()})"
    )
    return ModelChoice(models, "untrained", None,
                       f"untrained fallback{looked}: {', '.join(models)} -- the mechanics, not the paper's result",
                       runs={label: RunName(label) for label in models})


def _runs(root: Path) -> dict[str, tuple[Path, RunName]]:
    """label -> (run folder, its name), in load_models' order and labelling; two runs of one name (pooling and
    objective) are told apart by their folder names."""
    out: dict[str, tuple[Path, RunName]] = {}
    for run in _weight_runs(root):
        name = _run_name(run)
        if name.label in out:
            name = RunName(f"{name.pooling} ({run.name})", name.objective)
        out[name.label] = (run, name)
    return out


def _run_folders(root: Path) -> dict[str, Path]:
    """label -> run folder, in load_models' order and labelling."""
    return {label: folder for label, (folder, _) in _runs(root).items()}


def _weight_runs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob("results.json") if _has_weights(p.parent))


def load_models(
    results_dir: str | Path | None = None,
    encoders: Sequence[str] = ("minilm-l6", "tiny-modernbert"),
    poolings: Sequence[str] = ("cls", "mean", "lmk-fixed"),
    *,
    conf_dir: str | Path | None = None,
    device: str = "cpu",
) -> dict[str, EmbeddingModel]:
    """Labelled models to compare, on `device`.

    results_dir given: every run folder under it (a Table 2 sweep) holding results.json and export/ (or
    checkpoints/last.ckpt), labelled "encoder/pooling" from its results.json (else the folder name), with
    "(trained with <objective>)" where its `train.objective` is not the default (`RunName.label`). Otherwise each encoder of
    conf/encoder/ built once (untrained heads; random init for tiny-modernbert) and re-pooled with each
    of conf/pooling/ via with_pooling, so the poolings of one encoder share the very same weights.
    """
    models: dict[str, EmbeddingModel] = {}
    if results_dir is not None:
        root = Path(results_dir)
        if not root.is_dir():
            raise ValueError(
                f"results_dir {str(root)!r} is not a folder; pass a Table 2 sweep folder or None"
            )
        runs = _run_folders(root)
        if not runs:
            raise ValueError(f"no run folder with results.json and export/ or checkpoints/last.ckpt under {str(root)!r}")
        return {label: _load_run(run, device) for label, run in runs.items()}
    if not encoders or not poolings:
        raise ValueError("encoders and poolings must be non-empty lists of config names")
    conf = _conf_dir(conf_dir)
    pool_cfgs = [_load_cfg(conf, "pooling", p) for p in poolings]
    for enc in encoders:
        base = EmbeddingModel.build(_load_cfg(conf, "encoder", enc), pool_cfgs[0]).to(device).eval()
        for name, pcfg in zip(poolings, pool_cfgs, strict=True):
            models[f"{enc}/{name}"] = base if pcfg is pool_cfgs[0] else base.with_pooling(pcfg)
    return models
