"""Scoring is a registered axis: each scoring declared once with its needs (lmk.config.scorings, torch-free), one class
per scoring (lmk.eval.scorings), and eligibility read from the declared needs, never from a pooler's or a scoring's
name: a landmark pooler other than `lmk` is scored by MaxSim and exported multi-vector with no other edit."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from torch import Tensor

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from lmk.config import ConfigError, registry, scorings  # noqa: E402
from lmk.config.eval import EvalConfig  # noqa: E402
from lmk.data.retrieval import RetrievalCorpus  # noqa: E402
from lmk.eval.command import check_scoring  # noqa: E402
from lmk.eval.encoder import LmkEncoder  # noqa: E402
from lmk.eval.maxsim import LmkMaxSimEncoder  # noqa: E402
from lmk.eval.runner import build_encoder, run_suite  # noqa: E402
from lmk.eval.scorings import SCORING_CLASSES, refusal, register_scoring, scoring_class  # noqa: E402
from lmk.eval.tasks import LocalShort  # noqa: E402
from lmk.model.embedding import EmbeddingModel  # noqa: E402
from lmk.model.landmark import POOLER_CLASSES, Pooler, register_pooler  # noqa: E402
from lmk.model.landmark import names as declared_names  # noqa: E402
from lmk.model.multi_vector import encode_states  # noqa: E402
from lmk.sharing.st_folder import export_multi_vector  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
DOCS = ["the cat sat on the warm mat near the kitchen door while the dog slept", "stock markets fell after the bank "
        "raised rates", "a recipe for apple pie with cinnamon and butter", "the rocket launched into orbit"]
QUERIES = ["where did the cat sit", "why did markets fall", "apple pie recipe", "rocket orbit"]


@pytest.fixture
def registries() -> Iterator[None]:
    """The registries as they were after the test (a test's pooler or scoring must not leak into other tests)."""
    saved = (dict(POOLER_CLASSES), {k: dict(v) for k, v in declared_names.DECLARED_POOLERS.items()},
             dict(SCORING_CLASSES), {k: dict(v) for k, v in scorings.DECLARED_SCORINGS.items()})
    yield
    for live, old in zip((POOLER_CLASSES, declared_names.DECLARED_POOLERS, SCORING_CLASSES,
                          scorings.DECLARED_SCORINGS), saved, strict=True):
        live.clear()
        live.update(old)


def corpus() -> RetrievalCorpus:
    return RetrievalCorpus.from_records("planted", "test", [{"id": f"d{i}", "text": t} for i, t in enumerate(DOCS)],
                                        [{"id": f"q{i}", "text": t} for i, t in enumerate(QUERIES)],
                                        {f"q{i}": {f"d{i}": 1} for i in range(len(QUERIES))})


def eval_cfg(**kw) -> EvalConfig:
    return EvalConfig(**{"name": "test", "tasks": ["LocalShort"], "query_max_length": 64, "passage_max_length": 64,
                         "batch_size": 2, "show_progress": False, "workers": 0, **kw})


def test_the_declarations_are_the_classes_needs_and_load_without_torch() -> None:
    declared = registry.declared_scorings()
    assert {"single", "maxsim"} <= set(declared)
    assert scoring_class("single") is LmkEncoder and scoring_class("maxsim") is LmkMaxSimEncoder
    for name, cls in SCORING_CLASSES.items():
        assert cls.name == name and cls.needs_landmarks == declared[name]["needs_landmarks"]
        assert cls.multi_vector == declared[name]["multi_vector"]
    assert declared["maxsim"]["needs_landmarks"] and not declared["single"]["needs_landmarks"]
    code = ("import sys\nfrom lmk.config import EvalConfig, registry\nEvalConfig(scoring='maxsim')\n"
            "assert registry.scoring_refusal('maxsim', 'cls', 'cls', 'none')\n"
            "assert registry.scoring_refusal('maxsim', 'lmk-fixed', 'lmk', 'fixed') is None\n"
            "assert 'torch' not in sys.modules")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_a_class_cannot_contradict_its_declaration_nor_take_a_registered_name(registries: None) -> None:
    with pytest.raises(ValueError, match="change the declaration, not the class"):
        @register_scoring
        class Contrary(LmkEncoder):  # noqa: F841 - the decorator refuses it
            name = "maxsim"
            needs_landmarks = False
    with pytest.raises(ValueError, match="registered twice"):
        @register_scoring
        class Again(LmkEncoder):  # noqa: F841 - the decorator refuses it
            name = "single"
    with pytest.raises(ValueError, match="declared twice with different needs"):
        scorings.declare_scoring("single", multi_vector=True)


def test_a_scoring_registered_outside_lmk_declares_its_needs_and_validates(registries: None) -> None:
    with pytest.raises(ConfigError, match="eval.scoring='halfsim'"):
        eval_cfg(scoring="halfsim")

    @register_scoring
    class HalfSim(LmkMaxSimEncoder):  # defined here, not in lmk: its class attributes declare it
        name = "halfsim"
        describe = "MaxSim at half the score"

        def similarity(self, embeddings1, embeddings2):
            return super().similarity(embeddings1, embeddings2) / 2

    declared = registry.declared_scorings()["halfsim"]
    assert declared["needs_landmarks"] and declared["multi_vector"] and declared["module"] == __name__
    assert eval_cfg(scoring="halfsim").scoring == "halfsim"
    assert isinstance(build_encoder(build("lmk-fixed"), eval_cfg(scoring="halfsim")), HalfSim)
    assert registry.scoring_refusal("halfsim", "cls", "cls", "none")  # its needs, not its name, refuse a CLS row


def build(pooling: str | dict, **overrides) -> EmbeddingModel:
    pool = OmegaConf.load(CONF / "pooling" / f"{pooling}.yaml") if isinstance(pooling, str) else pooling
    return EmbeddingModel.build(OmegaConf.load(CONF / "encoder" / "tiny-modernbert.yaml"),
                                OmegaConf.merge(pool, {"chunk_size": 4, **overrides}),
                                query_max_length=64, passage_max_length=64, seed=0)


def test_a_landmark_pooler_other_than_lmk_is_scored_by_maxsim_and_exported_multi_vector(
        registries: None, tmp_path: Path) -> None:
    """A pooler registered in-process whose declaration needs the pool_mask: eval.scoring=maxsim validates, scores
    it (its landmark states: the same as lmk's at the same layout) and it exports as a MultiVectorEncoder."""

    @register_pooler
    class FirstLandmarkPooling(Pooler):  # defined here: no edit of lmk names it
        name = "test_first_landmark"
        needs_pool_mask = True

        def pool(self, token_embeddings: Tensor, attention_mask: Tensor, pool_mask: Tensor | None) -> Tensor:
            mask = (pool_mask if pool_mask is not None else attention_mask) & attention_mask
            return token_embeddings[range(len(mask)), mask.float().argmax(dim=1)]

    pooling = {"name": "lmk-first", "strategy": "fixed", "pooler": "test_first_landmark"}
    cfg = eval_cfg(scoring="maxsim", maxsim_query="tokens")
    check_scoring(OmegaConf.create({"eval": {"scoring": "maxsim"}, "model": None, "pooling": pooling}))
    assert registry.scoring_refusal("maxsim", "lmk-first", "test_first_landmark", "fixed") is None
    model = build(pooling)
    assert refusal("maxsim", model) is None
    section = run_suite(model, cfg, tmp_path / "cache", tasks=[LocalShort({"test": corpus()})])
    lmk_section = run_suite(build("lmk-fixed"), cfg, tmp_path / "cache-lmk", tasks=[LocalShort({"test": corpus()})])
    assert section["scoring"] == "maxsim" and section["maxsim_query"] == "tokens"
    # MaxSim scores the landmark states, not the pooler's vector: the same backbone and layout score as lmk's
    assert section["tasks"]["LocalShort"]["main_score"] == pytest.approx(lmk_section["tasks"]["LocalShort"]["main_score"])

    from sentence_transformers import MultiVectorEncoder

    folder = export_multi_vector(model, tmp_path / "mv", maxsim_query="tokens")
    mve = MultiVectorEncoder(str(folder), trust_remote_code=True, device="cpu")
    docs = mve.encode_document(DOCS[:1], convert_to_numpy=True)[0]
    assert docs.shape == encode_states(model, DOCS[:1], "passage")[0].shape


def test_a_pooling_without_landmarks_is_refused_by_its_needs(registries: None) -> None:
    @register_pooler
    class Plain(Pooler):  # no pool_mask: MaxSim has no landmark states to score
        name = "test_plain"

        def pool(self, token_embeddings: Tensor, attention_mask: Tensor, pool_mask: Tensor | None) -> Tensor:
            return token_embeddings[:, 0]

    assert "has no landmarks" in refusal("maxsim", build({"name": "plain", "strategy": "fixed",
                                                          "pooler": "test_plain"}))
    assert refusal("single", build("cls")) is None
    with pytest.raises(ConfigError, match="has no landmarks"):
        check_scoring(OmegaConf.create({"eval": {"scoring": "maxsim"}, "model": None,
                                        "pooling": {"name": "plain", "strategy": "fixed", "pooler": "test_plain"}}))


# The registries: the only modules that may name a pooler or a scoring by a literal to decide something
REGISTRY_MODULES = {"lmk/config/scorings.py", "lmk/config/registry.py", "lmk/model/landmark/names.py",
                    "lmk/eval/scorings.py"}
SCORING_KEYS = {"scoring", "pooler"}  # the config keys that hold a scoring's or a pooler's name


def _names() -> set[str]:
    return set(registry.declared_scorings()) | set(declared_names.DECLARED_POOLERS)


def _compared_names(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of each comparison (==, !=, in, not in) of something with a literal pooler or scoring name where
    the other side reads a pooler or scoring (`.pooler`, `.scoring`, `.name`, `["pooler"]`, `.get("scoring")`, ...)."""
    names, found = _names(), []

    def reads_name(node: ast.AST) -> bool:
        text = ast.unparse(node)
        return any(k in text for k in ("pool", "scor", ".name", "name ")) or (
            isinstance(node, ast.Name) and node.id in {"name", "scoring", "pooler"})

    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        literals = [s.value for s in sides if isinstance(s, ast.Constant) and isinstance(s.value, str)]
        literals += [e.value for s in sides if isinstance(s, ast.Tuple | ast.List | ast.Set) for e in s.elts
                     if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        hits = [x for x in literals if x in names]
        if hits and any(reads_name(s) for s in sides if not isinstance(s, ast.Constant)):
            found.append((node.lineno, hits[0]))
    return found


def test_no_module_outside_the_registries_compares_a_pooler_or_a_scoring_to_its_name() -> None:
    offenders = []
    for path in sorted((ROOT / "lmk").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in REGISTRY_MODULES:
            continue
        offenders += [f"{rel}:{line}: {name!r}" for line, name in _compared_names(ast.parse(path.read_text()))]
    assert not offenders, ("eligibility is read from declared needs (lmk.config.scorings, names.DECLARED_POOLERS), "
                           "not from a name:\n" + "\n".join(offenders))


def test_the_name_scan_finds_the_comparisons_it_forbids() -> None:
    bad = ("if root.eval.scoring == 'maxsim' and root.pooling.pooler != 'lmk': pass\n"
           "if pooling.get('pooler', 'lmk') == 'lmk': pass\nif name == 'lmk': pass\n"
           "if section.scoring in ('maxsim',): pass\n")
    assert sorted({line for line, _ in _compared_names(ast.parse(bad))}) == [1, 2, 3, 4]
