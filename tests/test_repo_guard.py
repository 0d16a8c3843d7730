"""The guard of tests/repo_guard.py, on a repository of its own: a pytest run whose test leaves a file in the
checkout fails naming it (untracked, ignored or a tracked file changed); a run that writes only to tmp_path and
the interpreter's caches passes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def _run(repo: Path, body: str) -> subprocess.CompletedProcess:
    (repo / "test_it.py").write_text("from pathlib import Path\n\nHERE = Path(__file__).parent\n\n\n"
                                     f"def test_it(tmp_path):\n    {body}\n")
    # the guard is the conftest's plugin: the installed ones (xdist, timeout, hydra's...) are not loaded, two thirds
    # of a run's start-up
    env = {**os.environ, "PYTHONPATH": str(TESTS), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_it.py"], cwd=repo,
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def repo(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / ".gitignore").write_text("__pycache__/\nmultirun/\n")
    (repo / "conftest.py").write_text("from repo_guard import pytest_sessionfinish, pytest_sessionstart  # noqa\n")
    (repo / "notes.txt").write_text("as it was\n")
    subprocess.run(["git", "-C", str(repo), "add", "."], check=True)
    return repo


@pytest.mark.parametrize(("body", "left"), [
    ("(HERE / 'slurm-55.out').write_text('CANCELLED')", "slurm-55.out"),
    ("(HERE / 'multirun').mkdir(); (HERE / 'multirun' / 'log').write_text('')", "multirun/"),  # ignored, and still a leftover
    ("(HERE / 'notes.txt').write_text('rewritten')", "notes.txt"),
])
def test_a_run_that_leaves_a_file_in_the_checkout_fails_naming_it(repo, body, left):
    proc = _run(repo, body)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout and "files the tests left in the repository" in proc.stdout
    assert f"  {left}\n" in proc.stdout


def test_a_run_that_writes_to_tmp_path_passes(repo):
    proc = _run(repo, "(tmp_path / 'out.txt').write_text('fine')")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "left in the repository" not in proc.stdout
