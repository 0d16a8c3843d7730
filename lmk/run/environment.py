"""The environment lock: `requirements.lock` pins every distribution `.[dev]` installs (CPU torch).

`make install` installs torch first, then `pip install -c requirements.lock -e .[dev]`; `make lock` refreshes
the lock from a fresh resolution (`pip install --dry-run --ignore-installed --report`, then
`python -m lmk.run.environment lock <report> requirements.lock`). Every results.json records the lock's hash
and the installed distributions that differ from it (`environment_info`), and the table prints them, so a
changed number can be told apart: "my environment differs" (a difference listed) from "the code changed".
GPU users swap the torch line for their CUDA build (a local version label such as +cu128 matches the pin).

    python -m lmk.run.environment check                  # lists what differs from the lock (exit 1 if any)
    python -m lmk.run.environment lock REPORT [OUT]      # a pip --report JSON -> the lock file
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

from lmk.config.paths import repo_root

LOCK_FILE = "requirements.lock"
PROJECT = "lmk"
# Installer tools: present in any venv, never part of what the code computes with.
_IGNORED = frozenset({"pip", "setuptools", "wheel", PROJECT})
_HEADER = """# The full environment of `pip install -e .[dev]` with CPU torch, resolved by `make lock` (do not edit by hand).
# `make install` installs torch==2.13.0 first, then `pip install -c requirements.lock -e .[dev]`.
# GPU users: replace the torch line with their CUDA build (e.g. torch==2.13.0+cu128 still matches it).
"""


def canonical(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _public(version: str) -> str:
    # torch 2.13.0+cpu and 2.13.0+cu128 both satisfy ==2.13.0: the lock pins the public version
    return version.split("+", 1)[0]


def lock_path() -> Path | None:
    """The repository's lock file (None outside a checkout, e.g. a wheel install)."""
    root = repo_root()
    path = root / LOCK_FILE if root else None
    return path if path is not None and path.is_file() else None


def read_lock(path: str | os.PathLike) -> dict[str, str]:
    """{canonical name: version} of a lock file's `name==version` lines."""
    pins = {}
    for line in Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[canonical(name.split("[", 1)[0].strip())] = _public(version.split(";", 1)[0].strip())
    return pins


def lock_hash(path: str | os.PathLike | None = None) -> str | None:
    """A short hash of the lock's pins (comments and order do not count); None without a lock."""
    path = path or lock_path()
    if path is None:
        return None
    pins = read_lock(path)
    return hashlib.sha256("\n".join(f"{k}=={v}" for k, v in sorted(pins.items())).encode()).hexdigest()[:12]


def installed() -> dict[str, str]:
    """{canonical name: public version} of every distribution this interpreter sees."""
    out = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            out.setdefault(canonical(name), _public(dist.version))
    return out


def differences(pins: dict[str, str], have: dict[str, str] | None = None) -> list[str]:
    """Installed distributions that the lock does not pin, or pins at another version."""
    have = installed() if have is None else have
    out = []
    for name, version in sorted(have.items()):
        if name in _IGNORED:
            continue
        if name not in pins:
            out.append(f"{name} {version} (not in the lock)")
        elif pins[name] != version:
            out.append(f"{name} {version} (lock {pins[name]})")
    return out


@lru_cache(maxsize=1)
def environment_info() -> dict[str, Any]:
    """What results.json records: the lock hash, Python, and what differs from the lock (empty: matches)."""
    path = lock_path()
    info: dict[str, Any] = {"lock": lock_hash(path), "python": sys.version.split()[0]}
    if path is not None:
        diff = differences(read_lock(path))
        info["differs_from_lock"] = diff[:20]
        info["n_differ"] = len(diff)
    return info


def write_lock(report: str | os.PathLike, out: str | os.PathLike) -> Path:
    """The lock from a `pip install --dry-run --ignore-installed --report` JSON (the project itself left out)."""
    items = json.loads(Path(report).read_text())["install"]
    pins = {canonical(i["metadata"]["name"]): _public(i["metadata"]["version"]) for i in items}
    lines = [f"{name}=={version}" for name, version in sorted(pins.items()) if name not in _IGNORED]
    out = Path(out)
    out.write_text(_HEADER + "\n".join(lines) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lmk.run.environment", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("check", help="list the installed distributions that differ from the lock")
    lock = sub.add_parser("lock", help="write the lock from a pip --report JSON")
    lock.add_argument("report")
    lock.add_argument("out", nargs="?", default=LOCK_FILE)
    args = parser.parse_args(argv)
    if args.cmd == "lock":
        path = write_lock(args.report, args.out)
        print(f"{path}: {len(read_lock(path))} pins, hash {lock_hash(path)}")
        return 0
    path = lock_path()
    if path is None:
        print(f"no {LOCK_FILE} next to this checkout; run `make lock` in the repository")
        return 1
    diff = differences(read_lock(path))
    print(f"lock {lock_hash(path)}: " + ("the environment matches it" if not diff else
                                         f"{len(diff)} differ:\n  " + "\n  ".join(diff)))
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
