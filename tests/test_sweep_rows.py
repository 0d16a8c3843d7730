"""What the sweep does with each row (lmk.sweep.rows.decide), from the facts the row sweeper gathers."""

from __future__ import annotations

import dataclasses
import os
import socket

import pytest

from lmk.run.results import Results, update_results
from lmk.sweep.rows import RowState, decide, finished_after_all, newer_holder, recorded_job


def state(**facts) -> RowState:
    base = {"job": "r", "digest": "abc", "results": {}, "record": {}, "lock": "free", "lock_owner": None,
            "recorded_job": "none", "recorded_state": None, "has_checkpoints": False}
    facts = {**base, **facts}
    results = facts["results"]
    return RowState(**{**facts, "results": results if isinstance(results, Results) else Results.from_dict(results)})


def test_a_job_the_scheduler_still_holds_is_reattached_never_submitted_again():
    pending = state(record={"status": "launched", "job_id": "41_0"}, recorded_job="alive", recorded_state="PENDING",
                    lock="free", results={})  # a pending job has no lock yet: the old plan launched it again
    d = decide(pending)
    assert d.action == "reattach" and "job 41_0" in d.why and "PENDING" in d.why
    assert decide(pending, force=True).action == "reattach"  # even a forced sweep never runs two jobs in one folder
    running = state(record={"status": "launched", "job_id": "41_1"}, recorded_job="alive", lock="alive",
                    results={"status": "running", "config_hash": "abc"})
    assert decide(running).action == "reattach"


@pytest.mark.parametrize("facts, action, why", [
    ({"results": {"status": "done", "config_hash": "abc"}}, "skip", "done, same config"),
    ({"results": {"status": "done", "config_hash": "old"}}, "launch", "changed config: starts over"),
    ({"results": {"status": "interrupted", "config_hash": "abc"}, "has_checkpoints": True}, "launch",
     "resumes from its last checkpoint"),
    ({"results": {"status": "failed", "config_hash": "abc"}}, "launch", "starts over (no checkpoint)"),
    ({}, "launch", "new"),
    ({"lock": "alive", "lock_owner": {"pid": 7, "host": "h", "job_id": "9"}}, "busy", "pid 7 on h (job 9)"),
    ({"lock": "unknown", "lock_owner": {"pid": 7, "host": "h"}}, "busy", "cannot be checked from here"),
    ({"results": {"status": "failed", "config_hash": "abc", "non_finite": {"what": "loss", "step": 3}},
      "has_checkpoints": True}, "not_retried", "a rerun of the same config replays the same batches"),
])
def test_each_rule(facts, action, why):
    d = decide(state(**facts))
    assert d.action == action and why in d.why


def test_overwrite_force_and_retrying_a_nan():
    done_old = decide(state(results={"status": "done", "config_hash": "old"}))
    assert done_old.overwrite and not done_old.start_over
    forced = decide(state(results={"status": "interrupted", "config_hash": "abc"}, has_checkpoints=True), force=True)
    assert forced.action == "launch" and forced.start_over and not forced.resumes and forced.why == "forced: starts over"
    nan = state(results={"status": "failed", "config_hash": "abc", "non_finite": {"what": "loss", "step": 1}})
    assert decide(nan, retry_nonfinite=True).action == "launch"
    # under another config the NaN row is simply a new run
    assert decide(state(results=dataclasses.replace(nan.results, config_hash="new"))).action == "launch"


def test_the_recorded_job_is_judged_by_its_scheduler():
    assert recorded_job({}) == ("none", None)
    assert recorded_job({"status": "completed", "job_id": "5"}) == ("none", None)  # seen to end
    here = {"status": "launched", "scheduler": "local", "host": socket.gethostname()}
    assert recorded_job({**here, "job_id": str(os.getpid())}) == ("alive", "RUNNING")  # its controller lives
    assert recorded_job({**here, "job_id": "999999999"})[0] == "dead"
    assert recorded_job({**here, "host": "elsewhere", "job_id": "5"})[0] == "unknown"


def test_a_job_reported_failed_whose_folder_records_it_done_counts_as_finished(tmp_path) -> None:
    update_results(tmp_path, status="done", config_hash="abc")
    assert finished_after_all(tmp_path, "abc")
    assert not finished_after_all(tmp_path, "other")  # done under another config: this job's failure stands
    update_results(tmp_path, status="failed")
    assert not finished_after_all(tmp_path, "abc") and not finished_after_all(tmp_path / "none", "abc")


def test_only_a_newer_job_or_run_makes_an_outcome_stale() -> None:
    mine = {"status": "launched", "job_id": "45_1", "queued_at": 1_000_000_000.0}
    done = Results(status="done", config_hash="other", updated_at="2001-09-09T01:46:50+0000")  # 10 s after queued
    assert newer_holder(mine, {"job_id": "48_1"}, Results(), "abc") == "job 48_1"
    assert "done at 2001-09-09T01:46:50+0000 under config other" in newer_holder(mine, {}, done, "abc")
    # the job's own record, its own finished run, or a run of another config from before it was queued: its outcome
    assert newer_holder(mine, {**mine, "status": "reattached"}, done, "other") is None
    assert newer_holder(mine, {}, dataclasses.replace(done, updated_at="2001-09-09T01:46:30+0000"), "abc") is None
    assert newer_holder({"status": "launched", "job_id": "45_1"}, {}, done, "abc") is None  # undated: kept
    assert newer_holder({"status": "completed"}, {"job_id": "48_1"}, Results(), "abc") is None  # in-process: no id
