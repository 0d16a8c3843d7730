"""Execute notebooks with nbclient, papermill-style parameters, executed copies + PNG figures on disk.

    python -m lmk.notebooks --out outputs/notebooks [--param key=value ...] [--threads N] [NOTEBOOK ...]
    python -m lmk.notebooks --check-clean          # fail if a committed notebook holds outputs
    python -m lmk.notebooks --strip NOTEBOOK ...   # drop outputs in place (before committing)

Parameters: the notebook's cell tagged ``parameters`` holds the defaults; overrides go into a new cell
tagged ``injected-parameters`` right after it (as papermill does), so the defaults stay visible. An
override whose name the parameters cell does not assign is an error (a typo would be silently ignored).
Values are Python literals (``lengths=[256,512]``, ``results_dir=None``); anything else is a string.

Outputs for ``notebooks/x.ipynb``: ``<out>/x.ipynb`` (executed, also written when a cell fails) and
``<out>/x_figures/``: the notebook's ``fig_dir`` parameter is pointed there unless overridden; a notebook
without a ``fig_dir`` parameter gets its inline PNG outputs extracted there instead.
The kernel is ``python3`` from this interpreter's environment (jupyter_client starts a kernelspec whose
argv is ``python`` with ``sys.executable``), with the output folder as working directory.
"""

from __future__ import annotations

import argparse
import ast
import base64
import copy
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from lmk.config.paths import in_repo

PARAMETERS_TAG = "parameters"
INJECTED_TAG = "injected-parameters"
DEFAULT_DIR = in_repo("notebooks")


def read(path: str | Path) -> nbformat.NotebookNode:
    return nbformat.read(str(path), as_version=4)


def _tags(cell: Any) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def parameters_cell_index(nb: nbformat.NotebookNode) -> int | None:
    """Index of the first cell tagged `parameters`, or None."""
    for i, cell in enumerate(nb.cells):
        if PARAMETERS_TAG in _tags(cell):
            return i
    return None


def notebook_parameters(nb: nbformat.NotebookNode) -> dict[str, Any]:
    """Names assigned in the parameters cell, with their literal defaults (non-literals map to None)."""
    idx = parameters_cell_index(nb)
    if idx is None:
        return {}
    out: dict[str, Any] = {}
    for node in ast.parse(nb.cells[idx].source).body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        value = getattr(node, "value", None)
        for t in targets:
            if isinstance(t, ast.Name):
                try:
                    out[t.id] = ast.literal_eval(value) if value is not None else None
                except ValueError:
                    out[t.id] = None
    return out


def inject_parameters(nb: nbformat.NotebookNode, params: Mapping[str, Any]) -> nbformat.NotebookNode:
    """A copy of `nb` with an `injected-parameters` cell after the parameters cell (replacing an old one)."""
    nb = copy.deepcopy(nb)
    nb.cells = [c for c in nb.cells if INJECTED_TAG not in _tags(c)]
    if not params:
        return nb
    known = notebook_parameters(nb)
    idx = parameters_cell_index(nb)
    if idx is None:
        raise ValueError("the notebook has no cell tagged 'parameters'; it cannot take --param overrides")
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise ValueError(f"unknown notebook parameter(s) {unknown}; allowed: {', '.join(sorted(known))}")
    lines = ["# Injected parameters"] + [f"{k} = {v!r}" for k, v in params.items()]
    cell = nbformat.v4.new_code_cell("\n".join(lines), metadata={"tags": [INJECTED_TAG]})
    nb.cells.insert(idx + 1, cell)
    return nb


def parse_param(text: str) -> tuple[str, Any]:
    """'key=value' -> (key, Python literal or string). 'none'/'null' -> None."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key.isidentifier():
        raise ValueError(f"--param expects key=value with a Python identifier as key, got {text!r}")
    raw = raw.strip()
    if raw.lower() in ("none", "null"):
        return key, None
    try:
        return key, ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return key, raw


def has_outputs(nb: nbformat.NotebookNode) -> bool:
    """True when any code cell carries outputs or an execution count."""
    return any(
        c.cell_type == "code" and (c.get("outputs") or c.get("execution_count") is not None) for c in nb.cells
    )


def strip_outputs(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A copy without outputs / execution counts (what gets committed)."""
    nb = copy.deepcopy(nb)
    for c in nb.cells:
        if c.cell_type == "code":
            c.outputs = []
            c.execution_count = None
    return nb


def extract_images(nb: nbformat.NotebookNode, fig_dir: Path) -> list[Path]:
    """Write every inline image/png output to fig_dir/cell<i>_<j>.png."""
    paths = []
    for i, cell in enumerate(nb.cells):
        for j, out in enumerate(cell.get("outputs", [])):
            data = out.get("data", {}).get("image/png")
            if data:
                fig_dir.mkdir(parents=True, exist_ok=True)
                p = fig_dir / f"cell{i:02d}_{j}.png"
                p.write_bytes(base64.b64decode(data))
                paths.append(p)
    return paths


@dataclass
class NotebookRun:
    source: Path
    executed: Path
    fig_dir: Path
    figures: list[Path] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None


def execute_notebook(
    path: str | Path,
    out_dir: str | Path,
    params: Mapping[str, Any] | None = None,
    *,
    kernel_name: str = "python3",
    timeout: int = 1800,
) -> NotebookRun:
    """Execute one notebook top to bottom; always write the executed copy; raise on a failing cell."""
    src = Path(path)
    if not src.is_file():
        raise FileNotFoundError(f"no notebook at {src}")
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    fig_dir = out / f"{src.stem}_figures"
    nb = read(src)
    params = dict(params or {})
    declares_fig_dir = "fig_dir" in notebook_parameters(nb)
    if declares_fig_dir:
        params.setdefault("fig_dir", str(fig_dir))
    nb = inject_parameters(strip_outputs(nb), params)
    client = NotebookClient(
        nb, kernel_name=kernel_name, timeout=timeout, resources={"metadata": {"path": str(out)}}
    )
    run = NotebookRun(source=src, executed=out / src.name, fig_dir=Path(params.get("fig_dir", fig_dir)))
    start = time.perf_counter()
    try:
        client.execute()
    except CellExecutionError as e:
        run.error = str(e)
    finally:
        run.seconds = time.perf_counter() - start
        nbformat.write(nb, str(run.executed))
    if not declares_fig_dir:
        run.figures = extract_images(nb, fig_dir)
    elif run.fig_dir.is_dir():
        run.figures = sorted(run.fig_dir.glob("*.png"))
    if run.error is not None:
        raise RuntimeError(f"{src} failed (executed copy with the traceback: {run.executed}):\n{run.error}")
    return run


def _notebooks(paths: Sequence[str]) -> list[Path]:
    if paths:
        return [Path(p) for p in paths]
    found = sorted(DEFAULT_DIR.glob("*.ipynb"))
    if not found:
        raise SystemExit(f"no notebooks found under {DEFAULT_DIR}")
    return found


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lmk.notebooks", description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*", help=f"notebooks to run (default: {DEFAULT_DIR}/*.ipynb)")
    ap.add_argument("--out", default="outputs/notebooks", help="folder for executed copies + figures")
    ap.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="override a parameter")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    ap.add_argument("--kernel", default="python3", help="kernel name (default python3 of this environment)")
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="OMP_NUM_THREADS for the kernel (1 is much faster on an oversubscribed CPU)",
    )
    ap.add_argument("--check-clean", action="store_true", help="only check the notebooks hold no outputs")
    ap.add_argument("--strip", action="store_true", help="strip outputs in place instead of executing")
    args = ap.parse_args(argv)

    nbs = _notebooks(args.notebooks)
    if args.check_clean or args.strip:
        dirty = [p for p in nbs if has_outputs(read(p))]
        if args.strip:
            for p in dirty:
                nbformat.write(strip_outputs(read(p)), str(p))
                print(f"stripped {p}")
            return 0
        for p in dirty:
            print(f"{p} holds outputs; run: python -m lmk.notebooks --strip {p}", file=sys.stderr)
        return 1 if dirty else 0
    try:
        params = dict(parse_param(p) for p in args.param)
    except ValueError as e:
        ap.error(str(e))
    if args.threads is not None:
        if args.threads < 1:
            ap.error(f"--threads must be >= 1, got {args.threads}")
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the kernel inherits this process's environment
    status = 0
    for p in nbs:
        try:
            run = execute_notebook(p, args.out, params, kernel_name=args.kernel, timeout=args.timeout)
        except (RuntimeError, ValueError) as e:
            print(f"FAILED {e}", file=sys.stderr)
            status = 1
            continue
        print(f"{p} -> {run.executed} ({run.seconds:.0f} s, {len(run.figures)} figures in {run.fig_dir})")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
