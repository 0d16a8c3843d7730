"""The RoPE-off recipe: a dry run composes every row at each scale; a real tiny sweep builds its table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import forked_cli
import pytest
from validated_rows import validated_rows

SPEC = "experiments/rope_ablation/spec.yaml"
ROOT = Path(__file__).resolve().parent.parent
ROWS = ["cls", "cls-norope", "mean", "mean-norope", "lmk", "lmk-norope"]


def sweep(*args: str) -> subprocess.CompletedProcess:
    return forked_cli.run([sys.executable, "-m", "lmk.sweep", SPEC, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)


@pytest.mark.parametrize("scale", ["tiny", "paper"])
def test_every_row_pairs_a_pooling_with_rope_on_or_off_and_validates(scale: str) -> None:
    """In process, as the row sweeper checks each job before launch; the dry runs below do it end to end."""
    typed = validated_rows(ROOT / SPEC, scale)
    assert list(typed) == ROWS
    for row, config in typed.items():
        assert config.encoder.rope is not row.endswith("-norope"), row


def assert_rope_pairs(jobs_file: Path) -> None:
    """The sweep's plan (train/jobs.json, written by a dry run and by a real run alike): every pooling with RoPE on
    and off, each a distinct run."""
    jobs = {j["row"]: j for j in json.loads(jobs_file.read_text())["jobs"]}
    assert list(jobs) == ROWS
    for row, job in jobs.items():
        assert ("encoder.rope=false" in job["overrides"]) is row.endswith("-norope")
    assert len({j["config_hash"] for j in jobs.values()}) == len(ROWS)  # rope on/off are distinct runs


# a sweep process (13-15 s): the rows' composition is checked fast above; the tiny scale's plan is checked by the
# real tiny sweep below (the same jobs.json), so only the paper scale is dry-run here
@pytest.mark.slow
def test_dry_run_pairs_every_pooling_with_rope_on_and_off(tmp_path: Path) -> None:
    proc = sweep("--scale", "paper", "--dry-run", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert_rope_pairs(tmp_path / "train" / "jobs.json")
    assert not (tmp_path / "train" / "cls" / "results.json").exists()


@pytest.mark.slow
def test_tiny_sweep_builds_the_table(tmp_path: Path) -> None:
    proc = sweep("--scale", "tiny", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert_rope_pairs(tmp_path / "train" / "jobs.json")
    md = (tmp_path / "rope_ablation.md").read_text()
    for label in ("| CLS |", "| CLS, RoPE off |", "| Mean, RoPE off |", "| LMK-variable, RoPE off |"):
        assert label in md
    results = json.loads((tmp_path / "train" / "cls-norope" / "results.json").read_text())
    assert results["status"] == "done" and results["config"]["encoder"]["rope"] is False
