"""The `trainer:` section checked against Lightning's own `Trainer` signature, before any compute.

The config layer is torch-free, so `lmk.config.validate` takes this check from its caller: `validate_training(cfg)`
is the training config validated with it. Lightning loads only when the check runs (after every other section,
a few seconds), and a bad key or value fails in one line naming it: an unknown key names the closest of the
Trainer's parameters, a value that does not fit the parameter's annotation names the allowed ones (Lightning's
precision values, for one). Hydra then instantiates the Trainer from the same section (lmk.train.fit).
"""

from __future__ import annotations

import inspect
from typing import Any

from lmk.config import RootConfig, validate
from lmk.config.schema import call_arguments, choice

# Trainer arguments lmk passes itself (lmk.train.fit): a config that set them would be overridden
SET_BY_LMK = {"callbacks": "checkpoints, resume and evaluation callbacks",
              "logger": "choose it with logger=wandb|csv|none",
              "plugins": "checkpoint writing and the cluster environment"}
ACCELERATOR_ALIASES = ("auto", "gpu")  # Lightning's own names beside its accelerator registry's


def trainer_arguments(section: dict[str, Any]) -> dict[str, Any]:
    """Every keyword argument of Lightning's Trainer for a `trainer:` section (without `_target_`), Lightning's
    defaults for the keys it does not give; raises ConfigError naming a bad key or value."""
    # here, not at the top: a typo in another section fails before Lightning loads
    from lightning.pytorch import Trainer
    from lightning.pytorch.accelerators import AcceleratorRegistry  # (the same reason)

    arguments = call_arguments(inspect.signature(Trainer, eval_str=True), section, "trainer", SET_BY_LMK)
    if isinstance(arguments["accelerator"], str):  # its annotation allows any string; the registry knows the names
        choice("trainer.accelerator", arguments["accelerator"],
               (*ACCELERATOR_ALIASES, *AcceleratorRegistry.available_accelerators()))
    return arguments


def validate_training(cfg: Any) -> RootConfig:
    """The typed, checked training config (`lmk.config.validate`), its trainer section by Lightning's signature."""
    return validate(cfg, trainer_arguments)
