"""The commands a user types, run exactly as typed (make targets through `make`, from the repository root)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from lmk.analysis import notebooks as nbr
from lmk.config.paths import repo_root

REPO = repo_root()
PNG = b"\x89PNG\r\n\x1a\n"


def make(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    """`make <args>` in the checkout, as a user runs it (offline, W&B offline)."""
    # not as a sub-make of `make test` (its flags and "Entering directory" lines are not what a user sees)
    env = {**{k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES")},
           "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(["make", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"make {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory) -> Path:
    """`make reproduce-table2 SCALE=tiny OUT=<tmp>`: the sweep the notebook commands analyse."""
    out = tmp_path_factory.mktemp("outputs")
    make("reproduce-table2", "SCALE=tiny", f"OUT={out}")
    assert (out / "table2" / "tiny" / "table2.md").is_file()
    return out


def test_repo_root_is_found_from_the_repository_not_a_module_depth():
    assert (REPO / "pyproject.toml").is_file() and (REPO / "conf" / "train.yaml").is_file()
    assert nbr.DEFAULT_DIR == REPO / "notebooks"


def test_make_notebooks_as_typed_after_a_sweep(tiny_sweep):
    proc = make("notebooks", f"OUT={tiny_sweep}")  # no SCALE: the runner picks the sweep present
    assert "no notebooks found" not in proc.stdout + proc.stderr
    executed = tiny_sweep / "notebooks" / "attention_position_bias.ipynb"
    nb = nbr.read(executed)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    said = [o.get("text", "") for o in outputs if o.output_type == "stream" and "Using the" in o.get("text", "")]
    assert said and said[0].startswith("Using the tiny sweep, 7 trained runs")  # it says which sweep it analysed
    figures = sorted((tiny_sweep / "notebooks" / "attention_position_bias_figures").glob("*.png"))
    assert len(figures) == 5 and all(f.read_bytes()[:8] == PNG for f in figures)
