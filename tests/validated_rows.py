"""Every training job of a spec's scale, composed and checked as the row sweeper checks it before launch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import open_dict


def validated_rows(spec_path: str | Path, scale: str) -> dict[str, Any]:
    """Row id -> its job's typed config (`lmk.train.command.validate_job`), optional rows included; a `scoring_of`
    row trains nothing and has no job."""
    from lmk.sweep.jobs import train_block
    from lmk.sweep.spec import load_spec
    from lmk.train.command import validate_job

    spec = load_spec(spec_path)
    typed = {}
    for job in train_block(spec.scale(scale), spec.rows_for(spec.scale(scale), with_optional=True)).jobs():
        cfg = job.compose()
        with open_dict(cfg):
            cfg.run_dir = "/tmp/lmk-test-row"  # outside a Hydra run there is no runtime folder
        typed[job.row] = validate_job(cfg)
    return typed
