"""The notebook runner (lmk.notebooks) and notebooks/attention_position_bias.ipynb end to end."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # inherited by the kernel

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from lmk.analysis import notebooks as nbr

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "attention_position_bias.ipynb"
PNG = b"\x89PNG\r\n\x1a\n"


def _toy(path: Path, with_fig_dir: bool = False) -> Path:
    params = "greeting = 'hi'\nsizes = [1, 2]\n" + ("fig_dir = 'figs'\n" if with_fig_dir else "")
    nb = new_notebook(
        cells=[
            new_code_cell(params, metadata={"tags": ["parameters"]}),
            new_code_cell("import sys\nprint(sys.executable)\nprint(greeting, sum(sizes))"),
            new_code_cell(
                "%matplotlib inline\nfrom matplotlib.figure import Figure\nfig = Figure(figsize=(2, 2))\n"
                "fig.subplots().plot([0, 1], [1, 0])\nfig"
            ),
        ],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    )
    nbformat.write(nb, str(path))
    return path


# --------------------------------------------------------------------------------------- the committed file


def test_committed_notebook_is_clean_and_parameterised():
    nb = nbr.read(NOTEBOOK)
    assert not nbr.has_outputs(nb), "strip it: python -m lmk.notebooks --strip " + str(NOTEBOOK)
    assert all(c.get("outputs", []) == [] for c in nb.cells if c.cell_type == "code")
    assert nbr.parameters_cell_index(nb) is not None
    params = nbr.notebook_parameters(nb)
    for key in ("results_dir", "encoders", "poolings", "lengths", "n_inputs", "n_docs", "device", "fig_dir"):
        assert key in params
    assert params["results_dir"] is None and params["device"] == "cpu"
    assert nbr.main(["--check-clean", str(NOTEBOOK)]) == 0


def test_check_clean_and_strip(tmp_path):
    path = _toy(tmp_path / "toy.ipynb")
    nb = nbr.read(path)
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="x")]
    nb.cells[1].execution_count = 3
    nbformat.write(nb, str(path))
    assert nbr.main(["--check-clean", str(path)]) == 1
    assert nbr.main(["--strip", str(path)]) == 0
    assert not nbr.has_outputs(nbr.read(path))


# ---------------------------------------------------------------------------------------------- the runner


def test_parse_param():
    assert nbr.parse_param("lengths=[256, 512]") == ("lengths", [256, 512])
    assert nbr.parse_param("results_dir=None") == ("results_dir", None)
    assert nbr.parse_param("results_dir=null") == ("results_dir", None)
    assert nbr.parse_param("device=cuda") == ("device", "cuda")
    assert nbr.parse_param("n=3") == ("n", 3)
    with pytest.raises(ValueError, match="key=value"):
        nbr.parse_param("no-equals")


def test_inject_parameters_after_the_parameters_cell(tmp_path):
    nb = nbr.read(_toy(tmp_path / "toy.ipynb"))
    out = nbr.inject_parameters(nb, {"greeting": "yo"})
    assert len(out.cells) == len(nb.cells) + 1 and len(nb.cells) == 3  # input not modified
    assert nbr.INJECTED_TAG in out.cells[1].metadata["tags"] and "greeting = 'yo'" in out.cells[1].source
    again = nbr.inject_parameters(out, {"sizes": [5]})  # replaces, does not stack
    assert len(again.cells) == 4 and "sizes = [5]" in again.cells[1].source
    with pytest.raises(ValueError, match="allowed: greeting, sizes"):
        nbr.inject_parameters(nb, {"greting": "typo"})


def test_execute_runs_the_venv_kernel_injects_and_extracts_figures(tmp_path):
    run = nbr.execute_notebook(
        _toy(tmp_path / "toy.ipynb"), tmp_path / "out", {"greeting": "hello", "sizes": [3, 4]}
    )
    nb = nbr.read(run.executed)
    text = "".join(o.get("text", "") for o in nb.cells[2].outputs)  # cell 1 is the injected one
    lines = text.split("\n")
    assert os.path.realpath(lines[0]) == os.path.realpath(sys.executable)  # the kernel is this venv's python
    assert lines[1] == "hello 7"
    assert len(run.figures) == 1 and run.figures[0].read_bytes()[:8] == PNG
    assert run.figures[0].parent == tmp_path / "out" / "toy_figures"


def test_failing_cell_still_writes_the_executed_copy(tmp_path):
    path = _toy(tmp_path / "bad.ipynb")
    nb = nbr.read(path)
    nb.cells.append(new_code_cell("raise ValueError('boom')"))
    nbformat.write(nb, str(path))
    # one kernel start for both checks: the CLI reports the failure (exit 1) and keeps the executed copy
    assert nbr.main(["--out", str(tmp_path / "out"), str(path)]) == 1
    executed = nbr.read(tmp_path / "out" / "bad.ipynb")
    assert executed.cells[-1].outputs[0].output_type == "error"
    assert "boom" in executed.cells[-1].outputs[0].evalue


# ---------------------------------------------------------------------------- the analysis notebook itself


@pytest.mark.slow  # the whole notebook on two models (about 25 s); its analysis functions are checked fast in tests/test_analysis.py
def test_attention_notebook_executes_top_to_bottom_at_tiny_size(tmp_path, monkeypatch):
    # --threads 1 sets OMP_NUM_THREADS for the kernel (no oversubscription on this shared box);
    # monkeypatch restores the variable afterwards
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", ""))
    out = tmp_path / "nb"
    argv = [
        "--out",
        str(out),
        "--threads",
        "1",
        "--param",
        "encoders=['tiny-modernbert', 'minilm-l6']",
        "--param",
        "lengths=[64, 96]",
        "--param",
        "n_docs=3",
        "--param",
        "n_queries=3",
        "--param",
        "n_inputs=2",
        "--param",
        "n_bins=5",
        "--param",
        "n_depth_bins=2",
        "--param",
        "chunk_words=12",
        "--param",
        "max_length=96",
        "--param",
        "ruler_lengths=[256]",
        "--param",
        "ruler_depths=[0.0, 0.1]",  # needles inside the first 96 tokens: each has a landmark
        "--param",
        "n_needle_docs=4",
        "--param",
        f"table2_root={str(tmp_path / 'no-sweeps')!r}",  # hermetic: the untrained fallback, whatever outputs/ holds
        str(NOTEBOOK),
    ]
    assert nbr.main(argv) == 0
    executed = nbr.read(out / NOTEBOOK.name)
    outputs = [o for c in executed.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    figs = out / f"{NOTEBOOK.stem}_figures"
    names = sorted(p.name for p in figs.glob("*.png"))
    assert names == [
        "attention_profile.png",
        "depth_length_needle.png",
        "depth_length_passkey.png",
        "information_at_position.png",
        "winning_landmark.png",
    ]
    assert all((figs / n).read_bytes()[:8] == PNG for n in names)
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 5  # shown inline too
    # the per-landmark view: a share per LMK model (the notebook itself asserts every winner is a valid landmark)
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    shares = re.findall(r"^(.+): winning landmark within ±1 chunk of the needle: ([0-9.]+) \((\d+) needle", text, re.M)
    assert {name for name, _, _ in shares} == {"minilm-l6/lmk-fixed", "tiny-modernbert/lmk-fixed"}, text[-2000:]
    assert all(0.0 <= float(share) <= 1.0 and int(n) > 0 for _, share, n in shares)
    assert not nbr.has_outputs(nbr.read(NOTEBOOK))  # running it never dirties the committed file
