"""`python -m lmk.evaluate`: one model through one eval suite -> results.json in this run's folder.

Examples:
    python -m lmk.evaluate model=outputs/train/<run> eval=local            # a trained run
    python -m lmk.evaluate model=outputs/train/<run> pooling=mean eval=local   # cross-pooling
    python -m lmk.evaluate model=<exported sentence-transformers folder> eval=longembed6
    python -m lmk.evaluate model=null encoder=minilm-l6 pooling=lmk-fixed eval=local  # untrained
    python -m lmk.evaluate model=BAAI/bge-base-en-v1.5 pooling=lmk-fixed eval=beir15  # any HF encoder
    python -m lmk.evaluate model=... eval.device=cuda:1 eval.precision=fp32

`model` may be a run dir (its export/, else checkpoints/last.ckpt), an exported folder, a
save_pretrained folder, a .ckpt file, null (the encoder config, untrained), or any Hugging Face
encoder: a hub id or a local folder (transformers or sentence-transformers layout) without lmk
metadata, evaluated with `pooling=` (zero-shot LMK on a published model, the paper's baselines). A
`pooling=` given on the command line overrides a trained model's pooling (same backbone, other
tokenization + pooler). The model runs on `eval.device` under an autocast of `eval.precision`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from lmk.config import CONF_DIR, MAXSIM_SCORINGS, ConfigError
from lmk.config.eval import EvalConfig, no_landmarks_message
from lmk.config.model import EncoderConfig, PoolingConfig
from lmk.hub.offline import is_hub_id
from lmk.run.cli import group_overridden, hydra_task, run_app
from lmk.run.results import STATUS_DONE, read_results


def validate_config(cfg: DictConfig) -> None:
    """Check an evaluate config without loading anything (the row sweeper calls this per job)."""
    checks = [("eval", EvalConfig.from_cfg), ("encoder", EncoderConfig.coerce), ("pooling", PoolingConfig.coerce)]
    for key, check in checks:
        if cfg.get(key) is None:
            continue
        try:
            check(cfg[key])
        except (ValueError, TypeError) as err:  # one line on the console, not a traceback (ConfigError)
            raise ConfigError(str(err) if str(err).startswith(f"{key}.") else f"{key}: {err}") from err
    if not isinstance(cfg.get("trust_remote_code", False), bool):
        raise ConfigError(f"trust_remote_code={cfg.get('trust_remote_code')!r} is not valid; allowed values: true, false")
    if not isinstance(cfg.get("record", False), bool):
        raise ConfigError(f"record={cfg.get('record')!r} is not valid; allowed values: true, false")
    model = cfg.get("model")
    if cfg.get("record"):
        check_record_target(model)
    if model not in (None, "", "null") and not is_hub_id(model) and not Path(str(model)).expanduser().exists():
        raise ConfigError(f"model={model!r} does not exist; give a training run dir, an exported model "
                                "folder, a .ckpt, a Hugging Face encoder (folder or hub id owner/name) or null")
    check_scoring(cfg)
    # fast path: mteb's task registry (seconds) loads only once the config validated
    from lmk.eval.preflight import preflight

    preflight(cfg)  # eval task names resolve (mteb's registry, offline), the hub mirror is set


def check_scoring(cfg: DictConfig) -> None:
    """eval.scoring=maxsim needs landmark states: a pooling whose pooler is lmk. Checked here where the pooling is
    known without loading (the pooling config of an untrained or hub model, a cross-pooling, a training run's
    results.json); the loaded model is checked again before anything is encoded."""
    if (cfg.get("eval") or {}).get("scoring") not in MAXSIM_SCORINGS:
        return
    model, pooling = cfg.get("model"), cfg.get("pooling")
    if model not in (None, "", "null") and not is_hub_id(model) and not group_overridden("pooling"):
        folder = Path(str(model)).expanduser()
        pooling = ((read_results(folder) if folder.is_dir() else {}).get("config") or {}).get("pooling")
    if not pooling or pooling.get("pooler", "lmk") == "lmk":
        return
    raise ConfigError(no_landmarks_message(str(pooling.get("name")), str(pooling.get("pooler"))))


def check_record_target(model: Any) -> None:
    """record=true writes into model='s training run: it must be a finished one (its results.json says so)."""
    folder = Path(str(model)).expanduser() if model not in (None, "", "null") else None
    raw = read_results(folder) if folder is not None and folder.is_dir() else {}
    if raw.get("command") == "evaluate" or raw.get("status") != STATUS_DONE:
        raise ConfigError(f"record=true records the scores in model='s training run, but model={model!r} is not a "
                          "finished training run folder; give model=<the folder python -m lmk.train wrote>, or "
                          "leave record out")


def run(cfg: DictConfig, run_dir: str | os.PathLike | None = None, cross_pooling: bool | None = None) -> dict[str, Any]:
    """Evaluate per `cfg` (the composed evaluate config); returns the eval section written to results.json."""
    validate_config(cfg)  # bad values, task names and paths fail here, before loading anything
    from lmk.hub.artifacts import check_available  # fast path: before torch and the model side load

    check_available(cfg)  # offline (HF_HUB_OFFLINE): a hub task or model missing on disk fails in seconds
    # torch-free path: the model side loads only after validation
    from lmk.eval.evaluation import evaluate

    return evaluate(cfg, run_dir, cross_pooling)


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="evaluate")
@hydra_task  # a user error: two lines on the console; a sweep's job: its output in its log (lmk.run.cli)
def main(cfg: DictConfig) -> float | None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    section = run(cfg)
    groups = [v for v in section.get("groups", {}).values() if v is not None]
    return float(sum(groups) / len(groups)) if groups else None  # a sweep's objective: mean group score


def cli() -> None:
    """`python -m lmk.evaluate` and `lmk-evaluate`: a command line that does not compose is one line, not Hydra's report."""
    run_app(main, "evaluate")
