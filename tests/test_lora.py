"""LoRA on a decoder (encoder.lora, through peft): frozen base weights, adapters only in the optimiser and in the
checkpoint, exact resume, and an export with the adapters merged that sentence-transformers loads without lmk."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import forked_cli
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from sentence_transformers import SentenceTransformer
from test_train import ENV, ROOT, in_process, losses, overrides, results, write_pairs

from lmk.model.embedding import EmbeddingModel
from lmk.model.exported import load_exported
from lmk.model.loading import load_model
from lmk.sharing.st_folder import export_sentence_transformers
from lmk.train.module import ContrastiveModule

CONF = ROOT / "conf"
TEXTS = ["Landmark pooling on a decoder, with adapters trained and merged.", "short", "",
         "A longer text that runs over several chunks of the landmark layout, to pool more than one landmark. " * 3]
LORA = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj", "gate_proj"]}
DECODER = ("experiment=tiny-decoder", "pooling=lmk-fixed", "pooling.chunk_size=8")
PROMPT = "Instruct - given a question, retrieve passages that answer it. Query - "


def decoder(**over) -> dict:
    return {**OmegaConf.to_container(OmegaConf.load(CONF / "encoder" / "tiny-decoder.yaml")), **over}


def lmk_fixed() -> dict:
    return {**OmegaConf.to_container(OmegaConf.load(CONF / "pooling" / "lmk-fixed.yaml")), "chunk_size": 8}


def test_lora_freezes_the_base_and_the_optimiser_holds_the_adapters_only() -> None:
    model = EmbeddingModel.build(decoder(lora=LORA), lmk_fixed(), passage_max_length=64)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in trainable} == {"q_proj", "v_proj", "gate_proj"}
    module = ContrastiveModule(model, max_steps=3)
    opt = module.configure_optimizers()["optimizer"]
    in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
    assert in_opt == {id(p) for p in model.parameters() if p.requires_grad}
    # the adapters start at zero (B = 0): the LoRA model embeds as its base until it trains
    plain = EmbeddingModel.build(decoder(), lmk_fixed(), passage_max_length=64)
    np.testing.assert_array_equal(model.encode(TEXTS), plain.encode(TEXTS))


def test_a_target_the_model_lacks_is_named_with_the_ones_it_has() -> None:
    with pytest.raises(ValueError, match="its linear layers: .*q_proj"):
        EmbeddingModel.build(decoder(lora={"target_modules": ["query_key_value"]}), lmk_fixed())


def lora_model() -> EmbeddingModel:
    """A LoRA decoder whose adapters moved off their zero start, as training moves them (seeded)."""
    model = EmbeddingModel.build(decoder(lora=LORA), lmk_fixed(), passage_max_length=64)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.05)
    return model


def test_a_checkpoint_leaves_the_frozen_base_out_and_loads_strictly() -> None:
    model = lora_model()
    module = ContrastiveModule(model, max_steps=3)
    checkpoint = {"state_dict": module.state_dict()}
    module.on_save_checkpoint(checkpoint)
    kept = set(checkpoint["state_dict"])
    assert kept == {n for n, p in module.named_parameters() if p.requires_grad} and len(kept) == 2 * 3 * 2
    fresh = ContrastiveModule(EmbeddingModel.build(decoder(lora=LORA), lmk_fixed(), passage_max_length=64),
                              max_steps=3)
    fresh.on_load_checkpoint(checkpoint)
    fresh.load_state_dict(checkpoint["state_dict"], strict=True)  # what Lightning does after the hook
    np.testing.assert_array_equal(fresh.model.encode(TEXTS), model.encode(TEXTS))
    # an encoder trains every weight: its checkpoint keeps them all
    full = ContrastiveModule(EmbeddingModel.build(decoder(), lmk_fixed(), passage_max_length=64), max_steps=3)
    checkpoint = {"state_dict": full.state_dict()}
    full.on_save_checkpoint(checkpoint)
    assert set(checkpoint["state_dict"]) == set(full.state_dict())




def test_the_export_merges_the_adapters(tmp_path) -> None:
    """The folder holds a plain transformers model with the adapters folded in; sentence-transformers (the folder's
    own code) and lmk embed with it as the LoRA model does. Without lmk in the process: tests/test_export.py."""
    model = lora_model()
    ref = model.encode(TEXTS)
    plain = EmbeddingModel.build(decoder(), lmk_fixed(), passage_max_length=64)
    assert not np.allclose(plain.encode(TEXTS), ref, atol=1e-3)  # the adapters change the embeddings
    folder = export_sentence_transformers(model, tmp_path / "export")
    assert type(model.backbone).__name__ == "PeftModel"  # the export merged a copy, not the training model
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "mistral" and "peft" not in json.dumps(config)
    assert not (folder / "adapter_config.json").exists()
    np.testing.assert_allclose(load_exported(folder).encode(TEXTS), ref, atol=1e-5)
    st = SentenceTransformer(str(folder), trust_remote_code=True, device="cpu")
    np.testing.assert_allclose(st.encode(TEXTS, convert_to_numpy=True), ref, atol=1e-5)


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lora")
    pairs = write_pairs(root / "pairs.jsonl")
    cmd = [sys.executable, "-m", "lmk.train", *DECODER, f"hydra.run.dir={root / 'run'}", "data.max_rows=null",
           f"data.sources=[{{path:'{pairs}',name:pairs,query_prompt:'{PROMPT}'}}]"]
    proc = forked_cli.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root / "run"


@pytest.mark.slow  # a real 3-step run of experiment=tiny-decoder in its own process: about 35 s on 2 busy cores
def test_a_lora_run_checkpoints_the_adapters_and_exports_its_model(lora_run) -> None:
    assert results(lora_run)["status"] == "done"
    ckpt = torch.load(lora_run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    keys = set(ckpt["state_dict"])
    assert len(keys) == 2 * 7 * 2 and all(".lora_A." in k or ".lora_B." in k for k in keys)  # 2 layers x 7 x (A, B)
    assert any(not torch.all(v == 0) for k, v in ckpt["state_dict"].items() if ".lora_B." in k)  # they trained
    assert len(ckpt["optimizer_states"][0]["state"]) == len(keys)  # AdamW's moments: the adapters' only
    # the run's model rebuilt from its checkpoint (the base from its seeded init, the adapters from the file)
    model, info = load_model(lora_run / "checkpoints" / "last.ckpt")
    assert info["kind"] == "checkpoint" and type(model.backbone).__name__ == "PeftModel"
    st = SentenceTransformer(str(lora_run / "export"), trust_remote_code=True, device="cpu")
    np.testing.assert_allclose(st.encode(TEXTS, convert_to_numpy=True), model.encode(TEXTS), atol=1e-5)
    # the source's instruction travels as the export's prompts: by the source's name and as `query`
    assert st.prompts["query"] == st.prompts["pairs"] == PROMPT
    np.testing.assert_allclose(st.encode(TEXTS, prompt_name="query", convert_to_numpy=True),
                               model.encode(TEXTS, prompt=PROMPT), atol=1e-5)


@pytest.mark.slow  # two 10-step runs, one SIGKILLed, and its resume: about 3 minutes on 2 busy cores
def test_a_killed_lora_run_resumes_bit_for_bit(tmp_path) -> None:
    from test_resume import KILLER, final_weights

    pairs = write_pairs(tmp_path / "pairs.jsonl")
    # 24 pairs / batch 4 = 6 batches an epoch: checkpoints at steps 4 and 8, killed at 9, so the resume starts
    # mid-epoch from step 8; adapter dropout on, so the resumed random stream must give the same masks
    setup = (*DECODER, "trainer.max_steps=10", "train.checkpoint_every_n_steps=4", "seed=5",
             "encoder.lora.dropout=0.1")
    ref, run = tmp_path / "ref", tmp_path / "run"
    in_process(ref, pairs, *setup)
    killed = forked_cli.run([sys.executable, "-c", KILLER, "9", *overrides(run, pairs, *setup)], cwd=ROOT, env=ENV,
                            capture_output=True, text=True, timeout=600)
    assert killed.returncode == -9, killed.stderr[-3000:]
    in_process(run, pairs, *setup)
    res = results(run)
    assert res["status"] == "done" and res["checkpoints"]["resumed_from"].endswith("last.ckpt")
    assert [s for s, _ in losses(run)] == list(range(10)) and losses(run) == losses(ref)
    a, b = final_weights(ref), final_weights(run)
    assert a.keys() == b.keys() and all(".lora_" in k for k in a) and all(torch.equal(a[k], b[k]) for k in a)
