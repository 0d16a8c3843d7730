"""Checkpoints a kill cannot truncate, and the one resume rule every job start applies (lmk.train.checkpoints)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

from lmk.run.results import update_results
from lmk.train import checkpoints as ck

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_train import in_process, results, write_pairs  # noqa: E402


def _save(path: Path, step: int, digest: str | None, size: int = 16) -> None:
    ck.AtomicCheckpointIO().save_checkpoint(
        {"global_step": step, "state_dict": {"w": torch.full((size,), float(step))},
         ck.RUN_KEY: {"config_hash": digest, "global_step": step}}, path)


def test_a_failed_save_leaves_the_previous_checkpoint_whole(tmp_path):
    path = tmp_path / "checkpoints" / "last.ckpt"
    _save(path, 1, "abc")

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("quota exceeded")  # the write dies half-way

    with pytest.raises(RuntimeError, match="quota"):
        ck.AtomicCheckpointIO().save_checkpoint({"global_step": 2, "x": torch.zeros(4), "y": Unpicklable()}, path)
    info, why = ck.read_info(path)
    assert info is not None and info.global_step == 1 and why == ""
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]  # no temporary file left behind


def _save_until_killed(path: str, saved) -> None:  # noqa: ANN001 - a multiprocessing Event
    """Big saves, one after another, until killed (in a process forked from the test's: torch is imported already)."""
    torch.set_num_threads(1)  # no OpenMP team in a forked child: the parent's would not exist there
    step = 0
    while True:
        step += 1
        ck.AtomicCheckpointIO().save_checkpoint({"global_step": step, "w": torch.full((8_000_000,), float(step)),
                                                 ck.RUN_KEY: {"config_hash": "abc", "global_step": step}}, path)
        saved.set()


def test_sigkill_during_saves_never_leaves_a_truncated_checkpoint(tmp_path):
    path = tmp_path / "checkpoints" / "last.ckpt"
    fork = multiprocessing.get_context("fork")
    saved = fork.Event()
    proc = fork.Process(target=_save_until_killed, args=(str(path), saved), daemon=True)
    proc.start()
    assert saved.wait(timeout=300)  # one save finished
    time.sleep(0.3)  # somewhere inside a later save
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    assert proc.exitcode == -signal.SIGKILL
    info, why = ck.read_info(path)
    assert info is not None, why  # the last complete save loads
    assert torch.load(path, weights_only=True)["w"][0].item() == info.global_step
    ck.clear_partial_saves(tmp_path)  # a job start removes what the kill left
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]


def test_the_rule_takes_the_newest_checkpoint_that_loads_and_carries_the_config(tmp_path):
    folder = tmp_path / "checkpoints"
    _save(folder / "best.ckpt", 2, "abc")
    _save(folder / "last.ckpt", 4, "abc")
    assert ck.resume_point("auto", tmp_path, "abc").path == folder / "last.ckpt"
    # a node dies mid-copy (an old, non-atomic save): last.ckpt is truncated; the rule passes over it
    data = (folder / "last.ckpt").read_bytes()
    (folder / "last.ckpt").write_bytes(data[: len(data) // 2])
    point = ck.resume_point("auto", tmp_path, "abc")
    assert point.path == folder / "best.ckpt" and point.step == 2
    assert point.skipped[0][0].name == "last.ckpt" and "does not load" in point.skipped[0][1]
    assert "passed over: last.ckpt does not load" in point.describe()


def test_a_changed_config_never_resumes_old_weights(tmp_path):
    _save(tmp_path / "checkpoints" / "last.ckpt", 4, "old")
    point = ck.resume_point("auto", tmp_path, "new")
    assert point.path is None and point.moved_to is not None
    assert (point.moved_to / "last.ckpt").is_file()  # kept, out of the way
    assert "config new" in (point.moved_to / "WHY").read_text()
    assert not (tmp_path / "checkpoints").exists()


def test_fresh_starts_and_named_files(tmp_path):
    _save(tmp_path / "checkpoints" / "last.ckpt", 4, "abc")
    # overwrite=true of a finished run: a fresh start, even under the same config
    assert ck.resume_point("auto", tmp_path, "abc", start_over=True).path is None
    _save(tmp_path / "checkpoints" / "last.ckpt", 3, "abc")
    assert ck.resume_point(None, tmp_path, "abc").moved_to is not None  # ckpt_path=null
    other = tmp_path / "elsewhere.ckpt"
    _save(other, 7, "another-config")
    point = ck.resume_point(str(other), tmp_path, "abc")  # a named file: taken as it is, hash not compared
    assert point.path == other and point.step == 7
    other.write_bytes(b"not a checkpoint")
    with pytest.raises(FileNotFoundError, match="ckpt_path=.*does not load"):
        ck.resume_point(str(other), tmp_path, "abc")


# ------------------------------------------------------------------------------------ through lmk.train


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    return write_pairs(tmp_path_factory.mktemp("data") / "pairs.jsonl")


def test_an_interrupted_run_with_a_truncated_last_resumes_from_the_newest_that_loads(tmp_path, pairs):
    run = tmp_path / "run"
    in_process(run, pairs, "trainer.max_steps=3", "train.checkpoint_every_n_steps=1", "train.monitor=train/loss")
    # as if killed mid-save by a non-atomic writer after step 3, with best.ckpt of an earlier step beside it
    last = run / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[:1000])
    update_results(run, status="running")
    in_process(run, pairs, "trainer.max_steps=3", "train.checkpoint_every_n_steps=1", "train.monitor=train/loss")
    res = results(run)
    assert res["status"] == "done"
    assert res["resume"]["from"].endswith("best.ckpt") and "last.ckpt: does not load" in res["resume"]["passed_over"][0]
    assert res["interruptions"][-1]["error"].startswith("stopped without a trace")
    assert ck.read_info(last)[0].global_step == 3  # rewritten whole


def test_a_rerun_under_a_changed_config_starts_over_with_the_old_checkpoints_aside(tmp_path, pairs):
    run = tmp_path / "run"
    in_process(run, pairs, "trainer.max_steps=2", "train.checkpoint_every_n_steps=1")
    update_results(run, status="failed", error="RuntimeError: node lost")
    in_process(run, pairs, "trainer.max_steps=2", "train.checkpoint_every_n_steps=1", "train.lr=1e-5")
    res = results(run)
    assert res["status"] == "done" and res["resume"]["from"] is None and res["timings"]["fit_steps"] == 2
    aside = Path(res["resume"]["moved_aside"])
    assert aside.parent.name == ck.SUPERSEDED_DIR and (aside / "last.ckpt").is_file()
    assert ck.read_info(run / "checkpoints" / "last.ckpt")[0].config_hash == res["config_hash"]
