"""Extending is a recipe: docs/extending.md's pooling, scoring and training objective recipes, performed exactly as
written in a copy of the repository, are picked up by the registries, by the tests' parametrisation and by
`lmk.train` / `lmk.evaluate`, with no other file touched."""

from __future__ import annotations

import json
import math
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


POOLING_RECIPE = ["conf/pooling/lmk-max.yaml", "lmk/model/landmark/max_landmark.py", "lmk/model/landmark/names.py"]
SCORING_RECIPE = ["lmk/config/scorings.py", "lmk/eval/mean_maxsim.py"]
OBJECTIVE_RECIPE = ["lmk/config/objectives.py", "lmk/train/mean_maxsim.py"]


def _recipe() -> dict[str, tuple[str | None, str]]:
    return {m["path"]: (m["into"], m["body"]) for m in RECIPE.finditer((ROOT / "docs" / "extending.md").read_text())}


def _copy_with(tmp_path: Path, paths: list[str]) -> Path:
    """A copy of the repository with the recipe's `paths` performed as written."""
    copy = tmp_path / "repo"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for part in ("lmk", "conf", "tests", "hydra_plugins", "experiments", "docs"):
        shutil.copytree(ROOT / part, copy / part, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    recipe = _recipe()
    assert sorted(recipe) == sorted(POOLING_RECIPE + SCORING_RECIPE + OBJECTIVE_RECIPE), "the recipes: a class and its declaration each"
    for rel in paths:
        table, body = recipe[rel]
        if table:
            _add_to_table(copy / rel, table, body)
            continue
        assert not (copy / rel).exists()
        (copy / rel).write_text(body)
    return copy


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
    copy = _copy_with(tmp_path, POOLING_RECIPE)  # one class, its declaration and one YAML

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


# the tiny evaluation: an untrained tiny encoder on the local docstring task, on the CPU
TINY_EVAL = ["model=null", "encoder=tiny-modernbert", "eval=local", "eval.tasks=[LocalShort]",
             "eval.groups={local-short:[LocalShort]}", "eval.short_n_queries=20", "eval.short_n_docs=60",
             "eval.query_max_length=24", "eval.passage_max_length=96", "eval.show_progress=false", "eval.device=cpu",
             "eval.precision=fp32", "eval.workers=0", "logger=none"]


@pytest.mark.slow  # a new scoring through validation and a tiny evaluation, each a process of its own
def test_the_scoring_recipe_is_picked_up_everywhere(tmp_path: Path) -> None:
    copy = _copy_with(tmp_path, SCORING_RECIPE)  # one class and its declaration

    # the declaration validates torch-free; the class registers under the declared name
    code = ("import sys\nfrom lmk.config import EvalConfig, registry\n"
            f"import lmk.config as c; assert c.__file__.startswith({str(copy)!r}), c.__file__\n"
            "assert EvalConfig(scoring='maxsim_mean').scoring == 'maxsim_mean'\n"
            "assert registry.declared_scorings()['maxsim_mean']['needs_landmarks'] and 'torch' not in sys.modules\n"
            "from lmk.eval.scorings import scoring_class\n"
            "assert scoring_class('maxsim_mean').__name__ == 'MeanMaxSimEncoder'")
    proc = _run([sys.executable, "-c", code], copy)
    assert proc.returncode == 0, proc.stderr[-3000:]

    # a pooling without landmark states is refused from the declared needs, before any model loads
    proc = _run([sys.executable, "-m", "lmk.evaluate", *TINY_EVAL, "pooling=cls", "eval.scoring=maxsim_mean",
                 f"hydra.run.dir={tmp_path / 'refused'}"], copy)
    assert proc.returncode != 0 and "has no landmarks" in proc.stdout + proc.stderr

    # an evaluation with it, through the real command (validation, model, mteb, results.json)
    run_dir = tmp_path / "eval"
    proc = _run([sys.executable, "-m", "lmk.evaluate", *TINY_EVAL, "pooling=lmk-fixed", "eval.scoring=maxsim_mean",
                 f"hydra.run.dir={run_dir}"], copy)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    section = json.loads((run_dir / "results.json").read_text())["eval"]
    assert section["scoring"] == "maxsim_mean" and section["maxsim_query"] == "landmarks"
    assert 0 <= section["tasks"]["LocalShort"]["main_score"] <= 1 and "maxsim_search_seconds" in section


# the tiny training: Table 2's smoke scale (a tiny random ModernBERT, 2 steps on the CPU)
TINY_TRAIN = ["experiment=table2-tiny", "++row=maxsim_mean"]

# the objective's loss equals InfoNCE over MaxSim divided by each query's vector count, at train.tau
OBJECTIVE_LOSS = """
import torch
from lmk.config import TrainSection
from lmk.train.losses import maxsim, scores_loss
from lmk.train.objectives import build_objective
objective = build_objective(TrainSection(objective="maxsim_mean", tau=0.05))
assert type(objective).__name__ == "MeanMaxSim" and objective.embedding == "landmark_states"
torch.manual_seed(0)
qs, ps = (torch.nn.functional.normalize(torch.randn(n, length, 8), dim=-1) for n, length in ((2, 3), (4, 5)))
qm, pm = torch.tensor([[1, 1, 1], [1, 0, 0]]).bool(), torch.ones(4, 5, dtype=torch.bool)
got = objective.loss((qs, qm), (ps, pm), group_size=2, in_batch=True, teacher_scores=None, offset=0)
want = scores_loss(maxsim(qs, qm, ps, pm) / torch.tensor([[3.0], [1.0]]) / 0.05, 2, True)
torch.testing.assert_close(got, want)
"""


@pytest.mark.slow  # a new objective through validation and a tiny training run, each a process of its own
def test_the_objective_recipe_is_picked_up_everywhere(tmp_path: Path) -> None:
    copy = _copy_with(tmp_path, OBJECTIVE_RECIPE)  # one class and its declaration

    # the declaration validates torch-free, a misspelt name is refused naming it; the class builds from its module
    code = ("import sys\nfrom lmk.config import ConfigError, TrainSection, registry\n"
            f"import lmk.config as c; assert c.__file__.startswith({str(copy)!r}), c.__file__\n"
            "assert TrainSection(objective='maxsim_mean').objective == 'maxsim_mean'\n"
            "assert registry.declared_objectives()['maxsim_mean']['embedding'] == 'landmark_states'\n"
            "try:\n    TrainSection.coerce({'objective': 'maxsim_maen'})\n"
            "except ConfigError as e:\n    assert 'maxsim_mean' in str(e), e\nelse:\n    raise AssertionError\n"
            "assert 'torch' not in sys.modules\n" + OBJECTIVE_LOSS)
    proc = _run([sys.executable, "-c", code], copy)
    assert proc.returncode == 0, proc.stderr[-3000:]

    # a pooling without landmark states is refused from the declared embedding, before any model loads
    proc = _run([sys.executable, "-m", "lmk.train", *TINY_TRAIN, "pooling=cls", "train.objective=maxsim_mean",
                 f"hydra.run.dir={tmp_path / 'refused'}"], copy)
    assert proc.returncode != 0 and "train.objective=maxsim_mean: pooling 'cls'" in proc.stdout + proc.stderr
    assert not (tmp_path / "refused" / "checkpoints").exists()

    # a training run with it, through the real command (validation, model, Lightning, results.json)
    run_dir = tmp_path / "run"
    proc = _run([sys.executable, "-m", "lmk.train", *TINY_TRAIN, "pooling=lmk-fixed", "train.objective=maxsim_mean",
                 f"hydra.run.dir={run_dir}"], copy)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "done" and results["config"]["train"]["objective"] == "maxsim_mean"
    assert results["metrics"]["global_step"] == 2 and math.isfinite(results["metrics"]["train/loss"])
