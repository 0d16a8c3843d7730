"""The architecture as checks (docs/architecture.md): the import-linter contracts of pyproject.toml (layers, a
torch-free config layer, no cycles), a tree a newcomer reads in a minute, and code small enough to read."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lmk"
# Entries of lmk/ that are not layers or leaves: the package marker, data files, and the command shims that keep
# `python -m lmk.<command>` (and the export path saved folders name) working.
SHIMS = ("evaluate.py", "tables.py", "download.py", "prefetch.py", "notebooks.py", "export.py")
MAX_ENTRIES, MAX_SHIM_LINES, MAX_MODULE_LINES, MAX_FUNCTION_LINES = 12, 20, 500, 80


def _sources() -> list[Path]:
    return sorted(p for p in [*PACKAGE.rglob("*.py"), *(ROOT / "hydra_plugins").rglob("*.py")])


def test_import_contracts_are_kept() -> None:
    linter = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(linter), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "0 broken" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_the_tree_shows_the_layers() -> None:
    entries = sorted(p.name for p in PACKAGE.iterdir() if p.name not in ("__init__.py", "__pycache__", "resources"))
    layers = [e for e in entries if e not in SHIMS]
    assert len(layers) <= MAX_ENTRIES, layers
    assert all((PACKAGE / e).is_dir() for e in layers), f"a top-level module that is not a shim: {layers}"
    for shim in SHIMS:
        lines = (PACKAGE / shim).read_text().splitlines()
        assert len(lines) < MAX_SHIM_LINES, f"lmk/{shim} is no thin shim ({len(lines)} lines)"


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_and_functions_stay_small(path: Path) -> None:
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES, f"{path.name}: {len(text.splitlines())} lines"
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)" for node in ast.walk(ast.parse(text))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{path.name}: functions over {MAX_FUNCTION_LINES} lines: {long}"


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_inside_functions_say_why_and_no_import_error_is_swallowed(path: Path) -> None:
    lines = path.read_text().splitlines()
    tree = ast.parse("\n".join(lines))
    unexplained, swallowed = [], []
    for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)):
        for node in ast.walk(fn):
            if isinstance(node, ast.Import | ast.ImportFrom):
                here, above = lines[node.lineno - 1], lines[node.lineno - 2].strip()
                if "#" not in here and not above.startswith("#"):
                    unexplained.append(node.lineno)
    for node in ast.walk(tree):
        if isinstance(node, ast.Try):
            for handler in node.handlers:
                names = ast.unparse(handler.type) if handler.type is not None else ""
                silent = all(isinstance(s, ast.Pass) for s in handler.body)
                if "ImportError" in names and silent:
                    swallowed.append(handler.lineno)
    assert not unexplained, f"{path.name}: imports inside functions without a comment saying why: lines {unexplained}"
    assert not swallowed, f"{path.name}: an ImportError swallowed silently at lines {swallowed}"


def test_the_model_layer_and_the_training_step_load_no_evaluation_stack() -> None:
    """What the gpu-check's model sections import (a GPU node runs them with the light wheelhouse) loads none of
    mteb, datasets, wandb, submitit or pydantic at run time: package __init__ files included, which the
    import-linter contract does not see."""
    forbidden = ("mteb", "datasets", "wandb", "submitit", "pydantic")
    # sentence-transformers (the poolers' base class) imports `datasets` itself when it is installed (a node without
    # it is fine: tests/test_node.py runs these sections there): what counts is what lmk's own code adds
    code = ("import sys, sentence_transformers\n"
            "before = set(sys.modules)\n"
            "import benchmarks.gpu_sections, benchmarks.encode_pipeline, lmk.config, lmk.data.collator\n"
            "import lmk.model.embedding, lmk.model.backbone, lmk.model.shape, lmk.sweep.cost, lmk.train.memory\n"
            "import lmk.train.module\n"
            f"print(sorted({{m.split('.')[0] for m in set(sys.modules) - before}} & set({forbidden!r})))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the last line: importing sentence-transformers under WANDB_MODE=offline prints transformers' banner first
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout


def test_a_sweep_driver_reads_configs_and_costs_without_the_model_stack() -> None:
    """The driver processes (the sweep, the rows sweeper, the dry run) read encoder shapes and job costs; they load
    no sentence-transformers, whose import prints transformers' W&B offline banner on the user's console."""
    code = ("import sys\n"
            "import lmk.sweep.cost, lmk.model.shape, lmk.model.backbone, lmk.train.command, lmk.sweep.rows\n"
            "print(sorted(m for m in ('sentence_transformers', 'mteb', 'lightning') if m in sys.modules))")
    env = {**os.environ, "WANDB_MODE": "offline"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]", proc.stdout


@pytest.mark.parametrize("evaluates", [["eval=none"], ["eval=local", "eval.in_training=none"]],
                         ids=["eval-none", "eval-stage-only"])
def test_a_training_job_that_evaluates_nothing_loads_no_mteb(tmp_path, evaluates) -> None:
    """A training job that evaluates nothing (eval=none; or eval.in_training=none, as at paper scale, where the eval
    stage evaluates): its checks before compute and its callbacks pass without mteb's registry, which costs each
    rank seconds of start-up. The sweeper's check of the same job still resolves every task name of the suite."""
    code = ("import sys\n"
            "from pathlib import Path\n"
            "from hydra import compose, initialize_config_dir\n"
            "from lmk.config import CONF_DIR, ConfigError\n"
            "from lmk.hub.artifacts import check_available\n"
            "from lmk.train.command import validate_job\n"
            "from lmk.train.fit import build_callbacks\n"
            "with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):\n"
            f"    cfg = compose('train', overrides=['experiment=tiny', 'run_dir={tmp_path}', *{evaluates!r}])\n"
            "typed = validate_job(cfg, in_job=True)\n"
            "check_available(cfg)\n"
            f"callbacks = build_callbacks(typed, Path({str(tmp_path)!r}), has_logger=False, config_hash='x')\n"
            "print(len(callbacks), 'mteb' in sys.modules)\n"
            "if cfg.eval.tasks:\n"
            "    cfg.eval.tasks = [*cfg.eval.tasks, 'LocalPaskey']\n"
            "    try:\n"
            "        validate_job(cfg)\n"
            "    except ConfigError as err:\n"
            "        print('sweeper:', err)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    count, loaded = next(line for line in lines if line.split()[0].isdigit()).split()
    assert int(count) >= 1 and loaded == "False", proc.stdout
    if "eval=local" in evaluates:
        assert any(line.startswith("sweeper:") and "LocalPaskey" in line for line in lines), proc.stdout


@pytest.mark.parametrize("logger", ["none", "csv"])
def test_an_evaluation_that_logs_to_no_tracker_loads_no_lightning(tmp_path, logger) -> None:
    """`python -m lmk.evaluate` with `logger=none` (its default) loads no Lightning (seconds of start-up per eval
    job: Lightning's import pulls torchmetrics, scipy.signal and torch._dynamo); with `logger=csv` it builds
    Lightning's CSV logger and writes metrics.csv beside results.json (an evaluation has no Trainer to save it)."""
    code = ("import json, sys\n"
            "from hydra import compose, initialize_config_dir\n"
            "from lmk.config import CONF_DIR\n"
            "from lmk.eval.command import run\n"
            "with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):\n"
            "    cfg = compose('evaluate', overrides=['model=null', 'encoder=tiny-modernbert', 'pooling=mean',\n"
            f"        'eval=local', 'eval.tasks=[LocalPasskey]', '~eval.groups', '+eval.groups={{p:[LocalPasskey]}}',\n"
            f"        'eval.lengths=[256]', 'eval.n_docs=10', 'eval.n_queries=5', 'logger={logger}',\n"
            "        'eval.show_progress=false'])\n"
            f"section = run(cfg, run_dir={str(tmp_path / 'run')!r})\n"
            "print(json.dumps({'lightning': 'lightning' in sys.modules, 'tasks': sorted(section['tasks'])}))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "LMK_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["tasks"] == ["LocalPasskey"]
    assert out["lightning"] is (logger == "csv"), out
    assert (tmp_path / "run" / "metrics.csv").is_file() is (logger == "csv")
