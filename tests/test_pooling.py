"""Poolers against direct computations; padding / batch invariance; registry and bad input."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from lmk.model.landmark import POOLER_CLASSES, LMKPooling, Pooler, build_pooler
from lmk.model.landmark.tokenization import LandmarkTokenizer

H = 8


# tiny tensors: thread hand-off costs ~100x the work on a busy 2-core machine
pytestmark = pytest.mark.usefixtures("one_torch_thread")


# test-sized options of poolers whose defaults are paper-sized (any other pooler is built with its defaults)
SMALL = {"latent_attention": {"num_latents": 4, "num_heads": 2}}


def make(name: str) -> Pooler:
    torch.manual_seed(0)
    return build_pooler(name, hidden_size=H, **SMALL.get(name, {}))  # hidden_size reaches those that need it


@pytest.fixture
def batch():
    """Two rows: right-padded row 0 (5 tokens, pool at 2 and 4), row 1 with 3 tokens and no pooled one."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 6, H, generator=g)
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]])
    pool = torch.tensor([[0, 0, 1, 0, 1, 1], [0, 0, 0, 0, 0, 1]], dtype=torch.bool)  # pads marked on purpose
    return x, mask, pool


def test_cls_is_position_zero(batch):
    x, mask, pool = batch
    assert torch.allclose(build_pooler("cls")(x, mask, pool), F.normalize(x[:, 0], dim=-1))


def test_cls_with_left_padding_takes_first_real_token():
    x = torch.randn(2, 4, H)
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    out = build_pooler("cls")(x, mask)
    assert torch.allclose(out, F.normalize(torch.stack([x[0, 2], x[1, 0]]), dim=-1))


def test_mean_is_masked_mean(batch):
    x, mask, pool = batch
    expected = torch.stack([x[0, :5].mean(0), x[1, :3].mean(0)])
    assert torch.allclose(build_pooler("mean")(x, mask, pool), F.normalize(expected, dim=-1), atol=1e-6)


def test_lmk_means_landmarks_and_falls_back(batch):
    x, mask, pool = batch
    # row 0: positions 2 and 4 (5 is padding, never pooled); row 1: no landmark -> masked mean
    expected = torch.stack([(x[0, 2] + x[0, 4]) / 2, x[1, :3].mean(0)])
    assert torch.allclose(build_pooler("lmk")(x, mask, pool), F.normalize(expected, dim=-1), atol=1e-6)


def test_latent_attention_matches_direct_computation(batch):
    """The authors' design written out: tokens query the (normed) latents per head, GEGLU block, masked mean."""
    x, mask, _ = batch
    with torch.no_grad():
        torch.manual_seed(1)
        one = build_pooler("latent_attention", hidden_size=H, num_latents=4, num_heads=2, head_dim=3)
        assert one.to_q.weight.shape == (6, H) and one.to_q.bias is None and one.ff_in.weight.shape == (8 * H, H)
        h = one.attn_norm(x)
        lat = one.latent_norm(one.latents)
        k_all, v_all = (lat @ one.to_kv.weight.T).chunk(2, dim=-1)
        heads = []
        for i in range(2):
            cols = slice(3 * i, 3 * i + 3)
            q = h @ one.to_q.weight[cols].T
            heads.append(torch.softmax(q @ k_all[:, cols].T / 3**0.5, dim=-1) @ v_all[:, cols])
        y = x + torch.cat(heads, dim=-1) @ one.to_out.weight.T
        ff = one.ff_in(one.ff_norm(y))
        y = y + one.ff_out(ff[..., : 4 * H] * F.gelu(ff[..., 4 * H :]))
        expected = torch.stack([y[0, :5].mean(0), y[1, :3].mean(0)])
        assert torch.allclose(one(x, mask), F.normalize(expected, dim=-1), atol=1e-5)


def test_latent_attention_defaults_are_the_authors_sizes():
    p = build_pooler("latent_attention", hidden_size=768)
    assert (p.num_latents, p.num_heads, p.head_dim, p.ff_mult) == (64, 12, 768, 4)
    assert p.latents.shape == (64, 768) and p.to_kv.weight.shape == (2 * 12 * 768, 768)
    with pytest.raises(ValueError, match="set num_heads"):
        build_pooler("latent_attention", hidden_size=32)  # 32 // 64 heads


@pytest.mark.parametrize("name", sorted(POOLER_CLASSES))
def test_every_pooler_contract(name, batch):
    x, mask, pool = batch
    p = make(name)
    originals = (x.clone(), mask.clone(), pool.clone())
    out = p(x, mask, pool)
    assert out.shape == (2, H) and out.dtype == torch.float32
    assert torch.allclose(out.norm(dim=-1), torch.ones(2), atol=1e-5)
    assert all(torch.equal(a, b) for a, b in zip((x, mask, pool), originals))  # no in-place edits
    # padding content never matters
    noisy = x.clone()
    noisy[~mask.bool()] = 1e3
    assert torch.allclose(p(noisy, mask, pool), out, atol=1e-5)
    # half precision input pools like float32
    for dtype in (torch.bfloat16, torch.float16):
        low = p(x.to(dtype), mask, pool)
        assert low.dtype == torch.float32 and torch.allclose(
            low, p(x.to(dtype).float(), mask, pool), atol=1e-2
        )
    # name / config round trip
    assert p.name == name and p.config()["name"] == name
    again = build_pooler(**p.config())
    assert type(again) is type(p) and again.config() == p.config()
    again.load_state_dict(p.state_dict())
    assert torch.allclose(again(x, mask, pool), out)


@pytest.fixture(scope="module")
def padded_tokenizers(minilm_tokenizer):
    left = copy.deepcopy(minilm_tokenizer)  # never flip the session fixture's padding side
    left.padding_side = "left"
    return {"right": minilm_tokenizer, "left": left}


@pytest.mark.parametrize("name", sorted(POOLER_CLASSES))
@pytest.mark.parametrize("side", ["right", "left"])
def test_text_pools_the_same_alone_and_in_a_padded_batch(name, side, padded_tokenizers):
    tok = padded_tokenizers[side]
    # a random hidden state per token id: a row's embedding depends only on its own tokens
    table = torch.randn(tok.vocab_size, H, generator=torch.Generator().manual_seed(0))
    p = make(name)
    texts = ["short one.", "A much longer text. It has several sentences! And more words than the rest.", ""]
    for strategy in ("fixed", "sentence", "every_k", "multi_cls", "none"):
        lt = LandmarkTokenizer(tok, strategy, chunk_size=3, max_length=24)
        together = embed_with(lt, p, table, texts)
        for i, text in enumerate(texts):
            alone = embed_with(lt, p, table, [text])[0]
            assert torch.allclose(alone, together[i], atol=1e-5), (strategy, text)


def embed_with(lt: LandmarkTokenizer, pooler: Pooler, table: torch.Tensor, texts: list[str]) -> torch.Tensor:
    f = lt(texts)
    return pooler(table[f["input_ids"]], f["attention_mask"], f["pool_mask"])


def test_lmk_needs_pool_mask():
    with pytest.raises(ValueError, match="needs a pool_mask"):
        LMKPooling()(torch.randn(1, 3, H), torch.ones(1, 3))


def test_latent_attention_is_trainable(batch):
    x, mask, pool = batch
    p = make("latent_attention")
    p(x, mask, pool).sum().backward()
    assert p.latents.grad is not None and p.latents.grad.abs().sum() > 0
    assert sum(t.numel() for t in p.parameters()) > 0
    assert sum(t.numel() for t in build_pooler("lmk").parameters()) == 0


def test_bad_input():
    with pytest.raises(ValueError, match="unknown pooler 'max'; allowed: cls, mean, lmk, last_token, latent_attention"):
        build_pooler("max")
    with pytest.raises(ValueError, match="needs hidden_size"):
        build_pooler("latent_attention")
    with pytest.raises(ValueError, match="takes no options"):
        build_pooler("mean", scale=2)
    # head_dim is its own size in the authors' design (no divisibility); a zero size is still refused
    with pytest.raises(ValueError, match="num_heads must be an integer >= 1"):
        build_pooler("latent_attention", hidden_size=10, num_heads=0)
    with pytest.raises(ValueError, match="attention_mask shape"):
        build_pooler("mean")(torch.randn(2, 3, H), torch.ones(2, 4))
    with pytest.raises(ValueError, match=r"\[batch, tokens, hidden\]"):
        build_pooler("mean")(torch.randn(3, H), torch.ones(3))
    with pytest.raises(ValueError, match="built for hidden_size 8"):
        make("latent_attention")(torch.randn(1, 2, 4), torch.ones(1, 2))


@pytest.mark.parametrize("name", sorted(POOLER_CLASSES))
def test_pooling_is_fp32_under_bf16_autocast_and_never_reads_padding(name, batch):
    """Lightning's bf16-mixed autocast covers the training step: pooling must still run in float32
    (bf16 sums lose the landmarks' mean), and a non-finite value at a padded position (a padded row that attended to
    no key) is never read."""
    x, mask, pool = batch
    p = make(name)
    with torch.no_grad():
        out = p(x, mask, pool)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            auto = p(x, mask, pool)
        poisoned = x.clone()
        poisoned[~mask.bool()] = float("nan")
        padded_nan = p(poisoned, mask, pool)
    assert auto.dtype == torch.float32 and torch.allclose(auto, out, atol=1e-6, rtol=0)
    assert torch.isfinite(padded_nan).all() and torch.allclose(padded_nan, out, atol=1e-6)

