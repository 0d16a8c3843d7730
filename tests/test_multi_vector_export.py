"""`python -m lmk.export <run> --multi-vector`: a sentence-transformers MultiVectorEncoder folder that loads where lmk
cannot be imported and gives lmk's landmark states and MaxSim scores; lmk reads it back; the card names the scoring."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from lmk.config.eval import EvalConfig  # noqa: E402
from lmk.data.retrieval import RetrievalCorpus  # noqa: E402
from lmk.eval.maxsim import maxsim_scores  # noqa: E402
from lmk.eval.runner import run_suite  # noqa: E402
from lmk.eval.tasks import LocalShort  # noqa: E402
from lmk.model.embedding import EmbeddingModel  # noqa: E402
from lmk.model.exported import load_exported  # noqa: E402
from lmk.model.multi_vector import encode_states  # noqa: E402
from lmk.sharing.publish import PublishError, write_folder  # noqa: E402
from lmk.sharing.st_folder import export_multi_vector, export_sentence_transformers  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
TEXTS = ["the cat sat on the warm mat near the kitchen door while the dog slept in the hall",
         "stock markets fell sharply after the central bank raised interest rates", "apple pie"]


def build(pooling: str) -> EmbeddingModel:
    pool = OmegaConf.merge(OmegaConf.load(CONF / "pooling" / f"{pooling}.yaml"),
                           {"chunk_size": 4} if pooling == "lmk-fixed" else {})
    return EmbeddingModel.build(OmegaConf.load(CONF / "encoder" / "tiny-modernbert.yaml"), pool,
                                query_max_length=64, passage_max_length=64, seed=0)


@pytest.fixture(scope="module")
def model() -> EmbeddingModel:
    return build("lmk-fixed")


@pytest.mark.slow  # a fresh interpreter imports sentence-transformers and transformers: about 20 s
def test_sentence_transformers_alone_gives_lmks_landmark_states(model: EmbeddingModel, tmp_path: Path) -> None:
    kinds = ("landmarks", "tokens")  # what a query keeps
    folders = [str(export_multi_vector(model, tmp_path / queries, maxsim_query=queries)) for queries in kinds]
    (tmp_path / "texts.json").write_text(json.dumps(TEXTS))
    out = tmp_path / "alone"
    out.mkdir()
    # `python -I`: lmk cannot be imported there (tests/st_alone.py refuses it), only the folders' own code runs
    proc = subprocess.run([sys.executable, "-I", str(ROOT / "tests" / "st_alone.py"), "--multi-vector",
                           str(tmp_path / "texts.json"), str(out), *folders], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "refused_loaded.json").read_text()) == []
    docs = encode_states(model, TEXTS, batch_size=3)
    assert max(len(d) for d in docs) >= 3  # several landmarks per document
    for i, queries in enumerate(kinds):
        assert not (out / f"{i}.error").exists(), (out / f"{i}.error").read_text()
        modules = json.loads((out / f"{i}.modules").read_text())
        assert modules[0].endswith(".landmark_transformer") and modules[1].endswith(".landmark_mask")
        vectors = np.load(out / f"{i}.npz")
        query_states = encode_states(model, TEXTS, "query", maxsim_query=queries, batch_size=3)
        for k in range(len(TEXTS)):
            np.testing.assert_allclose(vectors[f"doc{k}"], docs[k], atol=1e-5, rtol=0)
            np.testing.assert_allclose(vectors[f"query{k}"], query_states[k], atol=1e-5, rtol=0)
        np.testing.assert_allclose(np.load(out / f"{i}.scores.npy"), maxsim_scores(query_states, docs).numpy(),
                                   atol=1e-5)


def test_the_mask_module_keeps_what_lmk_scores(model: EmbeddingModel) -> None:
    """In process (fast): the exported pipeline's vectors are lmk's MaxSim vectors, for both query choices."""
    from lmk.sharing.st_folder import to_multi_vector_encoder

    for queries in ("landmarks", "tokens"):
        mve = to_multi_vector_encoder(model, maxsim_query=queries)
        docs = encode_states(model, TEXTS, batch_size=3)
        query_states = encode_states(model, TEXTS, "query", maxsim_query=queries, batch_size=3)
        for k, (d, q) in enumerate(zip(mve.encode_document(TEXTS, batch_size=3), mve.encode_query(TEXTS, batch_size=3),
                                       strict=True)):
            np.testing.assert_allclose(d.numpy(), docs[k], atol=1e-5, rtol=0)
            np.testing.assert_allclose(q.numpy(), query_states[k], atol=1e-5, rtol=0)


def test_lmk_reads_the_multi_vector_folder_as_the_same_model(model: EmbeddingModel, tmp_path: Path) -> None:
    loaded = load_exported(export_multi_vector(model, tmp_path / "mv"))
    assert loaded.fingerprint() == model.fingerprint()  # same weights, tokenization and (lmk) pooler
    assert "MultiVectorEncoder" in (tmp_path / "mv" / "README.md").read_text()


def test_a_pooling_without_landmarks_has_no_multi_vector_export(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="pooling 'mean' .*has no landmarks"):
        export_multi_vector(build("mean"), tmp_path / "mv")
    assert not (tmp_path / "mv").exists()


def _planted(docs: list[str] = TEXTS, queries: list[str] = TEXTS) -> RetrievalCorpus:
    return RetrievalCorpus.from_records("planted", "test", [{"id": f"d{i}", "text": t} for i, t in enumerate(docs)],
                                        [{"id": f"q{i}", "text": t} for i, t in enumerate(queries)],
                                        {f"q{i}": {f"d{i}": 1} for i in range(len(queries))})


def _finished_run(model: EmbeddingModel, folder: Path, scoring: str | None, corpus: RetrievalCorpus | None = None,
                  **eval_settings: str) -> Path:
    """A training run folder as lmk.train leaves it (its export, results.json), evaluated with `scoring` (and
    `eval_settings`) on a planted task (run_suite writes the mteb cache the card's scores are read from)."""
    export_sentence_transformers(model, folder / "export")
    results = {"status": "done", "command": "train", "config": {"pooling": {"name": "lmk-fixed", "pooler": "lmk"}}}
    if scoring:
        cfg = EvalConfig(name="test", tasks=["LocalShort"], query_max_length=64, passage_max_length=64,
                         show_progress=False, scoring=scoring, **eval_settings)
        results["eval"] = run_suite(model, cfg, folder / "mteb_cache", out_dir=folder,
                                    tasks=[LocalShort({"test": corpus or _planted()})])
    (folder / "results.json").write_text(json.dumps(results))
    return folder


@pytest.mark.parametrize("scoring", ["maxsim", "single"])
def test_the_card_says_which_scoring_its_scores_used(model: EmbeddingModel, tmp_path: Path, scoring: str) -> None:
    run = _finished_run(model, tmp_path / "run", scoring)
    pub = write_folder(run, tmp_path / "out", multi_vector=True)
    card = (pub.folder / "README.md").read_text()
    assert f"Scores computed with `eval.scoring={scoring}`" in card
    assert "MultiVectorEncoder" in card and json.loads((pub.folder / "modules.json").read_text())[1]["type"] == \
        "landmark_mask.LandmarkVectorMask"
    assert ("eval.scoring=maxsim record=true" in card) == (scoring == "single")  # how to get MaxSim scores


def test_a_run_without_landmarks_is_refused_in_one_line(tmp_path: Path) -> None:
    run = _finished_run(build("cls"), tmp_path / "run", None)
    with pytest.raises(PublishError, match="has no landmarks") as err:
        write_folder(run, tmp_path / "out", multi_vector=True)
    assert "\n" not in str(err.value) and not (tmp_path / "out").exists()


def test_mteb_scores_the_folder_as_lmk_evaluate_maxsim(model: EmbeddingModel, tmp_path: Path) -> None:
    """mteb's own multi-vector wrapper (MultiVectorWrapper, chosen by mteb.evaluate for a MultiVectorEncoder) on the
    export gives the scores of lmk's eval.scoring=maxsim on a local task."""
    import mteb
    from sentence_transformers import MultiVectorEncoder

    docs = ["the cat sat on the warm mat near the kitchen door while the dog slept",
            "stock markets fell sharply after the bank raised rates", "a recipe for apple pie with cinnamon and butter",
            "the rocket launched into orbit", "volcanic ash closed airports across europe"]
    queries = ["where did the cat sit", "why did markets fall", "apple pie recipe", "rocket orbit", "ash airports"]
    corpus = RetrievalCorpus.from_records("planted", "test", [{"id": f"d{i}", "text": t} for i, t in enumerate(docs)],
                                          [{"id": f"q{i}", "text": t} for i, t in enumerate(queries)],
                                          {f"q{i}": {f"d{i}": 1} for i in range(len(queries))})
    cfg = EvalConfig(name="test", tasks=["LocalShort"], query_max_length=64, passage_max_length=64,
                     show_progress=False, scoring="maxsim")
    ours = run_suite(model, cfg, tmp_path / "cache", tasks=[LocalShort({"test": corpus})])["tasks"]["LocalShort"]
    mve = MultiVectorEncoder(str(export_multi_vector(model, tmp_path / "mv")), trust_remote_code=True, device="cpu")
    theirs = mteb.evaluate(mve, LocalShort({"test": corpus}), cache=None, show_progress_bar=False, co2_tracker=False,
                           raise_error=True).task_results[0].scores["test"][0]
    assert 0 < ours["main_score"] < 1  # not a trivial ranking
    assert theirs["main_score"] == pytest.approx(ours["main_score"], abs=1e-5)


def test_a_run_evaluated_with_token_queries_exports_a_folder_whose_scores_equal_its_cards(
        model: EmbeddingModel, tmp_path: Path) -> None:
    """A run evaluated with eval.maxsim_query=tokens exports a folder whose sentence-transformers scores equal its
    card's: the export's queries are their token states, as the run's scores were computed (not its landmarks)."""
    import mteb
    from sentence_transformers import MultiVectorEncoder

    docs = ["the cat sat on the warm mat near the kitchen door while the dog slept",
            "stock markets fell sharply after the bank raised rates", "a recipe for apple pie with cinnamon and butter",
            "the rocket launched into orbit", "volcanic ash closed airports across europe"]
    queries = ["where did the cat sit on the mat", "why did stock markets fall", "apple pie recipe with butter",
               "the rocket orbit", "ash closed the airports"]
    run = _finished_run(model, tmp_path / "run", "maxsim", _planted(docs, queries), maxsim_query="tokens")
    card_score = json.loads((run / "results.json").read_text())["eval"]["tasks"]["LocalShort"]["main_score"]
    pub = write_folder(run, tmp_path / "out", multi_vector=True)
    assert "`eval.maxsim_query=tokens`" in (pub.folder / "README.md").read_text()

    def folder_score(folder: Path) -> float:
        mve = MultiVectorEncoder(str(folder), trust_remote_code=True, device="cpu")
        return mteb.evaluate(mve, LocalShort({"test": _planted(docs, queries)}), cache=None, show_progress_bar=False,
                             co2_tracker=False, raise_error=True).task_results[0].scores["test"][0]["main_score"]

    assert folder_score(pub.folder) == pytest.approx(card_score, abs=1e-5)
    # the folder the export wrote before (queries as their landmarks) scores otherwise: the check can fail
    landmark_queries = export_multi_vector(model, tmp_path / "landmarks", maxsim_query="landmarks")
    assert folder_score(landmark_queries) != pytest.approx(card_score, abs=1e-5)


@pytest.mark.slow  # three exports and an mteb evaluation of one of them
def test_a_maxsim_trained_run_exports_multi_vector_by_default_and_one_vector_on_request(
        model: EmbeddingModel, tmp_path: Path) -> None:
    """A run trained with train.objective=maxsim (and scored so) is shared as its landmark states: its default export
    is a MultiVectorEncoder whose mteb scores equal its card's, and the card names the objective; `--single-vector`
    (multi_vector=False) still gives its one vector. A run trained for one vector keeps the single-vector default."""
    import mteb
    from sentence_transformers import MultiVectorEncoder

    run = _finished_run(model, tmp_path / "run", "maxsim")
    results = json.loads((run / "results.json").read_text())
    results["config"]["train"] = {"objective": "maxsim", "maxsim_query": "landmarks", "maxsim_tau": 0.05}
    (run / "results.json").write_text(json.dumps(results))
    pub = write_folder(run, tmp_path / "out")  # no choice given: as the run was trained
    modules = json.loads((pub.folder / "modules.json").read_text())
    assert modules[1]["type"] == "landmark_mask.LandmarkVectorMask"
    card = (pub.folder / "README.md").read_text()
    assert "MaxSim InfoNCE (query landmark states against passage landmark states, maxsim_tau 0.05)" in card
    assert "Scores computed with `eval.scoring=maxsim`" in card
    mve = MultiVectorEncoder(str(pub.folder), trust_remote_code=True, device="cpu")
    theirs = mteb.evaluate(mve, LocalShort({"test": _planted()}), cache=None, show_progress_bar=False,
                           co2_tracker=False, raise_error=True).task_results[0].scores["test"][0]["main_score"]
    assert theirs == pytest.approx(results["eval"]["tasks"]["LocalShort"]["main_score"], abs=1e-5)
    one = write_folder(run, tmp_path / "one", multi_vector=False)
    assert all(m["type"] != "landmark_mask.LandmarkVectorMask"
               for m in json.loads((one.folder / "modules.json").read_text()))
    results["config"]["train"] = {"objective": "single", "tau": 0.02}
    (run / "results.json").write_text(json.dumps(results))
    default = write_folder(run, tmp_path / "single-trained")
    assert all(m["type"] != "landmark_mask.LandmarkVectorMask"
               for m in json.loads((default.folder / "modules.json").read_text()))
    assert "single-vector InfoNCE (tau 0.02)" in (default.folder / "README.md").read_text()
