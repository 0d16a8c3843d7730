"""Extending is a recipe: docs/extending.md's pooling recipe, performed exactly as written in a copy of the
repository, is picked up by the registry, by the tests' parametrisation and by `lmk.train`, with no other file
touched."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# a new file, or (`into NAME`) lines added to the table NAME of an existing file
RECIPE = re.compile(r"<!-- recipe: (?P<path>\S+)(?: into (?P<into>\w+))? -->\s*```\w*\n(?P<body>.*?)```", re.S)
# the tests whose parametrisation iterates the registry or conf/pooling
PICKED_UP = ("tests/test_pooling.py", "tests/test_registry.py", "tests/test_model.py", "tests/test_export.py",
             "tests/test_analysis.py")


def _recipe() -> dict[str, tuple[str | None, str]]:
    return {m["path"]: (m["into"], m["body"]) for m in RECIPE.finditer((ROOT / "docs" / "extending.md").read_text())}


def _add_to_table(path: Path, table: str, lines: str) -> None:
    """`lines` added at the top of the module-level table `table = {` / `table: T = {` of `path`."""
    text = path.read_text()
    opening = re.search(rf"^{table}(: [^=]+)? = {{\n", text, re.M)
    assert opening, f"{path} has no table {table}"
    path.write_text(text[:opening.end()] + lines + text[opening.end():])


def _run(args: list[str], cwd: Path, **kw: object) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(cwd), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, **kw)


@pytest.mark.slow  # a new pooler through training, evaluation and export, each a process of its own
def test_the_pooling_recipe_is_picked_up_everywhere(tmp_path: Path) -> None:
    copy = tmp_path / "repo"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for part in ("lmk", "conf", "tests", "hydra_plugins", "experiments", "docs"):
        shutil.copytree(ROOT / part, copy / part, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    recipe = _recipe()
    assert sorted(recipe) == ["conf/pooling/lmk-max.yaml", "lmk/model/landmark/max_landmark.py",
                              "lmk/model/landmark/names.py"], "the recipe is one class, its declaration and one YAML"
    for rel, (table, body) in recipe.items():
        if table:
            _add_to_table(copy / rel, table, body)
            continue
        assert not (copy / rel).exists()
        (copy / rel).write_text(body)

    # the registries: the runtime one (the class) and the torch-free declaration config validation reads
    code = ("from lmk.model.landmark import POOLER_CLASSES; from lmk.config import registry\n"
            f"import lmk.model.landmark as p; assert p.__file__.startswith({str(copy)!r}), p.__file__\n"
            "assert 'lmk_max' in POOLER_CLASSES and registry.declared_poolers()['lmk_max']['needs_pool_mask']")
    proc = _run([sys.executable, "-c", code], copy)
    assert proc.returncode == 0, proc.stderr[-3000:]

    # the tests' parametrisation: each of these files gets cases for the new pooler / pooling by itself
    proc = _run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *PICKED_UP], copy)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for test_file in PICKED_UP:
        cases = [line for line in proc.stdout.splitlines() if line.startswith(test_file)
                 and ("lmk_max" in line or "lmk-max" in line)]
        assert cases, f"{test_file} has no case for the new pooling"

    # a training run with it, through the real command (validation, model, Lightning, export)
    run_dir = tmp_path / "run"
    proc = _run([sys.executable, "-m", "lmk.train", "experiment=tiny", "pooling=lmk-max", "trainer.max_steps=2",
                 "logger=none", f"hydra.run.dir={run_dir}"], copy)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = (run_dir / "results.json").read_text()
    assert '"status": "done"' in results and '"pooler": "lmk_max"' in results
