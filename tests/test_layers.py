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


# The import checks below each need an interpreter that has not loaded what they look for. They share two fresh
# interpreters instead of one each (each start imports torch, transformers and hydra again: seconds of CPU). A check
# in a shared interpreter judges as a fresh one would only while the modules it looks for are still unloaded when it
# starts: each stage names them (`absent`), the chain asserts that before running it, and a later stage never takes
# away what an earlier one found. The order: what loads less first.
_CHAIN = """
import json, os, sys, traceback
from pathlib import Path
tmp = Path(sys.argv[1])

def stage(name, absent, body):
    early = sorted(m for m in absent if m in sys.modules)
    out = {'loaded_before': early}
    if not early:
        try:
            out.update(body(tmp / name) or {})
        except BaseException:
            out['error'] = traceback.format_exc()[-3000:]
    print('STAGE ' + json.dumps({name: out}), flush=True)

def fresh_cache(folder):
    os.environ['LMK_CACHE'] = str(folder / 'cache')  # read when used (lmk.run.umask_files.cache_root)
"""

# interpreter A: the commands' refusals (nothing heavy), the sweep driver (no model stack), then an evaluation without
# and with Lightning's CSV logger
_DRIVER_AND_EVAL = _CHAIN + """
import contextlib, io, runpy
HEAVY = ('torch', 'transformers', 'mteb', 'scipy')

def command(module, *argv):
    # `python -m <module> *argv` as typed (its __main__ block included): (exit code, stderr)
    err = io.StringIO()
    sys.argv = [module, *argv]
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            runpy.run_module(module, run_name='__main__', alter_sys=True)
            code = 0
        except SystemExit as exit:
            code = exit.code
    return code, err.getvalue()

def sweep_refusal(folder):
    code, err = command('lmk.sweep', 'experiments/table2/spec.yaml', '--scale', 'nope')
    return {'code': code, 'stderr': err, 'loaded': sorted(m for m in HEAVY if m in sys.modules)}

def export_refusal(folder):
    helped, _ = command('lmk.export', '--help')
    code, err = command('lmk.export', str(folder / 'no-run'), '--out', str(folder / 'out'))
    return {'help': helped, 'code': code, 'stderr': err, 'loaded': sorted(m for m in HEAVY if m in sys.modules)}

def driver(folder):
    import lmk.sweep.cost, lmk.model.shape, lmk.model.backbone, lmk.train.command, lmk.sweep.rows
    return {'loaded': sorted(m for m in ('sentence_transformers', 'mteb', 'lightning') if m in sys.modules)}

def evaluation(logger):
    def body(folder):
        from hydra import compose, initialize_config_dir
        from lmk.config import CONF_DIR
        from lmk.eval.command import run
        fresh_cache(folder)
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            cfg = compose('evaluate', overrides=['model=null', 'encoder=tiny-modernbert', 'pooling=mean',
                'eval=local', 'eval.tasks=[LocalPasskey]', '~eval.groups', '+eval.groups={p:[LocalPasskey]}',
                'eval.lengths=[256]', 'eval.n_docs=10', 'eval.n_queries=5', f'logger={logger}',
                'eval.show_progress=false'])
        section = run(cfg, run_dir=str(folder / 'run'))
        return {'lightning': 'lightning' in sys.modules, 'tasks': sorted(section['tasks']),
                'metrics_csv': (folder / 'run' / 'metrics.csv').is_file()}
    return body

stage('sweep-refusal', HEAVY, sweep_refusal)
stage('export-refusal', HEAVY, export_refusal)
stage('driver', ('sentence_transformers', 'mteb', 'lightning'), driver)
stage('eval-none', ('lightning',), evaluation('none'))
stage('eval-csv', ('lightning',), evaluation('csv'))
"""

# interpreter B: the model layer and the training step, then training jobs that evaluate nothing
_MODEL_AND_TRAINING_JOB = _CHAIN + """
FORBIDDEN = ('mteb', 'datasets', 'wandb', 'submitit', 'pydantic')

def model_layer(folder):
    import sentence_transformers
    before = set(sys.modules)
    import benchmarks.gpu_sections, benchmarks.encode_pipeline, lmk.config, lmk.data.collator
    import lmk.model.embedding, lmk.model.backbone, lmk.model.shape, lmk.sweep.cost, lmk.train.memory
    import lmk.train.module
    return {'loaded': sorted({m.split('.')[0] for m in set(sys.modules) - before} & set(FORBIDDEN))}

def training_job(evaluates):
    def body(folder):
        from hydra import compose, initialize_config_dir
        from lmk.config import CONF_DIR, ConfigError
        from lmk.hub.artifacts import check_available
        from lmk.train.command import validate_job
        from lmk.train.fit import build_callbacks
        folder.mkdir(parents=True)
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            cfg = compose('train', overrides=['experiment=tiny', f'run_dir={folder}', *evaluates])
        typed = validate_job(cfg, in_job=True)
        check_available(cfg)
        callbacks = build_callbacks(typed, folder, has_logger=False, config_hash='x')
        out = {'callbacks': len(callbacks), 'mteb': 'mteb' in sys.modules}
        if cfg.eval.tasks:  # the sweeper's check of the same job (it loads mteb: last)
            cfg.eval.tasks = [*cfg.eval.tasks, 'LocalPaskey']
            try:
                validate_job(cfg)
            except ConfigError as err:
                out['sweeper'] = next(iter(str(err).splitlines()), '')  # the line the sweeper prints first
        return out
    return body

# the model layer's check is against what sentence-transformers loads itself: nothing of FORBIDDEN before it
stage('model-layer', ('sentence_transformers', *FORBIDDEN), model_layer)
stage('eval-none', ('mteb',), training_job(['eval=none']))
stage('eval-stage-only', ('mteb',), training_job(['eval=local', 'eval.in_training=none']))
"""


def _run_chain(code: str, folder: Path, env: dict | None = None) -> dict[str, dict]:
    proc = subprocess.run([sys.executable, "-c", code, str(folder)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    stages = {}
    for line in proc.stdout.splitlines():
        if line.startswith("STAGE "):
            stages.update(json.loads(line[len("STAGE "):]))
    return stages


def _stage(stages: dict[str, dict], name: str) -> dict:
    out = stages[name]
    assert not out["loaded_before"], f"an earlier check of the shared interpreter loaded {out['loaded_before']}"
    assert "error" not in out, out["error"]
    return out


@pytest.fixture(scope="module")
def driver_and_eval(tmp_path_factory) -> dict[str, dict]:
    # WANDB_MODE=offline: the driver's console would show transformers' W&B banner if it loaded the model stack
    return _run_chain(_DRIVER_AND_EVAL, tmp_path_factory.mktemp("driver_and_eval"),
                      env={**os.environ, "WANDB_MODE": "offline"})


@pytest.fixture(scope="module")
def model_and_training_job(tmp_path_factory) -> dict[str, dict]:
    return _run_chain(_MODEL_AND_TRAINING_JOB, tmp_path_factory.mktemp("model_and_training_job"))


def test_the_model_layer_and_the_training_step_load_no_evaluation_stack(model_and_training_job) -> None:
    """What the gpu-check's model sections import (a GPU node runs them with the light wheelhouse) loads none of
    mteb, datasets, wandb, submitit or pydantic at run time: package __init__ files included, which the
    import-linter contract does not see."""
    # sentence-transformers (the poolers' base class) imports `datasets` itself when it is installed (a node without
    # it is fine: tests/test_node.py runs these sections there): what counts is what lmk's own code adds
    assert _stage(model_and_training_job, "model-layer")["loaded"] == []


def test_a_sweep_refuses_a_wrong_scale_before_any_heavy_stack_loads(driver_and_eval) -> None:
    """`python -m lmk.sweep <spec> --scale nope` fails in a second: the spec's checks load none of torch, transformers,
    mteb or scipy (the eval stage's merge and the cost model load theirs when they run)."""
    out = _stage(driver_and_eval, "sweep-refusal")
    assert out["code"] == 2 and "unknown scale 'nope'" in out["stderr"], out
    assert out["loaded"] == [], out


def test_an_export_refuses_a_missing_run_before_torch_loads(driver_and_eval) -> None:
    """`python -m lmk.export --help` and an export of a folder that is no training run answer without torch (nor
    transformers, mteb): lmk.export's names and the model side load only once nothing refuses."""
    out = _stage(driver_and_eval, "export-refusal")
    assert out["help"] == 0
    assert out["code"] == 2 and "has no results.json, so it is not a training run" in out["stderr"], out
    assert out["loaded"] == [], out


def test_a_sweep_driver_reads_configs_and_costs_without_the_model_stack(driver_and_eval) -> None:
    """The driver processes (the sweep, the rows sweeper, the dry run) read encoder shapes and job costs; they load
    no sentence-transformers, whose import prints transformers' W&B offline banner on the user's console."""
    assert _stage(driver_and_eval, "driver")["loaded"] == []


@pytest.mark.parametrize("evaluates", ["eval-none", "eval-stage-only"])
def test_a_training_job_that_evaluates_nothing_loads_no_mteb(model_and_training_job, evaluates) -> None:
    """A training job that evaluates nothing (eval=none; or eval.in_training=none, as at paper scale, where the eval
    stage evaluates): its checks before compute and its callbacks pass without mteb's registry, which costs each
    rank seconds of start-up. The sweeper's check of the same job still resolves every task name of the suite."""
    out = _stage(model_and_training_job, evaluates)
    assert out["callbacks"] >= 1 and out["mteb"] is False, out
    if evaluates == "eval-stage-only":
        assert "LocalPaskey" in out.get("sweeper", ""), out


@pytest.mark.parametrize("logger", ["none", "csv"])
def test_an_evaluation_that_logs_to_no_tracker_loads_no_lightning(driver_and_eval, logger) -> None:
    """`python -m lmk.evaluate` with `logger=none` (its default) loads no Lightning (seconds of start-up per eval
    job: Lightning's import pulls torchmetrics, scipy.signal and torch._dynamo); with `logger=csv` it builds
    Lightning's CSV logger and writes metrics.csv beside results.json (an evaluation has no Trainer to save it)."""
    out = _stage(driver_and_eval, f"eval-{logger}")
    assert out["tasks"] == ["LocalPasskey"]
    assert out["lightning"] is (logger == "csv"), out
    assert out["metrics_csv"] is (logger == "csv")
