"""The GPU node simulated (`make test-node`): a fresh venv with only that node's packages at its versions
(benchmarks/nodes/h200.txt; what this CPU machine cannot match is in tests/fixtures/h200-simulated.txt), the
archives of `make wheelhouse` for this Python, no network. Every --cpu-smoke section passes with the full
archive; with the light one the model sections pass and the rehearsal is skipped, naming what it needs.

Building the venv reaches the package registry (once: it is cached in .node-sim/, keyed by the packages it
holds); the checks run in a network namespace of their own (loopback only, for the rehearsal's gloo ranks)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from benchmarks import wheelhouse

ROOT = Path(__file__).resolve().parents[1]
SIM = ROOT / ".node-sim"
NODE_FILES = "benchmarks/nodes/h200.txt tests/fixtures/h200-simulated.txt"
PY = f"{sys.version_info.major}.{sys.version_info.minor}"
# the node's own versions of the model stack, the bottom of pyproject.toml's range
NODE_VERSIONS = {"transformers": "5.17.0", "sentence-transformers": "6.0.1", "huggingface-hub": "1.33.0",
                 "tokenizers": "0.23.2", "lightning": "2.6.6", "safetensors": "0.8.0", "torch": "2.13.0+cpu"}
REHEARSAL_NEEDS = {"mteb", "datasets", "wandb", "submitit"}
pytestmark = [pytest.mark.slow, pytest.mark.timeout(4800)]  # archives, a venv and two checks: minutes each


def _run(cmd: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def _archive(group: str) -> tuple[Path, dict]:
    """`make wheelhouse` as typed, for this Python and the simulated node; the archive and its manifest."""
    out = SIM / f"{group}.tar.xz"
    # xz -0: the archive for this Python only stands in (the one that travels, at -9, is sized by make wheelhouse)
    proc = _run(["make", "wheelhouse", f"NODE={NODE_FILES}", f"NODE_PYTHON={PY}", f"GROUP={group}",
                 f"WHEELHOUSE_OUT={out}", "XZ_PRESET=0", "MAX_MIB="], timeout=1800, cwd=ROOT)
    print(proc.stdout)  # the archive's size and contents, in the test's log
    with tarfile.open(out, "r:xz") as tar:
        manifest = json.loads(tar.extractfile(wheelhouse.MANIFEST).read())
    return out, manifest


def _node_venv(node_txt: Path, node: dict[str, str | None]) -> Path:
    """A venv holding the node's packages lmk uses, at the versions the archive was resolved against, their own
    dependencies at the node's versions where the node's list pins them (cached)."""
    pins = "".join(f"{n}=={v.split('+')[0]}\n" for n, v in sorted(node.items()) if v)
    key = hashlib.sha256(node_txt.read_bytes() + pins.encode()).hexdigest()[:12]
    venv = SIM / f"venv-{PY}-{key}"
    python = venv / "bin" / "python"
    if (venv / ".complete").is_file():
        return python
    shutil.rmtree(venv, ignore_errors=True)
    _run([sys.executable, "-m", "venv", str(venv)], timeout=300)
    env = {**os.environ, "PIP_CACHE_DIR": str(ROOT / ".wheelhouse" / "pip-cache")}
    # torch first, alone: the CPU build on this machine's disk, as `make install` does (no CUDA download)
    torch_pin = next(line for line in node_txt.read_text().splitlines() if line.startswith("torch=="))
    # --no-compile: a test venv compiles only what the checks import, on import (pip would compile all of torch)
    _run([str(python), "-m", "pip", "install", "--quiet", "--no-compile", torch_pin], timeout=1800, env=env)
    (venv / "node-pins.txt").write_text(pins)
    _run([str(python), "-m", "pip", "install", "--quiet", "--no-compile", "-r", str(node_txt), "-c",
          str(venv / "node-pins.txt")], timeout=3600, env=env)
    # newer releases of the node's unpinned packages may need packages the node lacks (typer -> pydantic): removed,
    # so the venv holds only the node's names
    extra = sorted(set(_installed(python)) - set(node) - {"pip", "setuptools", "wheel"})
    if extra:
        _run([str(python), "-m", "pip", "uninstall", "--yes", "--quiet", *extra], timeout=600)
    (venv / ".complete").write_text(" ".join(extra) + "\n")
    return python


def _installed(python: Path) -> dict[str, str]:
    out = _run([str(python), "-m", "pip", "list", "--format=json"], timeout=120).stdout
    return {wheelhouse.canonical(p["name"]): p["version"] for p in json.loads(out)}


def _offline(cmd: list[str]) -> list[str]:
    """`cmd` in a network namespace of its own with loopback up, where this machine allows one (root)."""
    if shutil.which("unshare") and subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0:
        return ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *cmd]
    pytest.fail("no network namespace here (unshare -n needs root): the node's no-network condition cannot hold")


def _gpu_check(python: Path, archive: Path, out: Path) -> dict:
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8",
           "HF_HUB_OFFLINE": "1", "PIP_NO_INDEX": "1", "LMK_CACHE": str(out / "cache"), "PYTHONUNBUFFERED": "1"}
    cmd = _offline([str(python), "-m", "benchmarks.gpu_check", "--cpu-smoke", "--wheelhouse", str(archive),
                    "--out", str(out)])
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    report_file = out / "cpu_check.json"
    assert report_file.is_file(), proc.stderr[-5000:]
    report = json.loads(report_file.read_text())
    assert proc.returncode == (1 if report["status"] == "failed" else 0), proc.stderr[-3000:]
    return report


def test_the_node_runs_every_section_with_the_archive_and_the_model_sections_with_the_light_one(tmp_path):
    full, manifest = _archive("full")
    light, light_manifest = _archive("light")
    # the size limit is make wheelhouse's refusal at xz -9 (tests/test_wheelhouse.py); this -0 archive is bigger
    assert {"mteb", "datasets", "wandb", "hydra-core"} <= set(manifest["packages"])
    assert set(light_manifest["packages"]) == {"hydra-core", "omegaconf", "antlr4-python3-runtime", "sentencex",
                                               "sentence-splitter", "platformdirs"}
    node = wheelhouse.read_node([ROOT / f for f in NODE_FILES.split()])
    python = _node_venv(full.with_name(full.name + ".node.txt"), node)
    installed = _installed(python)
    assert set(installed) <= set(node) | {"pip", "setuptools", "wheel"}  # only the node's packages
    for name, version in NODE_VERSIONS.items():
        assert installed[name] == version, (name, installed[name])
    assert not set(installed) & set(manifest["packages"])  # the archive brings only what the node lacks

    site = tmp_path / "site"  # the archive unpacked as a user would: the node's packages and it agree
    _run([str(python), "-m", "benchmarks.wheelhouse", "unpack", str(full), str(site)], 300, cwd=ROOT)
    _run([str(python), "-m", "pip", "check"], 300, env={**os.environ, "PYTHONPATH": str(site)})

    report = _gpu_check(python, full, tmp_path / "full")
    assert report["status"] == "ok" and report["python"] == sys.version.split()[0], report.get("failed_sections")
    for name in ("train_step", "padded", "encode", "encode_pipeline", "rehearsal"):
        assert report[name]["status"] == "ok", (name, report[name])
    row = report["rehearsal"]
    assert row["run_status"] == "done" and row["world_size"] == 2 and row["ddp_exercised"], row
    assert row["global_step"] == 3 and set(row["groups"]) >= {"msmarco-dev", "longembed6"}
    # W&B off, and a rerun over a kept --work folder retrains instead of refusing the finished row (the refusal
    # and overwrite=true are tested fast in tests/test_run_lock.py)
    assert "logger=csv" in row["command"] and "overwrite=true" in row["command"]
    assert not any((tmp_path / "full").glob("**/work")) and not Path(report["work"]).exists()

    report = _gpu_check(python, light, tmp_path / "light")
    # the light archive skips the rehearsal; the packed section needs CUDA (skipped with its reason on this CPU node)
    assert report["status"] == "ok" and report["skipped_sections"] == ["packed", "rehearsal"], report
    for name in ("train_step", "padded", "encode", "encode_pipeline"):
        assert report[name]["status"] == "ok", (name, report[name])
    skipped = report["rehearsal"]
    assert REHEARSAL_NEEDS <= set(skipped["needs"]) and skipped["reason"].startswith("needs "), skipped
