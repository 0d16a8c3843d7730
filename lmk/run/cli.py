"""Entry-point plumbing: an error of the user's input is two lines on stderr, what is wrong and the fix, and a
non-zero exit (the full trace with HYDRA_FULL_ERROR=1 or LMK_DEBUG=1); any other exception keeps its traceback.

Every lmk error about user input derives from `lmk.config.UserError` (ConfigError, PairDataError,
MissingArtifactsError, PreflightError, RunFolderBusy, SpecError, ...). `run_app` (every Hydra entry point:
`python -m lmk.train`, `lmk-train`, `lmk-evaluate`, ...) and `guard` (argparse commands) report them; the
task function's `hydra_task` wrapper keeps Hydra from printing its "Error executing job" banner and trace for
one, and under a multirun (local, submitit, SLURM) lets it fail the job, so the row sweeper records its line. Hydra's own composition errors (a key that is not in the config, a missing group option) span
several lines: its advice to append with `+` (wrong for a typo), OmegaConf's full_key / object_type and
the config search path. `run_app` composes the command line once with Hydra's compose API before the app
starts and prints such an error as one line that names the key (and the available options).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable
from typing import Any, TextIO

from hydra._internal.utils import get_args_parser
from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException, HydraException
from hydra.types import RunMode
from omegaconf.errors import OmegaConfBaseException

from lmk.config.schema import UserError, is_user_error
from lmk.run.console import job_log_file, job_output

log = logging.getLogger(__name__)
# run_app sets HYDRA_FULL_ERROR=1 for Hydra itself (so that it raises instead of printing) and marks it as its
# own with this variable: a process started from the job (DDP ranks) then still reports errors in short form.
_OWN_FULL_ERROR = "_LMK_SET_HYDRA_FULL_ERROR"
# A user error of a single (non-multirun) job, reported by run_app once Hydra has finished the run.
_PENDING: list[BaseException] = []
_TASKS_STARTED: list[bool] = []  # one entry per task call: an error before any is Hydra's composition error


def full_errors() -> bool:
    """Whether the user asked for full tracebacks: HYDRA_FULL_ERROR=1 (Hydra's switch) or LMK_DEBUG=1."""
    asked = os.environ.get("HYDRA_FULL_ERROR") == "1" and not os.environ.get(_OWN_FULL_ERROR)
    return asked or os.environ.get("LMK_DEBUG") == "1"


def error_lines(err: BaseException) -> list[str]:
    """A user error as the console shows it: what is wrong, then the fix (each on one line)."""
    what = " ".join(str(getattr(err, "what", err)).split()) or type(err).__name__
    fix = getattr(err, "fix", None)
    return [f"Error: {what}"] + ([f"Fix: {' '.join(str(fix).split())}"] if fix else [])


def error_line(err: BaseException) -> str:
    """One line for a sweep's row summary: `what; fix` for a user error, `Type: message` for anything else."""
    if is_user_error(err):
        return "; ".join(line.split(": ", 1)[1] for line in error_lines(err))
    return f"{type(err).__name__}: {' '.join(str(err).split())}"


def report(err: BaseException, stream: TextIO | None = None) -> None:
    print("\n".join(error_lines(err)), file=stream or sys.stderr, flush=True)


def _to_log_files(err: BaseException) -> None:
    """The job's log file keeps the user error with its traceback (the console shows two lines)."""
    record = logging.LogRecord(log.name, logging.ERROR, __file__, 0, "%s", (error_line(err),),
                               (type(err), err, err.__traceback__))
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def _multirun() -> bool:
    try:
        return HydraConfig.get().mode == RunMode.MULTIRUN
    except ValueError:  # not under Hydra
        return False


def _row_sweep_job() -> bool:
    """A job of the row sweeper (a table's sweep), which prints one line per row: its output goes to its log file.
    A plain `-m` sweep's jobs print on the console as a single run does, one after another."""
    try:
        return "lmk_row_sweeper" in str(HydraConfig.get().sweeper.get("_target_", ""))
    except ValueError:  # not under Hydra
        return False


def group_overridden(group: str) -> bool:
    """Whether the running Hydra job's command line set `group` (e.g. `pooling=` to cross-pool a trained model);
    False outside Hydra (tests call the commands' functions directly)."""
    try:
        overrides = HydraConfig.get().overrides.task
    except Exception:  # not under Hydra
        return False
    return any(o.lstrip("+~").split("=", 1)[0].split(".", 1)[0] == group for o in overrides)


def hydra_task(task: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Wrap a Hydra task function (under `@hydra.main`). In a row sweep (a table's job) the job's own output goes to
    its log file (`lmk.run.console.job_output`: the row sweeper prints its lines). A user error of a single run is
    kept for `run_app` to report after Hydra closed the run (no banner, no trace); in a multirun it fails the job
    as usual, and the row sweeper prints its line."""

    @functools.wraps(task)
    def wrapped(cfg: Any) -> Any:
        _TASKS_STARTED.append(True)
        multirun = _multirun()
        try:
            with job_output(job_log_file() if multirun and _row_sweep_job() else None):
                return task(cfg)
        except Exception as err:
            _to_log_files(err)  # the job's log file keeps every error with its traceback
            if not is_user_error(err) or full_errors() or multirun:
                raise
            _PENDING.append(err)
            return None

    return wrapped


def guard(main: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap an argparse command's `main`: a user error prints its two lines and exits 2."""

    @functools.wraps(main)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            return main(*args, **kwargs)
        except UserError as err:
            if full_errors():
                raise
            report(err)
            raise SystemExit(2) from None

    return wrapped

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


def run_app(app: Callable[[], Any], config_name: str) -> None:
    """Run a `@hydra.main` app: a command line that does not compose exits 1 with one line on stderr, a user error
    (`lmk.config.UserError`) anywhere in the run exits 1 with its two lines; other errors keep their traceback."""
    if full_errors():
        os.environ["HYDRA_FULL_ERROR"] = "1"  # LMK_DEBUG=1 asks Hydra for the full trace too
        os.environ.pop(_OWN_FULL_ERROR, None)
        app()
        return
    args, _ = get_args_parser().parse_known_args(sys.argv[1:])
    hydra_only = any(getattr(args, flag, None) for flag in _HYDRA_ONLY)
    _TASKS_STARTED.clear()
    saved = {k: os.environ.get(k) for k in ("HYDRA_FULL_ERROR", _OWN_FULL_ERROR)}
    os.environ.update({"HYDRA_FULL_ERROR": "1", _OWN_FULL_ERROR: "1"})  # Hydra raises; reported below
    try:
        app()
    except Exception as err:
        if is_user_error(err):
            report(err)
            raise SystemExit(1) from None
        if isinstance(err, CompactHydraException):  # Hydra's own compact errors: its message, as Hydra prints it
            print(one_line(err), file=sys.stderr)
            raise SystemExit(1) from None
        if not hydra_only and not _TASKS_STARTED and isinstance(err, HydraException | OmegaConfBaseException):
            # the command line did not compose (the task never ran): one line, not Hydra's report; composing it
            # here, not in a dry run first, saves a second composition on every start
            print(one_line(err), file=sys.stderr)
            raise SystemExit(1) from None
        raise
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    if _PENDING:
        report(_PENDING.pop())
        raise SystemExit(1)
