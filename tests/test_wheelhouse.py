"""A GPU node's own Python: `make gpu-check` runs there as given (no pip, no venv), `make wheelhouse` packs what it
lacks (benchmarks/wheelhouse.py), and the model stack's declared version range holds the node and the lock."""

from __future__ import annotations

import json
import os
import re
import subprocess
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from benchmarks import wheelhouse

ROOT = Path(__file__).resolve().parents[1]
NODE = ROOT / "benchmarks" / "nodes" / "h200.txt"


# `make` as a user types it, not as a sub-make of `make test` (which adds "Entering directory" lines and its flags)
MAKE_ENV = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES")}


def _make_n(*args: str) -> str:
    proc = subprocess.run(["make", "-n", *args], cwd=ROOT, capture_output=True, text=True, timeout=60, env=MAKE_ENV)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_gpu_check_runs_on_the_nodes_python_and_installs_nothing():
    plain = _make_n("gpu-check", "PYTHON=python3")
    assert plain.strip() == "python3 -m benchmarks.gpu_check --out outputs/gpu_check"
    with_archive = _make_n("gpu-check", "PYTHON=python3", "WHEELHOUSE=.wheelhouse/x.tar.xz")
    assert "python3 -m benchmarks.gpu_check" in with_archive and "--wheelhouse .wheelhouse/x.tar.xz" in with_archive
    for text in (plain, with_archive):
        assert not re.search(r"\bpip\b|venv|\binstall\b", text), text


def test_wheelhouse_target_names_the_node_python_and_group():
    text = _make_n("wheelhouse", "NODE=a.txt b.txt", "NODE_PYTHON=3.11", "GROUP=light")
    assert "--node a.txt --node b.txt --group light --python-version 3.11" in text
    assert "--out .wheelhouse/lmk-a-cp311-light.tar.xz" in text and "--max-mib 55" in text
    assert "--out .wheelhouse/lmk-h200-cp312.tar.xz" in _make_n("wheelhouse")


def test_the_gpu_sessions_command_fits_the_device_tool():
    """The one command a GPU session runs (documented in docs/gpu-node.md, not in the Makefile) stays within the
    device tool's 2000 characters, runs `make gpu-check` on the node's python3 and carries the archive `make
    wheelhouse` writes by default."""
    doc = (ROOT / "docs" / "gpu-node.md").read_text()
    section = doc.split("## 4. A GPU session with the device tool", 1)[1]
    (command,) = re.findall(r"^```\n(.*?)\n```", section, re.S | re.M)
    archive = re.search(r"--out (\S+)", _make_n("wheelhouse"))[1]
    assert len(command) <= 2000 and "\n" not in command and "$OUT" in command
    assert f"make gpu-check PYTHON=python3 WHEELHOUSE={archive} OUT=$OUT" in command
    assert f"--wheelhouse {archive}" in command and f'carry: ["{archive}"]' in section
    assert "GPU_RUN" not in (ROOT / "Makefile").read_text()


def test_node_list_reads_pip_freeze_and_later_lists_override(tmp_path):
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("# a comment\nTorch==2.11.0+cu130\nsentence_transformers==6.0.1\nrich\n-e git+x#egg=y\n"
                      "mylib @ file:///src/mylib\n")
    override = tmp_path / "over.txt"
    override.write_text("torch==2.13.0  # the CPU stand-in\nrich==15.0\n")
    node = wheelhouse.read_node([freeze, override])
    assert node == {"torch": "2.13.0", "sentence-transformers": "6.0.1", "rich": "15.0", "mylib": None}
    freeze.write_text("torch>=2\n")
    with pytest.raises(ValueError, match="pip freeze form"):
        wheelhouse.read_node([freeze])


def test_stubs_stand_for_the_nodes_pinned_packages_only(tmp_path):
    constraints = wheelhouse.node_stubs({"torch": "2.11.0+cu130", "rich": None}, tmp_path)
    assert constraints == ["torch==2.11.0+node"]
    (whl,) = tmp_path.glob("*.whl")
    with zipfile.ZipFile(whl) as z:
        meta = z.read("torch-2.11.0+node.dist-info/METADATA").decode()
    assert "Name: torch\nVersion: 2.11.0+node" in meta and "Requires-Dist" not in meta  # no CUDA wheels pulled


def test_groups_light_is_the_model_sections_needs_full_leaves_out_the_notebooks():
    full = wheelhouse.group_names("full")
    assert {"mteb", "datasets", "wandb", "submitit", "hydra-core", "torch"} <= set(full)
    assert not set(full) & set(wheelhouse.NOT_ON_NODES)
    light = wheelhouse.group_requirements("light")
    assert [wheelhouse.requirement_name(r) for r in light] == list(wheelhouse.LIGHT)
    assert "hydra-core>=1.3,<1.4" in light  # pyproject.toml's specifier
    with pytest.raises(ValueError, match="full or light"):
        wheelhouse.group_requirements("all")


def test_an_archive_for_another_python_is_refused(tmp_path):
    site = tmp_path / "site"
    (site / "pkg").mkdir(parents=True)
    (site / "pkg" / "__init__.py").write_text("X = 1\n")
    archive = tmp_path / "w.tar.xz"
    wheelhouse.pack(site, archive, {"python_version": "3.12", "packages": {"pkg": "1"}})
    with pytest.raises(SystemExit, match=r"built for Python 3.12, this is Python 3.11.*NODE_PYTHON=3.11"):
        wheelhouse.unpack(archive, tmp_path / "out", python_version="3.11")
    manifest = wheelhouse.unpack(archive, tmp_path / "out", python_version="3.12")
    assert manifest["packages"] == {"pkg": "1"} and (tmp_path / "out" / "pkg" / "__init__.py").is_file()
    assert json.loads((tmp_path / "out" / wheelhouse.MANIFEST).read_text())["python_version"] == "3.12"


# ---- the declared version range: the node's versions at the bottom, the lock's at the top -------------------
RANGES = {"torch": ("2.11", "2.14"), "transformers": ("5.17", "5.25"), "sentence-transformers": ("6.0", "6.4"),
          "huggingface-hub": ("1.33", None), "tokenizers": ("0.23", None)}


def _declared() -> dict[str, Requirement]:
    reqs = [Requirement(r) for r in wheelhouse._pyproject()["project"]["dependencies"]]
    return {wheelhouse.canonical(r.name): r for r in reqs}


def _lock() -> dict[str, str]:
    pins = (line.split("==") for line in (ROOT / "requirements.lock").read_text().splitlines() if "==" in line)
    return {wheelhouse.canonical(n): v.split()[0] for n, v in pins}


@pytest.mark.parametrize("name", sorted(RANGES))
def test_the_model_stack_declares_the_range_gpu_clusters_bring(name):
    spec = _declared()[name].specifier
    low, high = RANGES[name]
    assert Version(low) in spec and (high is None or Version(high) not in spec), spec
    node = wheelhouse.read_node([NODE])[name]
    assert Version(node.split("+")[0]) in spec, f"the node's {name} {node} is outside {spec}"
    assert Version(_lock()[name].split("+")[0]) in spec, f"the lock's {name} is outside {spec}"

