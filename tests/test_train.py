"""`python -m lmk.train` end to end at tiny size: checkpoints, export, results.json, W&B offline, resume."""

from __future__ import annotations

import csv
import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import forked_cli
import numpy as np
import pytest
from test_tables import wandb_summary  # the reader of a W&B run file's summary

from lmk.run.results import update_results

ROOT = Path(__file__).resolve().parents[1]
CONF = str(ROOT / "conf")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "WANDB_SILENT": "true"}
ENV.pop("WANDB_API_KEY", None)
ENV.pop("WANDB_MODE", None)


def write_pairs(path: Path, n: int = 24) -> Path:
    topics = ["lists", "the moon", "coffee", "sockets", "violins", "rivers", "taxes", "bees"]
    with open(path, "w") as fh:
        for i in range(n):
            t, o = topics[i % 8], topics[(i + 3) % 8]
            fh.write(json.dumps({"query": f"tell me about {t} {i}",
                                 "pos": [f"{t} {i} are described here. All about {t}."],
                                 "neg": [f"a note on {o}, nothing else", f"more on {o} {i}"]}) + "\n")
    return path


def overrides(run_dir: Path, pairs: Path, *extra: str) -> list[str]:
    return ["experiment=tiny", f"hydra.run.dir={run_dir}", f"data.sources=[{{path:'{pairs}'}}]",
            "data.max_rows=null", *extra]


def cli(run_dir: Path, pairs: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "lmk.train", *overrides(run_dir, pairs, *extra)]
    return forked_cli.run(cmd, cwd=ROOT, env=env or ENV, capture_output=True, text=True, timeout=600)


def in_process(run_dir: Path, pairs: Path, *extra: str) -> float | None:
    from hydra import compose, initialize_config_dir

    from lmk.train.command import run

    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"run_dir={run_dir}", *overrides(run_dir, pairs, *extra)[0:1],
                                                      *overrides(run_dir, pairs, *extra)[2:]])
    return run(cfg)


def results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def losses(run_dir: Path) -> list[tuple[int, float]]:
    rows = list(csv.DictReader(open(run_dir / "metrics.csv")))
    return [(int(r["step"]), float(r["train/loss"])) for r in rows if r.get("train/loss")]


@pytest.fixture()
def pairs(tmp_path: Path) -> Path:
    return write_pairs(tmp_path / "pairs.jsonl")


def test_cli_end_to_end_with_wandb_offline(tmp_path, pairs):
    run_dir = tmp_path / "run"
    proc = cli(run_dir, pairs, "encoder=tiny-modernbert", "pooling=lmk-variable", "trainer=cpu", "logger=wandb")
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = results(run_dir)
    assert res["status"] == "done" and res["metrics"]["global_step"] == 3
    assert res["config"]["pooling"]["name"] == "lmk-variable" and "${" not in json.dumps(res["config"])
    assert res["config_hash"] and res["data_fingerprint"] and "fit" in res["timings"]
    assert res["data"]["pairs.jsonl"] == {"path": str(pairs), "rows": 24, "skipped": 0, "skip_reasons": []}
    assert (run_dir / "checkpoints" / "last.ckpt").exists() and (run_dir / "checkpoints" / "best.ckpt").exists()
    assert losses(run_dir), "metrics.csv has the training loss"
    # W&B: an offline run folder that `wandb sync` accepts, and the sync hint.
    runs = glob.glob(str(run_dir / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert runs, list(run_dir.rglob("*"))[:20]
    assert res["wandb"]["mode"] == "offline" and res["wandb"]["sync"].startswith("wandb sync ")
    assert "wandb sync" in proc.stderr + proc.stdout
    # Landmark statistics of the training source, as training laid its texts out: every text is shorter than the
    # smallest chunk size drawn (32), so one landmark each; the W&B run's summary carries the same figures.
    figures = res["landmarks"]["train"]["pairs.jsonl"]
    assert figures["rows"] == 24 and figures["passage"]["texts"] == 72 and figures["query"]["texts"] == 24
    assert figures["passage"]["landmarks"]["mean"] == 1.0 and figures["passage"]["single_landmark_share"] == 1.0
    summary, _ = wandb_summary(run_dir, res["wandb"]["id"])
    assert summary["landmarks/train/pairs.jsonl/passage/single_landmark_share"] == 1.0
    assert summary["landmarks/train/pairs.jsonl/query/truncated_share"] == figures["query"]["truncated_share"]
    # tokens computed against real tokens (lmk.train.chunks): results.json and the W&B summary alike
    assert 0 < res["fill"]["fill"] < 1 and summary["fill/fill"] == res["fill"]["fill"]
    # The export reloads and embeds like the final checkpoint's weights.
    import torch

    from lmk.export import load_exported
    from lmk.model.embedding import EmbeddingModel

    exported = load_exported(run_dir / "export")
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    fresh = EmbeddingModel.build(res["config"]["encoder"], res["config"]["pooling"], query_max_length=16,
                                 passage_max_length=48)
    fresh.load_state_dict({k.removeprefix("model."): v for k, v in state.items()})
    texts = ["the moon and its phases", "a short one"]
    np.testing.assert_allclose(exported.encode(texts), fresh.encode(texts), atol=1e-5)


def test_config_typo_fails_before_training(tmp_path, pairs):
    run_dir = tmp_path / "bad"
    proc = cli(run_dir, pairs, "+trainer.max_stepz=3")
    assert proc.returncode != 0
    assert "max_stepz" in proc.stderr and "allowed keys" in proc.stderr and "max_steps" in proc.stderr
    assert not (run_dir / "checkpoints").exists()


def test_same_seed_same_metrics_and_resume_continues(tmp_path, pairs):
    a, b = tmp_path / "a", tmp_path / "b"
    # A previous failed/evaluated run in a's folder: a new (not resumed) run must not inherit it.
    update_results(a, status="failed", error="RuntimeError: old", eval={"groups": {"old": 1.0}})
    in_process(a, pairs, "seed=3", "trainer.max_steps=2")
    in_process(b, pairs, "seed=3", "trainer.max_steps=2")
    assert losses(a) == losses(b) and len(losses(a)) == 2
    assert results(a)["metrics"]["train/loss"] == results(b)["metrics"]["train/loss"]
    assert "error" not in results(a) and "eval" not in results(a)
    assert results(a)["timings"]["fit_steps"] == 2
    # Continue a's last.ckpt (step 2) up to step 4 under a changed max_steps: only a named checkpoint file does
    # that (the resume rule never takes another config's weights); two more steps, appended to metrics.csv.
    in_process(a, pairs, "seed=3", "trainer.max_steps=4", f"ckpt_path={a / 'checkpoints' / 'last.ckpt'}")
    res = results(a)
    assert res["metrics"]["global_step"] == 4
    assert res["checkpoints"]["resumed_from"].endswith("last.ckpt")
    assert res["timings"]["fit_steps"] == 2  # this fit ran steps 2..3 only (throughput is per fit)
    assert [s for s, _ in losses(a)] == [0, 1, 2, 3]


def test_wandb_failure_never_kills_the_run(tmp_path, pairs, monkeypatch, caplog, recwarn):
    monkeypatch.setenv("WANDB_MODE", "not-a-mode")  # wandb.init raises on this
    run_dir = tmp_path / "wb"
    in_process(run_dir, pairs, "logger=wandb", "trainer.max_steps=1")
    # The user is told: a warning, which reaches the log once the run's console routes warnings there (the first
    # run in a process switches that on, so either channel may carry it).
    told = [str(w.message) for w in recwarn] + [r.getMessage() for r in caplog.records]
    assert any("W&B init failed" in m and "continuing with the CSV log only" in m for m in told), told
    res = results(run_dir)
    assert res["status"] == "done" and res["wandb"] == {}
    assert losses(run_dir)


def test_failure_is_recorded(tmp_path, pairs):
    run_dir = tmp_path / "fail"
    with pytest.raises(FileNotFoundError):
        in_process(run_dir, pairs, "ckpt_path=/nonexistent/x.ckpt")
    res = results(run_dir)
    assert res["status"] == "failed" and "nonexistent" in res["error"]


@pytest.mark.slow  # two ranks through the command line; DDP's equality with one process is checked fast in tests/test_module.py
def test_cli_ddp_two_cpu_processes(tmp_path, pairs):
    run_dir = tmp_path / "ddp"
    proc = cli(run_dir, pairs, "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2",
               "trainer.precision=32-true", "trainer.deterministic=true", "trainer.max_steps=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert results(run_dir)["status"] == "done" and results(run_dir)["metrics"]["global_step"] == 2


def test_unreachable_wandb_server_falls_back_to_offline(tmp_path, pairs, monkeypatch):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)  # credentials present: mode auto -> online
    run_dir = tmp_path / "wb"
    with pytest.warns(UserWarning, match="logging offline instead"):
        in_process(run_dir, pairs, "logger=wandb", "logger.init_timeout=2", "trainer.max_steps=1")
    res = results(run_dir)
    assert res["status"] == "done" and res["wandb"]["mode"] == "offline"
    assert Path(res["wandb"]["dir"]).is_dir() and res["wandb"]["dir"].startswith(str(run_dir / "wandb" / "offline-run-"))
    assert glob.glob(str(Path(res["wandb"]["dir"]) / "run-*.wandb"))


def test_seed_varies_init_data_order_and_scores(tmp_path, pairs):
    def weights(run_dir: Path) -> dict:
        import torch

        return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]

    for seed in (0, 1):
        in_process(tmp_path / f"s{seed}", pairs, f"seed={seed}", "trainer.max_steps=2")
    r0, r1 = results(tmp_path / "s0"), results(tmp_path / "s1")
    assert r1["config"]["encoder"]["seed"] == 1 and r1["config"]["data"]["seed"] == 1  # derived from seed
    assert r0["config_hash"] != r1["config_hash"]
    assert losses(tmp_path / "s0") != losses(tmp_path / "s1")
    w0, w1 = weights(tmp_path / "s0"), weights(tmp_path / "s1")
    assert any(not np.array_equal(w0[k].numpy(), w1[k].numpy()) for k in w0)
