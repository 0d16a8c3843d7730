"""What a composed config hashes to, for every shipped option: the record tests/test_config_defaults.py holds the
code to (tests/fixtures/config_hashes.json, written by this file run as a script under the code it pins).

One record per composition (the root config and its overrides): the run's config hash (lmk.run.results.config_hash_of),
the composed content itself (every key, interpolations unresolved: what a `key=value` override without `+` needs to
find) and the descriptions the model and data fingerprints read (EncoderConfig / PoolingConfig / SourceConfig
`to_dict`, the validated eval suite). An option at its hash-neutral default counts as absent, so a later option
added to a group's _base leaves every record as it was.

    PYTHONPATH=<checkout> python tests/config_records.py <checkout>/conf tests/fixtures/config_hashes.json
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from lmk.config import DataConfig, EncoderConfig, EvalConfig, PoolingConfig
from lmk.run.results import HASH_NEUTRAL_DEFAULTS, config_hash_of

# overrides users type, without and with `+`: each must keep composing, to the hash it had
OVERRIDES = {
    "train": [["eval=local", "eval.maxsim_query=tokens", "eval.scoring=maxsim"], ["eval=beir15", "eval.workers=0"],
              ["eval=local", "eval.batch_size=7"], ["eval=beir15", "+eval.lengths=[256]"],
              ["pooling=lmk-fixed", "pooling.chunk_size=64"], ["pooling=cls", "pooling.train_chunk_sizes=[32]"],
              ["eval=table2-rehearsal", "eval.maxsim_block_mb=64"], ["pooling=lmk-fixed", "+pooling.placement=after"]],
    "evaluate": [["eval=table2-mini", "eval.scoring=maxsim"], ["eval=none", "eval.device=cpu"]],
}


def options(conf: Path, group: str) -> list[str]:
    """The selectable options of a group (a `_`-prefixed file is a base the options extend, not an option)."""
    return sorted(p.stem for p in (conf / group).glob("*.yaml") if not p.stem.startswith("_"))


def compositions(conf: Path) -> Iterator[tuple[str, list[str]]]:
    """(root config, overrides) for every shipped option: each group option alone, each experiment with each
    pooling (a table's rows), the overrides of OVERRIDES."""
    yield "train", []
    yield "evaluate", []
    for group in ("eval", "pooling", "encoder", "data"):
        for option in options(conf, group):
            yield "train", [f"{group}={option}"]
    for group in ("eval", "pooling"):
        for option in options(conf, group):
            yield "evaluate", [f"{group}={option}"]
    for experiment in options(conf, "experiment"):
        for pooling in options(conf, "pooling"):
            yield "train", [f"experiment={experiment}", f"pooling={pooling}", "++row=test-row"]
    for root, lists in OVERRIDES.items():
        for overrides in lists:
            yield root, overrides


def key(root: str, overrides: list[str]) -> str:
    return " ".join([root, *overrides])


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _settled(group: str, values: dict[str, Any]) -> dict[str, Any]:
    """A group's values less the options at a hash-neutral default: an option added later (in the group's _base,
    so in every composition) at a value that changes nothing."""
    return {k: v for k, v in values.items() if HASH_NEUTRAL_DEFAULTS.get(f"{group}.{k}", object()) != v}


def _content(cfg: Any) -> dict[str, Any]:
    content = OmegaConf.to_container(cfg, resolve=False)
    return {k: _settled(k, v) if isinstance(v, dict) else v for k, v in content.items()}


def record(root: str, overrides: list[str]) -> dict[str, str]:
    """The record of one composition (inside `initialize_config_dir` of the conf folder)."""
    cfg = compose(config_name=root, overrides=overrides)
    out = {"config_hash": config_hash_of(cfg), "content": _digest(_content(cfg))}
    out["encoder"] = _digest(EncoderConfig.coerce(cfg.encoder).to_dict())
    out["pooling"] = _digest(PoolingConfig.coerce(cfg.pooling).to_dict())
    out["eval"] = _digest(_settled("eval", dataclasses.asdict(EvalConfig.coerce(cfg.eval))))
    if "data" in cfg:
        out["sources"] = _digest([s.to_dict() for s in DataConfig.coerce(cfg.data).sources])
    return out


def records(conf: Path) -> dict[str, dict[str, str]]:
    with initialize_config_dir(config_dir=str(conf.resolve()), version_base="1.3"):
        return {key(root, overrides): record(root, overrides) for root, overrides in compositions(conf)}


if __name__ == "__main__":
    conf_dir, target = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
    target.write_text(json.dumps(records(conf_dir), indent=1, sort_keys=True) + "\n")
    print(f"{target}: {len(json.loads(target.read_text()))} compositions of {conf_dir}")
