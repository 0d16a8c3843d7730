"""The decoder table (experiments/decoder/spec.yaml): every row composes and validates at every scale, and the tiny
scale runs end to end through the same sweep, table and W&B code as Table 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import open_dict

from lmk.sweep.spec import load_spec

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "experiments" / "decoder" / "spec.yaml"


@pytest.mark.parametrize("scale", list(load_spec(SPEC).scales))
def test_every_decoder_row_composes_and_validates(scale: str) -> None:
    from lmk.sweep.jobs import train_block
    from lmk.train.command import validate_job

    spec = load_spec(SPEC)
    scale_ = spec.scale(scale)
    jobs = list(train_block(scale_, spec.rows_for(scale_, with_optional=True)).jobs())
    assert len(jobs) == len(spec.rows)
    for job in jobs:
        cfg = job.compose()
        with open_dict(cfg):
            cfg.run_dir = "/tmp/lmk-test-row"
        typed = validate_job(cfg)
        # every row trains the same LoRA decoder: only the pooling (and the MaxSim row's scoring) differ
        assert typed.encoder.name == "tiny-decoder" and typed.encoder.lora is not None
        assert typed.encoder.architecture == "mistral"


@pytest.mark.slow
def test_the_decoder_table_at_tiny_scale_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "decoder"
    proc = subprocess.run([sys.executable, "-m", "lmk.sweep", str(SPEC), "--scale", "tiny", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = json.loads((out / "decoder.json").read_text())
    rows = {cell["row"] for cell in table["cells"] if cell["value"] is not None}
    assert rows == {"last-token", "mean", "lmk-fixed-64", "lmk-variable", "lmk-fixed-64-maxsim",
                         "lmk-fixed-authors"}
    for name in ("decoder.md", "decoder.tex", "decoder.csv"):
        assert (out / name).is_file()
    maxsim = json.loads((out / "train" / "lmk-fixed-64-maxsim" / "results.json").read_text())
    assert maxsim["eval"]["scoring"] == "maxsim"
    single = json.loads((out / "train" / "lmk-fixed-64" / "results.json").read_text())
    assert single["eval"]["scoring"] == "single"
