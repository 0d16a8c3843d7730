"""Plots of the probes' results (matplotlib Figures, no pyplot state)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from lmk.analysis.attention import AttentionProfile
from lmk.analysis.common import objective_label
from lmk.analysis.landmark_winners import near_needle_share, objective_order


def _grid(n: int, ncols: int, size: tuple[float, float] = (4.2, 3.2)) -> tuple[Figure, list[Any]]:
    ncols = max(1, min(ncols, n))
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(size[0] * ncols, size[1] * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel().tolist()
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def _draw_profile(ax: Any, profile: AttentionProfile, title: str | None) -> None:
    cmap = mpl.colormaps["viridis"]
    x = profile.centers
    for layer in range(profile.n_layers):
        color = cmap(layer / max(1, profile.n_layers - 1))
        ax.plot(x, profile.mass[layer], color=color, lw=1.2, label=f"layer {layer}")
    ax.plot(x, profile.layer_mean(), color="black", lw=2, ls="--", label="mean")
    ax.axhline(1.0 / profile.n_bins, color="grey", lw=0.8, ls=":", label="uniform")
    ax.set_xlim(0, 1)
    ax.set_xlabel("relative key position")
    ax.set_ylabel("attention mass per bin")
    ax.set_title(title if title is not None else f"{profile.label} ({profile.rows} rows)", fontsize=9)


def plot_attention_profile(profile: AttentionProfile, title: str | None = None) -> Figure:
    """Attention mass vs relative key position, one line per layer (+ the layer mean, + uniform)."""
    fig = Figure(figsize=(5.5, 3.6), layout="constrained")
    ax = fig.subplots()
    _draw_profile(ax, profile, title)
    ax.legend(fontsize=7, ncol=2)
    return fig


def plot_attention_profiles(profiles: Mapping[str, AttentionProfile], ncols: int = 3) -> Figure:
    """One panel per model (per-layer lines), shared y axis."""
    if not profiles:
        raise ValueError("profiles is empty")
    fig, axes = _grid(len(profiles), ncols)
    ymax = max(float(p.mass.max()) for p in profiles.values())
    for ax, (name, prof) in zip(axes, profiles.items(), strict=True):
        _draw_profile(ax, prof, f"{name} ({prof.rows} rows)")
        ax.set_ylim(0, ymax * 1.05)
    axes[0].legend(fontsize=6, ncol=2)
    return fig


def _draw_heatmap(ax: Any, table: pd.DataFrame, title: str, vmin: float | None, vmax: float | None) -> Any:
    data = table.to_numpy(dtype=float)
    im = ax.imshow(data, aspect="auto", cmap="magma", vmin=vmin, vmax=vmax, origin="upper")
    ax.set_xticks(range(table.shape[1]), [str(c) for c in table.columns])
    ax.set_yticks(range(table.shape[0]), [str(i) for i in table.index])
    ax.set_xlabel("context length")
    ax.set_ylabel("evidence depth")
    ax.set_title(title, fontsize=9)
    for (i, j), v in np.ndenumerate(data):
        if np.isfinite(v):
            ax.text(
                j, i, f"{v:.2f}", ha="center", va="center", fontsize=7, color="white" if v < 0.6 else "black"
            )
    return im


def plot_depth_length_heatmap(
    table: pd.DataFrame, title: str = "Acc@1", vmin: float | None = 0.0, vmax: float | None = 1.0
) -> Figure:
    """Depth (rows) x length (columns) heatmap of a `depth_length_table`."""
    fig = Figure(figsize=(1.2 * table.shape[1] + 2.5, 0.5 * table.shape[0] + 1.8), layout="constrained")
    ax = fig.subplots()
    im = _draw_heatmap(ax, table, title, vmin, vmax)
    fig.colorbar(im, ax=ax)
    return fig


def plot_depth_length_heatmaps(
    tables: Mapping[str, pd.DataFrame], ncols: int = 3, vmin: float | None = 0.0, vmax: float | None = 1.0
) -> Figure:
    """One depth x length heatmap per model, shared colour scale."""
    if not tables:
        raise ValueError("tables is empty")
    fig, axes = _grid(len(tables), ncols, size=(3.6, 3.0))
    im = None
    for ax, (name, table) in zip(axes, tables.items(), strict=True):
        im = _draw_heatmap(ax, table, name, vmin, vmax)
    fig.colorbar(im, ax=axes)
    return fig


def plot_position_similarity(
    curves: Mapping[str, pd.DataFrame], title: str = "document vs chunk cosine"
) -> Figure:
    """Mean cosine (doc embedding vs chunk alone) against chunk position, one line per model (+/- std)."""
    if not curves:
        raise ValueError("curves is empty")
    fig = Figure(figsize=(6, 3.8), layout="constrained")
    ax = fig.subplots()
    for name, c in curves.items():
        ax.plot(c["bin_center"], c["mean"], marker="o", ms=3, label=name)
        ax.fill_between(c["bin_center"], c["mean"] - c["std"], c["mean"] + c["std"], alpha=0.15)
    ax.set_xlim(0, 1)
    ax.set_xlabel("chunk position in document (relative)")
    ax.set_ylabel("cosine(doc, chunk)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    return fig


def plot_length_scores(curves: pd.DataFrame, block: str = "train", title: str | None = None) -> Figure:
    """Score against document length, one line per pooling row (+/- standard error), one panel per task.

    curves: `length_curves(length_scores(sweep))`. The x axis is logarithmic (lengths double).
    """
    if curves.empty:
        raise ValueError("curves is empty: the sweep has no per-query scores of a length task (test_<L> splits)")
    data = curves[curves["block"] == block] if "block" in curves.columns else curves
    if data.empty:
        raise ValueError(f"no curves for block {block!r}; blocks: {sorted(curves['block'].unique())}")
    tasks = sorted(data["task"].unique())
    fig, axes = _grid(len(tasks), ncols=len(tasks), size=(4.6, 3.4))
    for ax, task in zip(axes, tasks, strict=True):
        part = data[data["task"] == task]
        for row, c in part.groupby("row", sort=False):
            c = c.sort_values("length")
            ax.errorbar(c["length"], 100 * c["mean"], yerr=100 * c["sem"], marker="o", ms=3, capsize=2, label=row)
        lengths = sorted(part["length"].unique())
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.set_ylim(-2, 102)
        ax.set_xlabel("document length (tokens)")
        ax.set_ylabel("score x100")
        ax.set_title(task, fontsize=9)
    axes[0].legend(fontsize=7)
    fig.suptitle(title or "score vs document length per pooling", fontsize=10)
    return fig


def _top(part: pd.DataFrame) -> float:
    return float(max(part["needle_landmark"].max(), part["winner"].max())) + 1


def _draw_winners(ax: Any, part: pd.DataFrame, within: int, title: str, rng: np.random.Generator,
                  top: float | None = None) -> None:
    """The needle's landmark (x) against the winning landmark (y) of `part`'s queries, coloured by needle depth, with
    the diagonal and its +/- `within` band; both axes up to `top` (default: `part`'s largest index + 1)."""
    top = _top(part) if top is None else top
    grid = np.array([0.0, top])
    ax.fill_between(grid, grid - within, grid + within, color="tab:green", alpha=0.15, label=f"within +/-{within}")
    ax.plot(grid, grid, color="grey", lw=0.8, ls="--")
    ax.scatter(part["needle_landmark"] + rng.uniform(-0.15, 0.15, len(part)),
               part["winner"] + rng.uniform(-0.15, 0.15, len(part)), c=part["depth"], cmap="viridis",
               vmin=0, vmax=1, s=14)
    ax.set_xlim(-0.5, top - 0.5)
    ax.set_ylim(-0.5, top - 0.5)
    ax.set_xlabel("needle's landmark (chunk index)")
    ax.set_ylabel("winning landmark")
    ax.set_title(title, fontsize=9)


def _seen(frame: pd.DataFrame) -> pd.DataFrame:
    seen = frame.dropna(subset=["needle_landmark"])
    if seen.empty:
        raise ValueError("no needle query has a needle landmark (all cut by truncation?): lower the depths or lengths")
    return seen


def plot_winning_landmarks(frame: pd.DataFrame, shares: pd.Series, within: int = 1,
                           title: str = "winning landmark vs the needle's landmark") -> Figure:
    """One panel per model: the needle's landmark index (x) against the landmark that wins the query's MaxSim (y),
    the diagonal and its +/- `within` band shaded; the panel title gives the share inside the band."""
    seen = _seen(frame)
    models = list(dict.fromkeys(seen["model"]))
    fig, axes = _grid(len(models), ncols=3, size=(3.8, 3.4))
    rng = np.random.default_rng(0)  # jitter only: many points share integer coordinates
    for ax, name in zip(axes, models, strict=True):
        _draw_winners(ax, seen[seen["model"] == name], within,
                      f"{name}: {100 * shares.get(name, np.nan):.0f}% within +/-{within}", rng)
    axes[0].legend(fontsize=7, loc="upper left")
    fig.suptitle(title, fontsize=10)
    return fig


def plot_winning_landmarks_by_objective(frame: pd.DataFrame, within: int = 1,
                                        title: str = "winning landmark vs the needle's landmark") -> Figure:
    """The two trainings of each pooling side by side: a row of panels per pooling, a column per training objective
    (`winning_landmarks`' pooling and objective columns; the schema's default objective first), each panel as in
    `plot_winning_landmarks` with the share within +/- `within` chunks in its title; a pooling not trained with an
    objective leaves that panel empty. With one objective only, `plot_winning_landmarks` (one panel per model)."""
    seen = _seen(frame)
    objectives = objective_order(seen)
    if len(objectives) < 2:
        return plot_winning_landmarks(frame, near_needle_share(frame, within), within, title)
    poolings = list(dict.fromkeys(seen["pooling"]))
    fig = Figure(figsize=(3.8 * len(objectives), 3.4 * len(poolings)), layout="constrained")
    axes = fig.subplots(len(poolings), len(objectives), squeeze=False)
    rng = np.random.default_rng(0)  # jitter only: many points share integer coordinates
    for i, pooling in enumerate(poolings):
        top = _top(seen[seen["pooling"] == pooling])  # one scale per pooling: its objectives compare point by point
        for j, objective in enumerate(objectives):
            ax, part = axes[i][j], seen[(seen["pooling"] == pooling) & (seen["objective"] == objective)]
            if part.empty:
                ax.set_axis_off()
                ax.set_title(f"{pooling}: not trained with {objective_label(objective)}", fontsize=9)
                continue
            share = float((part["distance"].abs() <= within).mean())
            _draw_winners(ax, part, within, f"{pooling}\n{objective_label(objective)}: "
                          f"{100 * share:.0f}% within +/-{within}", rng, top)
    next(ax for ax in axes.ravel() if ax.axison).legend(fontsize=7, loc="upper left")
    fig.suptitle(title, fontsize=10)
    return fig


def save_figure(fig: Figure, fig_dir: str | Path, name: str, dpi: int = 120) -> Path:
    """Write `fig` as `<fig_dir>/<name>.png` (folders created) and return the path."""
    out = Path(fig_dir)
    out.mkdir(parents=True, exist_ok=True)
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)
    path = out / f"{safe}.png"
    fig.savefig(path, dpi=dpi)
    return path
