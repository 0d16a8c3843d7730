"""`python -m lmk.train`: compose -> validate -> preflight -> fit (`lmk.train.fit`) -> results.json.

Examples:
    python -m lmk.train encoder=tiny-modernbert pooling=lmk-variable trainer=cpu logger=wandb
    python -m lmk.train -m pooling=lmk-fixed pooling.chunk_size=32,64,128
    python -m lmk.train hydra.run.dir=<run dir>      # an interrupted run: resumes its newest valid checkpoint
    python -m lmk.train overwrite=true hydra.run.dir=<finished run>  # start a finished folder over

A run folder has one live owner (`lmk.run.lock`); a resumed run continues exactly (`lmk.train.resume`).
This module stays torch-free so that a bad config fails in seconds: a typo in any section but `trainer` before
Lightning loads (about a second), one in `trainer` once its signature is read (Lightning's import, a few seconds);
the training machinery is imported after validation.
"""

from __future__ import annotations

import os
from typing import Any

import hydra
from omegaconf import DictConfig

from lmk.config import CONF_DIR, ConfigError, RootConfig, validate
from lmk.eval.preflight import preflight
from lmk.run.cli import hydra_task, run_app
from lmk.train.trainer_args import validate_training


def validate_job(cfg: Any, in_job: bool = False) -> RootConfig:
    """Every check a training job passes before compute: the config (`lmk.config.validate`, the trainer section by
    Lightning's signature), then this machine (data paths, task names; `lmk.eval.preflight`). The row sweeper runs
    it on every job before launching, every task name of the suite included; the job itself (`in_job`) checks the
    names it evaluates in training. What needs no heavy import runs first: lmk's rules, then the paths and task
    names (mteb's, cached), then the trainer section by Lightning's signature (its import: seconds)."""
    validate(cfg, None)
    try:
        preflight(cfg, evaluated_only=in_job)
    except (ValueError, RuntimeError) as err:  # one line on the console, naming the path or task
        raise ConfigError(str(err)) from err
    return validate_training(cfg)


def run(cfg: DictConfig) -> float | None:
    """Train one run from a composed config; returns the optimised metric (`train.monitor`)."""
    typed = validate_job(cfg, in_job=True)  # the config fails in about a second, before torch / the model load
    from lmk.hub.artifacts import check_available  # fast path: loaded once the config validated

    check_available(cfg)  # offline (HF_HUB_OFFLINE): every hub model / dataset this job loads is on disk
    from lmk.data.pairs import precheck_rows  # fast path: the data reader loads once the config validated

    precheck_rows(cfg.data)  # a bad training row fails here, in seconds, not after the model load
    # torch-free path: Lightning and the model load only after validation
    from lmk.train.fit import fit

    return fit(cfg, typed)


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
@hydra_task  # a user error: two lines on the console; a sweep's job: its output in its log (lmk.run.cli)
def main(cfg: DictConfig) -> float | None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # dataloader workers fork after tokenizing
    return run(cfg)


def cli() -> None:
    """`python -m lmk.train` and `lmk-train`: a command line that does not compose is one line, not Hydra's report."""
    run_app(main, "train")
