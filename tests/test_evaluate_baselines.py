"""`lmk.evaluate` on any Hugging Face encoder (zero-shot pooling on a published model), and the eval
device / precision in the evaluate command and the fit-end callback (offline, CPU)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import lmk.eval.command as evaluate  # noqa: E402
import lmk.eval.evaluation as evaluation  # noqa: E402
from lmk.model.embedding import EmbeddingModel  # noqa: E402
from lmk.model.loading import load_hf_encoder, load_model  # noqa: E402

CONF = Path(__file__).resolve().parents[1] / "conf"
TEXTS = ["the cat sat on the mat", "stock markets fell sharply today", "a recipe for apple pie",
         "the rocket reached orbit after a long delay " * 5]


def pool(name: str):
    return OmegaConf.load(CONF / "pooling" / f"{name}.yaml")


@pytest.fixture(scope="module")
def plain_modernbert(tmp_path_factory) -> tuple[Path, EmbeddingModel]:
    """A plain transformers folder (config.json, weights, tokenizer; no lmk metadata) of a tiny random
    ModernBERT, and the EmbeddingModel it was saved from (lmk-fixed pooling)."""
    m = EmbeddingModel.build(OmegaConf.load(CONF / "encoder" / "tiny-modernbert.yaml"), pool("lmk-fixed"))
    folder = tmp_path_factory.mktemp("plain") / "tiny-modernbert-plain"
    m.backbone.save_pretrained(folder)
    m.tokenizer.save_pretrained(folder)
    assert not (folder / "embedding_model.json").exists() and not (folder / "modules.json").exists()
    return folder, m


@pytest.mark.parametrize("pooling", ["lmk-fixed", "mean"])
def test_plain_transformers_folder_with_any_pooling(plain_modernbert, pooling):
    folder, original = plain_modernbert
    model, info = load_model(folder, pooling_cfg=pool(pooling))
    assert info == {"kind": "hf-encoder", "source": str(folder)}
    assert model.pooling_cfg.name == pooling and model.max_positions == 8192
    ref = original if pooling == "lmk-fixed" else original.with_pooling(pool("mean"))
    np.testing.assert_allclose(model.encode(TEXTS), ref.encode(TEXTS), atol=1e-5)  # same weights, same pooling


@pytest.mark.parametrize("pooling", ["lmk-fixed", "mean"])
def test_sentence_transformers_folder_with_any_pooling(minilm_path, pooling):
    model, info = load_model(minilm_path, pooling_cfg=pool(pooling))
    assert info["kind"] == "hf-encoder" and model.max_positions == 512
    emb = model.encode(TEXTS)
    assert emb.shape == (4, 384) and np.allclose(np.linalg.norm(emb, axis=1), 1, atol=1e-5)
    if pooling == "mean":  # MiniLM's own pooling: the published model's embeddings exactly
        from sentence_transformers import SentenceTransformer

        ref = SentenceTransformer(minilm_path, device="cpu").encode(TEXTS, normalize_embeddings=True)
        np.testing.assert_allclose(emb, ref, atol=1e-5)


def test_hub_id_offline_names_the_id():
    with pytest.raises(OSError, match=r"model='someorg/some-encoder'.*hub id.*HF_HUB_OFFLINE=1"):
        load_model("someorg/some-encoder", pooling_cfg=pool("mean"))
    with pytest.raises(ValueError, match="give pooling="):
        load_hf_encoder("someorg/some-encoder", None)


def _compose(overrides: list[str]):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose("evaluate", overrides=overrides)


def _corpus():
    from lmk.data.retrieval import RetrievalCorpus

    return RetrievalCorpus.from_records(
        "planted", "test", [{"id": f"d{i}", "text": t} for i, t in enumerate(TEXTS)],
        [{"id": f"q{i}", "text": t} for i, t in enumerate(TEXTS)], {f"q{i}": {f"d{i}": 1} for i in range(len(TEXTS))})


def _planted_tasks(monkeypatch):
    from lmk.eval.tasks import LocalShort

    monkeypatch.setattr(evaluation, "build_tasks", lambda cfg, check_offline=True: [LocalShort({"test": _corpus()})])


OVERRIDES = ["eval=local", "eval.tasks=[LocalShort]", "eval.groups={local-short:[LocalShort]}",
             "eval.query_max_length=32", "eval.passage_max_length=32", "eval.show_progress=false"]


def test_evaluate_command_on_a_published_model(tmp_path, minilm_path, monkeypatch):
    _planted_tasks(monkeypatch)
    cfg = _compose([f"model={minilm_path}", "pooling=mean", "eval.precision=bf16", *OVERRIDES])
    section = evaluate.run(cfg, run_dir=tmp_path / "run", cross_pooling=True)
    res = json.loads((tmp_path / "run" / "results.json").read_text())
    assert res["status"] == "done" and res["model"]["kind"] == "hf-encoder"
    assert res["model"]["device"] == "cpu" and res["model"]["precision"] == "bf16"
    assert res["model"]["attention"].startswith("padded: backbone type 'bert'")  # the encoding path, and why
    assert section["precision"] == "bf16" and section["device"] == "cpu"
    assert section["tasks"]["LocalShort"]["main_score"] > 0.9  # identical query and document texts
    assert section["model"].startswith("lmk/hf-") and "__mean__" in section["model"]
    assert (tmp_path / "run" / "mteb_cache").is_dir() and (tmp_path / "run" / "per_query.json").is_file()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised where CUDA is missing")
def test_evaluate_cuda_without_cuda_fails_before_loading(tmp_path, monkeypatch):
    def never(*a, **k):
        raise AssertionError("the model must not be loaded")

    monkeypatch.setattr(evaluation, "load_model", never)
    cfg = _compose(["model=null", "encoder=tiny-modernbert", "eval.device=cuda", *OVERRIDES])
    with pytest.raises(RuntimeError, match=r"eval.device='cuda'.*CUDA is not available"):
        evaluate.run(cfg, run_dir=tmp_path / "run")


def test_callback_evaluates_on_the_trainers_device(tmp_path, caplog):
    import lightning.pytorch as pl

    class TinyModule(pl.LightningModule):
        def __init__(self, model: EmbeddingModel) -> None:
            super().__init__()
            self.model = model

        def training_step(self, batch, batch_idx):
            return self.model(self.model.tokenize(TEXTS[:2])).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(torch.zeros(4, 1), batch_size=1)

    from lmk.config.eval import EvalConfig
    from lmk.eval.callback import build_eval_callback
    from lmk.eval.tasks import LocalShort

    model = EmbeddingModel.build(OmegaConf.load(CONF / "encoder" / "tiny-modernbert.yaml"), pool("lmk-fixed"))
    other = "cpu" if torch.cuda.is_available() else "cuda"
    cfg = EvalConfig(name="mini", tasks=["LocalShort"], groups={"short": ["LocalShort"]}, query_max_length=32,
                     passage_max_length=32, show_progress=False, device=other, precision="bf16")
    cb = build_eval_callback(cfg, tmp_path)
    cb._tasks = [LocalShort({"test": _corpus()})]
    module = TinyModule(model)
    module.train()
    accel = "gpu" if torch.cuda.is_available() else "cpu"
    trainer = pl.Trainer(max_steps=2, accelerator=accel, devices=1, logger=False, callbacks=[cb],
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    with caplog.at_level(logging.WARNING, logger="lmk.eval.callback"):
        trainer.fit(module)
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["eval"]["device"] == str(module.device) and res["eval"]["precision"] == "bf16"
    assert next(model.parameters()).device == module.device  # not moved away from the trainer
    assert "ignored during training" in caplog.text
