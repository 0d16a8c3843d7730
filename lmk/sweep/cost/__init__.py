"""The cost model of a sweep, by its parts; every figure is printed with its source (measured, published or
assumed):

    lmk.model.shape     an encoder's shape: parameters and FLOPs per token (the one `encoder_shape`)
    lmk.train.memory    per-device training memory, and the gradient-checkpointing decision it sets per job
    throughput.py       what the estimate divides by: a measured gpu-check, else a published peak (Rates)
    training.py         a training job: tokens, FLOPs (the passes lmk.train runs), wall time
    evaluation.py       the eval stage per shard: tokens and time from mteb's task statistics
    stage.py            a stage: its jobs, device-hours, longest job, how many at once, wall time
    limits.py           a job's estimate against its launcher's time limit; requeued segments
    report.py           the row sweeper's per-job report (memory, checkpointing, time)
    estimate.py         the sweep's table (the dry run), the refusals before launch, predicted vs measured time

The row sweeper reads `job_report` from here; the sweep driver `print_sweep_estimate`, `check_sweep` and
`training_time_report` (loaded on first use: they read mteb's task statistics).
"""

from __future__ import annotations

from typing import Any

from lmk.sweep.cost.report import job_report
from lmk.sweep.cost.throughput import GPU_CHECK_JSON, read_gpu_check

_LAZY = ("check_sweep", "print_sweep_estimate", "sweep_estimate", "training_time_report")
__all__ = ["GPU_CHECK_JSON", "job_report", "read_gpu_check", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        # lazy: the sweep-level estimate imports mteb (seconds), which the per-job report never needs
        from lmk.sweep.cost import estimate

        return getattr(estimate, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
