"""The CPU kernels a pinned scale computes with: declared once, set for every job of its sweep, recorded per run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lmk.run.cpu_kernels import KERNEL_SETS, SWITCHES, switches
from lmk.run.results import read_results, update_results
from lmk.sweep import load_spec
from lmk.sweep.spec import SpecError

ROOT = Path(__file__).resolve().parents[1]
SPECS = sorted((ROOT / "experiments").glob("*/spec.yaml"))


def test_a_kernel_set_is_its_libraries_switches():
    assert switches("avx2") == {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert switches(None) == {}
    assert set(SWITCHES) == {k for s in KERNEL_SETS.values() for k in s}
    with pytest.raises(ValueError, match=r"'avx9' is not a kernel set; choose one of \['avx2'\]"):
        switches("avx9")


@pytest.mark.parametrize("spec_path", SPECS, ids=lambda p: p.parent.name)
def test_every_cpu_scale_computes_with_avx2_and_the_paper_scale_as_the_machine_gives(spec_path):
    """The scales run offline on a CPU (their pins, where they have any, hold on every x86-64 CPU with AVX2) set the
    switches in every job's environment; the paper scale (GPUs) sets none, so nothing slows it."""
    spec = load_spec(spec_path)
    for name, scale in spec.scales.items():
        if name == "paper":
            assert scale.cpu_kernels is None and not set(SWITCHES) & set(scale.env), name
        else:
            assert scale.cpu_kernels == "avx2", name
            assert {k: scale.env[k] for k in SWITCHES} == switches("avx2"), name


def test_an_unknown_kernel_set_fails_the_spec_naming_the_sets(tmp_path):
    raw = yaml.safe_load((ROOT / "experiments" / "table2" / "spec.yaml").read_text())
    raw["scales"]["tiny"]["cpu_kernels"] = "avx9"
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(SpecError, match=r"spec.yaml: cpu_kernels: 'avx9' is not a kernel set; choose one of"):
        load_spec(path)


_IN_USE = """
import json, torch
torch.ones(4) @ torch.ones(4)  # a kernel runs: ATen has picked its instruction set
from lmk.run.cpu_kernels import in_use
print(json.dumps(in_use()))
"""


def test_what_a_run_computed_with_is_recorded(tmp_path):
    """With the switches set the process computes with AVX2 kernels (any x86-64 CPU with AVX2: this one too), and
    results.json records the switches, ATen's choice and the thread count."""
    env = {k: v for k, v in os.environ.items() if k not in SWITCHES}
    forced = json.loads(subprocess.run([sys.executable, "-c", _IN_USE], env={**env, **switches("avx2")},
                                       capture_output=True, text=True, timeout=120, check=True).stdout)
    assert forced["switches"] == switches("avx2") and forced["capability"] == "AVX2" and forced["threads"] >= 1
    free = json.loads(subprocess.run([sys.executable, "-c", _IN_USE], env=env, capture_output=True, text=True,
                                     timeout=120, check=True).stdout)
    assert free["switches"] == {} and free["capability"] in ("DEFAULT", "AVX2", "AVX512", "ZVECTOR", "VSX")
    update_results(tmp_path, status="running")
    recorded = read_results(tmp_path)["environment"]["cpu_kernels"]
    assert set(recorded) >= {"switches"} and isinstance(recorded["switches"], dict)


def test_a_tables_provenance_names_the_kernels_of_its_rows(tmp_path, monkeypatch):
    """What a row's results.json records reaches its table: the kernels ATen picked, whether they were set, threads."""
    import torch

    from lmk.sweep.provenance import provenance_lines

    for key in SWITCHES:
        monkeypatch.delenv(key, raising=False)
    update_results(tmp_path / "train" / "cls", row="cls", status="done")
    text = "\n".join(provenance_lines(tmp_path))
    expected = f"{torch.backends.cpu.get_cpu_capability()} kernels (the CPU's own), {torch.get_num_threads()} threads"
    assert expected in text, text
