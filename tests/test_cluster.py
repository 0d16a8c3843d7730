"""lmk.run.cluster: Lightning reads the ranks of submitit's local executor (and spawns nothing itself)."""

from __future__ import annotations

import pytest

from lmk.run.cluster import SubmititEnvironment, cluster_plugins, submitit_rank, under_submitit_local

TASK = {"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_JOB_ID": "4242", "SUBMITIT_LOCAL_NTASKS": "2",
        "SUBMITIT_LOCAL_JOB_NUM_NODES": "1", "SUBMITIT_LOCAL_NODEID": "0", "SUBMITIT_LOCAL_GLOBALID": "1",
        "SUBMITIT_LOCAL_LOCALID": "1"}


@pytest.fixture
def task(monkeypatch):
    for key in ("SLURM_JOB_ID", "MASTER_PORT", "MASTER_ADDR"):
        monkeypatch.delenv(key, raising=False)
    for key, value in TASK.items():
        monkeypatch.setenv(key, value)


def test_reads_submitit_job_environment(task):
    env = SubmititEnvironment()
    assert SubmititEnvironment.detect() and env.creates_processes_externally
    assert (env.world_size(), env.global_rank(), env.local_rank(), env.node_rank()) == (2, 1, 1, 0)
    assert env.main_address == "127.0.0.1"
    assert 20000 <= env.main_port < 40000 and env.main_port == SubmititEnvironment().main_port  # every task agrees
    assert submitit_rank() == 1
    assert [type(p) for p in cluster_plugins()] == [SubmititEnvironment]
    env.validate_settings(num_devices=2, num_nodes=1)
    with pytest.raises(ValueError, match="trainer.devices to launcher.tasks_per_node"):
        env.validate_settings(num_devices=1, num_nodes=1)


def test_lightning_uses_it_and_spawns_nothing(task):
    import lightning.pytorch as pl

    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", plugins=cluster_plugins(), logger=False)
    strategy = trainer.strategy
    assert isinstance(strategy.cluster_environment, SubmititEnvironment)
    assert strategy.global_rank == 1 and strategy.world_size == 2 and strategy.local_rank == 1
    assert strategy._process_group_backend is None or strategy._get_process_group_backend() == "gloo"


def test_not_detected_outside_submitit_or_under_slurm(task, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "7")  # SLURM jobs: Lightning's SLURMEnvironment reads them
    assert not under_submitit_local() and cluster_plugins() == [] and submitit_rank() is None
    monkeypatch.delenv("SLURM_JOB_ID")
    monkeypatch.delenv("SUBMITIT_EXECUTOR")
    assert not under_submitit_local() and submitit_rank() is None


# ---- two nodes x two ranks on this machine ---------------------------------------------------------------
def test_slurm_task_env_is_what_lightning_reads(monkeypatch):
    from lightning.fabric.plugins.environments import SLURMEnvironment

    from lmk.run.cluster import slurm_task_env

    for key, value in slurm_task_env(node=1, local=0, nodes=2, tasks_per_node=2, job_id="777", port=29555).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    env = SLURMEnvironment()
    assert SLURMEnvironment.detect() and not under_submitit_local() and cluster_plugins() == []
    assert (env.world_size(), env.global_rank(), env.local_rank(), env.node_rank()) == (4, 2, 0, 1)
    assert (env.main_address, env.main_port) == ("localhost", 29555)
    env.validate_settings(num_devices=2, num_nodes=2)


@pytest.mark.slow  # four training processes on this machine: about a minute on 2 busy cores
def test_two_nodes_two_ranks_rehearsed_through_slurm_variables(tmp_path):
    """2 nodes x 2 ranks, each task with SLURM's variables (lmk.run.cluster.emulate_slurm), through python -m
    lmk.train and Lightning's SLURMEnvironment: node ranks, one prepare_data for the job (the cache is shared),
    rank-0-only writes and lock, passages gathered from all four ranks."""
    import json
    import re
    import sys

    from lmk.run.cluster import emulate_slurm
    from tests.test_train import ENV, ROOT, losses, overrides, write_pairs

    pairs = write_pairs(tmp_path / "pairs.jsonl")
    run_dir, logs = tmp_path / "run", tmp_path / "logs"
    logs.mkdir()
    cmd = [sys.executable, "-m", "lmk.train", *overrides(run_dir, pairs, "trainer=ddp-cpu", "launcher.nodes=2",
                                                             "++launcher.tasks_per_node=2", "data.batch_size=2",
                                                             "trainer.max_steps=2", f"data.cache_dir={tmp_path / 'cache'}")]
    codes = emulate_slurm(cmd, nodes=2, tasks_per_node=2, env=ENV, cwd=str(ROOT), timeout=600, log_dir=str(logs))
    out = [(logs / f"task{r}.log").read_text() for r in range(4)]
    assert codes == [0, 0, 0, 0], "\n".join(o[-2000:] for o in out)
    seen = [re.search(r"rank (\d) of 4: node (\d), local rank (\d)", o).groups() for o in out]
    assert seen == [("0", "0", "0"), ("1", "0", "1"), ("2", "1", "0"), ("3", "1", "1")]
    # every task of the job writes one log file (<run dir>/train.log, the lmk.data chatter goes there only): the
    # data is prepared once for the job, by global rank 0, not once per node
    log_text = (run_dir / "train.log").read_text()
    assert all(f"rank {r} of 4: node {r // 2}" in log_text for r in range(4))  # all four tasks write to it
    assert log_text.count("prepare_data (once per job") == 1
    assert "prepare_data (once per job, global rank 0)" in log_text
    assert all("against 16 passages gathered from 4 ranks" in o for o in out)  # 2 x 2 passages x 4 ranks
    res = json.loads((run_dir / "results.json").read_text())
    assert res["status"] == "done" and res["metrics"]["global_step"] == 2
    assert [s for s, _ in losses(run_dir)] == [0, 1]  # metrics.csv written once (rank 0), each step once
    assert (run_dir / "checkpoints" / "last.ckpt").exists() and not (run_dir / "run.lock").exists()


@pytest.mark.parametrize(("node", "builds"), [(0, True), (1, False)])
def test_prepare_data_runs_once_per_job_not_once_per_node(monkeypatch, tmp_path, node, builds):
    """On a shared cache, local rank 0 of node 1 built the same Arrow copy as node 0 on a shared cache."""
    import lightning.pytorch as pl

    from lmk.data.datamodule import PairDataModule
    from lmk.run.cluster import slurm_task_env
    from tests.test_train import write_pairs

    for key in ("MASTER_ADDR", "SUBMITIT_EXECUTOR", "SUBMITIT_LOCAL_JOB_ID"):
        monkeypatch.delenv(key, raising=False)
    for key, value in slurm_task_env(node=node, local=0, nodes=2, tasks_per_node=2, job_id="9", port=29500).items():
        monkeypatch.setenv(key, value)
    trainer = pl.Trainer(accelerator="cpu", devices=2, num_nodes=2, strategy="ddp", logger=False)
    assert (trainer.node_rank, trainer.local_rank) == (node, 0)
    cache = tmp_path / "cache"
    dm = PairDataModule(sources=[{"path": str(write_pairs(tmp_path / "pairs.jsonl"))}], cache_dir=str(cache))
    trainer._data_connector.attach_data(pl.LightningModule(), datamodule=dm)
    trainer._data_connector.prepare_data()
    assert (cache.exists() and any(cache.rglob("*.arrow"))) == builds
