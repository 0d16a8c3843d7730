"""The eval callback inside a real (tiny) Lightning fit, and the evaluate command end to end."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from hydra import compose, initialize_config_dir
from lightning.pytorch.loggers import CSVLogger
from omegaconf import OmegaConf

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from lmk.config.eval import EvalConfig  # noqa: E402
from lmk.data.retrieval import RetrievalCorpus  # noqa: E402
from lmk.eval.callback import EvalCallback, build_eval_callback  # noqa: E402
from lmk.eval.tasks import LocalShort  # noqa: E402
from lmk.model.embedding import EmbeddingModel  # noqa: E402

CONF = Path(__file__).resolve().parents[1] / "conf"
TEXTS = ["the cat sat on the mat", "stock markets fell sharply", "a recipe for apple pie", "the rocket reached orbit"]


def planted() -> RetrievalCorpus:
    return RetrievalCorpus.from_records(
        "planted", "test", [{"id": f"d{i}", "text": t} for i, t in enumerate(TEXTS)],
        [{"id": f"q{i}", "text": t} for i, t in enumerate(TEXTS)], {f"q{i}": {f"d{i}": 1} for i in range(len(TEXTS))})


class TinyModule(pl.LightningModule):
    """Holds the EmbeddingModel as `.model` like ContrastiveModule; a loss that moves the weights."""

    def __init__(self, model: EmbeddingModel) -> None:
        super().__init__()
        self.model = model
        self.train_modes: list[bool] = []

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.train_modes.append(self.model.training)
        feats = self.model.tokenize(TEXTS[:2], side="passage")
        return self.model(feats).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(torch.zeros(8, 1), batch_size=1)


def test_callback_every_n_steps_and_at_fit_end(tmp_path: Path) -> None:
    model = EmbeddingModel.build(OmegaConf.load(CONF / "encoder" / "tiny-modernbert.yaml"),
                                 OmegaConf.load(CONF / "pooling" / "lmk-fixed.yaml"))
    cfg = EvalConfig(name="mini", tasks=["LocalShort"], groups={"short": ["LocalShort"]}, every_n_steps=2,
                     query_max_length=32, passage_max_length=32, show_progress=False)
    cb = build_eval_callback(cfg, tmp_path)
    assert isinstance(cb, EvalCallback)
    cb._tasks = [LocalShort({"test": planted()})]  # tiny planted data instead of the regenerated task
    module = TinyModule(model)
    module.train()  # from_pretrained models start in eval mode; Lightning keeps the mode it finds
    trainer = pl.Trainer(max_steps=4, accelerator="cpu", logger=CSVLogger(str(tmp_path), name="", version=""),
                         callbacks=[cb], enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(module)
    assert sorted(cb.history) == [2, 4]  # step 2 mid-training, step 4 = fit end
    assert all(module.train_modes)  # train mode restored after the mid-training eval
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["eval"]["suite"] == "mini"
    assert set(results["eval_history"]) == {"2", "4"}
    assert results["eval"]["tasks"]["LocalShort"]["metric"] == "ndcg_at_10"
    assert results["eval"]["per_query"] == "per_query.json" and (tmp_path / "per_query.json").is_file()
    # the weights moved between the two evals: two distinct cache identities
    assert len(list((tmp_path / "mteb_cache" / "results").iterdir())) == 2
    with open(tmp_path / "metrics.csv") as fh:
        rows = list(csv.DictReader(fh))
    keys = set(rows[0])
    assert {"eval/LocalShort", "eval/LocalShort/test", "eval/group/short"} <= keys
    logged = [r for r in rows if r.get("eval/group/short")]
    assert [int(r["step"]) for r in logged] == [2, 4]


@pytest.fixture()
def eval_cfg_overrides() -> list[str]:
    # A local suite of one tiny task keeps the command test fast; LocalShort data is replaced below.
    return ["eval=local", "eval.tasks=[LocalShort]", "eval.groups={local-short:[LocalShort]}",
            "eval.query_max_length=32", "eval.passage_max_length=32", "eval.show_progress=false", "logger=csv"]


def _compose(overrides: list[str]):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose("evaluate", overrides=overrides)


def test_evaluate_command_untrained_and_cross_pooling(tmp_path: Path, eval_cfg_overrides: list[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import lmk.eval.command as evaluate
    import lmk.eval.evaluation as evaluation

    # the real build_tasks, with LocalShort's data swapped for the planted corpus (the offline short
    # corpus takes minutes to encode on 2 CPU cores)
    monkeypatch.setattr(evaluation, "build_tasks", lambda cfg: [LocalShort({"test": planted()})])
    cfg = _compose(["model=null", "encoder=tiny-modernbert", "pooling=lmk-fixed", *eval_cfg_overrides])
    section = evaluate.run(cfg, run_dir=tmp_path / "untrained")
    res = json.loads((tmp_path / "untrained" / "results.json").read_text())
    assert res["status"] == "done" and res["command"] == "evaluate"
    assert res["config"]["encoder"]["name"] == "tiny-modernbert" and len(res["config_hash"]) == 12
    assert "git_commit" in res and "eval" in res["timings"]
    assert res["eval"]["tasks"]["LocalShort"]["main_score"] == section["tasks"]["LocalShort"]["main_score"]
    assert res["model"]["kind"] == "encoder-config" and res["model"]["pooling"] == "lmk-fixed-32"

    # a saved model re-evaluated with another pooling (cross-pooling): same backbone, mean pooler
    model = EmbeddingModel.build(OmegaConf.load(CONF / "encoder" / "tiny-modernbert.yaml"),
                                 OmegaConf.load(CONF / "pooling" / "lmk-fixed.yaml"))
    model.save_pretrained(tmp_path / "saved")
    cfg = _compose([f"model={tmp_path / 'saved'}", "pooling=mean", *eval_cfg_overrides])
    evaluate.run(cfg, run_dir=tmp_path / "cross", cross_pooling=True)
    res = json.loads((tmp_path / "cross" / "results.json").read_text())
    assert res["status"] == "done"
    assert res["model"]["kind"] == "pretrained"
    assert res["model"]["trained_pooling"] == "lmk-fixed-32" and res["model"]["pooling"] == "mean"
    assert res["eval"]["model"].startswith("lmk/tiny-modernbert__mean__")


def test_evaluate_bad_model_path_fails_clearly(tmp_path: Path) -> None:
    from lmk.model.loading import load_model

    with pytest.raises(FileNotFoundError, match="run dir, an exported model folder"):
        load_model(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="checkpoints/last.ckpt"):
        load_model(tmp_path / "empty")
    with pytest.raises(ValueError, match="encoder= and pooling="):
        load_model(None)
