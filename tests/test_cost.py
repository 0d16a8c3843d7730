"""The model's size and memory: parameter count and FLOPs (lmk.model.shape), the per-device memory estimate and
the gradient-checkpointing decision it sets (lmk.train.memory), the per-job report the dry run prints
(lmk.sweep.cost.job_report), and the paper config fits 80 GB by its own estimate."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import forked_cli
import pytest
import torch

from lmk.model.backbone import shipped_config
from lmk.model.shape import EncoderShape, encoder_shape
from lmk.sweep.cost import job_report, read_gpu_check
from lmk.sweep.cost.training import training_flops
from lmk.train.memory import GIB, Precision, decide_checkpointing, estimate_memory, job_memory

ROOT = Path(__file__).resolve().parent.parent
BASE = EncoderShape.from_config(shipped_config("modernbert-base"))
PAPER = dict(queries=256, group_size=8, query_len=128, passage_len=512)
MIXED = Precision.of("bf16-mixed")


def _compose(*overrides: str):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        return compose("train", overrides=["+row=x", "run_dir=/tmp/lmk-cost", *overrides])


def test_modernbert_base_parameter_count():
    assert BASE.params() == 149_014_272  # the published ModernBERT-base size


@pytest.mark.parametrize("arch", ["modernbert", "bert"])
def test_params_equal_an_instantiated_model(arch):
    from transformers import AutoConfig, AutoModel

    sizes = dict(num_hidden_layers=3, hidden_size=64, intermediate_size=96, num_attention_heads=4, vocab_size=500,
                 pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
    config = AutoConfig.for_model(arch, **sizes)
    with torch.device("meta"):
        model = AutoModel.from_config(config, add_pooling_layer=False) if arch == "bert" else AutoModel.from_config(config)
    assert EncoderShape.from_config(config.to_dict()).params() == sum(p.numel() for p in model.parameters())


def test_activations_are_linear_in_the_batch():
    one = estimate_memory(BASE, **{**PAPER, "queries": 64}, precision=MIXED, checkpointing=True)
    two = estimate_memory(BASE, **{**PAPER, "queries": 128}, precision=MIXED, checkpointing=True)
    assert two.activations == pytest.approx(2 * one.activations)
    assert two.tokens_in_flight == 2 * one.tokens_in_flight
    assert two.weights == one.weights and two.optimizer == one.optimizer  # independent of the batch


def test_checkpointing_reduces_activations_and_mixed_keeps_an_fp32_stream():
    full = estimate_memory(BASE, **PAPER, precision=MIXED, checkpointing=False)
    ckpt = estimate_memory(BASE, **PAPER, precision=MIXED, checkpointing=True)
    assert ckpt.activations < full.activations / 4
    # the checkpointed layer inputs of 256 x 8 x 512 tokens in fp32 alone: ~70 GB
    layer_inputs = 256 * 8 * 512 * 768 * 4 * 22
    assert layer_inputs < ckpt.activations < layer_inputs * 1.6
    half = estimate_memory(BASE, **PAPER, precision=Precision.of("bf16-true"), checkpointing=True)
    assert half.activations < ckpt.activations and half.weights == ckpt.weights / 2


def test_grad_cache_bounds_activations():
    small = estimate_memory(BASE, **PAPER, precision=MIXED, checkpointing=True, grad_cache_chunk=64)
    big = estimate_memory(BASE, **{**PAPER, "queries": 1024}, precision=MIXED, checkpointing=True, grad_cache_chunk=64)
    assert small.activations == big.activations and small.tokens_in_flight == 64 * 512
    uncached = estimate_memory(BASE, **PAPER, precision=MIXED, checkpointing=True)
    assert small.activations < uncached.activations / 20


def test_a_token_budget_bounds_the_chunk_by_tokens_not_by_the_row_setting():
    kw = dict(precision=MIXED, checkpointing=True, grad_cache_chunk=64)
    rows = estimate_memory(BASE, **PAPER, **kw)
    # a budget of exactly 64 rows at the longest length: the row estimate
    assert estimate_memory(BASE, **PAPER, **kw, grad_cache_tokens=64 * 512).total == rows.total
    # four times that: four times the tokens in flight, whatever grad_cache_chunk says (the chunk holds them)
    big = estimate_memory(BASE, **PAPER, **kw, grad_cache_tokens=4 * 64 * 512)
    assert big.tokens_in_flight == 4 * rows.tokens_in_flight and big.activations > 3 * rows.activations
    assert "at most 131,072 tokens in flight (256 rows at 512 tokens)" in " ".join(big.notes)
    # a budget under one row: a longest row goes alone
    assert estimate_memory(BASE, **PAPER, **kw, grad_cache_tokens=100).tokens_in_flight == 512
    # job_memory reads the setting from the composed job
    base = ["experiment=table2-paper", "pooling=cls", "launcher=submitit_slurm"]
    assert (job_memory(_compose(*base, "train.grad_cache_tokens=262144")).tokens_in_flight
            == 4 * job_memory(_compose(*base)).tokens_in_flight)


def test_optimizer_state_and_ddp_buckets():
    one = estimate_memory(BASE, **PAPER, precision=MIXED, world_size=1)
    many = estimate_memory(BASE, **PAPER, precision=MIXED, world_size=24)
    assert one.optimizer == 2 * one.weights == 2 * BASE.params() * 4 and one.autocast_weights == BASE.params() * 2
    assert one.ddp_buckets == 0 and many.ddp_buckets == one.grads


def test_flops_per_token():
    dense = 2 * BASE.layers * BASE.layer_params()
    assert BASE.forward_flops_per_token(512) > dense
    # sliding-window layers cost the same at 512 and 8192; global ones grow with the length
    long, short = BASE.forward_flops_per_token(8192), BASE.forward_flops_per_token(512)
    globals_ = len(range(0, 22, 3))
    assert long - short == pytest.approx(4 * (8192 - 512) * 768 * globals_)
    assert BASE.train_flops_per_token(512, checkpointing=True) == 4 * short
    assert replace(BASE, local_window=None).forward_flops_per_token(8192) > long


def test_paper_config_fits_an_80gb_gpu_by_its_own_estimate():
    cfg = _compose("experiment=table2-paper", "pooling=lmk-variable", "launcher=submitit_slurm")
    report = job_report(cfg)
    assert report["gpu_memory_gb"] == 80 and report["fits"] is True, report["summary"]
    assert report["memory_gib"]["total"] < 80 and "fits a 80 GB GPU" in report["summary"]
    # ... and it is grad cache that makes it fit: the same batch without it does not
    nocache = job_memory(_compose("experiment=table2-paper", "pooling=cls", "launcher=submitit_slurm",
                                  "train.grad_cache=false"))
    assert not nocache.fits(80) and nocache.total > 80 * GIB


def test_each_fitting_key_lowers_the_estimate():
    base = ["experiment=table2-paper", "pooling=cls", "launcher=submitit_slurm", "train.grad_cache=false"]
    ref = job_memory(_compose(*base)).total
    assert job_memory(_compose(*base, "encoder.dtype=bfloat16")).total < ref
    assert job_memory(_compose(*base, "trainer.precision=bf16-true")).total < ref
    assert job_memory(_compose(*base, "data.batch_size=64")).total < ref / 3


def test_paper_dry_run_prints_the_memory_estimate_and_the_checkpointing_decision(tmp_path):
    out = tmp_path / "paper"
    proc = forked_cli.run([sys.executable, "-m", "lmk.sweep", "experiments/table2/spec.yaml", "--scale", "paper",
                           "--dry-run", "--out", str(out), "--rows", "cls"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    assert "memory per device:" in text and "fits a 80 GB GPU" in text
    # per job: checkpointing off, and why (the estimate without it fits)
    assert "gradient checkpointing off (auto): 46.2 GiB without it fits 80 GB" in text
    # the GPU-hours count grad cache's forward but no checkpoint recompute; every figure names its source
    assert "4 passes per token (forward, backward (2), grad-cache embedding pass)" in proc.stdout
    assert "train throughput: " in proc.stdout and "job overhead: " in proc.stdout
    # per stage: the longest job, how many run at once, the time limit
    assert "(beir15)" in proc.stdout and "all 6 (6 GPUs)" in proc.stdout and "of 12.0 h" in proc.stdout
    # per row and in total: padded (the table's figure) and at the texts' lengths by path, the lengths' source named
    rows = proc.stdout.split("training GPU-hours per row:")[1].splitlines()
    cls = next(line for line in rows if line.split()[:1] == ["cls"]).split()
    total = next(line for line in rows if line.split()[:1] == ["total"]).split()
    assert cls[1] == "single" and cls[-1] == "profile" and total[1] == cls[2] == "83.4"  # one row: 834.4 / 10
    padded, batch, budget, packed = (float(x.rstrip("*")) for x in total[1:5])
    # the job's path: token-budget mini-batches (the experiment's train.grad_cache_tokens)
    assert padded > batch > budget > packed > 0 and cls[4].endswith("*") and not cls[3].endswith("*")
    assert "profile 'msmarco-passage', not a measurement" in proc.stdout and "cfli/bge-full-data is not on disk" in proc.stdout
    job = json.loads((out / "train" / "jobs.json").read_text())["jobs"][0]
    assert job["report"]["fits"] is True and job["report"]["memory_gib"]["total"] > 1
    assert job["report"]["gradient_checkpointing"]["on"] is False
    assert job["report"]["time"]["timeout_min"] == 720 and job["report"]["refusal"] is None


def test_a_job_that_does_not_fit_names_the_keys_that_fix_it():
    report = job_report(_compose("experiment=table2-paper", "pooling=cls", "launcher=submitit_slurm",
                                 "train.grad_cache=false"))
    assert report["fits"] is False and "DOES NOT FIT" in report["summary"]
    assert "train.grad_cache=true" in report["summary"] and "launcher.nodes" in report["summary"]
    # bf16 weights (no fp32 master copy) lose most AdamW updates at lr 2e-5: never suggested
    assert "bfloat16" not in report["summary"] and "bf16-true" not in report["summary"]
    assert report["world_size"] == 20  # 5 nodes x 4 GPUs, the authors' 20


def test_training_flops_of_the_paper_run_count_no_checkpoint_recompute():
    cfg = _compose("experiment=table2-paper", "pooling=cls", "launcher=submitit_slurm")
    tokens, flops, passes, what = training_flops(cfg, 20)
    assert tokens == 5000 * 20 * 256 * (128 + 8 * 512) and passes == 4 and "checkpoint recompute" not in what
    per_token = BASE.train_flops_per_token(512, checkpointing=False, grad_cache=True)
    assert flops == pytest.approx(tokens * per_token, rel=0.01)  # queries are 3% of the tokens
    # the pass it no longer counts: the same job checkpointed costs 5/4 of it
    _, checkpointed, five, _ = training_flops(_compose("experiment=table2-paper", "pooling=cls",
                                                       "launcher=submitit_slurm", "encoder.gradient_checkpointing=true"), 20)
    assert five == 5 and checkpointed == pytest.approx(flops * 5 / 4)


def test_auto_checkpointing_is_on_only_where_the_estimate_without_it_does_not_fit():
    paper = ["experiment=table2-paper", "pooling=cls", "launcher=submitit_slurm"]
    at_80 = decide_checkpointing(_compose(*paper))
    assert at_80.setting == "auto" and not at_80.on and at_80.without_gib == 46.2 and at_80.gpu_memory_gb == 80
    assert at_80.line == "gradient checkpointing off (auto): 46.2 GiB without it fits 80 GB"
    at_40 = decide_checkpointing(_compose(*paper, "launcher.gpu_memory_gb=40"))
    assert at_40.on and "46.2 GiB without it exceeds 36.0 GiB (90% of 40 GB)" in at_40.why
    assert at_40.with_gib < 40 * 0.9  # and with it the job fits
    # without grad cache the batch needs checkpointing even on 80 GB
    assert decide_checkpointing(_compose(*paper, "train.grad_cache=false")).on
    unknown = decide_checkpointing(_compose(*paper, "launcher.gpu_memory_gb=null"))
    assert unknown.on and "launcher.gpu_memory_gb is not set" in unknown.why  # a GPU job: the safe side
    on_cpu = decide_checkpointing(_compose(*paper, "trainer=ddp-cpu"))
    assert not on_cpu.on and "CPU" in on_cpu.why
    forced = decide_checkpointing(_compose(*paper, "encoder.gradient_checkpointing=true"))
    assert forced.on and "auto saves a forward pass" in forced.why
    assert not decide_checkpointing(_compose(*paper, "encoder.gradient_checkpointing=false")).on
    # the estimate the report prints is the one for the decided setting
    assert job_memory(_compose(*paper)).total == job_memory(_compose(*paper), checkpointing=False).total


def test_checkpointing_setting_is_validated_torch_free():
    from lmk.config import ConfigError
    from lmk.train.trainer_args import validate_training

    validate_training(_compose("experiment=table2-paper", "pooling=cls"))
    with pytest.raises(ConfigError, match="gradient_checkpointing='sometimes'.*true, false, auto"):
        validate_training(_compose("experiment=table2-paper", "pooling=cls", "encoder.gradient_checkpointing=sometimes"))


def test_published_configs_size_hub_encoders_not_on_disk():
    sizes = {"BAAI/bge-m3": 568e6, "FacebookAI/xlm-roberta-large": 560e6, "answerdotai/ModernBERT-large": 395e6,
             "google-bert/bert-base-uncased": 110e6}
    for model_id, published in sizes.items():
        assert encoder_shape({"model_id": model_id}).params() == pytest.approx(published, rel=0.02), model_id
    with pytest.raises(ValueError, match="PUBLISHED_CONFIGS"):
        encoder_shape({"model_id": "nobody/no-such-encoder"})


def test_read_gpu_check_takes_only_a_gpu_measurement(tmp_path):
    path = tmp_path / "gpu_check.json"
    assert read_gpu_check(path) is None
    tp = {"train_tokens_per_s": 1.0e5, "encode_tokens_per_s": {"512": 2.0e5}}
    path.write_text(json.dumps({"status": "ok", "mode": "cpu-smoke", "device": "cpu", "throughput": tp}))
    assert read_gpu_check(path) is None
    assert read_gpu_check(path, modes=("gpu", "cpu-smoke"))["mode"] == "cpu-smoke"  # only when asked for
    path.write_text(json.dumps({"status": "failed", "mode": "gpu", "throughput": tp}))
    assert read_gpu_check(path) is None
    path.write_text("{not json")
    assert read_gpu_check(path) is None
    path.write_text(json.dumps({"status": "ok", "mode": "gpu", "device": "NVIDIA H200", "throughput": tp}))
    assert read_gpu_check(path) == {**tp, "mode": "gpu", "device": "NVIDIA H200"}


def test_read_gpu_check_reads_the_encode_pipeline_section(tmp_path):
    """The end-to-end vs forward-only figures of gpu-check's `encode_pipeline` section."""
    pipeline = {"512": {"end_to_end_tokens_per_s": 9.0e5, "forward_only_tokens_per_s": 1.0e6, "ratio": 0.9},
                "8192": {"end_to_end_tokens_per_s": 3.0e5, "forward_only_tokens_per_s": 3.2e5, "ratio": 0.94}}
    path = tmp_path / "gpu_check.json"
    path.write_text(json.dumps({"status": "ok", "mode": "gpu", "throughput": {"train_flops_per_s": 1e14},
                                "encode_pipeline": {"status": "ok", **pipeline}}))
    assert read_gpu_check(path)["encode_pipeline"] == pipeline


def test_training_passes_count_the_grad_cache_forward():
    assert BASE.train_passes() == 3 and BASE.train_passes(checkpointing=True) == 4
    assert BASE.train_passes(checkpointing=True, grad_cache=True) == 5  # the paper's: no-grad embedding pass too


@pytest.mark.parametrize("arch", ["llama", "mistral", "granite"])
def test_decoder_and_lora_params_equal_instantiated_models(arch):
    """A Llama-like decoder (grouped-query attention, SwiGLU, RMSNorm) and peft's adapters on it, counted as built."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModel

    from lmk.config.model import check_lora

    config = AutoConfig.for_model(arch, num_hidden_layers=2, hidden_size=64, intermediate_size=96,
                                  num_attention_heads=4, num_key_value_heads=2, vocab_size=500)
    model = AutoModel.from_config(config)
    shape = EncoderShape.from_config(config.to_dict())
    assert shape.decoder and shape.kv_dim == 32 and shape.params() == sum(p.numel() for p in model.parameters())
    lora = check_lora(arch, {"r": 4})
    adapted = get_peft_model(model, LoraConfig(r=4, lora_alpha=32, target_modules=lora["target_modules"]))
    assert shape.lora_params(lora) == sum(p.numel() for p in adapted.parameters() if p.requires_grad)
    with pytest.raises(ValueError, match="Wqkv"):
        shape.lora_params({**lora, "target_modules": ["Wqkv"]})


def test_lora_memory_freezes_the_base_and_trains_float32_adapters():
    from lmk.config.model import check_lora

    shape = encoder_shape({"model_id": "mistralai/Mistral-7B-v0.3"})  # a published config: nothing downloaded
    lora = check_lora("mistral", {})
    sizes = dict(queries=16, group_size=8, query_len=128, passage_len=512, grad_cache_chunk=8, world_size=8)
    bf16 = Precision.of("bf16-mixed", "bfloat16")
    est = estimate_memory(shape, **sizes, precision=bf16, lora=lora)
    n, trainable = shape.params(), shape.lora_params(lora)
    assert 7.0e9 < n < 7.2e9 and trainable == 32 * 64 * (3 * (4096 + 14336) + 2 * (4096 + 4096) + 2 * (4096 + 1024))
    # the frozen bf16 base holds no gradient, optimizer state or DDP bucket; the fp32 adapters hold all of them
    assert est.weights == 2 * n + 4 * trainable and est.grads == 4 * trainable and est.optimizer == 8 * trainable
    assert est.ddp_buckets == 4 * trainable and est.autocast_weights == 2 * trainable
    assert est.tokens_in_flight == 8 * 512 and any(note.startswith("LoRA r 64") for note in est.notes)
    full = estimate_memory(shape, **sizes, precision=bf16)  # every weight trains
    assert full.grads == 2 * n and full.optimizer == 4 * n and full.total > est.total + 25 * GIB
    # the adapters' backward keeps each module's dropped-out input: no dropout, less memory
    assert estimate_memory(shape, **sizes, precision=bf16, lora={**lora, "dropout": 0.0}).activations < est.activations
    assert estimate_memory(shape, **sizes, precision=bf16, lora=lora, checkpointing=True).activations < est.activations / 10


def test_a_frozen_base_costs_one_forward_for_its_backward():
    assert EncoderShape.train_passes(False, True, frozen=True) == 3 == EncoderShape.train_passes(False, True) - 1
    shape = encoder_shape({"model_id": "ibm-granite/granite-4.1-8b"})
    lora = {"r": 64, "target_modules": ["q_proj", "v_proj"], "dropout": 0.1}
    plain, adapted = shape.train_flops_per_token(512, grad_cache=True), shape.train_flops_per_token(512, grad_cache=True,
                                                                                                   lora=lora)
    forward = shape.forward_flops_per_token(512)
    assert adapted == pytest.approx(3 * forward + 4 * 2 * shape.lora_params(lora)) and adapted < plain
