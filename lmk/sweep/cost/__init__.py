"""The cost model of a sweep, by its parts; every figure is printed with its source (measured, published or
assumed):

    lmk.model.shape     an encoder's shape: parameters and FLOPs per token (the one `encoder_shape`)
    lmk.train.memory    per-device training memory, and the gradient-checkpointing decision it sets per job
    throughput.py       what the estimate divides by: a measured gpu-check, else a published peak (Rates)
    training.py         a training job: tokens, FLOPs (the passes lmk.train runs), wall time
    lengths.py          a job's texts' token lengths: measured (a sample of the source, the row's landmark
                        tokenizer, cached) or a shipped profile (lmk/resources/length_profiles.json), said which
    paths.py            a training step's FLOPs by batching path (padded, batch longest, sorted, packed)
    measured.py         each row's GPU-hours padded and at its lengths by path (the dry run's per-row block)
    evaluation.py       the eval stage per shard: tokens and time from mteb's task statistics
    index.py            a MaxSim row's index (landmark vectors and bytes per document, per task) and exact search
    stage.py            a stage: its jobs, device-hours, longest job, how many at once, wall time
    limits.py           a job's estimate against its launcher's time limit; requeued segments
    report.py           the row sweeper's per-job report (memory, checkpointing, time)
    estimate.py         the sweep's table (the dry run), the refusals before launch, predicted vs measured time

The row sweeper reads `job_report` from here; the sweep driver `print_sweep_estimate`, `check_sweep` and
`training_time_report` (loaded on first use: they read mteb's task statistics).
"""

from lmk import interface

__all__, __getattr__ = interface(__name__, {
    "lmk.sweep.cost.estimate": ("check_sweep", "format_estimate", "print_sweep_estimate", "sweep_estimate",
                                "training_time_report"),
    "lmk.sweep.cost.evaluation": ("CHARS_PER_TOKEN", "eval_cost"),
    "lmk.sweep.cost.index": ("Layout", "TaskIndex", "compressed_index_bytes", "task_index"),
    "lmk.sweep.cost.lengths": ("Lengths", "job_lengths", "laid_out", "measure_source", "profile_lengths"),
    "lmk.sweep.cost.limits": ("TimeLimit", "eval_verdict", "training_verdict"),
    "lmk.sweep.cost.measured": ("RowHours", "format_rows", "row_hours"),
    "lmk.sweep.cost.paths": ("PATHS", "job_path", "maxsim_flops", "objective", "side_flops", "step_flops",
                             "token_budget"),
    "lmk.sweep.cost.report": ("job_report",),
    "lmk.sweep.cost.stage": ("StageCost", "makespan"),
    "lmk.sweep.cost.throughput": ("GPU_CHECK_JSON", "maxsim_throughput", "peak_throughput", "read_gpu_check"),
    "lmk.sweep.cost.training": ("TrainingJob", "training_cost", "training_flops"),
})
