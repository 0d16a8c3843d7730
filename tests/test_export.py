"""sentence-transformers export: the folder reloads through SentenceTransformer and as an EmbeddingModel."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
from components import POOLING_CONFIGS
from omegaconf import OmegaConf
from sentence_transformers import SentenceTransformer

from lmk.export import LandmarkPooling, LandmarkTransformer, export_sentence_transformers, load_exported
from lmk.model.embedding import EmbeddingModel

CONF = Path(__file__).resolve().parents[1] / "conf"
TEXTS = [
    "Landmark tokens summarise the chunk before them.",
    "tiny",
    "",
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. " * 4,
]


def build(encoder: str, pooling: str, **pool_over) -> EmbeddingModel:
    enc = OmegaConf.load(CONF / "encoder" / f"{encoder}.yaml")
    pool = OmegaConf.merge(OmegaConf.load(CONF / "pooling" / f"{pooling}.yaml"), pool_over)
    return EmbeddingModel.build(enc, pool, query_max_length=16, passage_max_length=64)


# every conf/pooling option on the tiny ModernBERT (a new pooling is exported and reloaded here by itself), and the
# pretrained MiniLM with two of them
CASES = [("tiny-modernbert", p) for p in POOLING_CONFIGS] + [("minilm-l6", "lmk-fixed"), ("minilm-l6", "cls")]


@pytest.mark.parametrize(("encoder", "pooling"), CASES)
def test_export_reload_equal(tmp_path, encoder, pooling):
    m = build(encoder, pooling, chunk_size=8)
    path = export_sentence_transformers(m, tmp_path / "st")
    modules = json.loads((path / "modules.json").read_text())
    assert [mod["type"] for mod in modules] == ["lmk.export.LandmarkTransformer", "lmk.export.LandmarkPooling"]

    ref = m.encode(TEXTS, batch_size=2)
    st = SentenceTransformer(str(path), trust_remote_code=True, device="cpu")
    assert isinstance(st[0], LandmarkTransformer) and isinstance(st[1], LandmarkPooling)
    assert st.max_seq_length == 64 and st.get_embedding_dimension() == m.hidden_size
    got = st.encode(TEXTS, batch_size=3, convert_to_numpy=True)
    np.testing.assert_allclose(got, ref, atol=1e-5)

    back = load_exported(path)
    assert back.name == m.name and back.tokenizer.config() == m.tokenizer.config()
    np.testing.assert_allclose(back.encode(TEXTS), ref, atol=1e-6)
    assert back.fingerprint() == m.fingerprint()


def test_export_needs_trust_remote_code(tmp_path):
    path = export_sentence_transformers(build("minilm-l6", "lmk-fixed"), tmp_path / "st")
    with pytest.raises(ValueError, match="trust_remote_code"):
        SentenceTransformer(str(path), device="cpu")


def test_export_max_seq_length_and_landmarks(tmp_path):
    m = build("minilm-l6", "lmk-fixed", chunk_size=8)
    path = export_sentence_transformers(m, tmp_path / "st", max_seq_length=128)
    st = SentenceTransformer(str(path), trust_remote_code=True, device="cpu")
    assert st.max_seq_length == 128
    long = TEXTS[3] * 2
    feats = st.preprocess([long])
    # landmark layout survives export: a [SEP] after every 8 content tokens, pooled
    assert feats["input_ids"].shape[1] == 128
    assert feats["pool_mask"].sum() == int((feats["input_ids"] == 102).sum())
    np.testing.assert_allclose(st.encode([long]), m.encode([long], max_length=128), atol=1e-5)
    # a user can lengthen it like any sentence-transformers model (clamped to the 512 positions)
    st.max_seq_length = 4096
    assert st.preprocess(["word " * 1000])["input_ids"].shape[1] == 512


def test_export_trainable_pooler(tmp_path):
    enc = OmegaConf.load(CONF / "encoder" / "tiny-modernbert.yaml")
    latent = {"name": "latent", "strategy": "none", "pooler": "latent_attention",
              "pooler_kwargs": {"num_latents": 4, "num_heads": 2}}
    m = EmbeddingModel.build(enc, latent, passage_max_length=32)
    path = export_sentence_transformers(m, tmp_path / "st")
    assert (path / "1_LandmarkPooling" / "model.safetensors").is_file()
    st = SentenceTransformer(str(path), trust_remote_code=True, device="cpu")
    np.testing.assert_allclose(st.encode(TEXTS), m.encode(TEXTS), atol=1e-5)
    np.testing.assert_allclose(load_exported(path).encode(TEXTS), m.encode(TEXTS), atol=1e-6)


def test_an_export_written_before_the_layout_loads() -> None:
    """A folder exported by the flat-layout lmk (commit f99b5e6) loads unchanged, as lmk and as
    sentence-transformers, and embeds as it did then."""
    fixture = Path(__file__).resolve().parent / "fixtures" / "export-v0.1"
    expected = json.loads((fixture / "expected.json").read_text())
    folder = fixture / "lmk-latent"
    assert [m["type"] for m in json.loads((folder / "modules.json").read_text())] == [
        "lmk.export.LandmarkTransformer", "lmk.export.LandmarkPooling"]
    model = load_exported(folder)
    got = model.encode(expected["texts"], side="passage", max_length=expected["max_length"])
    np.testing.assert_allclose(got, np.asarray(expected["embeddings"]["lmk-latent"], dtype=np.float32), atol=1e-6)
    st = SentenceTransformer(str(folder), trust_remote_code=True, device="cpu")
    assert isinstance(st[0], LandmarkTransformer) and isinstance(st[1], LandmarkPooling)
