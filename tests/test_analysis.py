"""Position-bias probes (lmk.analysis): hand-made tensors with known answers, then real tiny models."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pandas as pd
import pytest
import torch
from components import CONF, POOLING_CONFIGS
from matplotlib.figure import Figure
from omegaconf import OmegaConf
from transformers import BertConfig, BertModel, ModernBertConfig, ModernBertModel

from lmk import analysis as an
from lmk.analysis.attention import AttentionRecorder


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    # The shared 2-core box is oversubscribed: one intra-op thread is several times faster than two
    # spinning ones. Restored after this module so other test files keep their setting.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# --------------------------------------------------------------------------------------------- binning


def test_all_mass_on_first_key_fills_first_bin():
    attn = torch.zeros(3, 50)
    attn[:, 0] = 1.0
    out = an.bin_attention(attn, None, n_bins=20)
    assert out.shape == (3, 20)
    assert torch.allclose(out[:, 0], torch.ones(3))
    assert torch.allclose(out[:, 1:], torch.zeros(3, 19))


def test_all_mass_on_last_key_fills_last_bin():
    attn = torch.zeros(2, 37)
    attn[:, -1] = 1.0
    out = an.bin_attention(attn, None, n_bins=5)
    assert torch.allclose(out[:, -1], torch.ones(2)) and float(out[:, :-1].abs().sum()) == 0.0


def test_uniform_attention_gives_uniform_bins_and_rows_sum_to_one():
    attn = torch.full((4, 100), 0.01)
    out = an.bin_attention(attn, torch.ones(100, dtype=torch.bool), n_bins=20)
    assert torch.allclose(out, torch.full((4, 20), 0.05), atol=1e-6)
    softmax_rows = torch.softmax(torch.randn(2, 3, 61), dim=-1)
    binned = an.bin_attention(softmax_rows, None, n_bins=7)
    assert torch.allclose(binned.sum(-1), torch.ones(2, 3), atol=1e-5)


def test_bins_use_rank_among_real_keys_so_padding_side_does_not_matter():
    real = torch.softmax(torch.randn(10), dim=0)
    right = torch.cat([real, torch.zeros(6)])
    left = torch.cat([torch.zeros(6), real])
    mask_r = torch.cat([torch.ones(10), torch.zeros(6)]).bool()
    mask_l = torch.cat([torch.zeros(6), torch.ones(10)]).bool()
    a = an.bin_attention(right, mask_r, n_bins=5)
    b = an.bin_attention(left, mask_l, n_bins=5)
    assert torch.allclose(a, b)
    # 10 real keys in 5 bins: keys 2k, 2k+1 -> bin k
    assert torch.allclose(a, real.view(5, 2).sum(-1))
    # mass on masked keys is dropped, not binned
    leaky = right.clone()
    leaky[-1] = 5.0
    assert torch.allclose(an.bin_attention(leaky, mask_r, n_bins=5), a)


def test_broadcast_key_mask_and_fewer_keys_than_bins():
    attn = torch.softmax(torch.randn(2, 4, 3), dim=-1)  # [B, R, T=3]
    mask = torch.ones(2, 1, 3, dtype=torch.bool)
    out = an.bin_attention(attn, mask, n_bins=6)
    # key r of 3 -> bin 2r: bins 0, 2, 4 hold the keys, the rest stay empty
    assert torch.allclose(out[..., [0, 2, 4]], attn)
    assert float(out[..., [1, 3, 5]].abs().sum()) == 0.0


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_bad_n_bins_raises(bad):
    with pytest.raises(ValueError, match="n_bins"):
        an.bin_attention(torch.ones(1, 4), None, n_bins=bad)


def test_mismatched_key_mask_raises():
    with pytest.raises(ValueError, match="key_mask"):
        an.bin_attention(torch.ones(1, 4), torch.ones(5), n_bins=2)


# ------------------------------------------------------------------------------------------ pooled rows


def _features():
    return {
        "input_ids": torch.tensor([[101, 5, 6, 102, 7, 102], [101, 5, 6, 7, 0, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]]),
        "pool_mask": torch.tensor([[0, 0, 0, 1, 0, 1], [0, 0, 0, 0, 0, 0]]).bool(),
    }


def test_pooled_rows_per_kind():
    f = _features()
    cls = an.pooled_rows(f, "cls")
    assert cls.tolist() == [[True] + [False] * 5, [True] + [False] * 5]
    assert an.pooled_rows(f, "mean").tolist() == f["attention_mask"].bool().tolist()
    lmk = an.pooled_rows(f, "lmk")
    assert lmk[0].tolist() == [False, False, False, True, False, True]
    # a row without landmarks falls back to every real token (as the LMK pooler does)
    assert lmk[1].tolist() == [True, True, True, True, False, False]
    with pytest.raises(ValueError, match="allowed: cls, mean, lmk"):
        an.pooled_rows(f, "max")


# ------------------------------------------------------------------- probe on hand-made attention inputs


def test_recorder_known_answers():
    # q = 0 -> all scores equal -> uniform attention over the keys the mask allows
    T, n_bins = 40, 4
    q = torch.zeros(1, 2, T, 8)
    k = torch.randn(1, 2, T, 8)
    rows = torch.zeros(T, dtype=torch.bool)
    rows[[0, 10]] = True
    rec = AttentionRecorder(rows, torch.ones(T, dtype=torch.bool), n_bins, row_chunk=1)
    rec.record(q, k, None, scaling=None)
    assert torch.allclose(rec.layers[0] / 2, torch.full((n_bins,), 0.25), atol=1e-6)
    # a mask letting every row see only key 0 puts all the mass in bin 0
    mask = torch.zeros(1, 1, T, T, dtype=torch.bool)
    mask[..., 0] = True
    rec.record(torch.randn(1, 2, T, 8), k, mask, scaling=0.3)
    assert torch.allclose(rec.layers[1] / 2, torch.tensor([1.0, 0.0, 0.0, 0.0]))
    # an additive float mask (eager style) works the same way
    add = torch.zeros(1, 1, 1, T)
    add[..., T // 2 :] = float("-inf")
    rec.record(torch.randn(1, 2, T, 8), k, add, scaling=None)
    assert torch.allclose(rec.layers[2][2:], torch.zeros(2)) and abs(float(rec.layers[2].sum()) - 2) < 1e-5
    assert all(torch.allclose(m, torch.ones_like(m), atol=1e-5) for m in rec.row_mass[:2])


def _tiny_modernbert(local_attention=16):
    cfg = ModernBertConfig(
        vocab_size=200,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        local_attention=local_attention,
        global_attn_every_n_layers=3,
        max_position_embeddings=512,
        pad_token_id=0,
        cls_token_id=1,
        sep_token_id=2,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    return ModernBertModel._from_config(cfg, attn_implementation="sdpa").eval()


def _tiny_bert():
    cfg = BertConfig(
        vocab_size=200,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    return BertModel._from_config(cfg, attn_implementation="sdpa").eval()


@pytest.mark.parametrize("make", [_tiny_modernbert, _tiny_bert], ids=["modernbert-rope", "bert"])
def test_probe_matches_eager_attentions_and_leaves_the_model_alone(make):
    model = make()
    T = 80
    torch.manual_seed(1)
    feats = {"input_ids": torch.randint(3, 200, (1, T)), "attention_mask": torch.ones(1, T, dtype=torch.long)}

    def fwd(f):
        return model(input_ids=f["input_ids"], attention_mask=f["attention_mask"]).last_hidden_state

    with torch.no_grad():
        plain = fwd(feats)
    rows = torch.zeros(1, T, dtype=torch.bool)
    rows[0, [0, 5, 40, 79]] = True
    captured = {}

    def fwd_capture(f):
        captured["h"] = fwd(f)
        return captured["h"]

    mass, row_mass = an.record_pooled_attention(fwd_capture, model, feats, rows, n_bins=10, row_chunk=3)
    assert model.config._attn_implementation == "sdpa"  # restored
    assert torch.allclose(captured["h"], plain, atol=1e-5)  # the probe does not change the model's output
    # ground truth: the full eager attention maps (RoPE applied by the model itself)
    model.config._attn_implementation = "eager"
    with torch.no_grad():
        out = model(**feats, output_attentions=True)
    model.config._attn_implementation = "sdpa"
    truth = np.stack(
        [an.bin_attention(a[0].mean(0)[rows[0]], None, 10).mean(0).numpy() for a in out.attentions]
    )
    assert mass.shape == truth.shape == (model.config.num_hidden_layers, 10)
    np.testing.assert_allclose(mass, truth, atol=1e-5)
    np.testing.assert_allclose(mass.sum(1), 1.0, atol=1e-5)
    for m in row_mass:
        np.testing.assert_allclose(m, 1.0, atol=1e-5)


def test_probe_sees_modernbert_sliding_window():
    model = _tiny_modernbert(local_attention=16)  # local layers: keys within +-8 of the query
    T = 80
    feats = {"input_ids": torch.randint(3, 200, (1, T)), "attention_mask": torch.ones(1, T, dtype=torch.long)}
    rows = torch.zeros(1, T, dtype=torch.bool)
    rows[0, 0] = True  # the [CLS] row: a local layer lets it see keys 0..8 only -> bins 0 and 1 of 10
    mass, _ = an.record_pooled_attention(
        lambda f: model(**f).last_hidden_state, model, feats, rows, n_bins=10
    )
    local = [i for i, t in enumerate(model.config.layer_types) if t == "sliding_attention"]
    glob = [i for i, t in enumerate(model.config.layer_types) if t == "full_attention"]
    assert local and glob
    assert np.all(mass[local][:, 2:] == 0.0)
    assert np.all(mass[glob][:, 2:].sum(1) > 0.1)


def test_probe_rejects_batches_and_empty_rows():
    model = _tiny_bert()
    feats = {"input_ids": torch.randint(3, 200, (2, 8)), "attention_mask": torch.ones(2, 8, dtype=torch.long)}
    with pytest.raises(ValueError, match="one input"):
        an.record_pooled_attention(lambda f: model(**f), model, feats, torch.ones(2, 8, dtype=torch.bool))
    one = {k: v[:1] for k, v in feats.items()}
    with pytest.raises(ValueError, match="at least one"):
        an.record_pooled_attention(lambda f: model(**f), model, one, torch.zeros(1, 8, dtype=torch.bool))
    with pytest.raises(TypeError, match="transformers config"):
        with an.probe_attention(torch.nn.Linear(2, 2)):
            pass


# -------------------------------------------------------------------------------- real EmbeddingModels


@pytest.fixture(scope="module")
def models():
    return an.load_models(encoders=["tiny-modernbert", "minilm-l6"], poolings=["cls", "mean", "lmk-fixed"])


LONG = " ".join(
    f"Sentence number {i} talks about topic {i % 7} and the weather in city {i % 11}." for i in range(60)
)


def test_load_models_shares_one_backbone_per_encoder(models):
    assert list(models) == [
        "tiny-modernbert/cls",
        "tiny-modernbert/mean",
        "tiny-modernbert/lmk-fixed",
        "minilm-l6/cls",
        "minilm-l6/mean",
        "minilm-l6/lmk-fixed",
    ]
    assert models["tiny-modernbert/cls"].backbone is models["tiny-modernbert/lmk-fixed"].backbone
    assert models["minilm-l6/cls"].backbone is not models["tiny-modernbert/cls"].backbone
    assert [an.pooling_kind(m) for m in models.values()] == ["cls", "mean", "lmk"] * 2


def test_load_models_bad_names():
    with pytest.raises(ValueError, match="allowed: .*cls"):
        an.load_models(encoders=["minilm-l6"], poolings=["nope"])
    with pytest.raises(ValueError, match="not a folder"):
        an.load_models(results_dir="/nonexistent/sweep")


@pytest.mark.parametrize(
    "name",
    [
        "tiny-modernbert/cls",
        "tiny-modernbert/mean",
        "tiny-modernbert/lmk-fixed",
        "minilm-l6/cls",
        "minilm-l6/lmk-fixed",
    ],
)
def test_attention_profile_on_real_models(models, name):
    model = models[name]
    n_layers = model.backbone.config.num_hidden_layers
    prof = an.attention_profile(model, [LONG, LONG[:400]], n_bins=20, max_length=160)
    assert prof.mass.shape == (n_layers, 20) and prof.per_input.shape == (2, n_layers, 20)
    np.testing.assert_allclose(prof.mass.sum(1), 1.0, atol=1e-5)  # per-layer distributions
    np.testing.assert_allclose(prof.per_input.sum(2), 1.0, atol=1e-5)
    assert abs(prof.row_mass_min - 1) < 1e-4 and abs(prof.row_mass_max - 1) < 1e-4
    assert prof.lengths[0] == 160 and prof.lengths[1] < 160
    feats = model.tokenize([LONG], max_length=160)
    expected_rows = {"cls": 1, "mean": 160, "lmk": int(feats["pool_mask"].sum())}[prof.rows]
    assert prof.n_rows[0] == expected_rows
    if prof.rows == "lmk":
        assert 1 < expected_rows < 160
    frame = prof.to_frame()
    assert len(frame) == n_layers * 20 and set(frame.columns) >= {"layer", "bin_center", "mass"}
    assert model.backbone.config._attn_implementation == "sdpa"


def test_attention_profile_rows_override_and_errors(models):
    m = models["minilm-l6/mean"]
    cls_rows = an.attention_profile(m, [LONG], rows="cls", max_length=64)
    assert cls_rows.n_rows == [1]
    with pytest.raises(ValueError, match="allowed: cls, mean, lmk"):
        an.attention_profile(m, [LONG], rows="max")
    with pytest.raises(ValueError, match="non-empty list"):
        an.attention_profile(m, LONG)


# -------------------------------------------------------------------------- depth x length sensitivity


def test_depth_length_table_shape_counts_and_means():
    df = pd.DataFrame(
        {
            "length": [256, 256, 256, 512, 512, 512],
            "depth": [0.05, 0.1, 0.95, 0.5, 1.0, 0.45],
            "acc_at_1": [1.0, 0.0, 1.0, 1.0, 0.0, 0.0],
        }
    )
    counts = an.depth_length_table(df, n_depth_bins=4, agg="count")
    assert counts.shape == (4, 2) and list(counts.columns) == [256, 512]
    assert counts.to_numpy().tolist() == [[2, 0], [0, 1], [0, 1], [1, 1]]
    means = an.depth_length_table(df, n_depth_bins=4)
    assert means.loc["0.00-0.25", 256] == 0.5 and means.loc["0.75-1.00", 512] == 0.0
    assert np.isnan(means.loc["0.25-0.50", 256])
    with pytest.raises(ValueError, match="lacks columns"):
        an.depth_length_table(df.drop(columns="depth"))
    with pytest.raises(ValueError, match="agg"):
        an.depth_length_table(df, agg="sum")
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        an.depth_bins([1.5])


@pytest.fixture(scope="module")
def passkey():
    return an.synthetic_corpora("passkey", lengths=(64, 128), n_docs=6, n_queries=6, seed=0)


def test_evidence_position_sensitivity_on_passkey(models, passkey):
    model = models["minilm-l6/lmk-fixed"]
    pq = an.evidence_position_sensitivity(model, passkey, max_length=128)
    assert len(pq) == 12 and sorted(pq["length"].unique()) == [64, 128]
    assert pq["gold_rank"].between(1, 6).all()
    assert ((pq["gold_rank"] == 1) == (pq["acc_at_1"] == 1.0)).all()
    assert (pq["best_sim"] >= pq["gold_sim"] - 1e-6).all()
    assert pq["depth"].between(0, 1).all()
    counts = an.depth_length_table(pq, n_depth_bins=3, agg="count")
    assert counts.shape == (3, 2) and counts.sum().tolist() == [6, 6]
    acc = an.depth_length_table(pq, n_depth_bins=3)
    assert acc.shape == (3, 2) and np.nanmax(acc.to_numpy()) <= 1.0
    # the table's overall mean matches the per-query Acc@1 (count-weighted)
    weighted = np.nansum(acc.to_numpy() * counts.to_numpy()) / counts.to_numpy().sum()
    assert abs(weighted - pq["acc_at_1"].mean()) < 1e-9


def test_sensitivity_tables_over_models(models, passkey):
    sub = {k: models[k] for k in ("minilm-l6/cls", "minilm-l6/mean")}
    rows, tables = an.sensitivity_tables(sub, passkey, n_depth_bins=2, max_length=128)
    assert set(rows["model"]) == set(sub) and len(rows) == 24
    assert all(t.shape == (2, 2) for t in tables.values())


def test_synthetic_corpora_bad_task():
    with pytest.raises(ValueError, match="allowed: passkey, needle"):
        an.synthetic_corpora("haystack")


# --------------------------------------------------------------------------------- information probe


def test_position_similarity_and_curve(models):
    model = models["minilm-l6/mean"]
    df = an.position_similarity(model, [LONG, LONG[:300]], chunk_words=16, max_length=128)
    assert set(df["doc"]) == {0, 1}
    assert df["rel_pos"].between(0, 1).all() and df["cos"].between(-1.0001, 1.0001).all()
    # only the words the model sees at 128 tokens are chunked: LONG is far longer than that
    assert df[df["doc"] == 0]["start_word"].max() + 16 < len(LONG.split())
    curve = an.position_curve(df, n_bins=4)
    assert curve.shape[0] == 4 and curve["count"].sum() == len(df)
    np.testing.assert_allclose(curve["bin_center"], [0.125, 0.375, 0.625, 0.875])


def test_position_curve_known_values():
    df = pd.DataFrame({"rel_pos": [0.1, 0.2, 0.9, 1.0], "cos": [0.8, 0.6, 0.1, 0.3]})
    c = an.position_curve(df, n_bins=2)
    assert c["mean"].round(6).tolist() == [0.7, 0.2] and c["count"].tolist() == [2, 2]
    c3 = an.position_curve(df, n_bins=5)
    assert c3["count"].tolist() == [1, 1, 0, 0, 2] and np.isnan(c3.loc[2, "mean"])


# ------------------------------------------------------------------------------------------------ plots


def _profile(n_layers=3, n_bins=5, label="m"):
    mass = np.full((n_layers, n_bins), 1.0 / n_bins)
    return an.AttentionProfile(label, "cls", mass, mass[None], [10], [1], 1.0, 1.0)


def test_plots_return_figures_and_save(tmp_path):
    fig = an.plot_attention_profile(_profile())
    assert isinstance(fig, Figure) and len(fig.axes[0].lines) == 3 + 2  # layers + mean + uniform
    grid = an.plot_attention_profiles(
        {"a": _profile(), "b": _profile(2), "c": _profile(), "d": _profile()}, ncols=3
    )
    assert sum(ax.get_visible() for ax in grid.axes if ax.get_label() != "<colorbar>") == 4
    table = pd.DataFrame([[1.0, 0.5], [np.nan, 0.0]], index=["0.00-0.50", "0.50-1.00"], columns=[256, 512])
    heat = an.plot_depth_length_heatmap(table)
    assert isinstance(heat, Figure)
    heats = an.plot_depth_length_heatmaps({"x": table, "y": table})
    assert isinstance(heats, Figure)
    curve = an.position_curve(pd.DataFrame({"rel_pos": [0.1, 0.9], "cos": [0.5, 0.2]}), n_bins=2)
    sim = an.plot_position_similarity({"x": curve, "y": curve})
    assert len(sim.axes[0].lines) == 2
    path = an.save_figure(sim, tmp_path / "figs", "a/b c")
    assert path.name == "a_b_c.png" and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="empty"):
        an.plot_position_similarity({})


def test_load_models_from_a_sweep_folder(models, tmp_path):
    import json

    from lmk.export import export_sentence_transformers

    src = models["tiny-modernbert/lmk-fixed"]
    run = tmp_path / "sweep" / "lmk-fixed-32"
    export_sentence_transformers(src, run / "export")
    cfg = {
        "encoder": {"name": "tiny-modernbert"},
        "pooling": {"name": "lmk-fixed", "strategy": "fixed", "chunk_size": 32},
    }
    (run / "results.json").write_text(json.dumps({"status": "done", "config": cfg}))
    (tmp_path / "sweep" / "unfinished").mkdir()  # no export/: skipped
    loaded = an.load_models(results_dir=tmp_path / "sweep")
    assert list(loaded) == ["tiny-modernbert/lmk-fixed-32"]
    m = loaded["tiny-modernbert/lmk-fixed-32"]
    assert an.pooling_kind(m) == "lmk"
    np.testing.assert_allclose(m.encode([LONG], max_length=64), src.encode([LONG], max_length=64), atol=1e-5)
    with pytest.raises(ValueError, match="no run folder"):
        an.load_models(results_dir=tmp_path / "sweep" / "unfinished")


@pytest.mark.parametrize("pooling", POOLING_CONFIGS)
def test_attention_probe_applies_or_says_it_does_not(models, pooling):
    """Every pooling option: the probe reads the rows its pooler declares, or says it does not apply."""
    from lmk.config.model import PoolingConfig

    cfg = PoolingConfig.coerce(OmegaConf.load(CONF / "pooling" / f"{pooling}.yaml"))
    model = models["tiny-modernbert/cls"].with_pooling(cfg)
    declared = type(model.pooler).attention_rows
    if declared is None:
        with pytest.raises(an.NotApplicable, match="declares no attention rows"):
            an.attention_profile(model, [LONG], max_length=96)
        return
    prof = an.attention_profile(model, [LONG], max_length=96)
    assert prof.rows == declared == an.pooling_kind(model)
    np.testing.assert_allclose(prof.per_input.sum(2), 1.0, atol=1e-5)
