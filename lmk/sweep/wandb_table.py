"""The aggregated table in W&B: one run of the sweep's group (job type `table`) holding the table as a W&B Table
(the same cells, daggers and provenance as table2.md) and every cell in its summary (`<block>/<row>/<column>`).

Only when the sweep's runs logged to W&B (their results.json "wandb" section names a mode): the table run uses
the same mode, project and group. Offline it lands in `<out>/wandb/offline-run-*` (`wandb sync` uploads it);
the table files on disk stay the source of truth (`lmk.tables` rebuilds them from results.json alone). A W&B
failure is a warning, never a failed sweep.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from pathlib import Path
from typing import Any

import wandb

from lmk.run.console import verbose
from lmk.sweep.tables import Table, _fmt, caption, short_commit

log = logging.getLogger(__name__)


def sweep_wandb(out: str | Path) -> dict[str, Any] | None:
    """The W&B mode, project and group of the sweep's training runs (from their results.json); None when no run
    of the sweep logged to W&B (logger=csv, W&B disabled or failed to start)."""
    for path in sorted((Path(out) / "train").rglob("results.json")):
        try:
            info = json.loads(path.read_text()).get("wandb") or {}
        except (OSError, ValueError):
            continue
        if info.get("mode") in ("online", "offline"):
            return {k: info.get(k) for k in ("mode", "project", "group")}
    return None


def table_data(table: Table) -> tuple[list[str], list[list[Any]]]:
    """The W&B Table's columns and rows: the Markdown table's cells (bold as **x**, daggers) + provenance."""
    keys = table.column_keys()
    columns = ["block", "row", "pooling", *(label for _, label in keys), "git_commit", "config_hash", "run_dir"]
    data = []
    for block, rows in table.blocks.items():
        for row_id, cells in rows.items():
            first = cells.get("avg") or next(iter(cells.values()), None)
            data.append([block, row_id, table.labels.get(row_id, row_id),
                         *(_fmt(cells.get(k), ("**", "**")) for k, _ in keys),
                         short_commit(first.git_commit if first else None), first.config_hash if first else None,
                         first.run_dir if first else None])
    return columns, data


def cell_summary(table: Table) -> dict[str, float]:
    """`<block>/<row>/<column label>` -> score x100, for W&B's own run view."""
    out: dict[str, float] = {}
    for block, rows in table.blocks.items():
        for row_id, cells in rows.items():
            for key, label in table.column_keys():
                cell = cells.get(key)
                if cell is not None and cell.value is not None:
                    out[f"{block}/{row_id}/{label}"] = round(100 * cell.value, 2)
    return out


def log_table(table: Table, name: str, out: str | Path, info: dict[str, Any]) -> str | None:
    """Log `table` as a W&B Table named `name` in a run of `info`'s group (mode / project / group of the sweep's
    runs); returns the offline run folder (to sync) or the run's URL, None when W&B failed (a warning)."""
    if not verbose():
        os.environ.setdefault("WANDB_SILENT", "true")  # wandb's banners: the sweep prints the one line that matters
    try:
        run = wandb.init(project=info.get("project") or "lmk", group=info.get("group"), job_type="table",
                         name=f"{name}-table", dir=str(out), mode=info.get("mode") or "offline",
                         reinit="finish_previous", settings=wandb.Settings(quiet=True, init_timeout=5.0))
        columns, data = table_data(table)
        run.log({name: wandb.Table(columns=columns, data=data)})
        run.summary.update({**cell_summary(table), "caption": caption(table).replace("`", "")})
        where = str(Path(run.dir).parent) if info.get("mode") == "offline" else getattr(run, "url", None)
        run.finish()
        wandb.teardown()  # waits until the service wrote the run's records (the file `wandb sync` uploads)
        return where
    except Exception as err:  # noqa: BLE001 - W&B is a copy of the table: the files on disk are the result
        warnings.warn(f"W&B table logging failed ({type(err).__name__}: {err}); the table files are complete",
                      stacklevel=2)
        return None
