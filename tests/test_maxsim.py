"""eval.scoring=maxsim: exact MaxSim over landmark states, the same states the single vector averages, blocks that
do not change a score, and a pooling without landmarks that says so."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from datasets import Dataset
from omegaconf import OmegaConf

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from lmk.config import ConfigError  # noqa: E402
from lmk.config.eval import EvalConfig, EvalConfigError  # noqa: E402
from lmk.data.retrieval import RetrievalCorpus  # noqa: E402
from lmk.eval.command import check_scoring  # noqa: E402
from lmk.eval.maxsim import LmkMaxSimEncoder, NoLandmarksError, maxsim_blocks, maxsim_scores  # noqa: E402
from lmk.eval.runner import build_encoder, run_suite  # noqa: E402
from lmk.eval.tasks import LocalShort  # noqa: E402
from lmk.model.embedding import EmbeddingModel  # noqa: E402
from lmk.model.multi_vector import encode_states  # noqa: E402
from lmk.run.results import config_hash_of  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CONF = Path(__file__).resolve().parents[1] / "conf"
DOCS = [
    "the cat sat on the warm mat near the kitchen door while the dog slept in the hall",
    "stock markets fell sharply after the central bank raised interest rates again this spring",
    "a recipe for apple pie with cinnamon, butter and a crisp crust baked for forty minutes",
    "the rocket launched",
]
QUERIES = ["where did the cat sit", "why did markets fall after the bank raised rates", "apple pie"]


def build(pooling: str, **overrides) -> EmbeddingModel:
    pool = OmegaConf.merge(OmegaConf.load(CONF / "pooling" / f"{pooling}.yaml"), overrides)
    return EmbeddingModel.build(OmegaConf.load(CONF / "encoder" / "tiny-modernbert.yaml"), pool,
                                query_max_length=64, passage_max_length=64, seed=0)


@pytest.fixture(scope="module")
def lmk_model() -> EmbeddingModel:
    return build("lmk-fixed", chunk_size=4)  # several landmarks per document


def cfg(**kw) -> EvalConfig:
    base = {"name": "test", "tasks": ["LocalShort"], "query_max_length": 64, "passage_max_length": 64,
            "batch_size": 2, "show_progress": False, "scoring": "maxsim"}
    return EvalConfig(**{**base, **kw})


def by_hand(model: EmbeddingModel, text: str, which: str) -> np.ndarray:
    """One text alone through the backbone; its landmark (or all token) states, each normalised, in numpy."""
    feats = model.landmark_tokenizer([text], train=False, max_length=64)
    with torch.no_grad():
        hidden = model.backbone(input_ids=feats["input_ids"], attention_mask=feats["attention_mask"]
                                ).last_hidden_state[0].numpy()
    keep = feats["attention_mask"][0].numpy().astype(bool)
    if which == "landmarks":
        keep &= feats["pool_mask"][0].numpy().astype(bool)
    states = hidden[keep]
    return states / np.linalg.norm(states, axis=1, keepdims=True)


@pytest.mark.parametrize("query_states", ["landmarks", "tokens"])
def test_maxsim_search_scores_equal_maxsim_by_hand(lmk_model: EmbeddingModel, query_states: str) -> None:
    encoder = build_encoder(lmk_model, cfg(maxsim_query=query_states))
    assert isinstance(encoder, LmkMaxSimEncoder)
    meta = LocalShort.metadata
    corpus = Dataset.from_list([{"id": f"d{i}", "text": t} for i, t in enumerate(DOCS)])
    queries = Dataset.from_list([{"id": f"q{i}", "text": t} for i, t in enumerate(QUERIES)])
    kwargs = {"task_metadata": meta, "hf_split": "test", "hf_subset": "default", "encode_kwargs": {"batch_size": 2},
              "num_proc": None}
    encoder.index(corpus, **kwargs)
    found = encoder.search(queries, top_k=len(DOCS), **kwargs)  # what mteb ranks and scores with
    docs = [by_hand(lmk_model, t, "landmarks") for t in DOCS]
    assert min(len(d) for d in docs) >= 1 and max(len(d) for d in docs) >= 4  # several landmarks per document
    for qi, query in enumerate(QUERIES):
        q = by_hand(lmk_model, query, query_states)
        expected = {f"d{di}": float((q @ d.T).max(axis=1).sum()) for di, d in enumerate(docs)}
        assert found[f"q{qi}"] == pytest.approx(expected, abs=1e-4)


def test_the_documents_held_at_once_fit_the_budget(lmk_model: EmbeddingModel) -> None:
    encoder = build_encoder(lmk_model, cfg(maxsim_block_mb=1))
    assert encoder.max_vectors() == 64 // 4 + 2
    assert encoder.corpus_chunk_size == 2**20 // (18 * 256 * 4)  # 1 MiB of 18 x 256 float32 vectors per document
    # the bound holds: a text at the passage length has no more landmark states
    states = encode_states(lmk_model, ["word " * 200, "short"])
    assert max(len(s) for s in states) <= encoder.max_vectors() and len(states[0]) >= 64 // 5


def test_single_vector_is_the_normalised_mean_of_the_maxsim_states(lmk_model: EmbeddingModel) -> None:
    texts = DOCS + QUERIES
    single = lmk_model.encode(texts, batch_size=2)
    raw = encode_states(lmk_model, texts, batch_size=2, normalize=False)
    multi = encode_states(lmk_model, texts, batch_size=2)
    for i, states in enumerate(raw):
        states = torch.from_numpy(states)
        # the lmk pooler's vector: the normalised mean of exactly these (unnormalised) landmark states
        torch.testing.assert_close(F.normalize(states.mean(0), dim=0), torch.from_numpy(single[i]), atol=1e-6, rtol=0)
        # MaxSim's vectors: the same states, each normalised
        torch.testing.assert_close(F.normalize(states, dim=-1), torch.from_numpy(multi[i]), atol=1e-6, rtol=0)
        n_landmarks = int(lmk_model.tokenize([texts[i]])["pool_mask"].sum())
        assert len(states) == n_landmarks


def test_block_size_does_not_change_the_scores() -> None:
    gen = torch.Generator().manual_seed(0)
    queries = [F.normalize(torch.randn(n, 8, generator=gen), dim=-1) for n in (3, 1, 7, 2)]
    docs = [F.normalize(torch.randn(n, 8, generator=gen), dim=-1) for n in (5, 1, 30, 2, 9, 4, 12)]
    whole = maxsim_scores(queries, docs, block_mb=256)
    small = 2.5 / 1024  # MiB
    blocks = maxsim_blocks([len(q) for q in queries], [len(d) for d in docs], 8, small)
    assert len({q for q, _ in blocks}) > 1 and len(blocks) > 4  # queries in chunks, documents in blocks
    torch.testing.assert_close(maxsim_scores(queries, docs, block_mb=small), whole, atol=1e-6, rtol=0)
    expected = torch.tensor([[float((q @ d.T).max(dim=1).values.sum()) for d in docs] for q in queries])
    torch.testing.assert_close(whole, expected, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="raise eval.maxsim_block_mb"):
        maxsim_scores(queries, docs, block_mb=1 / 1024)


def test_maxsim_run_writes_per_query_scores_and_its_scoring(lmk_model: EmbeddingModel, tmp_path: Path) -> None:
    rc = RetrievalCorpus.from_records("planted", "test", [{"id": f"d{i}", "text": t} for i, t in enumerate(DOCS)],
                                      [{"id": f"q{i}", "text": t} for i, t in enumerate(DOCS)],
                                      {f"q{i}": {f"d{i}": 1} for i in range(len(DOCS))})
    section = run_suite(lmk_model, cfg(), tmp_path / "mteb_cache", tasks=[LocalShort({"test": rc})])
    # a document's landmarks each find themselves (cosine 1): its own document scores highest
    assert section["tasks"]["LocalShort"]["main_score"] == pytest.approx(1.0)
    assert section["scoring"] == "maxsim" and section["maxsim_query"] == "landmarks"
    per_query = json.loads((tmp_path / "per_query.json").read_text())
    assert per_query["LocalShort"]["test"] == {f"q{i}": pytest.approx(1.0) for i in range(len(DOCS))}
    single = run_suite(lmk_model, cfg(scoring="single"), tmp_path / "mteb_cache", tasks=[LocalShort({"test": rc})])
    assert single["scoring"] == "single" and single["n_encoded"] > 0  # its own cache: never the MaxSim scores


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_a_pooling_without_landmarks_says_so(pooling: str) -> None:
    with pytest.raises(NoLandmarksError, match=f"pooling '{pooling}' .* has no landmarks.*eval.scoring=single"):
        build_encoder(build(pooling), cfg())
    composed = OmegaConf.create({"model": None, "pooling": OmegaConf.load(CONF / "pooling" / f"{pooling}.yaml"),
                                 "eval": {"scoring": "maxsim"}})
    with pytest.raises(ConfigError, match="has no landmarks") as err:
        check_scoring(composed)
    assert "\n" not in str(err.value)


def test_a_training_run_without_landmarks_fails_before_loading(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps({"status": "done", "command": "train",
                                                  "config": {"pooling": {"name": "mean", "pooler": "mean"}}}))
    composed = OmegaConf.create({"model": str(run), "pooling": {"name": "lmk-fixed", "pooler": "lmk"},
                                 "eval": {"scoring": "maxsim"}})
    with pytest.raises(ConfigError, match="pooling 'mean' .*has no landmarks"):
        check_scoring(composed)  # the run's pooling counts, not the evaluate config's default
    check_scoring(OmegaConf.merge(composed, {"eval": {"scoring": "single"}}))


def test_scoring_settings_are_validated_and_hash_only_when_not_default() -> None:
    with pytest.raises(EvalConfigError, match=r"eval.scoring='late': allowed \['single', 'maxsim', 'maxsim-compressed'\]"):
        cfg(scoring="late")
    with pytest.raises(EvalConfigError, match="eval.maxsim_query='words'"):
        cfg(maxsim_query="words")
    local = OmegaConf.to_container(_compose(["eval=local"]).eval)  # composed: the settings from conf/eval/_base.yaml
    assert {"scoring", "maxsim_query", "maxsim_block_mb"} <= set(local)
    before = OmegaConf.create({"eval": {k: v for k, v in local.items()
                                        if k not in ("scoring", "maxsim_query", "maxsim_block_mb")}})
    # a run composed before these settings existed keeps its hash; a MaxSim run gets its own
    assert config_hash_of(OmegaConf.create({"eval": local})) == config_hash_of(before)
    assert config_hash_of(OmegaConf.create({"eval": {**local, "scoring": "maxsim"}})) != config_hash_of(before)


def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose("evaluate", overrides=overrides)


OVERRIDES = ["eval=local", "eval.tasks=[LocalShort]", "eval.groups={local-short:[LocalShort]}",
             "eval.query_max_length=64", "eval.passage_max_length=64", "eval.show_progress=false"]


def test_evaluate_an_export_with_maxsim_records_the_scoring(lmk_model: EmbeddingModel, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import lmk.eval.command as evaluate
    import lmk.eval.evaluation as evaluation
    from lmk.run.results import Results
    from lmk.sharing.st_folder import export_sentence_transformers

    rc = RetrievalCorpus.from_records("planted", "test", [{"id": f"d{i}", "text": t} for i, t in enumerate(DOCS)],
                                      [{"id": f"q{i}", "text": t} for i, t in enumerate(DOCS)],
                                      {f"q{i}": {f"d{i}": 1} for i in range(len(DOCS))})
    monkeypatch.setattr(evaluation, "build_tasks", lambda cfg, check_offline=True: [LocalShort({"test": rc})])
    export = export_sentence_transformers(lmk_model, tmp_path / "export")
    for scoring in ("maxsim", "single"):
        run = tmp_path / scoring
        evaluate.run(_compose([f"model={export}", f"eval.scoring={scoring}", *OVERRIDES]), run_dir=run)
        record = Results.read(run).eval
        assert record.scoring == scoring and (run / record.per_query).is_file()
        assert record.tasks["LocalShort"]["main_score"] == pytest.approx(1.0)
    assert Results.read(tmp_path / "maxsim").eval.extra["maxsim_query"] == "landmarks"


def test_evaluate_maxsim_on_cls_fails_before_loading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import lmk.eval.command as evaluate
    import lmk.eval.evaluation as evaluation

    def never(*args, **kwargs):
        raise AssertionError("the model must not be loaded")

    monkeypatch.setattr(evaluation, "load_model", never)
    cfg = _compose(["model=null", "encoder=tiny-modernbert", "pooling=cls", "eval.scoring=maxsim", *OVERRIDES])
    with pytest.raises(ConfigError, match="pooling 'cls' .*has no landmarks"):
        evaluate.run(cfg, run_dir=tmp_path / "run")


def test_training_with_a_maxsim_evaluation_and_no_landmarks_fails_before_training() -> None:
    from hydra import compose, initialize_config_dir

    from lmk.train.trainer_args import validate_training

    overrides = ["run_dir=/tmp/lmk-test-run", "eval=table2-tiny", "eval.scoring=maxsim"]
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["pooling=mean", *overrides])
        ok = compose("train", overrides=overrides)
    with pytest.raises(ConfigError, match="pooling 'mean' .*has no landmarks"):
        validate_training(cfg)
    assert validate_training(ok).eval.scoring == "maxsim"
