"""Checks before launch: local data paths and eval task names are validated before any model is
built and before any job of a sweep is launched; the error names the row and the thing."""

from __future__ import annotations

import sys
from pathlib import Path

import forked_cli
import pytest
import yaml
from hydra import compose, initialize_config_dir

from lmk.config import ConfigError
from lmk.train.command import validate_job
from lmk.train.trainer_args import validate_training

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"


def _compose(name: str, overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose(name, overrides=overrides)


def test_missing_data_file_fails_validation(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "pairs.jsonl"
    cfg = _compose("train", ["experiment=tiny", "run_dir=/tmp/x", f"data.sources=[{{path:{missing}}}]"])
    validate_training(cfg)  # the config alone is fine: the data path is checked against this machine after it
    with pytest.raises(ConfigError) as err:
        validate_job(cfg)
    assert str(missing) in str(err.value) and "do not exist" in str(err.value)
    present = tmp_path / "pairs.jsonl"
    present.write_text('{"query": "q", "pos": ["p"], "neg": ["n"]}\n')
    validate_job(_compose("train", ["experiment=tiny", "run_dir=/tmp/x", f"data.sources=[{{path:{present}}}]"]))


def test_misspelt_task_fails_validation_naming_the_closest() -> None:
    cfg = _compose("train", ["experiment=tiny", "run_dir=/tmp/x", "eval=table2-tiny",
                             "eval.tasks=[LocalShort,SciFactz]"])
    with pytest.raises(ConfigError) as err:
        validate_job(cfg)
    assert "'SciFactz'" in str(err.value) and "SciFact" in str(err.value)
    from lmk.eval.command import validate_config
    from lmk.eval.task_names import UnknownTaskError

    with pytest.raises(UnknownTaskError, match="LocalPaskey"):
        validate_config(_compose("evaluate", ["eval=table2-tiny", "eval.tasks=[LocalShort,LocalPaskey]"]))
    with pytest.raises(ConfigError, match="does not exist"):  # a user error: what is wrong and the fix
        validate_config(_compose("evaluate", ["eval=table2-tiny", "model=/no/such/run"]))


@pytest.mark.parametrize(("row", "thing"), [
    ("typo", "LocalPaskey"),
    pytest.param("nodata", "/no/such/dir/pairs.jsonl", marks=pytest.mark.slow),  # the same path as a typo: 12 s
])
def test_sweep_dry_run_fails_naming_the_row_and_the_thing(tmp_path: Path, row: str, thing: str) -> None:
    spec = yaml.safe_load((ROOT / "experiments" / "table2" / "spec.yaml").read_text())
    spec["rows"] = [
        {"id": "cls", "label": "CLS", "overrides": ["pooling=cls"]},
        {"id": "typo", "label": "typo", "overrides": ["pooling=mean", "eval.tasks=[LocalShort,LocalPaskey]"]},
        {"id": "nodata", "label": "nodata", "overrides": ["pooling=mean", "data.sources=[{path:/no/such/dir/pairs.jsonl}]"]},
    ]
    spec["scales"] = {"tiny": spec["scales"]["tiny"]}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    out = tmp_path / "out"
    proc = forked_cli.run([sys.executable, "-m", "lmk.sweep", str(path), "--scale", "tiny", "--dry-run", "--out",
                           str(out), "--rows", f"cls,{row}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text
    assert f"row '{row}'" in text and thing in text
    assert not (out / "train" / "jobs.json").exists()  # nothing planned, nothing launched


def test_misspelt_task_options_key_is_named() -> None:
    from lmk.eval.command import validate_config
    from lmk.eval.task_names import UnknownTaskError

    cfg = _compose("evaluate", ["eval=mldr-eng", "+eval.task_options.MultiLongDocRetrival={eval_splits:[test]}"])
    with pytest.raises(UnknownTaskError, match="MultiLongDocRetrival"):
        validate_config(cfg)
