"""The aggregated table in W&B: one run of the sweep's group (job type `table`) holding the table as a W&B Table
(the same cells, daggers and provenance as table2.md) and every cell in its summary (`<block>/<row>/<column>`).

Only when the sweep's runs logged to W&B (their results.json "wandb" section names a mode): the table run uses
the same mode, project and group. Offline it lands in `<out>/wandb/offline-run-*` (`wandb sync` uploads it);
the table files on disk stay the source of truth (`lmk.tables` rebuilds them from results.json alone). A W&B
failure is a warning, never a failed sweep.

Each row's own W&B run (the one its training logged to) also gets the row's cells in its summary
(`<name>/<column label>`, log_row_summaries), so W&B's run table, grouped by `<name>/row`, rebuilds the paper
table; at scales with an eval stage this is how the merged scores reach the row's run.
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
from lmk.run.results import Results
from lmk.sweep.table_renderer import Table, _fmt, caption, short_commit

log = logging.getLogger(__name__)


def sweep_wandb(out: str | Path) -> dict[str, Any] | None:
    """The W&B mode, project and group of the sweep's training runs (from their results.json); None when no run
    of the sweep logged to W&B (logger=csv, W&B disabled or failed to start)."""
    for path in sorted((Path(out) / "train").rglob("results.json")):
        try:
            info = Results.from_dict(json.loads(path.read_text())).wandb
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
        run.summary.update({**cell_summary(table), "caption": caption(table).replace("`", ""),
                            "notes": " ".join(table.notes)})
        where = str(Path(run.dir).parent) if info.get("mode") == "offline" else getattr(run, "url", None)
        run.finish()
        wandb.teardown()  # waits until the service wrote the run's records (the file `wandb sync` uploads)
        return where
    except Exception as err:  # noqa: BLE001 - W&B is a copy of the table: the files on disk are the result
        warnings.warn(f"W&B table logging failed ({type(err).__name__}: {err}); the table files are complete",
                      stacklevel=2)
        return None


def row_scores(table: Table, name: str) -> dict[tuple[str, str], dict[str, Any]]:
    """(block, row) -> that row's summary for its own W&B run: `<name>/<column label>` -> the table's cell x100
    (the values of cell_summary), plus `<name>/block` and `<name>/row` (the row's label) to group W&B's view by."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for block, rows in table.blocks.items():
        for row_id, cells in rows.items():
            scores: dict[str, Any] = {f"{name}/block": block, f"{name}/row": table.labels.get(row_id, row_id)}
            for key, label in table.column_keys():
                cell = cells.get(key)
                if cell is not None and cell.value is not None:
                    scores[f"{name}/{label}"] = round(100 * cell.value, 2)
            if len(scores) > 2:  # a failed row has no scores: its run keeps its own summary
                out[(block, row_id)] = scores
    return out


def row_runs(run_dir: str | Path | None, row_id: str) -> list[tuple[Path, dict[str, Any]]]:
    """The run folders of a table row (one, or one per seed) whose training logged to W&B, with the run's id."""
    base = Path(run_dir) if run_dir else None
    if base is None or not base.is_dir():
        return []  # a row read back from W&B itself (its run_dir is a URL): nothing local to update
    paths = [base / "results.json"] if (base / "results.json").is_file() else sorted(base.rglob("results.json"))
    found = []
    for path in paths:
        try:
            results = Results.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
        info = dict(results.wandb)
        if results.row_id != row_id or info.get("mode") not in ("online", "offline"):
            continue
        id_file = path.parent / "wandb_run_id"  # the id an exact resume continues (lmk.run.loggers)
        info["id"] = info.get("id") or (id_file.read_text().strip() if id_file.is_file() else None)
        info["init_timeout"] = results.section("logger").get("init_timeout")
        if info["id"]:
            found.append((path.parent, info))
    return found


def _write_summary(folder: Path, info: dict[str, Any], scores: dict[str, Any], mode: str) -> None:
    run = wandb.init(id=info["id"], resume="allow", dir=str(folder), project=info.get("project") or "lmk",
                     group=info.get("group"), name=info.get("name"), mode=mode, reinit="finish_previous",
                     settings=wandb.Settings(quiet=True, init_timeout=float(info.get("init_timeout") or 90.0)))
    run.summary.update(scores)
    run.finish()


def _online() -> bool:
    # fast path: the credential check lives with the training logger (lightning); offline rows never load it
    from lmk.run.loggers import wandb_credentials

    return os.environ.get("WANDB_MODE") not in ("offline", "disabled", "dryrun") and wandb_credentials()


def log_row_summaries(table: Table, name: str) -> int:
    """Write each row's column scores (the table's cells, see row_scores) into the summary of the row's own W&B
    run(s), so W&B's run table rebuilds the paper table. The run is resumed by its id: online when it ran online
    and an API key is set, else as a new offline segment of the same id next to the run's others (`wandb sync`
    uploads them all). Returns the number of runs updated; a W&B failure is one warning, never a failed sweep."""
    if not verbose():
        os.environ.setdefault("WANDB_SILENT", "true")  # wandb's banners: the sweep prints the one line that matters
    online: bool | None = None  # checked once, at the first row that ran online
    written = 0
    for (block, row_id), scores in row_scores(table, name).items():
        first = next(iter(table.blocks[block][row_id].values()), None)
        for folder, info in row_runs(first.run_dir if first else None, row_id):
            if info["mode"] == "online" and online is None:
                online = _online()
            mode = "online" if info["mode"] == "online" and online else "offline"
            try:
                _write_summary(folder, info, scores, mode)
                written += 1
            except Exception as err:  # noqa: BLE001 - W&B is a copy of the table: the files on disk are the result
                reason = " ".join(str(err).split())  # one line
                warnings.warn(f"W&B summary of row {row_id} not written ({type(err).__name__}: {reason}); the "
                              "table files are complete", stacklevel=2)
                online = False  # an unreachable server: the next rows go offline instead of waiting again
    if written:
        wandb.teardown()  # waits until the service wrote the runs' records (the files `wandb sync` uploads)
    return written
