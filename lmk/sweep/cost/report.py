"""The row sweeper's per-job report (`hydra.sweeper.report`, printed per row in a dry run, stored in jobs.json):
a training job's memory per device against `launcher.gpu_memory_gb`, whether it checkpoints gradients and why,
and its estimated wall time against `launcher.timeout`."""

from __future__ import annotations

from typing import Any

from lmk.model.shape import encoder_shape
from lmk.sweep.cost.limits import TimeLimit, training_verdict
from lmk.sweep.cost.stage import hours
from lmk.sweep.cost.throughput import choose_rates
from lmk.sweep.cost.training import training_job
from lmk.train.memory import FIT_HINT, decide_checkpointing, job_memory, job_world_size, sections


def job_time(c: dict[str, Any]) -> dict[str, Any] | None:
    """A training job's estimated wall time and its verdict against the launcher's limit; None where no rate
    is known without a measurement (a CPU job) or no limit applies (the local launcher)."""
    launcher = c.get("launcher") or {}
    limit = TimeLimit.of(c, launcher.get("name"))
    on_cpu = str((c.get("trainer") or {}).get("accelerator", "gpu")) == "cpu"
    if limit is None or on_cpu:
        return None
    rates = choose_rates(False, encoder_shape(c["encoder"]))
    verdict = training_verdict(training_job(c, job_world_size(c), rates), limit, rates.train.source)
    return {"hours": round(verdict.wall_s / 3600, 2), "timeout_min": limit.minutes, "verdict": verdict.text,
            "refusal": verdict.refusal, "source": rates.train.source,
            "summary": f"estimated {hours(verdict.wall_s)} against launcher.timeout {hours(limit.seconds)}: "
                       + (verdict.text if verdict.refusal is None else "EXCEEDS it (`python -m lmk.sweep` refuses it "
                                                                         "before launch, naming the fixes)")}


def job_report(cfg: Any) -> dict[str, Any] | None:
    """What the row sweeper prints and stores for a training job; None for a job that trains nothing."""
    c = sections(cfg)
    if not c.get("data") or not c.get("trainer"):
        return None  # an evaluation job: no training memory or steps to estimate
    gpu_gb = (c.get("launcher") or {}).get("gpu_memory_gb")
    checkpointing = decide_checkpointing(c)
    est = job_memory(c, checkpointing.on)
    fits = None if gpu_gb is None else est.fits(float(gpu_gb))
    hint = FIT_HINT + ("" if checkpointing.on else "; or encoder.gradient_checkpointing=true")
    time = job_time(c)
    lora = [n for n in est.notes if n.startswith("LoRA")]  # what trains and what is frozen (the decoder recipe)
    parts = ["memory per device: " + est.summary(gpu_gb) + ("" if fits is not False else f"; {hint}"), *lora,
             checkpointing.line, *([time["summary"]] if time else [])]
    return {"memory_gib": est.gib(), "gpu_memory_gb": gpu_gb, "fits": fits, "notes": est.notes,
            "world_size": job_world_size(c), "gradient_checkpointing": checkpointing.record(), "time": time,
            "refusal": time["refusal"] if time else None, "summary": "; ".join(parts)}
