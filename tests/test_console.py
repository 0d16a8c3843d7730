"""What a user sees on the console: one line per event, no adverts or per-task progress bars, and a
config error as one line (the full trace only with HYDRA_FULL_ERROR=1, as Hydra does)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import forked_cli
import pytest

from lmk.run.cli import error_line, error_lines

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled"}
ENV.pop("HYDRA_FULL_ERROR", None)


def run(module: str, *overrides: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return forked_cli.run([sys.executable, "-m", module, *overrides], cwd=ROOT, env=env or ENV,
                          capture_output=True, text=True, timeout=600)


def test_train_with_eval_prints_each_event_once(tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"query": f"about topic {i}", "pos": [f"topic {i} is described here"],
                                         "neg": [f"unrelated note {i}"]}) + "\n" for i in range(16)))
    run_dir = tmp_path / "run"
    # A real fit + an mteb evaluation (passkey only: no offline training set to build) + export.
    proc = run("lmk.train", "experiment=tiny", f"hydra.run.dir={run_dir}", f"data.sources=[{{path:'{pairs}'}}]",
               "data.max_rows=null", "eval=table2-tiny", "eval.tasks=[LocalPasskey]",
               "~eval.groups.local-short", "trainer.max_steps=2", "trainer.enable_progress_bar=true",
               "eval.show_progress=true")
    console = proc.stdout + proc.stderr
    assert proc.returncode == 0, console[-3000:]
    for line in ("Seed set to 0", "GPU available:", "`Trainer.fit` stopped"):
        assert console.count(line) == 1, (line, console)
    assert "litlogger" not in console.lower() and "litmodels" not in console.lower()
    assert "Standardizing text corpus format" not in console  # mteb's per-task dataset map bar
    assert "Writing model shards" not in console               # one shard: seconds of work
    assert "eval LocalPasskey: ndcg_at_1=" in console          # lmk's own events stay on the console
    (task_line,) = [line for line in console.splitlines() if "eval LocalPasskey:" in line]  # one line per task
    assert " in " in task_line and "texts/s" in task_line          # its score, time and speed
    assert "Epoch 0/-" not in console and "step 2/2 (100%)" in console  # lmk's progress line, right totals
    assert "Searching corpus chunks" not in console and "Generating train split" not in console
    # mteb's step-by-step INFO lines reach the run's log file, not the console.
    assert "Running retrieval task" not in console
    assert "Running retrieval task" in (run_dir / "train.log").read_text()
    assert json.loads((run_dir / "results.json").read_text())["status"] == "done"


@pytest.mark.parametrize(("module", "overrides", "names"), [
    ("lmk.train", ["experiment=tiny", "pooling.chunk_size=abc"], "chunk_size='abc'"),
    ("lmk.evaluate", ["model=null", "encoder=tiny-modernbert", "pooling=cls", "eval=table2-tiny",
                      "pooling.chunk_size=abc"], "chunk_size='abc'"),
    ("lmk.evaluate", ["model=null", "encoder=tiny-modernbert", "pooling=cls", "eval=table2-tiny",
                      "eval.lengths=[300]"], "eval.lengths=[300]"),
])
def test_config_error_is_one_line(tmp_path: Path, module: str, overrides: list[str], names: str) -> None:
    args = [*overrides, f"hydra.run.dir={tmp_path / 'run'}"]
    proc = run(module, *args)
    assert proc.returncode != 0
    assert names in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) <= 4, proc.stderr
    assert not (tmp_path / "run" / "results.json").exists()  # failed before anything ran
    full = run(module, *args, env={**ENV, "HYDRA_FULL_ERROR": "1"})
    assert full.returncode != 0 and "Traceback" in full.stderr and names in full.stderr


@pytest.mark.parametrize(("module", "override", "expected"), [
    ("lmk.train", "pooling.chunk_sise=3", ["Could not override 'pooling.chunk_sise'", "not in struct"]),
    ("lmk.train", "pooling=meen", ["Could not find 'pooling/meen'", "available options in 'pooling'", "lmk-fixed"]),
    ("lmk.evaluate", "eval.batch_sise=3", ["Could not override 'eval.batch_sise'"]),
])
def test_hydra_composition_error_is_one_line(tmp_path: Path, module: str, override: str, expected: list[str]) -> None:
    args = ["experiment=tiny"] if module == "lmk.train" else ["model=null", "eval=table2-tiny"]
    args += [override, f"hydra.run.dir={tmp_path / 'run'}"]
    proc = run(module, *args)
    assert proc.returncode != 0
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert all(text in proc.stderr for text in expected), proc.stderr
    assert "To append to your config" not in proc.stderr  # Hydra's advice, wrong for a typo
    full = run(module, *args, env={**ENV, "HYDRA_FULL_ERROR": "1"})  # Hydra's own report, in full
    assert full.returncode != 0 and "Traceback" in full.stderr


# A user error (lmk.config.UserError) through every entry point: what is wrong and the fix, no traceback.
BAD_ROW = "bad-row"
ERRORS = {  # the error -> (overrides, what the message names); each fails before the model loads
    BAD_ROW: (["experiment=tiny", "data.max_rows=null"], "'query' is int (3), not a string"),
    "model-path": (["experiment=tiny", "encoder.source=hub", "+encoder.model_id=/nonexistent/model"],
                   "/nonexistent/model"),
    "hub-task": (["experiment=tiny", "eval=table2-tiny", "eval.tasks=[SciFact]", "~eval.groups"], "mteb/scifact"),
    "eval-model-path": (["model=/nonexistent/model", "eval=table2-tiny"], "/nonexistent/model"),
    "eval-hub-task": (["model=null", "encoder=tiny-modernbert", "pooling=cls", "eval=table2-tiny",
                       "eval.tasks=[SciFact]", "~eval.groups"], "mteb/scifact"),
}
SCRIPTS = {"lmk.train": "lmk-train", "lmk.evaluate": "lmk-evaluate"}


@pytest.mark.parametrize(("entry", "error"), [
    ("python -m lmk.train", BAD_ROW), ("python -m lmk.train", "model-path"), ("python -m lmk.train", "hub-task"),
    ("lmk-train", BAD_ROW), ("python -m lmk.evaluate", "eval-model-path"), ("lmk-evaluate", "eval-hub-task"),
])
def test_user_error_is_what_and_fix_through_every_entry_point(tmp_path: Path, entry: str, error: str) -> None:
    overrides, names = ERRORS[error]
    if error == BAD_ROW:
        pairs = tmp_path / "pairs.jsonl"
        pairs.write_text('{"query": "a", "pos": ["b"]}\n{"query": 3, "pos": ["b"]}\n')
        overrides = [*overrides, f"data.sources=[{{path:'{pairs}'}}]"]
    module = entry.split()[-1] if entry.startswith("python") else next(m for m, s in SCRIPTS.items() if s == entry)
    cmd = [sys.executable, "-m", module] if entry.startswith("python") else [str(Path(sys.executable).parent / entry)]
    proc = forked_cli.run([*cmd, *overrides, f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=600)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) <= 3, proc.stderr
    assert lines[-2].startswith("Error: ") and names in lines[-2] and lines[-1].startswith("Fix: "), proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout and 'File "' not in proc.stderr + proc.stdout


def test_user_error_keeps_what_and_fix_through_pickling() -> None:
    # a sweep's job under submitit sends its exception back pickled: the row's line must not change
    from lmk.config import ConfigError, UserError
    from lmk.data.pairs import PairDataError
    from lmk.hub.artifacts import MissingArtifactsError

    err = PairDataError("f.jsonl:2: 'query' is int (3); not a string", fix="correct that row")
    back = pickle.loads(pickle.dumps(err))
    assert (back.what, back.fix) == ("f.jsonl:2: 'query' is int (3); not a string", "correct that row")
    assert isinstance(back, UserError) and isinstance(back, ValueError)
    house = ConfigError("pooling.chunk_size='abc' is not valid; allowed values: an integer")
    assert (house.what, house.fix) == ("pooling.chunk_size='abc' is not valid", "allowed values: an integer")
    report = MissingArtifactsError("offline and not on disk:\n  dataset x\nLooked in: y. Fix: run make download")
    assert report.what == "offline and not on disk:\n  dataset x\nLooked in: y" and report.fix == "run make download"
    assert error_lines(report) == ["Error: offline and not on disk: dataset x Looked in: y", "Fix: run make download"]
    assert error_line(RuntimeError("boom\nbang")) == "RuntimeError: boom bang"  # not a user error: type named


def test_user_error_traceback_on_request(tmp_path: Path) -> None:
    overrides, names = ERRORS["eval-model-path"]
    args = [sys.executable, "-m", "lmk.evaluate", *overrides, f"hydra.run.dir={tmp_path / 'run'}"]
    debug = forked_cli.run(args, cwd=ROOT, env={**ENV, "LMK_DEBUG": "1"}, capture_output=True, text=True, timeout=600)
    assert debug.returncode != 0 and "Traceback" in debug.stderr and names in debug.stderr


def test_progress_line_says_step_total_loss_speed_and_eta() -> None:
    from lmk.train.progress import progress_line

    assert progress_line(40, 200, 1.23456, 2.0, "cls: ") == "cls: step 40/200 (20%) | loss 1.235 | 2 steps/s | ETA 1m20s"
    assert progress_line(3, None, None, None) == "step 3"  # no max_steps: no total, no ETA
