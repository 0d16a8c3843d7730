"""The tests' warm `python -m` (tests/forked_cli.py) gives what a fresh interpreter gives, or runs one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import forked_cli
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("args", [["lmk.train", "experiment=tiny", "pooling.chunk_size=abc"],
                                  ["lmk.sweep", "experiments/table2/spec.yaml", "--scale", "nosuchscale"],
                                  ["lmk.evaluate", "--help"]])
def test_a_forked_command_exits_and_prints_as_a_fresh_interpreter(args: list[str], tmp_path: Path,
                                                                  monkeypatch) -> None:
    monkeypatch.delenv("LMK_TEST_FORK", raising=False)
    run_dir = [f"hydra.run.dir={tmp_path / 'run'}"] if args[0] == "lmk.train" else []  # nothing into the checkout
    cmd = [sys.executable, "-m", *args, *run_dir]
    assert forked_cli._forkable(cmd, ROOT, dict(os.environ), True, {})
    forked = forked_cli.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    fresh = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)


def test_a_command_past_its_timeout_is_killed_with_what_it_started(monkeypatch) -> None:
    monkeypatch.delenv("LMK_TEST_FORK", raising=False)
    cmd = [sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1"]  # serves until stopped
    with pytest.raises(subprocess.TimeoutExpired):
        forked_cli.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3)
    # the warm process took the next command: the killed child was reaped
    assert forked_cli.run([sys.executable, "-m", "lmk.evaluate", "--help"], cwd=ROOT, capture_output=True,
                          timeout=300).returncode == 0


@pytest.mark.parametrize(("change", "forkable"), [
    ({"WANDB_MODE": "disabled"}, True),            # read when the run starts
    ({"HF_ENDPOINT": "http://127.0.0.1:1"}, False),  # read when huggingface_hub is imported
    ({"PYTHONPATH": "/elsewhere"}, False),
    ({"OMP_NUM_THREADS": "7"}, False),
])
def test_an_environment_read_at_import_time_gets_a_fresh_interpreter(change: dict, forkable: bool,
                                                                      monkeypatch) -> None:
    monkeypatch.delenv("LMK_TEST_FORK", raising=False)
    cmd = [sys.executable, "-m", "lmk.evaluate", "--help"]
    assert forked_cli._forkable(cmd, ROOT, {**os.environ, **change}, True, {}) is forkable


def test_a_folder_with_python_code_or_other_commands_get_a_fresh_interpreter(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("LMK_TEST_FORK", raising=False)
    cmd = [sys.executable, "-m", "lmk.evaluate", "--help"]
    env = dict(os.environ)
    assert forked_cli._forkable(cmd, tmp_path, env, True, {})
    (tmp_path / "lmk.py").write_text("raise SystemExit('a module of the folder would shadow lmk')\n")
    assert not forked_cli._forkable(cmd, tmp_path, env, True, {})  # `python -m` would import the folder's lmk
    assert not forked_cli._forkable([sys.executable, "-c", "pass"], ROOT, env, True, {})
    assert not forked_cli._forkable(cmd, ROOT, env, False, {})  # output not captured: the console's own
    assert not forked_cli._forkable(cmd, ROOT, env, True, {"input": "x"})
