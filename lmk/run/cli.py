"""Entry-point plumbing: a config error is one line on stderr (the full trace with HYDRA_FULL_ERROR=1).

Our own config errors (`lmk.config.ConfigError`) are Hydra "compact" errors, which Hydra prints as their
message. Hydra's own composition errors (a key that is not in the config, a missing group option) span
several lines: its advice to append with `+` (wrong for a typo), OmegaConf's full_key / object_type and
the config search path. `run_app` composes the command line once with Hydra's compose API before the app
starts and prints such an error as one line that names the key (and the available options).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from hydra import compose, initialize_config_dir
from hydra._internal.utils import get_args_parser
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from lmk.config import CONF_DIR

# Flags that make Hydra do something other than compose-and-run: left entirely to Hydra.
_HYDRA_ONLY = ("help", "hydra_help", "version", "cfg", "shell_completion", "info", "config_path",
               "config_name", "config_dir", "experimental_rerun", "multirun")


def one_line(exc: BaseException) -> str:
    """Hydra's multi-line composition message (+ OmegaConf's cause) as one line."""
    texts = [str(exc)]
    if isinstance(exc.__cause__, OmegaConfBaseException):
        texts.append(str(exc.__cause__))
    parts: list[str] = []
    options: list[str] | None = None
    for line in (line for text in texts for line in text.splitlines()):
        stripped = line.strip()
        if options is not None and line.startswith("\t"):
            options.append(stripped)
            continue
        options = None
        if not stripped or stripped.startswith(("To append to your config use", "full_key:", "object_type=")):
            continue
        if stripped.startswith("Config search path:"):
            break
        if stripped.startswith("Available options in"):
            parts.append(stripped[0].lower() + stripped[1:])
            options = []
            parts.append(options)  # type: ignore[arg-type] - filled by the following tab-indented lines
            continue
        parts.append(stripped.rstrip("."))
    out: list[str] = []
    for part in parts:
        if isinstance(part, list):
            out[-1] = f"{out[-1]} {', '.join(part)}"
        else:
            out.append(part)
    return "; ".join(out) if out else type(exc).__name__


def composition_error(config_name: str, argv: Sequence[str]) -> str | None:
    """Compose `config_name` with the command line's overrides: the one-line error, or None if it composes
    (or if the command line asks Hydra for something else: help, --cfg, a multirun, another config dir)."""
    args, _ = get_args_parser().parse_known_args(list(argv))
    if any(getattr(args, flag, None) for flag in _HYDRA_ONLY):
        return None
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        try:
            compose(config_name, overrides=list(args.overrides), return_hydra_config=True)
        except (HydraException, OmegaConfBaseException) as exc:
            return one_line(exc)
    return None


def run_app(app: Callable[[], Any], config_name: str) -> None:
    """Run a `@hydra.main` app; a command line that does not compose exits 1 with one line on stderr."""
    if os.environ.get("HYDRA_FULL_ERROR") != "1":
        error = composition_error(config_name, sys.argv[1:])
        if error is not None:
            print(error, file=sys.stderr)
            raise SystemExit(1)
    app()
