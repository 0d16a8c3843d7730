"""Evaluation data prepared once, read-only in the jobs: many eval jobs never convert the same corpora into one
shared `datasets` cache (and never need a working file lock there)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import forked_cli
import pytest
from omegaconf import OmegaConf

from lmk.config.eval import EvalConfig
from lmk.eval import prepared
from lmk.eval.replicas import Sizes, write_replicas

ROOT = Path(__file__).resolve().parent.parent
# a beir task (mteb's v2 loader), a LongEmbed task (v1 attributes, converted by mteb), a multilingual subset
TASKS = ["SciFact", "LEMBNeedleRetrieval", "MultiLongDocRetrieval"]
SIZES = Sizes(n_queries=3, n_docs=6, lengths=(256,))
SUITE = ["eval=table2-rehearsal", f"eval.tasks=[{','.join(TASKS)}]", "~eval.groups",
         "eval.task_options.LEMBNeedleRetrieval.eval_splits=[test_256]"]
MODEL = ["model=null", "encoder=tiny-modernbert", "encoder.config_overrides.num_hidden_layers=1",
         "encoder.config_overrides.hidden_size=32", "encoder.config_overrides.num_attention_heads=2",
         "encoder.config_overrides.intermediate_size=32", "pooling=mean"]
# capabilities that let root write where permission bits forbid it: dropped, a root job obeys chmod a-w
NO_OVERRIDE = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner", "--"]


def _suite(mirror: Path) -> EvalConfig:
    cfg = OmegaConf.load(ROOT / "conf" / "eval" / "table2-rehearsal.yaml")
    cfg.tasks, cfg.groups = TASKS, {}
    cfg.task_options.LEMBNeedleRetrieval.eval_splits = ["test_256"]
    return EvalConfig.from_cfg(cfg)


def _snapshot(*folders: Path) -> dict[str, tuple[int, int, int]]:
    """Every path under `folders` with its inode, size and mtime: any write, rename or new file shows."""
    out = {}
    for folder in folders:
        for p in [folder, *folder.rglob("*")]:
            st = p.lstat()
            out[str(p)] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture()
def offline_mirror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Replicas of TASKS in a mirror, the mirror active, offline, an empty `datasets` cache of this test's own."""
    import datasets

    mirror = tmp_path / "mirror"
    write_replicas(mirror, TASKS, SIZES)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("LMK_HUB_MIRROR", str(mirror))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf" / "datasets")
    return mirror


def _loaded(task) -> dict:
    """What mteb's own loading makes of a task (the state its evaluate starts from)."""
    task.load_data()
    task.convert_v1_dataset_format_to_v2(num_proc=None)
    return {sub: {split: task.dataset[sub][split] for split in task.eval_splits} for sub in task.hf_subsets}


def test_prepared_data_is_what_mteb_loads_and_is_prepared_once(offline_mirror: Path, tmp_path: Path) -> None:
    from lmk.eval.suites import build_tasks

    root, cfg = tmp_path / "prepared", _suite(offline_mirror)
    first = prepared.prepare(cfg, root)
    assert sorted(first) == sorted(TASKS) and all(v.startswith("prepared ") for v in first.values())
    for task in prepared.hub_leaves(build_tasks(cfg)):  # the same rows, columns and qrels as mteb's loading
        folder = prepared.task_folder(root, task)
        assert prepared.incomplete(folder) is None
        want, got = _loaded(task), prepared.read(folder)
        assert set(got) == set(want), task.metadata.name
        for sub, splits in want.items():
            assert set(got[sub]) == set(splits)
            for split, data in splits.items():
                assert set(got[sub][split]) == set(data) == {"corpus", "queries", "relevant_docs", "top_ranked"}
                for key in ("corpus", "queries"):
                    assert got[sub][split][key].features == data[key].features
                    assert got[sub][split][key].to_list() == data[key].to_list(), (task.metadata.name, key)
                assert got[sub][split]["relevant_docs"] == data["relevant_docs"]
                assert got[sub][split]["top_ranked"] == data["top_ranked"]

    # a rerun converts nothing: every task reused, no file under the preparation or the datasets cache changes
    import datasets

    cache = Path(datasets.config.HF_DATASETS_CACHE)
    before = _snapshot(root, cache)
    again = prepared.prepare(cfg, root)
    assert again == {t: v.replace("prepared", "reused") for t, v in first.items()}
    assert _snapshot(root, cache) == before

    # a changed replica gets a new fingerprint and is prepared again; the others are reused
    write_replicas(offline_mirror, ["SciFact"], Sizes(n_queries=2, n_docs=5, lengths=(256,)))
    third = prepared.prepare(cfg, root)
    assert third["SciFact"].startswith("prepared ") and third["SciFact"] != first["SciFact"]
    assert {t: v for t, v in third.items() if t != "SciFact"} == {t: again[t] for t in TASKS if t != "SciFact"}
    task = next(t for t in build_tasks(cfg) if t.metadata.name == "SciFact")
    assert prepared.read(prepared.task_folder(root, task))["default"]["test"]["corpus"].num_rows == 5


def test_a_half_written_preparation_is_not_used_and_is_written_again(offline_mirror: Path, tmp_path: Path) -> None:
    from lmk.eval.suites import build_tasks

    root, cfg = tmp_path / "prepared", _suite(offline_mirror)
    prepared.prepare(cfg, root)
    task = next(t for t in build_tasks(cfg) if t.metadata.name == "SciFact")
    folder = prepared.task_folder(root, task)
    arrow = next((folder / "default" / "test" / "corpus").glob("*.arrow"))
    arrow.write_bytes(arrow.read_bytes()[:100])  # a copy cut short
    assert "truncated" in str(prepared.incomplete(folder))
    with pytest.raises(prepared.PreparedDataError, match="SciFact: .*truncated"):
        prepared.attach(build_tasks(cfg), root)
    assert prepared.prepare(cfg, root)["SciFact"] == f"prepared {folder.name}"
    assert prepared.incomplete(folder) is None
    shutil.rmtree(folder)
    (folder.parent / f".{folder.name}.tmp-1").mkdir()  # a preparation killed before its rename: not a copy
    assert prepared.prepare(cfg, root)["SciFact"] == f"prepared {folder.name}"
    assert prepared.incomplete(folder) is None


def test_a_job_without_its_prepared_data_fails_before_the_model_loads(offline_mirror: Path, tmp_path: Path) -> None:
    from lmk.eval.suites import build_tasks

    cfg = _suite(offline_mirror)
    with pytest.raises(prepared.PreparedDataError, match=r"SciFact: hub.prepared=.*`python -m lmk.eval.prepared --out"):
        prepared.attach(build_tasks(cfg), tmp_path / "empty")
    prepared.prepare(cfg, tmp_path / "p")
    write_replicas(offline_mirror, ["SciFact"], Sizes(n_queries=2, n_docs=5, lengths=(256,)))  # changed since
    with pytest.raises(prepared.PreparedDataError, match=r"SciFact: .*not prepared; prepared: [0-9a-f]{16}"):
        prepared.attach(build_tasks(cfg), tmp_path / "p")


def test_a_task_whose_data_cannot_load_fails_alone(offline_mirror: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    from lmk.eval.suites import build_tasks
    from lmk.hub.mirror import mark_started

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))  # nothing of the hub here
    mark_started(offline_mirror / "datasets" / "mteb" / "scifact", "mteb/scifact", None)  # a download cut short
    report = prepared.prepare(_suite(offline_mirror), tmp_path / "p")
    assert report["SciFact"].startswith("failed: ")
    assert all(report[t].startswith("prepared ") for t in TASKS if t != "SciFact")
    others = [t for t in build_tasks(_suite(offline_mirror)) if t.metadata.name != "SciFact"]
    assert len(prepared.attach(others, tmp_path / "p")) == 2  # the jobs of the other tasks read theirs
    assert not (tmp_path / "p" / "SciFact").exists() or not any((tmp_path / "p" / "SciFact").iterdir())


def _evaluate(run: Path, hf_home: Path, mirror: Path, *extra: str, drop_caps: bool = False
              ) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "LMK_HUB"))}
    env.update(HF_HOME=str(hf_home), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "lmk.evaluate", *MODEL, *SUITE, f"hub.mirror={mirror}", f"hydra.run.dir={run}",
           *extra]
    return forked_cli.run([*NO_OVERRIDE, *cmd] if drop_caps else cmd, cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


def _scores(run: Path) -> tuple[dict, dict]:
    res = json.loads((run / "results.json").read_text())
    assert res["status"] == "done", res.get("error")
    return res["eval"]["tasks"], json.loads((run / "per_query.json").read_text())


@pytest.mark.slow  # four evaluations end to end; what a job reads from prepared data is checked fast by test_prepared_data_is_what_mteb_loads_and_is_prepared_once
def test_eval_job_reads_prepared_data_read_only_with_the_same_scores(tmp_path: Path) -> None:
    """The old path (each job converts into its `datasets` cache) and a job on prepared data made read-only give
    the same scores, query by query; the read-only job writes nothing under the preparation, the mirror or its
    `datasets` cache, and takes no lock there. As root the job runs without the capabilities that ignore
    permission bits, so every write into a chmod a-w folder fails, as it would for any user."""
    root = os.geteuid() == 0
    if root and shutil.which("setpriv") is None:
        pytest.skip("root without setpriv: a read-only folder cannot be made binding for the job")
    mirror, data = tmp_path / "mirror", tmp_path / "prepared"
    write_replicas(mirror, TASKS, SIZES)
    before_fix = _evaluate(tmp_path / "run-old", tmp_path / "hf-old", mirror)  # each job loads (and converts)
    assert before_fix.returncode == 0, before_fix.stderr[-3000:]
    assert list((tmp_path / "hf-old").rglob("*.lock"))  # what every such job does in a shared cache

    env = {**os.environ, "HF_HOME": str(tmp_path / "hf-prepare"), "HF_HUB_OFFLINE": "1"}
    prep = forked_cli.run([sys.executable, "-m", "lmk.eval.prepared", "--out", str(data), *SUITE,
                           f"hub.mirror={mirror}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert prep.returncode == 0, prep.stderr[-3000:]
    assert all(f"{t}" in prep.stdout for t in TASKS) and "3 hub tasks" in prep.stdout

    shared = tmp_path / "hf-shared"  # the jobs' own datasets cache: read-only too
    shared.mkdir()
    forked_cli.run(["chmod", "-R", "a-w", str(data), str(mirror), str(shared)], check=True)
    before = _snapshot(data, mirror, shared)
    # the same job without the prepared data cannot run on a read-only cache: the defect the preparation removes
    old = _evaluate(tmp_path / "run-ro-old", shared, mirror, drop_caps=root)
    assert old.returncode != 0 and "Permission denied" in old.stderr + old.stdout
    job = _evaluate(tmp_path / "run-prepared", shared, mirror, f"hub.prepared={data}", drop_caps=root)
    assert job.returncode == 0, job.stderr[-3000:]
    assert f"eval data of 3 hub tasks read from {data}" in (tmp_path / "run-prepared" / "evaluate.log").read_text()
    assert _snapshot(data, mirror, shared) == before
    assert not [p for d in (data, mirror, shared) for p in d.rglob("*") if p.name.endswith(".lock")]
    tasks_old, per_query_old = _scores(tmp_path / "run-old")
    tasks_new, per_query_new = _scores(tmp_path / "run-prepared")
    assert set(tasks_new) == set(TASKS)
    assert {t: (e["main_score"], e["splits"]) for t, e in tasks_new.items()} == \
        {t: (e["main_score"], e["splits"]) for t, e in tasks_old.items()}
    assert per_query_new == per_query_old
    forked_cli.run(["chmod", "-R", "u+w", str(tmp_path)], check=True)  # so that pytest can clean up
