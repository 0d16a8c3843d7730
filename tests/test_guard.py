"""The non-finite guard: a non-finite loss or gradient norm stops the run at once, naming
the step and the batch's samples, keeping the last good checkpoint and recording the cause in results.json."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import forked_cli
import lightning.pytorch as pl
import pytest
import torch

from lmk.train.guard import NonFiniteError, NonFiniteGuard
from lmk.train.module import ContrastiveModule
from tests.test_module import build_model, loader, trainer
from tests.test_train import ENV, ROOT, overrides, results

BAD_ROW = 5


def scored_pairs(path: Path, n: int = 24, bad: int | None = BAD_ROW) -> Path:
    """Pairs with teacher scores; row `bad` has a score that is finite in JSON but overflows float32 (inf)."""
    topics = ["lists", "the moon", "coffee", "sockets", "violins", "rivers", "taxes", "bees"]
    with open(path, "w") as fh:
        for i in range(n):
            t, o = topics[i % 8], topics[(i + 3) % 8]
            fh.write(json.dumps({"query": f"tell me about {t} {i}", "pos": [f"{t} {i} are described here."],
                                 "neg": [f"a note on {o}, nothing else"],
                                 "pos_scores": [1e39 if i == bad else 0.9], "neg_scores": [0.1]}) + "\n")
    return path


def _weights(ckpt: Path) -> dict[str, torch.Tensor]:
    return torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]


def test_non_finite_loss_from_the_data_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path):
    """The whole path (python -m lmk.train): a teacher score that overflows float32 makes the loss NaN at the step
    that draws row 5; the run stops there, names the row, writes no later checkpoint and records the cause."""
    from hydra import compose, initialize_config_dir

    from lmk.train.command import run

    pairs = scored_pairs(tmp_path / "pairs.jsonl")
    run_dir = tmp_path / "run"
    args = overrides(run_dir, pairs, "trainer.max_steps=6", "train.checkpoint_every_n_steps=1", "data.group_size=2")
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"run_dir={run_dir}", args[0], *args[2:]])
    with pytest.raises(NonFiniteError, match=rf"non-finite loss at step (\d+) .*pairs.jsonl:row {BAD_ROW} ") as err:
        run(cfg)
    step = err.value.info["step"]
    res = results(run_dir)
    assert res["status"] == "failed" and res["error"].startswith("NonFiniteError: non-finite loss at step")
    cause = res["non_finite"]
    assert cause["what"] == "loss" and cause["step"] == step
    assert any(k.startswith(f"pairs.jsonl:row {BAD_ROW} ") for k in cause["sample_keys"])
    last = run_dir / "checkpoints" / "last.ckpt"
    if step == 0:
        assert not last.exists() and cause["last_good_checkpoint"] is None
    else:  # the checkpoint of the step before: finite weights, and nothing written after it
        assert cause["last_good_checkpoint"] == str(last)
        saved = torch.load(last, map_location="cpu", weights_only=False)
        assert saved["global_step"] == step
        assert all(torch.isfinite(v).all() for v in saved["state_dict"].values() if v.is_floating_point())


class _PoisonWeights(pl.Callback):
    """A fault from outside the loss: one weight becomes NaN at step `at` (before or after its optimiser step)."""

    def __init__(self, at: int, when: str) -> None:
        self.at, self.when = at, when

    def _poison(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.global_step == self.at:
            with torch.no_grad():
                next(p for p in pl_module.parameters() if p.requires_grad).view(-1)[0] = float("nan")

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.when == "before":
            self._poison(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.when == "after":  # after the step, before ModelCheckpoint saves (checkpoint callbacks run last)
            self._poison(trainer, pl_module)


@pytest.mark.parametrize(("grad_cache", "when", "objective"), [(False, "before", "single"), (True, "before", "single"),
                                                             (False, "after", "single"), (True, "before", "maxsim")])
def test_guard_stops_before_the_step_and_never_saves_nan_weights(tmp_path, grad_cache, when, objective):
    from lightning.pytorch.callbacks import ModelCheckpoint

    pl.seed_everything(0)
    model = build_model()
    module = ContrastiveModule(model, lr=1e-3, warmup_steps=0, max_steps=4, grad_cache=grad_cache, grad_cache_chunk=2,
                               objective=objective)
    ckpt = ModelCheckpoint(dirpath=str(tmp_path / "ck"), save_last=True, every_n_train_steps=1, save_top_k=0)
    t = trainer(tmp_path, 4, enable_checkpointing=True, callbacks=[ckpt, NonFiniteGuard(),
                                                                   _PoisonWeights(1 if when == "before" else 2, when)])
    with pytest.raises(NonFiniteError) as err:
        t.fit(module, train_dataloaders=loader(model, n=16))
    info = err.value.info
    # "before": step 1's loss is NaN and its step is never taken; "after": the weights after step 2 are NaN and
    # their checkpoint is refused. Either way last.ckpt is the one written after the first step, finite.
    assert (info["what"], info["step"]) == (("loss", 1) if when == "before" else ("weights", 2))
    if when == "before":
        assert len(info["sample_keys"]) == 4 and info["last_good_checkpoint"].endswith("last.ckpt")
    saved = torch.load(tmp_path / "ck" / "last.ckpt", map_location="cpu", weights_only=False)
    assert saved["global_step"] == 1
    assert all(torch.isfinite(v).all() for v in saved["state_dict"].values() if v.is_floating_point())


# ---- padded batches over sliding-window layers --------------------------------------------------------------
NAN_SDPA = "lmk_test_keyless_nan_sdpa"


def _keyless_nan_sdpa(module, query, key, value, attention_mask, **kwargs):
    """SDPA as CUDA's memory-efficient kernel has behaved (pytorch#110213): NaN for a query row with no valid key.
    CPU SDPA returns 0 there, so this stands in for the GPU."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    out, weights = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if torch.is_tensor(attention_mask) and attention_mask.dtype == torch.bool:
        keyless = ~attention_mask.any(dim=-1)  # [B, 1, Q]
        out = out.masked_fill(keyless.squeeze(1)[:, :, None, None], float("nan"))  # out: [B, Q, heads, D]
    return out, weights


def sliding_encoder() -> dict:
    """tiny-modernbert with layers global, sliding (+-4 tokens), global: a padded position 5+ tokens past a short
    text has no key in the sliding layer."""
    from tests.test_module import TINY

    return {**TINY, "config_overrides": {**TINY["config_overrides"], "num_hidden_layers": 3,
                                         "global_attn_every_n_layers": 2, "local_attention": 8}}


def _sliding_model():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    from lmk.model.embedding import EmbeddingModel
    from tests.test_module import POOLINGS

    AttentionInterface.register(NAN_SDPA, _keyless_nan_sdpa)
    AttentionMaskInterface.register(NAN_SDPA, sdpa_mask)
    torch.manual_seed(0)
    model = EmbeddingModel.build(sliding_encoder(), POOLINGS["mean"], query_max_length=16, passage_max_length=48)
    model.backbone.config._attn_implementation = NAN_SDPA
    return model


def test_padded_rows_without_a_key_in_a_sliding_window_stay_finite():
    model = _sliding_model()  # built by lmk: guarded, as every build path guards (below)
    texts = ["hi", "a much longer passage about rivers, deltas, the moon and coffee beans, with many words in it"]
    features = model.tokenize(texts, side="passage")
    assert int(features["attention_mask"][0].sum()) + 5 < features["attention_mask"].shape[1]  # the situation
    unguarded = copy.deepcopy(model.backbone)  # the same backbone without the guard's pre-hook
    unguarded._forward_pre_hooks.clear()
    inputs = {k: features[k] for k in ("input_ids", "attention_mask")}
    with torch.no_grad():
        raw = model.pooler(unguarded(**inputs).last_hidden_state, features["attention_mask"], features["pool_mask"])
        model.backbone.config._attn_implementation = "sdpa"  # CPU SDPA: 0 for keyless rows
        plain = model(features)
        model.backbone.config._attn_implementation = NAN_SDPA
    assert not torch.isfinite(raw[0]).all()  # the NaN of the keyless rows reached the short text's embedding
    out = model(features)
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    # real tokens see what they saw before: the embeddings equal CPU SDPA's
    torch.testing.assert_close(out.detach(), plain, atol=1e-6, rtol=1e-5)


def test_every_build_path_guards_padded_rows(tmp_path):
    """Training, evaluation and the probes build or load their models through these paths: each backbone carries
    the guard (lmk.model.long_attention.guard_padded_rows), so no path meets a keyless row's NaN."""
    from lmk.export import export_sentence_transformers, load_exported
    from lmk.model.backbone import load_backbone
    from lmk.model.embedding import EmbeddingModel
    from lmk.model.loading import load_model
    from tests.test_module import POOLINGS

    def guarded(backbone) -> bool:
        return bool(getattr(backbone, "_lmk_padded_rows_guarded", False)) and len(backbone._forward_pre_hooks) == 1

    built = EmbeddingModel.build(sliding_encoder(), POOLINGS["lmk-fixed"], query_max_length=16, passage_max_length=48)
    assert guarded(built.backbone) and guarded(load_backbone(sliding_encoder())[0])
    assert guarded(built.with_pooling(POOLINGS["mean"]).backbone)
    built.save_pretrained(tmp_path / "saved")
    assert guarded(EmbeddingModel.from_pretrained(tmp_path / "saved").backbone)
    export_sentence_transformers(built, tmp_path / "st")
    assert guarded(load_exported(tmp_path / "st").backbone)
    for ref in (tmp_path / "saved", tmp_path / "st"):  # what evaluation loads (a run's export, a saved model)
        assert guarded(load_model(str(ref))[0].backbone), ref
    # a bare transformers backbone (no lmk build path) has no guard: the check above can fail
    assert not guarded(type(built.backbone)(built.backbone.config))


@pytest.mark.slow  # two training processes: about a minute on 2 busy cores
def test_nan_on_one_rank_stops_every_rank_at_the_same_step(tmp_path):
    """Under DDP the bad row lands on one rank; the ranks agree through one all-reduce, so both stop at that step
    (neither waits for the other at the next collective) and rank 0 records the bad rank and row."""
    pairs = scored_pairs(tmp_path / "pairs.jsonl")
    run_dir = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "lmk.train", *overrides(
        run_dir, pairs, "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.precision=32-true",
        "trainer.deterministic=true", "trainer.max_steps=6", "data.batch_size=2", "data.group_size=2")]
    proc = forked_cli.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
    assert proc.returncode != 0
    res = results(run_dir)
    cause = res["non_finite"]
    assert res["status"] == "failed" and cause["what"] == "loss" and len(cause["ranks"]) == 1
    assert [k for k in cause["sample_keys"] if k.startswith(f"pairs.jsonl:row {BAD_ROW} ")]
    assert set(cause["values"]) == {"0", "1"}  # both ranks reached the check of the same step
    assert f"non-finite loss at step {cause['step']} " in proc.stderr


def test_non_finite_error_survives_the_trip_back_to_the_sweeper() -> None:
    """A job's exception is pickled back to the sweeper: the guard's error must unpickle, with its record."""
    import pickle

    err = pickle.loads(pickle.dumps(NonFiniteError("non-finite loss at step 2", {"step": 2, "what": "loss"})))
    assert str(err) == "non-finite loss at step 2" and err.info == {"step": 2, "what": "loss"}
