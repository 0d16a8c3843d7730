"""What a user sees on the console: one line per event, no adverts or per-task progress bars, and a
config error as one line (the full trace only with HYDRA_FULL_ERROR=1, as Hydra does)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled"}
ENV.pop("HYDRA_FULL_ERROR", None)


def run(module: str, *overrides: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *overrides], cwd=ROOT, env=env or ENV,
                          capture_output=True, text=True, timeout=600)


def test_train_with_eval_prints_each_event_once(tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"query": f"about topic {i}", "pos": [f"topic {i} is described here"],
                                         "neg": [f"unrelated note {i}"]}) + "\n" for i in range(16)))
    run_dir = tmp_path / "run"
    # A real fit + an mteb evaluation (passkey only: no offline training set to build) + export.
    proc = run("lmk.train", "experiment=tiny", f"hydra.run.dir={run_dir}", f"data.sources=[{{path:'{pairs}'}}]",
               "data.max_rows=null", "eval=table2-tiny", "eval.tasks=[LocalPasskey]",
               "~eval.groups.local-short", "trainer.max_steps=2")
    console = proc.stdout + proc.stderr
    assert proc.returncode == 0, console[-3000:]
    for line in ("Seed set to 0", "GPU available:", "`Trainer.fit` stopped"):
        assert console.count(line) == 1, (line, console)
    assert "litlogger" not in console.lower() and "litmodels" not in console.lower()
    assert "Standardizing text corpus format" not in console  # mteb's per-task dataset map bar
    assert "Writing model shards" not in console               # one shard: seconds of work
    assert "eval LocalPasskey: ndcg_at_1=" in console          # lmk's own events stay on the console
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
