"""Experiment loggers: W&B (offline without credentials, never fatal) + CSV, CSV only, or none (Lightning's
logger classes; the console's setup is `lmk.run.quiet_logging`).

Rules: results are never only in W&B (a CSV log is always written next to it); any W&B exception
at init / log / finish is caught, warned about, and W&B is dropped for the rest of the run; each
job of a multirun gets its own W&B run (`finish_loggers` in a `finally`) and one group per sweep.
"""

from __future__ import annotations

import csv
import logging
import netrc
import os
import uuid
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import wandb
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers import CSVLogger, Logger, WandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.utilities import rank_zero_only

from lmk.config.model import pooling_label
from lmk.config.schema import get_key as _get
from lmk.run.console import verbose

log = logging.getLogger(__name__)


WANDB_MODES = ("online", "offline", "disabled")


def wandb_credentials() -> bool:
    """True when W&B has an API key: WANDB_API_KEY, or a `wandb login` entry in the netrc file."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    path = os.environ.get("NETRC") or str(Path.home() / ".netrc")
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def resolve_wandb_mode(requested: str = "auto") -> str | None:
    """The W&B mode: explicit config > WANDB_MODE env > online with credentials, else offline.

    Returns None to let wandb read WANDB_MODE itself (so a bad value there fails inside wandb, caught).
    """
    if requested != "auto":
        if requested not in WANDB_MODES:
            raise ValueError(f"logger.mode={requested!r} is not valid; allowed values: auto, {', '.join(WANDB_MODES)}")
        return requested
    if os.environ.get("WANDB_MODE"):
        return None
    return "online" if wandb_credentials() else "offline"


def sweep_group() -> str | None:
    """One W&B group per Hydra multirun: the sweep folder (`<parent>-<timestamp>`); None outside one."""
    try:
        hc = HydraConfig.get()
    except ValueError:
        return None
    if hc.mode != RunMode.MULTIRUN:
        return None
    sweep = Path(str(hc.sweep.dir))
    return f"{sweep.parent.name}-{sweep.name}" if sweep.parent.name else sweep.name


class _AppendingWriter(ExperimentWriter):
    """Lightning's CSV writer deletes an existing metrics.csv; a resumed run appends to it instead."""

    def _check_log_dir_exists(self) -> None:
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as fh:
                header = next(csv.reader(fh), [])
            self.metrics_keys = sorted(set(header))


class AppendingCSVLogger(CSVLogger):
    """CSVLogger writing `<save_dir>/metrics.csv`, appending on resume (the first segment is kept)."""

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return self._experiment


class SafeWandbLogger(WandbLogger):
    """A WandbLogger whose failures are warnings: after the first one it stops calling W&B."""

    broken: bool = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Lightning always passes `anonymous` (None); wandb warns that the setting has no effect
        if self._wandb_init.get("anonymous") is None:
            self._wandb_init.pop("anonymous", None)

    def _guard(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if self.broken:
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - W&B must never kill a run
            self.broken = True
            warnings.warn(f"W&B {what} failed ({type(err).__name__}: {err}); W&B is off for the rest of this run, "
                          "metrics still go to metrics.csv / results.json", stacklevel=2)
            return None

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        self._guard("log", super().log_metrics, metrics, step)

    @rank_zero_only
    def log_hyperparams(self, params: Any) -> None:
        self._guard("config log", super().log_hyperparams, params)

    @rank_zero_only
    def finalize(self, status: str) -> None:
        self._guard("finalize", super().finalize, status)

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        self._guard("checkpoint hook", super().after_save_checkpoint, checkpoint_callback)

    def log_summary(self, values: Mapping[str, Any]) -> None:
        """Put final values (eval scores, status) in the run summary."""
        if rank_zero_only.rank != 0:
            return

        def _set() -> None:
            for k, v in values.items():
                self.experiment.summary[k] = v

        self._guard("summary", _set)


def _run_name(logger_cfg: Any, cfg: Any) -> str:
    name = _get(logger_cfg, "run_name")
    if name:
        return str(name)
    base = str(_get(cfg, "name", None) or "run")
    pooling = _get(cfg, "pooling", None)
    seed = _get(cfg, "seed", None)
    return _with_label(base, pooling) + (f"-s{seed}" if seed is not None else "")


def _with_label(base: str, pooling: Any) -> str:
    """`base` (the run's name) ending in the pooling's row label (`pooling_label`: the chunk size only where the
    strategy is chunked), once: a name that ends in the pooling's name gets the label's chunk size."""
    name = str(_get(pooling, "name", "") or "")
    label = pooling_label(pooling) if name else ""
    if not label or base.endswith(label):
        return base
    return base + label[len(name):] if base.endswith(name) else f"{base}-{label}"


WANDB_ID_FILE = "wandb_run_id"  # <run_dir>/wandb_run_id: the W&B run a resumed run continues


def _start_wandb(kwargs: dict[str, Any]) -> SafeWandbLogger:
    logger = SafeWandbLogger(**{k: v for k, v in kwargs.items() if v is not None})
    if rank_zero_only.rank == 0:
        _ = logger.experiment  # start now so an init failure falls back here, not mid-fit
    return logger


def _build_wandb(logger_cfg: Any, run_dir: Path, cfg: Any, resume: bool = False) -> SafeWandbLogger | None:
    mode = resolve_wandb_mode(str(_get(logger_cfg, "mode", "auto")))
    group = _get(logger_cfg, "group") or sweep_group()
    tags = [str(t) for t in (_get(logger_cfg, "tags") or [])]
    run_dir.mkdir(parents=True, exist_ok=True)
    id_file = run_dir / WANDB_ID_FILE
    # One W&B run per run folder: a resumed run continues it; a fresh one gets a new id (kept for its resume).
    resume = resume and id_file.is_file()
    run_id = id_file.read_text().strip() if resume else uuid.uuid4().hex[:8]
    kwargs: dict[str, Any] = {
        "project": _get(logger_cfg, "project", "lmk"),
        "entity": _get(logger_cfg, "entity"),
        "group": group,
        "tags": tags,
        "name": _run_name(logger_cfg, cfg),
        "notes": _get(logger_cfg, "notes"),
        "save_dir": str(run_dir),  # -> <run_dir>/wandb/offline-run-*
        "log_model": bool(_get(logger_cfg, "log_model", False)),
        "reinit": "finish_previous",  # a multirun job never appends to the previous job's run
        "id": run_id,
        "resume": "allow" if resume else None,  # asking the server for a resume status costs a round trip
        # An unreachable server would stall init for ~100 s: bound it, then fall back to offline below.
        # quiet: wandb's "logged in as" banner asks the server for the user name with its own, unbounded
        # retries (10 s more when it is down); the run URL is logged here instead.
        "settings": wandb.Settings(init_timeout=float(_get(logger_cfg, "init_timeout", 90.0)), quiet=True),
    }
    if mode is not None:
        kwargs["mode"] = mode
    if not verbose():
        os.environ.setdefault("WANDB_SILENT", "true")  # wandb's banners: lmk says the one line that matters
    try:
        logger = _start_wandb(kwargs)
    except Exception as err:  # noqa: BLE001 - never fatal
        if not isinstance(err, wandb.errors.CommError) or kwargs.get("mode") == "offline":
            warnings.warn(f"W&B init failed ({type(err).__name__}: {err}); continuing with the CSV log only",
                          stacklevel=2)
            return None
        # The server did not answer in logger.init_timeout: an offline run can still be synced later.
        warnings.warn(f"W&B init failed ({type(err).__name__}: {err}); logging offline instead (wandb sync later)",
                      stacklevel=2)
        try:
            wandb.finish(exit_code=1)  # drop the half-started online run, if any
            run_id = uuid.uuid4().hex[:8]  # the service still holds the failed online run's id
            logger = _start_wandb({**kwargs, "mode": "offline", "id": run_id})
        except Exception as err2:  # noqa: BLE001
            warnings.warn(f"W&B offline init failed too ({type(err2).__name__}: {err2}); continuing with the CSV "
                          "log only", stacklevel=2)
            return None
    if rank_zero_only.rank == 0:
        id_file.write_text(run_id)
        if wandb_mode(logger) == "online":
            log.info("W&B run %s: %s", run_id, getattr(logger.experiment, "url", None))
    if rank_zero_only.rank == 0 and wandb_mode(logger) == "offline":  # the one W&B line of the run
        log.info("W&B offline (no API key / no network): `wandb sync %s` later",
                 offline_run_dir(logger) or f"{run_dir}/wandb/offline-run-*")
    return logger


def build_logger(logger_cfg: Any, run_dir: str | os.PathLike, cfg: Any = None,
                 resume: bool = False) -> Logger | list[Logger] | None:
    """Lightning logger(s) for `logger_cfg` (`logger.name`: wandb | csv | none).

    wandb -> [SafeWandbLogger, CSVLogger] (CSV alone when W&B fails to start); csv -> CSVLogger;
    none -> None. The CSV log is `<run_dir>/metrics.csv`. `resume`: continue the W&B run whose id is
    in `<run_dir>/wandb_run_id`.
    """
    name = _get(logger_cfg, "name", "csv")
    run_dir = Path(run_dir)
    if name == "none":
        return None
    if name not in ("wandb", "csv"):
        raise ValueError(f"logger.name={name!r} is not valid; allowed values: wandb, csv, none")
    csv = AppendingCSVLogger(save_dir=str(run_dir), name="", version="")
    if name == "csv":
        return csv
    wandb_logger = _build_wandb(logger_cfg, run_dir, cfg or {}, resume=resume)
    return [wandb_logger, csv] if wandb_logger is not None else csv


def as_list(loggers: Logger | Sequence[Logger] | None) -> list[Logger]:
    if loggers is None:
        return []
    if isinstance(loggers, Logger):
        return [loggers]
    return list(loggers)


def find_wandb(loggers: Logger | Sequence[Logger] | None) -> SafeWandbLogger | None:
    for lg in as_list(loggers):
        if isinstance(lg, SafeWandbLogger) and not lg.broken:
            return lg
    return None


def wandb_mode(logger: WandbLogger) -> str | None:
    run = logger._experiment  # not `.experiment`: never start a run just to ask
    if run is None:
        return None
    try:
        return "offline" if run.settings._offline else ("disabled" if run.disabled else "online")
    except Exception:  # noqa: BLE001 - attribute names differ across wandb versions
        return os.environ.get("WANDB_MODE")


def offline_run_dir(logger: WandbLogger) -> str | None:
    run = logger._experiment
    try:
        return str(Path(run.dir).parent) if run is not None else None  # run.dir is <offline-run-*>/files
    except Exception:  # noqa: BLE001
        return None


def wandb_info(loggers: Logger | Sequence[Logger] | None) -> dict[str, Any]:
    """The results.json "wandb" section (empty without a working W&B logger)."""
    lg = find_wandb(loggers)
    if lg is None or lg._experiment is None:
        return {}
    run = lg._experiment
    info: dict[str, Any] = {"mode": wandb_mode(lg)}
    for key in ("id", "name", "project", "group", "url"):
        try:
            info[key] = getattr(run, key)
        except Exception:  # noqa: BLE001
            pass
    if info.get("mode") == "offline":
        info["dir"] = offline_run_dir(lg)
        # A resumed run leaves one offline folder per segment, all with the run's id: sync them all.
        segments = f"{Path(info['dir']).parent}/offline-run-*-{info['id']}" if info.get("id") and info["dir"] else None
        info["sync"] = f"wandb sync {segments or info['dir']}"
    return info


def finish_loggers(loggers: Logger | Sequence[Logger] | None, exit_code: int = 0) -> None:
    """Write what the CSV log still buffers and close the W&B run of this job (multirun jobs must not share one);
    never raises. Lightning's Trainer saves its loggers at the end of a fit; an evaluation has no Trainer."""
    for lg in as_list(loggers):
        if isinstance(lg, CSVLogger):
            try:
                lg.save()
            except Exception as err:  # noqa: BLE001 - the scores are in results.json too
                warnings.warn(f"the CSV log could not be written ({type(err).__name__}: {err})", stacklevel=2)
        if isinstance(lg, WandbLogger) and lg._experiment is not None:
            try:
                lg._experiment.finish(exit_code=exit_code)
            except Exception as err:  # noqa: BLE001
                warnings.warn(f"W&B finish failed ({type(err).__name__}: {err}); the run folder is kept",
                              stacklevel=2)
            if isinstance(lg, SafeWandbLogger) and wandb_mode(lg) == "offline":  # said once at the start
                log.debug("W&B offline run saved. Sync with: wandb sync %s", offline_run_dir(lg))
    try:
        if wandb.run is not None:
            wandb.finish(exit_code=exit_code)
    except Exception:  # noqa: BLE001
        pass
