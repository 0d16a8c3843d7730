"""Tests write nothing into the repository: what `git status` shows when the session starts and when it ends must
agree, or the run fails naming each path (a pytest plugin, loaded by conftest.py; under xdist the controller alone
checks, after every worker is done).

Compared: tracked files changed and untracked files (with their contents' hash, so a file already modified before
the run and written again by a test counts), and new ignored entries outside the caches below (a test that leaves
`multirun/`, `lightning_logs/` or a `slurm-<job>.out` in the root fails, ignored or not). Files inside an ignored
folder that already existed (a local `outputs/`) are not seen: a clean clone, as CI's, sees them all."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

# ignored folders tools keep on purpose: the interpreter's bytecode, the venv, test and lint caches, the node cache
CACHES = ("__pycache__/", ".venv/", ".pytest_cache/", ".ruff_cache/", ".hypothesis/", ".wheelhouse/", ".node-sim/")
_BEFORE = pytest.StashKey[dict]()


def _git(root: Path, *args: str) -> list[str]:
    out = subprocess.run(["git", "-C", str(root), "status", "--porcelain=v1", "-z", *args], capture_output=True,
                         check=True, timeout=120).stdout.decode()
    return [entry for entry in out.split("\0") if entry]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""


def snapshot(root: Path) -> dict[str, str]:
    """Every entry git shows as changed, untracked or (outside CACHES) newly ignored -> its status and content."""
    state = {}
    for entry in _git(root, "--untracked-files=all"):
        code, path = entry[:2], entry[3:]
        state[path] = f"{code} {_digest(root / path)}"
    for entry in _git(root, "--ignored=traditional", "--untracked-files=normal"):
        code, path = entry[:2], entry[3:]
        if code == "!!" and not any(f"/{cache}" in f"/{path}" for cache in CACHES):
            state[path] = "!!"
    return state


def left_behind(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """The paths a run added or changed (a path it removed again is not its leftover)."""
    return sorted(path for path, state in after.items() if before.get(path) != state)


def _root(config: pytest.Config) -> Path | None:
    proc = subprocess.run(["git", "-C", str(config.rootpath), "rev-parse", "--show-toplevel"], capture_output=True,
                          text=True, timeout=60)
    return Path(proc.stdout.strip()) if proc.returncode == 0 else None  # not a checkout: nothing to guard


def pytest_sessionstart(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput") or (root := _root(session.config)) is None:
        return
    session.config.stash[_BEFORE] = {"root": root, "state": snapshot(root)}


def pytest_sessionfinish(session: pytest.Session) -> None:
    before = session.config.stash.get(_BEFORE, None)
    if before is None:
        return
    paths = left_behind(before["state"], snapshot(before["root"]))
    if not paths:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.section("files the tests left in the repository", red=True)
        for path in paths:
            reporter.write_line(f"  {path}")
        reporter.write_line("  a test writes into the checkout: give it tmp_path (or cwd=tmp_path) instead "
                            "(or these files were edited while the tests ran: run them again)")
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
