"""results.json through its typed record: every key a writer writes is a field, old files still read, and keys the
record does not name survive a read."""

from __future__ import annotations

import json

import pytest

from lmk.run.results import Results, read_results, update_results

# A training run's results.json as the writers before the typed record left it (nulls where a phase had nothing)
OLD = {
    "status": "done", "error": None, "traceback": None, "config": {"seed": 3, "row": "cls", "eval": {"groups": {
        "short": ["LocalShort"]}}}, "config_hash": "09e8b6c4e2d6", "git_commit": "c80dc15", "resume": {
        "from": None, "step": None, "passed_over": [], "moved_aside": None}, "wandb": None,
    "gradient_checkpointing": {"on": False, "why": "off"}, "metrics": {"train/loss": 2.08, "global_step": 2},
    "timings": {"fit": 1.5}, "data_fingerprint": "8a3b3f0d71117f02", "data": None, "checkpoints": {"last": "x"},
    "export": "run/export", "eval": {"tasks": {"LocalShort": {"main_score": 0.5}}, "groups": {"short": 0.5},
                                     "per_query": "per_query.json", "stage": {"shards": {}}},
    "environment": {"lock": "21ce77ee2296"}, "updated_at": "2026-12-04T22:26:00+0000", "written_by_a_newer_lmk": 1,
}


def test_an_old_results_json_reads_into_the_record(tmp_path) -> None:
    (tmp_path / "results.json").write_text(json.dumps(OLD))
    r = Results.read(tmp_path)
    assert (r.status, r.row_id, r.config_hash, r.config["seed"]) == ("done", "cls", "09e8b6c4e2d6", 3)
    assert r.wandb == {} and r.data == {} and r.interruptions == [] and r.non_finite == {}  # null or absent: empty
    assert r.eval.groups == {"short": 0.5} and r.eval.per_query == "per_query.json" and r.eval.group_tasks == {}
    assert r.section("eval")["groups"] == {"short": ["LocalShort"]} and r.section("logger") == {}
    assert r.eval.extra == {"stage": {"shards": {}}} and r.extra == {"written_by_a_newer_lmk": 1}
    assert Results.read(tmp_path / "none").status is None  # no results.json yet: an empty record


def test_writers_write_only_the_keys_of_the_record(tmp_path) -> None:
    update_results(tmp_path, status="running", config={"row": "mean"})
    update_results(tmp_path, status="done", metrics={"global_step": 4})
    on_disk = read_results(tmp_path)
    assert on_disk["status"] == "done" and on_disk["config"] == {"row": "mean"} and "environment" in on_disk
    assert Results.read(tmp_path).metrics == {"global_step": 4}
    with pytest.raises(TypeError, match="no key 'metric'.*lmk.run.results.Results"):
        update_results(tmp_path, metric={"x": 1})
    assert read_results(tmp_path) == on_disk  # a refused write changes nothing
