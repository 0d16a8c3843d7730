"""The decoder table (experiments/decoder/spec.yaml): every row composes and validates at every scale, the MPE-style
row is MPE's method as a config line, the paper scale's dry run prints an 8B row's memory and GPU-hours from Table 2's
cost model and refuses a job over its time limit, and the tiny scale runs end to end through the same sweep, table
and W&B code as Table 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import forked_cli
import pytest
import yaml
from validated_rows import validated_rows

from lmk.sweep.spec import load_spec, validate_spec

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "experiments" / "decoder" / "spec.yaml"
# the decoder each scale trains: random offline shapes below paper scale, the authors' 8B decoder at paper scale
DECODER = {"tiny": "tiny-decoder", "mini": "tiny-decoder", "rehearsal": "tiny-decoder", "paper": "granite-4.1-8b"}


@pytest.mark.parametrize("scale", list(load_spec(SPEC).scales))
def test_every_decoder_row_composes_and_validates(scale: str) -> None:
    spec = load_spec(SPEC)
    typed = validated_rows(SPEC, scale)
    assert len(typed) == len([r for r in spec.rows if r.scoring_of is None])  # the MaxSim row trains nothing
    for row, t in typed.items():
        # every row trains the same LoRA decoder on the same data: only the pooling, the objective (the MaxSim-trained
        # rows) and the scoring (the MaxSim rows) differ
        assert t.encoder.name == DECODER[scale] and t.encoder.lora is not None, row
        assert t.encoder.lora["target_modules"] == typed["last-token"].encoder.lora["target_modules"]
        assert t.data == typed["last-token"].data, row
        objective = {"objective": "maxsim"} if row.endswith("-mt") or row == "mpe-style" else {}
        assert t.train.to_dict() == {**typed["last-token"].train.to_dict(), **objective}, row
    # MPE's method (an EOS every 64 tokens, documents scored by MaxSim over those states, a short query its one
    # closing EOS) is lmk-fixed-64's layout scored by MaxSim over landmark states
    mpe = typed["mpe-style"]
    assert (mpe.pooling.strategy, mpe.pooling.pooler, mpe.pooling.chunk_size) == ("fixed", "lmk", 64)
    assert mpe.eval.scoring == "maxsim" and mpe.eval.maxsim_query == "landmarks"
    assert mpe.train.objective == "maxsim" and mpe.train.maxsim_query == "landmarks"  # MPE trains with MaxSim too
    assert typed["lmk-fixed-64"].eval.scoring == "single"


def test_the_mpe_style_row_is_optional_and_named() -> None:
    spec = load_spec(SPEC)
    row = {r.id: r for r in spec.rows}["mpe-style"]
    assert row.optional and row.label.startswith("MPE-style")
    assert "mpe-style" not in [r.id for r in spec.rows_for(spec.scale("mini"))]
    assert "mpe-style" in [r.id for r in spec.rows_for(spec.scale("mini"), with_optional=True)]


def test_the_paper_scale_is_the_authors_decoder_recipe() -> None:
    from lmk.sweep.jobs import train_block

    spec = load_spec(SPEC)
    job = train_block(spec.scale("paper"), spec.rows_for(spec.scale("paper"))[:1]).jobs()[0]
    cfg = job.compose()
    # decoder_ft/decoder-embeddings/scripts/msmarco_lmk_finallayer.sh, key by key
    assert cfg.encoder.model_id == "ibm-granite/granite-4.1-8b" and cfg.encoder.dtype == "bfloat16"
    assert (cfg.trainer.max_steps, cfg.train.warmup_steps, cfg.train.lr, cfg.train.weight_decay, cfg.train.tau) == \
        (4000, 50, 2e-4, 0.03, 0.02)
    assert (cfg.data.group_size, cfg.data.batch_size, cfg.train.grad_cache_chunk) == (8, 16, 8)
    assert (cfg.data.query_max_length, cfg.data.passage_max_length) == (128, 512) and cfg.train.grad_cache
    assert cfg.trainer.precision == "bf16-mixed"
    from lmk.config.model import check_lora

    lora = check_lora("x", dict(cfg.encoder.lora))
    assert (lora["r"], lora["alpha"]) == (64, 32)
    assert set(lora["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


@pytest.mark.slow  # a paper dry run end to end; an 8B LoRA row's sizing is checked fast in tests/test_cost.py, its refusal below
def test_the_decoder_paper_dry_run_prints_an_8b_rows_memory_and_gpu_hours(tmp_path: Path) -> None:
    out = tmp_path / "paper"
    proc = forked_cli.run([sys.executable, "-m", "lmk.sweep", str(SPEC), "--scale", "paper", "--dry-run",
                           "--out", str(out), "--rows", "lmk-fixed-64"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    # per job: bf16 frozen base, fp32 LoRA + AdamW, activations of one 8-row grad-cache chunk of 512 tokens
    assert "memory per device: weights 16.35 + grads 0.74 + AdamW 1.47" in text
    assert "(4,096 tokens in flight)" in text and "fits a 80 GB GPU" in text
    assert "LoRA r 64 on 7 modules: 198M float32 adapter weights train" in text and "8.38B frozen base" in text
    assert "gradient checkpointing off (auto)" in text
    # the GPU-hours from Table 2's cost model: a frozen base's backward is one forward
    assert "8381M params frozen + 198M LoRA (r 64), 3 passes per token" in proc.stdout
    assert "GPU-hours" in proc.stdout and "train throughput: " in proc.stdout
    job = json.loads((out / "train" / "jobs.json").read_text())["jobs"][0]
    report = job["report"]
    assert report["fits"] is True and 60 < report["memory_gib"]["total"] < 80
    assert report["time"]["timeout_min"] == 720 and report["refusal"] is None and 5 < report["time"]["hours"] < 12


def test_a_decoder_job_over_its_time_limit_is_refused(tmp_path: Path) -> None:
    from lmk.sweep.cost.estimate import check_sweep

    spec = yaml.safe_load(SPEC.read_text())
    spec["scales"]["paper"]["train_overrides"] += ["launcher.timeout=120", "launcher.max_requeues=0"]
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    refusals = check_sweep(str(tmp_path / "spec.yaml"), "paper", ["lmk-fixed-64"])
    assert len(refusals) == 1 and refusals[0].startswith("train stage: a training job needs")
    assert "launcher.timeout=120 stops it at 2.0 h" in refusals[0] and "resume across jobs" in refusals[0]
    assert check_sweep(str(SPEC), "paper", ["lmk-fixed-64"]) == []  # the spec's own limit fits


@pytest.mark.parametrize("scale", list(load_spec(SPEC).scales))
def test_every_column_is_a_group_of_its_scales_suite(scale: str) -> None:
    validate_spec(load_spec(SPEC), scale)  # the sweep's own check before any compute (the RULER column included)


@pytest.mark.slow
def test_the_decoder_table_at_tiny_scale_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "decoder"
    proc = forked_cli.run([sys.executable, "-m", "lmk.sweep", str(SPEC), "--scale", "tiny", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = json.loads((out / "decoder.json").read_text())
    rows = {cell["row"] for cell in table["cells"] if cell["value"] is not None}
    spec = load_spec(SPEC)
    assert rows == {r.id for r in spec.rows_for(spec.scale("tiny"))}  # every row of the scale, the 2x2's included
    assert {"lmk-fixed-64", "lmk-fixed-64-maxsim", "lmk-fixed-64-mt", "lmk-fixed-64-mt-single"} <= rows
    trained = json.loads((out / "train" / "lmk-fixed-64-mt" / "results.json").read_text())
    assert trained["config"]["train"]["objective"] == "maxsim" and trained["eval"]["scoring"] == "maxsim"
    for name in ("decoder.md", "decoder.tex", "decoder.csv"):
        assert (out / name).is_file()
    assert not (out / "train" / "lmk-fixed-64-maxsim").exists()  # scored from lmk-fixed-64's checkpoint
    maxsim = json.loads((out / "rescore" / "lmk-fixed-64-maxsim" / "results.json").read_text())
    assert maxsim["eval"]["scoring"] == "maxsim" and maxsim["config"]["model"] == str(out / "train" / "lmk-fixed-64")
    single = json.loads((out / "train" / "lmk-fixed-64" / "results.json").read_text())
    assert single["eval"]["scoring"] == "single"
    # the RULER column: the NIAH group scored, the haystack named
    assert 0.0 <= single["eval"]["groups"]["ruler-niah"] <= 1.0
    assert single["eval"]["tasks"]["RulerNiahSingle"]["data"]["haystack"] == "lmk-essays"
    assert any(cell["column"] == "ruler-niah" and cell["value"] is not None for cell in table["cells"])


def test_the_paper_scale_sizes_mistral_7b_as_its_alternative() -> None:
    """`encoder=mistral-7b-v0.3` (the script's other model) is sized by the same model without its weights."""
    from lmk.sweep.cost import job_report
    from lmk.sweep.jobs import compose_config

    cfg = compose_config("lmk.train", ["experiment=decoder-paper", "encoder=mistral-7b-v0.3", "launcher=submitit_slurm",
                                       "pooling=lmk-fixed", "++row=x"])
    report = job_report(cfg)
    assert report["fits"] is True and "LoRA r 64 on 7 modules: 168M float32 adapter weights" in report["summary"]
    assert "7.11B frozen base weights at 2 bytes" in report["summary"] and report["refusal"] is None
