"""The packed (unpadded) inference path on the CPU, through its reference attention: the packed layout gives the padded
embeddings (hidden states at real tokens, pooled LMK embeddings) for ModernBERT's sliding-window layers and for causal
decoders, the landmark positions survive pack/unpack, and the automatic choice keeps the CPU on the padded path.

Tolerance: float32, |packed - padded| <= 1e-5 at every real token (seen: ~5e-7 ModernBERT, ~2e-6 decoders);
a missing window or a leak across texts moves them by more than 1e-3 (asserted, so the comparison can fail)."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from omegaconf import OmegaConf

import lmk.model.packed_attention as pa
from lmk.config import ConfigError
from lmk.config.model import EncoderConfig
from lmk.model.embedding import EmbeddingModel

CONF = Path(__file__).resolve().parents[1] / "conf"
ATOL = 1e-5
# mixed lengths, the longest several ModernBERT windows (16 tokens) long; built once per model
TEXTS = ["word " * n for n in (3, 40, 95, 7, 60)]


def enc(name: str, **over) -> dict:
    cfg = {**OmegaConf.to_container(OmegaConf.load(CONF / "encoder" / f"{name}.yaml")), **over}
    if name == "tiny-modernbert":  # 2 layers, one sliding (16-token window: config.sliding_window 8), one global
        cfg["config_overrides"] = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2,
                                   "intermediate_size": 96, "global_attn_every_n_layers": 2, "local_attention": 16,
                                   "max_position_embeddings": 512}
        cfg["max_positions"] = 512
    return cfg


def pool(name: str, **over) -> dict:
    return {**OmegaConf.to_container(OmegaConf.load(CONF / "pooling" / f"{name}.yaml")), **over}


def build(encoder: dict) -> EmbeddingModel:
    return EmbeddingModel.build(encoder, pool("lmk-fixed", chunk_size=8), passage_max_length=128)


BACKBONES = {
    "modernbert": lambda: enc("tiny-modernbert"),
    "mistral": lambda: enc("tiny-decoder"),  # left padding, grouped-query attention, causal
    # Mistral with a causal sliding window shorter than the texts
    "mistral-window": lambda: enc("tiny-decoder", config_overrides={
        **enc("tiny-decoder")["config_overrides"], "sliding_window": 16}),
    "llama": lambda: enc("tiny-decoder", architecture="llama"),
}


@pytest.fixture(scope="module", params=list(BACKBONES))
def model(request) -> EmbeddingModel:
    return build(BACKBONES[request.param]())


def _both(model: EmbeddingModel, feats: dict) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.inference_mode():
        return model.hidden_states(feats, "fp32"), pa.packed_hidden_states(model.backbone, feats)


def test_packed_hidden_states_and_pooled_embeddings_equal_the_padded_ones(model) -> None:
    feats = model.tokenize(TEXTS)
    lengths = feats["attention_mask"].sum(dim=1)
    assert len(set(lengths.tolist())) == len(TEXTS) and int(lengths.max()) > 3 * 16  # padded, beyond the windows
    padded, packed = _both(model, feats)
    real = feats["attention_mask"].bool()
    assert float((padded[real] - packed[real]).abs().max()) <= ATOL
    assert not packed[~real].any()  # padding stays zero: nothing reads it
    with torch.inference_mode():
        pooled = [model.pooler(h, feats["attention_mask"], feats["pool_mask"]) for h in (padded, packed)]
    assert float((pooled[0] - pooled[1]).abs().max()) <= ATOL


def test_the_window_and_the_text_boundaries_are_what_makes_them_equal(monkeypatch) -> None:
    """Without ModernBERT's window, or with one text's tokens seeing another's, the packed states move by far more
    than the tolerance: the equality above is the windows' and the boundaries' doing."""
    model = build(BACKBONES["modernbert"]())
    feats = model.tokenize(TEXTS)
    real = feats["attention_mask"].bool()
    padded, _ = _both(model, feats)
    with monkeypatch.context() as m:
        m.setattr(pa, "_window", lambda module, sliding_window, is_causal: (False, -1))
        no_window = _both(model, feats)[1]
    assert float((padded[real] - no_window[real]).abs().max()) > 1e-3
    plan = pa.pack_plan(feats["attention_mask"])
    total = int(plan.cu_seqlens[-1])
    one_text = pa.Packing(plan.index, plan.positions, torch.tensor([0, total], dtype=torch.int32), total, plan.shape)
    with torch.inference_mode():
        leaky = pa.packed_hidden_states(model.backbone, feats, one_text)  # every token sees the whole batch
    assert float((padded[real] - leaky[real]).abs().max()) > 1e-3


def test_landmark_positions_and_token_positions_survive_pack_and_unpack() -> None:
    model = build(BACKBONES["mistral"]())  # left padding: real tokens do not start at column 0
    feats = model.tokenize(TEXTS)
    mask, pool_mask, ids = feats["attention_mask"].bool(), feats["pool_mask"], feats["input_ids"]
    assert not bool(mask[:, 0].all())
    plan = pa.pack_plan(feats["attention_mask"])
    packed_ids = ids.reshape(-1)[plan.index]
    packed_pool = pool_mask.reshape(-1)[plan.index]
    assert torch.equal(packed_ids, ids[mask]) and torch.equal(packed_ids[packed_pool], ids[pool_mask.bool()])
    # unpack puts every packed token back at its padded position: the landmarks included
    back = torch.zeros(ids.numel(), dtype=ids.dtype)
    back[plan.index] = packed_ids
    assert torch.equal(back.view_as(ids)[mask], ids[mask])
    assert torch.equal(back.view_as(ids)[pool_mask.bool()], ids[pool_mask.bool()])
    lengths = mask.sum(dim=1).tolist()
    assert plan.cu_seqlens.tolist() == [sum(lengths[:i]) for i in range(len(lengths) + 1)]
    assert plan.max_length == max(lengths) and plan.cu_seqlens.dtype == torch.int32
    # positions restart at 0 for every text: the padded path's positions (counted from a row's first real token)
    starts = plan.cu_seqlens.tolist()
    assert all(plan.positions[0, a:b].tolist() == list(range(b - a)) for a, b in zip(starts[:-1], starts[1:]))


def test_encode_with_packed_forced_gives_the_padded_embeddings() -> None:
    cfg = BACKBONES["modernbert"]()
    padded, packed = build({**cfg, "packed": False}), build({**cfg, "packed": True})
    assert padded.attention_path("fp32") == (False, "padded (encoder.packed=false)")
    assert packed.attention_path("fp32") == (True, "packed (encoder.packed=true)")
    a = padded.encode(TEXTS, batch_size=3, workers=0)
    b = packed.encode(TEXTS, batch_size=3, workers=0)
    assert abs(a - b).max() <= ATOL


def test_auto_takes_padded_on_the_cpu_and_packed_where_varlen_runs(monkeypatch) -> None:
    model = build(BACKBONES["modernbert"]())
    packed, why = model.attention_path("fp32")
    assert not packed and why == "padded: device cpu (varlen_attn is CUDA only)"
    # the rest of the decision, without a GPU: an Ampere-or-newer device at half precision takes the packed path
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert pa.choose(model.backbone, "cuda", "bf16") == (True, "packed (varlen_attn)")
    assert pa.choose(model.backbone, "cuda", "fp32")[1] == "padded: precision fp32 (FlashAttention runs bf16/fp16)"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    assert not pa.choose(model.backbone, "cuda", "fp16")[0]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(pa, "_kernel_params", lambda: frozenset({"is_causal", "scale"}))  # torch 2.10's signature
    assert "window_size" in pa.choose(model.backbone, "cuda", "bf16")[1]  # ModernBERT's windows need it


def test_an_unsupported_backbone_stays_padded_and_forcing_it_is_refused() -> None:
    bert = build({**OmegaConf.to_container(OmegaConf.load(CONF / "encoder" / "minilm-l6.yaml"))})
    assert pa.unsupported(bert.backbone).startswith("backbone type 'bert'")
    assert pa.choose(bert.backbone, "cuda", "bf16")[0] is False  # decided before any CUDA call
    with pytest.raises(ValueError, match="encoder.packed=true, but backbone type 'bert'"):
        pa.choose(bert.backbone, "cpu", "fp32", True)


def test_the_setting_is_hash_neutral_and_checked() -> None:
    base = enc("tiny-modernbert")
    assert "packed" not in EncoderConfig.coerce(base).to_dict()  # auto: every model keeps its fingerprint
    assert EncoderConfig.coerce({**base, "packed": False}).to_dict()["packed"] is False
    assert EncoderConfig.coerce({**base, "packed": "true"}).packed is True
    with pytest.raises(ConfigError, match="encoder.packed='yes'"):
        EncoderConfig.coerce({**base, "packed": "yes"})


def test_the_attention_function_needs_the_packed_lengths() -> None:
    q = torch.zeros(1, 2, 4, 8)
    with pytest.raises(RuntimeError, match="cu_seq_lens_q"):
        pa._varlen_forward(torch.nn.Module(), q, q, q, None)
