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
