"""The Table-2 sweep: the paper scale's dry run, and a real tiny-scale sweep -> table, with resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import forked_cli
import pytest
import yaml
from validated_rows import validated_rows

from lmk.run.results import read_results, update_results
from lmk.sweep import pinned
from lmk.sweep.spec import load_spec

SPEC = "experiments/table2/spec.yaml"
ROOT = Path(__file__).resolve().parent.parent


def sweep(*args: str, cwd: Path = ROOT, timeout: float = 600) -> subprocess.CompletedProcess:
    return forked_cli.run([sys.executable, "-m", "lmk.sweep", SPEC, *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.slow  # a paper dry run end to end; the fast suite keeps one (tests/test_cost.py)
def test_paper_dry_run_builds_the_cluster_jobs(tmp_path: Path) -> None:
    out = tmp_path / "paper"
    proc = sweep("--scale", "paper", "--dry-run", "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plan = json.loads((out / "train" / "jobs.json").read_text())
    rows = [j["row"] for j in plan["jobs"]]
    spec = load_spec(ROOT / SPEC)
    # the spec's trained rows, optional ones included (a MaxSim row, scoring_of, is scored from its row's model)
    assert rows == [r.id for r in spec.rows_for(spec.scale("paper")) if r.scoring_of is None]
    assert any(r.optional for r in spec.rows_for(spec.scale("paper")))
    assert "pooling.chunk_size=64" in {j["row"]: j for j in plan["jobs"]}["every-k"]["overrides"]  # every_64
    by_row = {j["row"]: j for j in plan["jobs"]}
    assert "pooling=lmk-fixed" in by_row["lmk-fixed-64"]["overrides"]
    assert "pooling.chunk_size=64" in by_row["lmk-fixed-64"]["overrides"]
    assert all("experiment=table2-paper" in j["overrides"] and "launcher=submitit_slurm" in j["overrides"]
               for j in plan["jobs"])
    assert len({j["config_hash"] for j in plan["jobs"]}) == len(rows)  # every row is a distinct config
    launcher = plan["launcher"]
    assert launcher["_target_"].endswith("submitit_launcher.SlurmLauncher")
    # the authors' 20 GPUs x 256 queries (run_20gpus_mdl): 5 nodes x 4 GPUs, one task per GPU
    assert launcher["nodes"] == 5 and launcher["gpus_per_node"] == 4 and launcher["tasks_per_node"] == 4
    assert {j["effective_batch"]["queries"] for j in plan["jobs"]} == {5120}
    assert "effective batch 5120 queries (256 per device x 4 devices x 5 nodes" in proc.stdout + proc.stderr
    assert plan["command"][0].startswith("python -m lmk.train experiment=table2-paper")
    assert not (out / "train" / "cls" / "results.json").exists()  # nothing launched


def test_paper_rows_compose_to_the_paper_hyperparameters() -> None:
    from hydra import compose, initialize_config_dir

    from lmk.train.trainer_args import validate_training

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose("train", overrides=["experiment=table2-paper", "pooling=lmk-variable", "+row=x",
                                          "launcher=submitit_slurm", "run_dir=/tmp/x"])
    typed = validate_training(cfg)
    assert cfg.encoder.model_id == "answerdotai/ModernBERT-base"
    assert typed.train.lr == 2e-5 and typed.train.tau == 0.02 and typed.train.warmup_steps == 250
    assert cfg.trainer.max_steps == 5000 and cfg.trainer.precision == "bf16-mixed"
    assert cfg.data.batch_size == 256 and cfg.data.query_max_length == 128 and cfg.data.passage_max_length == 512
    assert cfg.eval.query_max_length == 8192 and cfg.eval.passage_max_length == 8192
    assert list(cfg.pooling.train_chunk_sizes) == [32, 64, 128, 256] and cfg.pooling.chunk_size == 32
    assert set(cfg.eval.groups) >= {"msmarco-dev", "beir15", "mteb-v2-retrieval", "coir", "mldr-eng", "longembed6"}


def test_bad_row_fails_before_training(tmp_path: Path) -> None:
    spec = (ROOT / SPEC).read_text().replace("overrides: [pooling=mean]", "overrides: [pooling=meen]")
    bad = tmp_path / "spec.yaml"
    bad.write_text(spec)
    proc = forked_cli.run([sys.executable, "-m", "lmk.sweep", str(bad), "--scale", "tiny", "--out",
                           str(tmp_path / "o")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "unknown pooling 'meen'" in proc.stderr and "mean" in proc.stderr
    assert not (tmp_path / "o" / "train").exists()


def test_misspelt_key_in_a_row_names_the_row(tmp_path: Path) -> None:
    spec = (ROOT / SPEC).read_text().replace("pooling.chunk_size=64", "pooling.chunk_sise=64")
    bad = tmp_path / "spec.yaml"
    bad.write_text(spec)
    proc = forked_cli.run([sys.executable, "-m", "lmk.sweep", str(bad), "--scale", "tiny", "--out",
                           str(tmp_path / "o")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "row 'lmk-fixed-64'" in proc.stderr and "chunk_sise" in proc.stderr, proc.stderr
    assert "did you mean pooling.chunk_size" in proc.stderr
    assert "make reproduce-table2" not in out and "Traceback" not in out  # no advice to run another scale
    assert not (tmp_path / "o" / "train" / "cls" / "results.json").exists()  # nothing launched


def test_spec_error_is_one_line(tmp_path: Path) -> None:
    spec = (ROOT / SPEC).read_text().replace("overrides: [pooling=mean]", "overrides: [pooling=meen]")
    bad = tmp_path / "spec.yaml"
    bad.write_text(spec)
    cmd = [sys.executable, "-m", "lmk.sweep", str(bad), "--scale", "tiny", "--out", str(tmp_path / "o")]
    proc = forked_cli.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()  # what is wrong, and the fix
    assert len(lines) <= 2 and lines[0].startswith("Error: ") and "unknown pooling 'meen'" in proc.stderr, proc.stderr
    full = forked_cli.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HYDRA_FULL_ERROR": "1"})
    assert full.returncode != 0 and "Traceback" in full.stderr and "unknown pooling 'meen'" in full.stderr


def loud_spec(tmp_path: Path) -> Path:
    """The tiny scale as loud as mini: W&B (offline), Lightning's progress bar and the encode bars asked for."""
    spec = yaml.safe_load((ROOT / SPEC).read_text())
    spec["scales"]["tiny"]["train_overrides"] += ["logger=wandb", "trainer.enable_progress_bar=true",
                                                  "eval.show_progress=true"]
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@pytest.mark.slow  # a whole sweep, then the row sweeper over it; the sweeper's resume and failure decisions are checked fast in tests/test_sweep_faults.py
def test_tiny_sweep_end_to_end_with_resume_and_failure(tmp_path: Path) -> None:
    out, spec = tmp_path / "tiny", loud_spec(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "LMK_VERBOSE"}
    args = [sys.executable, "-m", "lmk.sweep", str(spec), "--scale", "tiny", "--rows", "cls,lmk-fixed-32", "--out",
            str(out)]
    proc = forked_cli.run(args, cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # What a user sees (stdout is a pipe, not a terminal): per row a start, a progress and a result line, no
    # bars, no banners; the table; each row's log file keeps the detail.
    console = proc.stdout + proc.stderr
    md = (out / "table2.md").read_text()
    assert len(console.splitlines()) <= 2 * 12 + len(md.splitlines()) + 8, console
    assert "\r" not in console and "Epoch 0/-2" not in console and "Traceback" not in console
    for row in ("cls", "lmk-fixed-32"):
        mine = [line for line in console.splitlines() if line.startswith((f"row {row} ", f"row {row}:", f"{row}: "))]
        assert 3 <= len(mine) <= 12, mine
        assert sum("W&B" in line or "wandb" in line for line in mine) == 1, mine  # `wandb sync` in the result line
        assert any(line.startswith(f"{row}: step 2/2") for line in mine), mine
        log = (out / "train" / row / "train.log").read_text()
        assert "Running retrieval task" in log and "wandb" in log and "GPU available" in log
    # one W&B line per row, one for the table's W&B run (the `$ ...` command line names logger=wandb)
    assert sum("wandb" in line.lower() for line in console.splitlines() if not line.startswith("$")) <= 2 + 1
    assert "| CLS |" in md and "| LMK-fixed-32 |" in md and "Provenance" in md
    for row in ("cls", "lmk-fixed-32"):
        res = read_results(out / "train" / row)
        assert res["status"] == "done" and res["config"]["row"] == row
        assert 0.0 <= res["eval"]["groups"]["local-passkey"] <= 1.0
        assert (out / "train" / row / res["eval"]["per_query"]).exists()
    cells = json.loads((out / "table2.json").read_text())["cells"]
    assert {c["run_dir"] for c in cells if c["row"] == "cls" and c["value"] is not None} == {str(out / "train" / "cls")}
    assert "table written to" in proc.stdout

    # Resume: a row whose config hash is unchanged is skipped, nothing recomputed (lmk-fixed-32 below); a whole
    # sweep run again skips every row through the driver in test_tiny_sweep_over_seeds.
    before = (out / "train" / "lmk-fixed-32" / "results.json").stat().st_mtime_ns

    # A changed config for one row is recomputed; a failing row is recorded and the others go on.
    update_results(out / "train" / "cls", config_hash="stale")
    rows = out / "train" / "rows2.yaml"
    rows.write_text("cls: [pooling=cls]\nlmk-fixed-32: [pooling=lmk-fixed, pooling.chunk_size=32]\n"
                    "broken: [pooling=mean, 'data.sources=[{path: /nonexistent/pairs.jsonl}]']\n")
    proc = forked_cli.run(
        [sys.executable, "-m", "lmk.train", "-m", "experiment=table2-tiny", "logger=wandb",
         "trainer.enable_progress_bar=true", "eval.show_progress=true", "hydra/sweeper=rows",
         f"hydra.sweeper.rows_file={rows}", f"hydra.sweep.dir={out / 'train'}", "hydra.sweeper.max_batch_size=1"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    status = json.loads((out / "train" / "sweep_status.json").read_text())
    assert status["lmk-fixed-32"]["status"] == "skipped"
    assert (proc.stdout + proc.stderr).count("skip (done, same config)") == 1
    assert (out / "train" / "lmk-fixed-32" / "results.json").stat().st_mtime_ns == before
    assert status["cls"]["status"] == "completed"        # stale hash -> recomputed
    assert status["broken"]["status"] == "failed" and "nonexistent" in status["broken"]["error"]
    # the row's line names what is wrong and the fix, no traceback
    (failed,) = [line for line in proc.stdout.splitlines() if line.startswith("row broken: FAILED")]
    assert "nonexistent" in failed and "give existing" in failed and "Traceback" not in proc.stdout + proc.stderr
    assert read_results(out / "train" / "broken")["status"] == "failed"
    assert read_results(out / "train" / "cls")["config_hash"] != "stale"


@pytest.mark.slow  # the mini dry run composes every job; each mini row composes and validates fast in test_every_row_of_every_scale_composes_and_validates
def test_mini_scale_dry_run_and_zero_shot_block(tmp_path: Path) -> None:
    proc = sweep("--scale", "mini", "--dry-run", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    zs = json.loads((tmp_path / "zeroshot" / "jobs.json").read_text())
    assert "lmk-variable" not in [j["row"] for j in zs["jobs"]]  # untrained, it equals lmk-fixed-32


@pytest.mark.slow  # about 4 minutes on 2 quiet cores, over 10 when they are shared: the real mini recipe, two rows
@pytest.mark.timeout(1800)
def test_mini_scale_two_rows_for_real(tmp_path: Path) -> None:
    proc = sweep("--scale", "mini", "--rows", "cls,lmk-fixed-32", "--no-zero-shot", "--out", str(tmp_path),
                 timeout=1700)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for row in ("cls", "lmk-fixed-32"):
        res = read_results(tmp_path / "train" / row)
        assert res["status"] == "done" and res["metrics"]["global_step"] == 15
        assert set(res["eval"]["groups"]) >= {"local-short", "local-longdoc", "local-passkey", "local-needle"}
        assert (tmp_path / "train" / row / "export" / "modules.json").exists()
    assert "| LMK-fixed-32 |" in (tmp_path / "table2.md").read_text()
    # the two rows print what the README's mini table (experiments/table2/pinned.json) shows for them
    rows = ["cls", "lmk-fixed-32"]
    drifts = pinned.compare(pinned.load_pinned(SPEC)["mini"], pinned.measured_rows(
        json.loads((tmp_path / "table2.json").read_text())), rows=rows)
    assert not drifts, pinned.drift_message(drifts, SPEC, "mini", tmp_path)


def test_config_hash_follows_values_interpolated_from_the_launcher() -> None:
    from hydra import compose, initialize_config_dir

    from lmk.run.results import config_hash_of

    def digest(*extra: str) -> str:
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            cfg = compose(config_name="train", overrides=["trainer=ddp-multinode", "launcher=submitit_slurm", *extra])
        return config_hash_of(cfg)

    base = digest()
    # Where a job is queued does not change its numbers; the node count (global batch, negatives) does.
    assert digest("launcher.partition=other") == base
    assert digest("launcher.nodes=4") != base
    assert digest("launcher.gpus_per_node=2") != base
    # How encode batches are built does not change the embeddings (bitwise); what is evaluated does.
    assert digest("eval.workers=0", "eval.prefetch=7") == base
    assert digest("eval.batch_size=7") != base


@pytest.mark.slow  # four tiny trainings with evaluation: about 90 s on 2 busy cores
def test_tiny_sweep_over_seeds(tmp_path: Path) -> None:
    out = tmp_path / "tiny"
    args = ("--scale", "tiny", "--rows", "cls,lmk-fixed-32", "--seeds", "0,1", "--no-zero-shot", "--out", str(out))
    proc = sweep(*args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for row in ("cls", "lmk-fixed-32"):
        runs = [read_results(out / "train" / row / f"seed{k}") for k in (0, 1)]
        assert [r["config"]["seed"] for r in runs] == [0, 1] and all(r["status"] == "done" for r in runs)
        assert runs[0]["config"]["data"]["seed"] == 0 and runs[1]["config"]["data"]["seed"] == 1
        assert runs[0]["eval"]["groups"] != runs[1]["eval"]["groups"] or \
            runs[0]["metrics"]["train/loss"] != runs[1]["metrics"]["train/loss"]
    cells = json.loads((out / "table2.json").read_text())["cells"]
    cls_avg = next(c for c in cells if c["row"] == "cls" and c["column"] == "avg")
    assert cls_avg["n_seeds"] == 2 and cls_avg["std"] is not None and "p_value_seeds" in cls_avg
    assert "\u00b1" in (out / "table2.md").read_text()
    again = sweep(*args)  # finished (row, seed) jobs are skipped
    assert again.returncode == 0
    assert (again.stdout + again.stderr).count("skip (done, same config)") == 4


@pytest.mark.parametrize("scale", list(load_spec(ROOT / SPEC).scales))
def test_every_row_of_every_scale_composes_and_validates(scale: str) -> None:
    """The spec is data that is meant to change: no test pins its rows; every row must compose to a job that
    passes the checks the row sweeper runs before launching (validation, then this machine)."""
    spec = load_spec(ROOT / SPEC)
    trained = [r.id for r in spec.rows_for(spec.scale(scale), with_optional=True) if r.scoring_of is None]
    assert list(validated_rows(ROOT / SPEC, scale)) == trained
