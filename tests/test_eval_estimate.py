"""The sweep's cost estimate before launch: tokens, GPU-hours, the longest job, concurrency and wall time per
stage from the configs and mteb's task statistics; a job longer than its time limit is refused, naming the fix."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import forked_cli
import pytest
import yaml
from omegaconf import OmegaConf

from lmk.config.eval import EvalConfig
from lmk.model.shape import encoder_shape
from lmk.sweep.cost.estimate import format_estimate, sweep_estimate, training_time_report
from lmk.sweep.cost.evaluation import CHARS_PER_TOKEN, eval_cost
from lmk.sweep.cost.limits import TimeLimit, eval_verdict, training_verdict
from lmk.sweep.cost.stage import StageCost, makespan
from lmk.sweep.cost.throughput import peak_throughput
from lmk.sweep.cost.training import TrainingJob, training_cost

ROOT = Path(__file__).resolve().parent.parent
SPEC = str(ROOT / "experiments" / "table2" / "spec.yaml")


def test_training_tokens_follow_the_config() -> None:
    cfg = OmegaConf.create({
        "encoder": OmegaConf.load(ROOT / "conf" / "encoder" / "modernbert-base.yaml"),
        "data": {"batch_size": 256, "group_size": 8, "query_max_length": 128, "passage_max_length": 512},
        "trainer": {"max_steps": 5000}})
    cost = training_cost(cfg, n_jobs=2, gpus_per_job=24)
    assert cost.tokens == 2 * 5000 * 256 * 24 * (128 + 8 * 512)
    shape = encoder_shape(cfg.encoder)  # the shipped ModernBERT-base config.json (lmk.sweep.cost)
    assert shape.params() == 149_014_272
    per_query = 128 * shape.forward_flops_per_token(128) + 8 * 512 * shape.forward_flops_per_token(512)
    # encoder.gradient_checkpointing: auto with no GPU memory given: on (the safe side), 4 forwards
    assert cost.flops == pytest.approx(2 * 5000 * 256 * 24 * per_query * 4)
    cfg.train = {"grad_cache": True}  # grad cache's no-grad embedding pass is a 5th forward
    assert training_cost(cfg, n_jobs=2, gpus_per_job=24).flops == pytest.approx(cost.flops * 5 / 4)
    assert "5 passes" in training_cost(cfg, 2, 24).notes[0]
    cfg.trainer.max_steps = -1
    with pytest.raises(ValueError, match="max_steps"):
        training_cost(cfg, 1, 1)


def test_eval_tokens_come_from_mteb_task_statistics() -> None:
    suite = EvalConfig(name="s", tasks=["SciFact"], query_max_length=64, passage_max_length=256)
    shape = encoder_shape({"model_id": "answerdotai/ModernBERT-base"})
    cost = eval_cost(suite, n_rows=3, shards={"all": ["SciFact"]}, shape=shape)
    # SciFact test: 5183 documents of 1499.4 characters on average (truncated at 256), 300 queries of 90.3
    docs, queries = 5183 * min(1499.41173065792 / CHARS_PER_TOKEN, 256), 300 * min(90.34666666666666 / CHARS_PER_TOKEN, 64)
    assert cost.tokens == pytest.approx(3 * (docs + queries))
    assert cost.jobs == 3
    longer = eval_cost(EvalConfig(name="s", tasks=["SciFact"], query_max_length=64, passage_max_length=8192),
                       1, {"all": ["SciFact"]}, shape)
    assert longer.tokens > cost.tokens / 3  # truncation at 256 tokens counted


def _report(mode: str, train_flops: float = 2.0e14, **extra: object) -> str:
    tp = {"mode": mode, "device": "NVIDIA H200" if mode == "gpu" else "cpu", "train_tokens_per_s": 5.0e4,
          "train_flops_per_s": train_flops, "train_passes": 5, "encode_tokens_per_s": {"512": 2.5e5, "8192": 9.0e4},
          "job_overhead_s": 30.0}
    return json.dumps({"status": "ok", "mode": mode, "device": tp["device"], "throughput": tp, **extra})


def test_a_cpu_smoke_report_at_the_default_path_is_never_measured(tmp_path: Path) -> None:
    """A --cpu-smoke JSON where gpu-check writes is never read as measured (it gave 2.7M GPU-hours once)."""
    path = tmp_path / "gpu_check.json"
    path.write_text(_report("cpu-smoke", train_flops=1.5e8))
    _, rates = sweep_estimate(SPEC, "paper", ["cls"], gpu="H100", gpu_check=path)
    assert not rates.train.measured and "published H100" in rates.train.source


def test_training_uses_the_measured_training_throughput_and_eval_the_encode_pipeline(tmp_path: Path) -> None:
    pipeline = {"512": {"end_to_end_tokens_per_s": 2.0e5, "forward_only_tokens_per_s": 2.5e5, "ratio": 0.8},
                "8192": {"end_to_end_tokens_per_s": 8.0e4, "forward_only_tokens_per_s": 9.0e4, "ratio": 0.89}}
    path = tmp_path / "gpu_check.json"
    path.write_text(_report("gpu", encode_pipeline={"status": "ok", **pipeline}))
    (train, ev), rates = sweep_estimate(SPEC, "paper", ["cls"], gpu_check=path)
    assert rates.train.measured and rates.train.flops_per_s == 2.0e14  # the train step, not an encode figure
    assert train.device_s == pytest.approx(train.flops / 2.0e14 + 30.0 * 20)  # 20 GPUs x the measured overhead
    shape = encoder_shape({"model_id": "answerdotai/ModernBERT-base"})  # the paper's encoder
    assert rates.encode_includes_tokenization and ev.device_s > 0
    # a 6000-token text is encoded at the figure measured at 8192 (the nearest length)
    assert rates.encode_at(6000).flops_per_s == pytest.approx(8.0e4 * shape.forward_flops_per_token(8192))
    text = format_estimate([train, ev], rates)
    for line in ("train throughput: measured (gpu, NVIDIA H200)", "end to end (tokenization included",
                 "search: exact", "job overhead: 30 s"):
        assert line in text, text
    assert "tokenization: " not in text  # counted in the end-to-end figure, not twice


def test_a_cpu_measurement_is_taken_only_when_given_for_a_cpu_scale(tmp_path: Path) -> None:
    cpu = tmp_path / "cpu_check.json"
    cpu.write_text(_report("cpu-smoke", train_flops=1.5e8))
    with pytest.raises(ValueError, match="trains on the GPU"):
        sweep_estimate(SPEC, "paper", ["cls"], throughput_file=cpu)
    with pytest.raises(ValueError, match="--cpu-smoke"):
        sweep_estimate(SPEC, "rehearsal", ["cls"], gpu_check=cpu)  # a CPU scale never reads the default path
    (train,), rates = sweep_estimate(SPEC, "rehearsal", ["cls"], throughput_file=cpu)
    assert rates.train.kind == "cpu" and train.parallel == 1 and "eval not estimated" in train.notes[-1]
    # 3 steps x 2 ranks x 4 queries x (16 + 4 x 64) tokens, each rank at the measured rate, + the overhead
    assert train.tokens == 3 * 2 * 4 * (16 + 4 * 64)
    assert train.job_wall_s == pytest.approx(train.flops / (1.5e8 * 2) + 30.0)


def test_predicted_training_time_is_printed_beside_the_measured_one(tmp_path: Path) -> None:
    cpu = tmp_path / "cpu_check.json"
    cpu.write_text(_report("cpu-smoke", train_flops=1.5e8))
    out = tmp_path / "sweep"
    (out / "train").mkdir(parents=True)
    (out / "train" / "sweep_status.json").write_text(json.dumps(
        {"cls": {"status": "completed", "seconds": 40.0}, "mean": {"status": "completed", "seconds": 50.0},
         "lmk-sentence": {"status": "failed", "seconds": 3.0}, "lmk-fixed-32": {"status": "skipped"}}))
    (train,), _ = sweep_estimate(SPEC, "rehearsal", ["cls"], throughput_file=cpu)
    text = training_time_report(SPEC, "rehearsal", out, cpu)
    assert text is not None and "measured 1.5 min for 2 rows" in text
    assert f"predicted {2 * train.job_wall_s / 60:.1f} min" in text and "cpu_check.json" in text
    assert training_time_report(SPEC, "rehearsal", tmp_path / "nothing", cpu) is None


def test_paper_sweep_estimate_has_both_stages(tmp_path: Path) -> None:
    rows = ["cls", "mean", "lmk-fixed-32"]
    stages, rates = sweep_estimate(SPEC, "paper", rows, gpu="H100", gpu_check=tmp_path / "absent.json")
    train, ev = stages
    assert train.stage == "train" and train.jobs == 3 and ev.stage == "eval" and ev.jobs == 3 * 6
    assert train.tokens == 3 * 5000 * 256 * 20 * (128 + 8 * 512)  # 5 nodes x 4 GPUs
    assert ev.tokens > 1e9 and "published H100" in rates.train.source
    assert 0 < ev.gpu_hours() and 0 < train.gpu_hours()
    # the GPU-hours count grad cache's pass and no checkpoint recompute (off at 80 GB): 4 passes
    compute_s = train.device_s - 3 * 20 * rates.job_overhead_s
    assert compute_s == pytest.approx(train.flops / rates.train.flops_per_s)
    assert "4 passes" in train.notes[0] and "grad-cache embedding pass" in train.notes[0]
    assert "checkpoint recompute" not in train.notes[0] and "gradient checkpointing off (auto)" in train.notes[0]
    peak = peak_throughput("A100")
    assert peak.flops_per_s == pytest.approx(312e12 * 0.35) and "assumed utilisation" in peak.source
    with pytest.raises(ValueError, match="H100"):
        peak_throughput("TPUv9")


def test_stage_wall_time_is_the_schedule_of_its_longest_jobs(tmp_path: Path) -> None:
    assert makespan([1.0, 2.0, 3.0], None) == 3.0 and makespan([1.0, 2.0, 3.0], 1) == 6.0
    assert makespan([1.0, 2.0, 3.0], 2) == 4.0 and makespan([], 2) == 0.0
    (train, ev), _ = sweep_estimate(SPEC, "paper", ["cls", "mean"], gpu="H100", gpu_check=tmp_path / "absent.json")
    # the eval stage's wall is its longest shard (BEIR-15 by mteb's statistics), not the mean job
    shard_s = {shard: sum(sec for _, sec in tasks) for shard, tasks in ev.shards.items()}
    assert ev.longest == "beir15" == max(shard_s, key=shard_s.get)
    assert ev.wall_s() == ev.job_wall_s > 2 * ev.device_s / ev.jobs and ev.parallel is None
    assert train.parallel is None and train.wall_s() == train.job_wall_s  # SLURM: all rows at once...
    text = format_estimate([train, ev], _)
    assert "all 2 (40 GPUs)" in text and "all 12 (12 GPUs)" in text and "(beir15)" in text
    assert f"one at a time: {train.serial_s() / 3600:.1f} h" in text  # ...and what one at a time would take


def _job(**kw: object) -> TrainingJob:
    base = dict(steps=5000, gpus=20, gpus_per_node=4, per_device_batch=256, compute_s=16 * 3600.0, overhead_s=120.0,
                checkpoint_every=1000)
    return TrainingJob(**{**base, **kw})


def test_a_training_job_longer_than_its_limit_is_refused_naming_the_fixes() -> None:
    fits = training_verdict(_job(), TimeLimit(1080), "src")
    assert fits.refusal is None and fits.text == "89% of 18.0 h"
    refused = training_verdict(_job(), TimeLimit(720), "published A100")
    assert refused.text == "16.0 h > 12.0 h" and "published A100" in refused.refusal
    for fix in ("launcher.timeout=962 or more", "at least 27: launcher.nodes=8 with data.batch_size=160 keeps 5,120",
                "launcher.max_requeues=1", "2 segments of 12.0 h, each keeping 3000 steps"):
        assert fix in refused.refusal, refused.refusal
    # resume across jobs: two requeues suffice, so the job runs in segments and is not refused
    requeued = training_verdict(_job(), TimeLimit(720, requeues=2), "src")
    assert requeued.refusal is None and requeued.text.startswith("2 segments")
    assert requeued.wall_s == pytest.approx(12 * 3600 + 120 + 2000 * 16 * 3600 / 5000)  # 3000 + 2000 steps
    # with the scheduler's warning 2 min ahead a segment keeps every step before it (saved then), not 3000
    warned = training_verdict(_job(), TimeLimit(720, requeues=1, signal_delay_s=120), "src")
    assert warned.refusal is None and warned.wall_s == pytest.approx(12 * 3600 + 120 + (5000 - 3729) * 11.52)
    assert "each keeping 3729 steps" in training_verdict(_job(), TimeLimit(720, signal_delay_s=120), "src").refusal
    # a checkpoint only at the end keeps nothing from a segment (no warning in time): the fix names the interval
    coarse = training_verdict(_job(checkpoint_every=0), TimeLimit(720, requeues=3), "src")
    assert coarse.refusal and "train.checkpoint_every_n_steps=" in coarse.refusal and "allows 4 segments" in coarse.refusal


def test_an_eval_shard_longer_than_its_limit_is_refused_naming_the_fixes() -> None:
    stage = StageCost("eval", 2, 0.0, 0.0, shards={"beir15": [("A", 3000.0), ("B", 3000.0)], "small": [("C", 60.0)]},
                      longest="beir15", job_wall_s=6120.0)
    refused = eval_verdict(stage, TimeLimit(60, where=" in the scale's eval_stage.launcher_overrides"), 120.0, "src")
    assert refused.refusal and refused.text == "1.7 h > 1.0 h"
    assert "launcher.timeout=102 or more in the scale's eval_stage" in refused.refusal
    assert "eval_stage.shard_by: task; the longest task, A, needs 52.0 min" in refused.refusal
    assert "launcher.max_requeues=1" in refused.refusal
    assert eval_verdict(stage, TimeLimit(60, requeues=1), 120.0, "src").refusal is None  # a segment per task


@pytest.mark.slow  # a sweep process end to end; the refusal itself is checked fast in tests/test_decoder_table.py
def test_the_sweep_refuses_a_job_over_its_time_limit_before_anything_launches(tmp_path: Path) -> None:
    spec = yaml.safe_load(Path(SPEC).read_text())
    spec["scales"]["paper"]["train_overrides"].append("launcher.timeout=60")
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    for extra in (["--dry-run"], []):
        out = tmp_path / ("dry" if extra else "real")
        proc = forked_cli.run([sys.executable, "-m", "lmk.sweep", str(tmp_path / "spec.yaml"), "--scale", "paper",
                               "--rows", "cls", "--out", str(out), *extra], cwd=ROOT, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "refused before launch: train stage: a training job needs 4.2 h" in proc.stderr
        assert "launcher.timeout=60 stops it at 1.0 h" in proc.stderr and "launcher.max_requeues=4" in proc.stderr
        if extra:  # the dry run prints each row's report and the table first, the verdict in the stage's row
            assert "4.2 h > 1.0 h" in proc.stdout and "REFUSED: a training job needs 4.2 h" in proc.stdout
            assert "estimated 4.2 h against launcher.timeout 1.0 h: EXCEEDS it" in proc.stdout + proc.stderr
            job = json.loads((out / "train" / "jobs.json").read_text())["jobs"][0]
            assert "launcher.timeout=60 stops it" in job["report"]["refusal"]
    assert not (tmp_path / "real" / "train").exists()  # nothing planned into a launch, nothing submitted
