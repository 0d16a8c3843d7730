"""The environment lock: requirements.lock pins every distribution of `.[dev]`, every
install path uses it, and every results.json records its hash."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

import lmk.run.results as results_module
from lmk.run import environment
from lmk.run.results import update_results

ROOT = Path(__file__).resolve().parent.parent


def test_the_lock_covers_every_installed_distribution() -> None:
    path = environment.lock_path()
    assert path == ROOT / environment.LOCK_FILE
    pins = environment.read_lock(path)
    assert pins["torch"] == "2.13.0" and pins["mteb"] and pins["numpy"]  # CPU torch; GPU users swap the line
    # the venv `make install` built from the lock: nothing unpinned, nothing at another version
    assert environment.differences(pins) == []


def test_every_install_path_uses_the_lock() -> None:
    make = (ROOT / "Makefile").read_text()
    install = make.split("$(STAMP):", 1)[1].split("\n\n", 1)[0]
    assert install.index("torch==2.13.0") < install.index("-c requirements.lock -e '.[dev]'")
    assert re.search(r"^lock:", make, re.M) and "lmk/run/environment.py lock" in make
    conda = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in conda["dependencies"] if isinstance(d, dict))
    assert pip[0] == "torch==2.13.0" and "-c requirements.lock" in pip
    assert "make test" in (ROOT / ".ci" / "run").read_text()  # which installs through `make install`


def test_results_json_records_the_lock_hash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    results = update_results(tmp_path, status="running")
    env = results["environment"]
    assert env["lock"] == environment.lock_hash() and len(env["lock"]) == 12
    assert env["n_differ"] == 0 and env["python"]
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["environment"]["lock"] == env["lock"]
    # a later writer under another environment (here: a stand-in record) is recorded beside the first
    other = {**env, "lock": "0" * 12}
    monkeypatch.setattr(results_module, "environment_info", lambda: other)
    merged = update_results(tmp_path, status="done")
    assert merged["environment"]["lock"] == env["lock"]
    assert merged["environment"]["also_written_under"] == [other]


def test_lock_hash_reads_the_pins_only_and_differences_name_them(tmp_path: Path) -> None:
    a, b = tmp_path / "a.lock", tmp_path / "b.lock"
    a.write_text("# header\nNumPy==2.0\ntorch==2.13.0+cpu\n")
    b.write_text("torch==2.13.0\nnumpy==2.0  # comment\n")
    assert environment.lock_hash(a) == environment.lock_hash(b)
    assert environment.read_lock(a) == {"numpy": "2.0", "torch": "2.13.0"}
    have = {"numpy": "2.1", "torch": "2.13.0", "extra-pkg": "1", "pip": "25"}
    assert environment.differences(environment.read_lock(a), have) == [
        "extra-pkg 1 (not in the lock)", "numpy 2.1 (lock 2.0)"]


def test_make_lock_writes_the_resolution_of_a_pip_report(tmp_path: Path) -> None:
    report = {"install": [{"metadata": {"name": "Torch", "version": "2.13.0+cpu"}},
                          {"metadata": {"name": "lmk", "version": "0.1"}},
                          {"metadata": {"name": "typing_extensions", "version": "4.15.0"}}]}
    (tmp_path / "r.json").write_text(json.dumps(report))
    out = environment.write_lock(tmp_path / "r.json", tmp_path / "requirements.lock")
    pins = [line for line in out.read_text().splitlines() if not line.startswith("#")]
    assert pins == ["torch==2.13.0", "typing-extensions==4.15.0"]  # the project itself is not pinned
