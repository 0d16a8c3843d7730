"""The gpu-check's rehearsal section: the rehearsal scale's first row through `lmk.train` and `lmk.evaluate`, as
the sweep runs it, with DDP over every visible GPU (the rehearsal's own CPU ranks in smoke mode).

Each job is a subprocess with a timeout (its whole process group is killed at the limit: a hang costs the
section, never the report), W&B off (logger=csv, WANDB_MODE=disabled), in the environment the check started
with (the runner restores what a section changed, Lightning's determinism settings among them).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu_sections import ROOT, rehearsal_ranks, section

# seconds per job: on a GPU the rehearsal's jobs are start-up (imports, config, DDP, mteb) and a few tiny steps,
# about a minute each; on 2 busy CPU cores its 2 gloo ranks take several
JOB_TIMEOUT_S = {"gpu": 180, "cpu-smoke": 1800}
NO_WANDB = {"WANDB_MODE": "disabled"}


def run_job(cmd: list[str], env: dict[str, str], timeout_s: float) -> dict[str, Any]:
    """`cmd` in the repository root with `env` added to this process's environment, killed (its process group,
    DDP ranks included) after `timeout_s`: returncode (None when killed), wall seconds, stderr's tail."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        timed_out = True
    out = {"returncode": None if timed_out else proc.returncode, "wall_s": round(time.perf_counter() - t0, 1),
           "timeout_s": timeout_s}
    if timed_out:
        out["timed_out"] = True
    if timed_out or proc.returncode != 0:
        out["stderr_tail"] = (err or "")[-2000:]
    return out


def ddp_world(smoke: bool) -> dict[str, Any]:
    """The ranks the rehearsal runs: every visible GPU (the rehearsal's CPU ranks in smoke mode)."""
    ranks = rehearsal_ranks() if smoke else torch.cuda.device_count()
    out = {"world_size": ranks, "strategy": "ddp" if ranks > 1 else "auto", "ddp_exercised": ranks > 1}
    if ranks == 1:
        out["note"] = "single GPU: DDP not exercised (NCCL and all_gather(sync_grads=True) untested)"
    return out


@section("rehearsal", needs="full")
def check_rehearsal(smoke: bool, work: Path) -> dict[str, Any]:
    """The rehearsal's first row as the sweep runs it: `lmk.train` with DDP over every visible GPU, then one
    `lmk.evaluate` job on the trained row with the eval stage's suite. Its folders are scratch: each run starts
    them over (overwrite=true), so the check reruns. The training job's wall time, less its steps, is the fixed
    cost of a job that the cost estimate adds (`job_overhead_s`)."""
    # the evaluation stack (mteb, datasets) is a package group the node may lack: imported once it was checked
    from lmk.run.results import read_results
    from lmk.sweep.hub_mirror import prepare
    from lmk.sweep.jobs import stage_overrides
    from lmk.sweep.spec import load_spec

    mode = "cpu-smoke" if smoke else "gpu"
    spec = load_spec(ROOT / "experiments/table2/spec.yaml")
    scale = spec.scale("rehearsal")
    row = spec.rows_for(scale)[0]
    run_dir, eval_dir = work / "rehearsal" / row.id, work / "rehearsal" / f"{row.id}-eval"
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries only the JSON report
        mirror = prepare(scale, work / "rehearsal")  # the replicas, read offline like a compute node
    prepare_s = round(time.perf_counter() - t0, 1)
    hub = [f"hub.mirror={mirror}"] if mirror else []
    world = ddp_world(smoke)
    env = {**scale.env, **NO_WANDB}
    cmd = [sys.executable, "-m", "lmk.train", *scale.train_overrides, *row.overrides, f"++row={row.id}",
           "launcher=local", "logger=csv", "trainer.num_nodes=1", f"trainer.accelerator={'cpu' if smoke else 'gpu'}",
           f"trainer.devices={world['world_size']}", f"trainer.strategy={world['strategy']}",
           f"hydra.run.dir={run_dir}", "eval.in_training=none", "overwrite=true", *hub]
    job = run_job(cmd, env, JOB_TIMEOUT_S[mode])
    res = read_results(run_dir)
    out: dict[str, Any] = {"row": row.id, "command": " ".join(cmd[1:]), **job, "prepare_s": prepare_s,
                           **world, "run_status": res.get("status"),
                           "global_step": (res.get("metrics") or {}).get("global_step"),
                           "timings": res.get("timings") or {}}
    if job["returncode"] != 0 or res.get("status") != "done":
        return out
    ecmd = [sys.executable, "-m", "lmk.evaluate", f"model={run_dir}", *stage_overrides(scale, hub),
            "eval.in_training=all", f"hydra.run.dir={eval_dir}"]
    ejob = run_job(ecmd, env, JOB_TIMEOUT_S[mode])
    eres = read_results(eval_dir)
    out["eval"] = {"command": " ".join(ecmd[1:]), **ejob, "run_status": eres.get("status")}
    out.update(returncode=ejob["returncode"], run_status=eres.get("status"),
               groups=(eres.get("eval") or {}).get("groups"))
    if "stderr_tail" in ejob:
        out["stderr_tail"] = ejob["stderr_tail"]
    return out
