"""Inference: device/precision resolution, bf16 autocast, token-budget batches, unmasked single rows,
sliding-window attention without a dense mask (offline, CPU, tiny models; CUDA tests marked gpu)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from lmk.model.batching import fixed_batches, token_budget_batches
from lmk.model.device import autocast, resolve_device, resolve_precision
from lmk.model.embedding import EmbeddingModel

CONF = Path(__file__).resolve().parents[1] / "conf"
TEXTS = [
    "Landmark pooling inserts a separator after every chunk of tokens.",
    "Short one.",
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. " * 6,
    "",
    "Mean pooling averages all token states; CLS pooling keeps only the first one.",
    "Dense retrieval embeds queries and passages in one vector space; a dot product ranks them. " * 3,
    "x",
]


def _build(encoder: str, pooling: str = "lmk-fixed", **enc_over) -> EmbeddingModel:
    enc = OmegaConf.merge(OmegaConf.load(CONF / "encoder" / f"{encoder}.yaml"), enc_over)
    pool = OmegaConf.merge(OmegaConf.load(CONF / "pooling" / f"{pooling}.yaml"), {"chunk_size": 8})
    return EmbeddingModel.build(enc, pool, query_max_length=32, passage_max_length=128)


@pytest.fixture(scope="module", params=["minilm-l6", "tiny-modernbert"])
def model(request) -> EmbeddingModel:
    return _build(request.param)


@pytest.fixture(scope="module")
def modernbert() -> EmbeddingModel:
    return _build("tiny-modernbert")


class _Spy:
    """Records the shape and the attention_mask each backbone call receives."""

    def __init__(self, backbone: torch.nn.Module) -> None:
        self.calls: list[tuple[tuple[int, ...], torch.Tensor | None]] = []
        self.handle = backbone.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        self.calls.append((tuple(kwargs["input_ids"].shape), kwargs.get("attention_mask")))

    def __enter__(self) -> _Spy:
        return self

    def __exit__(self, *exc) -> None:
        self.handle.remove()


# ------------------------------------------------------------------------------- device / precision
def test_resolve_device_auto_and_cpu():
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match=r"eval.device='gpu'.*auto, cpu, cuda, cuda:N"):
        resolve_device("gpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised where CUDA is missing")
@pytest.mark.parametrize("spec", ["cuda", "cuda:1"])
def test_cuda_request_without_cuda_names_the_key(spec):
    with pytest.raises(RuntimeError, match=rf"eval.device='{spec}'.*CUDA is not available.*eval.device=auto"):
        resolve_device(spec)


def test_resolve_precision():
    assert resolve_precision("auto", "cpu") == "fp32"
    assert resolve_precision("bf16", "cpu") == "bf16"
    with pytest.raises(ValueError, match=r"eval.precision='fp64'.*auto, bf16, fp16, fp32"):
        resolve_precision("fp64", "cpu")
    with pytest.raises(ValueError, match="resolve_precision"):
        with autocast("cpu", "auto"):
            pass


def test_bf16_autocast_close_to_fp32_and_float32_out(model):
    fp32 = model.encode(TEXTS, batch_size=3)
    bf16 = model.encode(TEXTS, batch_size=3, precision="bf16")
    assert bf16.dtype == np.float32 and bf16.shape == fp32.shape
    assert next(model.backbone.parameters()).dtype == torch.float32  # autocast, not a cast of the weights
    cos = (fp32 * bf16).sum(axis=1)  # both L2-normalised
    assert cos.min() > 0.99, cos
    assert not np.array_equal(fp32, bf16)  # autocast was really on


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_bf16_close_to_cpu_fp32():
    m = _build("tiny-modernbert")
    ref = m.encode(TEXTS, batch_size=3)
    m.to(resolve_device("cuda"))
    got = m.encode(TEXTS, batch_size=3, precision="auto", max_tokens_per_batch=256)
    assert got.dtype == np.float32
    assert (ref * got).sum(axis=1).min() > 0.99


# ------------------------------------------------------------------------------------------ batches
def test_token_budget_batches_respect_budget():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 300, size=200)
    lengths[17] = 1000  # longer than the budget: alone
    batches = token_budget_batches(lengths, 512)
    seen = np.concatenate(batches)
    assert sorted(seen.tolist()) == list(range(200))  # every row once
    for b in batches:
        assert len(b) * lengths[b].max() <= 512 or len(b) == 1
    assert [b.tolist() for b in batches if 17 in b] == [[17]]
    # longest first, and the batches widen as rows get shorter
    assert lengths[batches[0][0]] == lengths.max()
    assert max(len(b) for b in batches) > len(batches[1])
    with pytest.raises(ValueError, match="max_tokens_per_batch"):
        token_budget_batches(lengths, 0)
    assert [len(b) for b in fixed_batches(lengths, 64)] == [64, 64, 64, 8]


def test_encode_by_token_budget_equals_fixed_batches(model):
    budget = 96
    lengths = model.token_lengths(TEXTS)
    with _Spy(model.backbone) as spy:
        by_budget = model.encode(TEXTS, max_tokens_per_batch=budget)
    fixed = model.encode(TEXTS, batch_size=2)
    np.testing.assert_allclose(by_budget, fixed, atol=1e-5)  # same order, same vectors
    np.testing.assert_allclose(by_budget[2], model.encode([TEXTS[2]])[0], atol=1e-5)
    shapes = [s for s, _ in spy.calls]
    assert sum(s[0] for s in shapes) == len(TEXTS)
    for rows, width in shapes:
        assert rows * width <= budget or rows == 1
    assert max(lengths) > budget // 2  # the long text really went alone
    assert any(rows > 2 for rows, _ in shapes)  # short texts share wide batches


def test_single_row_batch_has_no_mask_and_same_embedding(model):
    with _Spy(model.backbone) as spy:
        alone = model.encode([TEXTS[2]])
    assert len(spy.calls) == 1 and spy.calls[0][1] is None
    feats = model.tokenize([TEXTS[2]])
    with torch.inference_mode():
        masked = model(feats).numpy()  # forward passes the all-ones mask
    np.testing.assert_allclose(alone, masked, atol=1e-5)
    with _Spy(model.backbone) as spy:
        model.encode(TEXTS[:2], batch_size=2)
    assert spy.calls[0][1] is not None  # padded batches keep their mask


def test_lean_attention_equals_dense_sliding_window_mask(modernbert):
    from lmk.model.long_attention import LEAN_SDPA, banded_attention, lean_attention

    long = " ".join(["token"] * 1500)
    feats = modernbert.tokenize([long], max_length=1200)  # > BLOCK: several blocks
    backbone = modernbert.backbone
    with torch.inference_mode():
        dense = backbone(input_ids=feats["input_ids"], attention_mask=feats["attention_mask"]).last_hidden_state
        with lean_attention(backbone) as on:
            assert on and backbone.config._attn_implementation == LEAN_SDPA
            lean = backbone(input_ids=feats["input_ids"]).last_hidden_state
    assert backbone.config._attn_implementation == "sdpa"  # restored
    torch.testing.assert_close(lean, dense, atol=1e-4, rtol=1e-4)
    # the band itself against a brute-force masked softmax
    q, k, v = (torch.randn(1, 2, 70, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    i = torch.arange(70)
    band = (i[:, None] - i[None, :]).abs() <= 5
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=band)
    torch.testing.assert_close(banded_attention(q, k, v, 5, block=16), ref)


@pytest.mark.slow
def test_32k_token_document_fits_in_memory():
    """A 32,768-token document (tiny ModernBERT, 32k positions) encodes alone within 24 GB of RSS."""
    import sys

    sys.path.insert(0, str(CONF.parent))
    from benchmarks.bench_long_inputs import doc_of_tokens, long_model
    from benchmarks.common import peak_memory_mb

    m = long_model(32768)
    text = doc_of_tokens(m, 32768)
    res = peak_memory_mb(lambda: m.encode([text], max_tokens_per_batch=16384))
    emb = res["result"]
    assert emb.shape == (1, m.hidden_size) and np.isfinite(emb).all()
    assert m.truncation_count == 1  # really 32,768 tokens
    assert res["peak_mb"] < 24 * 1024, res["peak_mb"]


def test_adapter_precision_is_part_of_the_cache_identity(modernbert):
    from lmk.eval.encoder import LmkEncoder

    auto = LmkEncoder(modernbert, precision="auto")  # CPU: fp32, the same identity as before
    plain = LmkEncoder(modernbert)
    bf16 = LmkEncoder(modernbert, precision="bf16", max_tokens_per_batch=64)
    assert auto.precision == plain.precision == "fp32" and bf16.precision == "bf16"
    assert auto.mteb_model_meta.experiment_kwargs == plain.mteb_model_meta.experiment_kwargs
    assert bf16.mteb_model_meta.experiment_kwargs["precision"] == "bf16"
    with pytest.raises(ValueError, match="max_tokens_per_batch=0"):
        LmkEncoder(modernbert, max_tokens_per_batch=0)
