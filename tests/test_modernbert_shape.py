"""The rehearsal encoder: ModernBERT-base's real config shrunk in depth/width, and a ModernBERT-like
tokenizer built offline (cased byte-level BPE, specials after the merges, 8192 positions)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from lmk.model import modernbert_tokenizer as mbt

ROOT = Path(__file__).resolve().parent.parent
SHRUNK = {"num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
          # the vocabulary and the special ids follow the tokenizer
          "vocab_size", "pad_token_id", "cls_token_id", "sep_token_id", "bos_token_id", "eos_token_id"}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("lmk-cache")


@pytest.fixture(scope="module")
def tok(cache):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(mbt.get_model_path(cache_dir=cache)))


def test_tokenizer_is_a_cased_byte_level_bpe_with_leading_space_tokens(tok):
    assert tok.is_fast and tok.model_max_length == 8192
    assert tok("Hello world")["input_ids"] != tok("hello world")["input_ids"]  # cased
    tokens = tok.convert_ids_to_tokens(tok("the Python list of the world")["input_ids"])
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"
    assert "Ġthe" in tokens and any(t.startswith("Ġ") and len(t) > 3 for t in tokens)
    text = "Byte-level: ünïcode, tabs\tand 12345 — all round-trip."
    assert tok.decode(tok(text)["input_ids"], skip_special_tokens=True) == text  # no [UNK] for bytes
    assert set(tok("a b")) == {"input_ids", "attention_mask"}  # no token type ids, like ModernBERT's


def test_special_tokens_come_after_the_merges_like_modernbert(tok):
    ids = [tok.convert_tokens_to_ids(t) for t in mbt.SPECIAL_TOKENS]
    n = ids[0]
    assert ids == list(range(n, n + 5))  # [UNK] [CLS] [SEP] [PAD] [MASK], as 50280..50284 in ModernBERT
    assert (tok.unk_token_id, tok.cls_token_id, tok.sep_token_id, tok.pad_token_id, tok.mask_token_id) == tuple(ids)
    bpe = {i for t, i in tok.get_vocab().items() if not t.startswith("[")}
    assert max(bpe) < n and len(tok) % 64 == 0 and len(tok) - n < 64 + 5  # near the top, padded to 64
    assert tok.convert_ids_to_tokens(len(tok) - 1).startswith("[unused")


def test_tokenizer_is_deterministic_and_cached(tmp_path, cache):
    a, b = mbt.build(tmp_path / "a"), mbt.build(tmp_path / "b")
    assert json.loads((a / "tokenizer.json").read_text()) == json.loads((b / "tokenizer.json").read_text())
    path = mbt.get_model_path(cache_dir=cache)
    stamp = (path / "tokenizer.json").stat().st_mtime_ns
    assert mbt.get_model_path(cache_dir=cache) == path and (path / "tokenizer.json").stat().st_mtime_ns == stamp
    assert path.parent == cache / "tokenizers" and path.name.startswith("modernbert-like-")


def test_encoder_config_is_modernbert_base_except_the_shrunk_keys(cache, monkeypatch):
    from transformers import AutoConfig

    from lmk.model.backbone import is_checkpointing, load_backbone, shipped_config

    monkeypatch.setenv("LMK_CACHE", str(cache))
    model, tok = load_backbone(OmegaConf.load(ROOT / "conf/encoder/modernbert-base-shape.yaml"))
    # the reference: ModernBERT-base's config.json read by the same transformers version
    base = shipped_config("modernbert-base")
    ref = AutoConfig.for_model(**{k: v for k, v in base.items() if k != "transformers_version"}).to_dict()
    got = model.config.to_dict()
    changed = {k for k in set(ref) | set(got) if ref.get(k) != got.get(k)}
    changed -= {"architectures", "_name_or_path", "dtype", "torch_dtype"}  # file metadata, not the model
    # layer_types is derived from the depth: the same global/local pattern, cut at the shrunk depth
    assert got["layer_types"] == ref["layer_types"][: got["num_hidden_layers"]]
    assert changed - {"layer_types"} == SHRUNK, changed - SHRUNK
    assert got["vocab_size"] == len(tok) and got["cls_token_id"] == tok.cls_token_id
    assert got["layer_types"][:4] == ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    assert is_checkpointing(model)
    out = model(**tok(["a short text", "another one"], return_tensors="pt", padding=True)).last_hidden_state
    assert out.shape[-1] == 64 and torch.isfinite(out).all()


def test_shipped_config_is_refused_for_other_sources():
    from lmk.config.model import EncoderConfig

    with pytest.raises(ValueError, match="only applies to source=random"):
        EncoderConfig(name="x", source="hub", model_id="answerdotai/ModernBERT-base", config="modernbert-base")
