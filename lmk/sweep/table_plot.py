"""The bar chart written beside a paper table (table2.png): each block's rows, short and long context averages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.pyplot as plt


def plot_averages(table: Any, path: Path, block_titles: dict[str, str], title: str) -> None:
    """`table` is a `lmk.sweep.table_renderer.Table` (its blocks of rows of cells, and the rows' labels)."""
    matplotlib.use("Agg")
    blocks = list(table.blocks)
    fig, axes = plt.subplots(1, len(blocks), figsize=(6 * len(blocks), 4), squeeze=False)
    for ax, block in zip(axes[0], blocks):
        rows = table.blocks[block]
        names = [table.labels.get(r, r) for r in rows]
        xs = range(len(names))
        width = 0.38
        for i, ctx in enumerate(("short", "long")):
            vals = [100 * (cells.get(f"avg-{ctx}").value or 0) if cells.get(f"avg-{ctx}") else 0
                    for cells in rows.values()]
            ax.bar([x + (i - 0.5) * width for x in xs], vals, width, label=f"{ctx} context")
        ax.set_xticks(list(xs))
        ax.set_xticklabels(names, rotation=35, ha="right", fontsize=8)
        ax.set_ylabel("score x100")
        ax.set_title(block_titles.get(block, block))
        ax.set_ylim(0, 115)  # headroom: the legend sits above the bars
        ax.legend(loc="upper center", ncol=2, fontsize=8)
    fig.suptitle(title.replace("`", ""), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
