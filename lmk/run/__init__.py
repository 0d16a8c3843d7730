"""Run infrastructure: what every command needs around its work, below the model and the data.

    results.py  <run_dir>/results.json (merged, atomic), config hash, git commit, timings
    cpu_kernels.py  the instruction set a pinned CPU run computes with, set for its jobs and recorded
    environment.py  requirements.lock: its hash and what the installed environment differs in (results.json)
    umask_files.py  atomic JSON writes, umask-following permissions, the lmk cache folder
    lock.py     one live owner per run folder (run.lock), finished-folder reuse
    scheduler.py  what SLURM says of a job (alive, dead, unknown: never "nothing visible" read as dead)
    checkpoint_dir.py  a run folder's checkpoint files, torch-free (moving them aside, interrupted saves)
    faults.py   fault plans: a bad day rehearsed through the real path
    loggers.py  W&B (offline without credentials, never fatal) + CSV: Lightning's logger classes
    quiet_logging.py  one console line per event, the chatter in the log file; no progress bars for short work
    cli.py      a command line that does not compose -> one line on stderr
    cluster.py  Lightning's view of the ranks submitit's local executor starts
"""

from lmk import interface

__all__, __getattr__ = interface(__name__, {
    "lmk.run.checkpoint_dir": ("SUPERSEDED_DIR", "TMP_MARK", "candidates", "clear_partial_saves", "move_aside"),
    "lmk.run.cli": ("error_line", "error_lines", "full_errors", "group_overridden", "guard", "hydra_task", "report",
                    "run_app"),
    "lmk.run.cluster": ("SubmititEnvironment", "cluster_plugins", "emulate_slurm", "slurm_task_env",
                        "submitit_rank", "under_submitit_local"),
    "lmk.run.console": ("console_stream", "interactive", "redirected", "verbose"),
    "lmk.run.cpu_kernels": ("KERNEL_SETS", "SWITCHES", "in_use", "switches"),
    "lmk.run.environment": ("lock_hash",),
    "lmk.run.umask_files": ("cache_root", "follow_umask", "write_json"),
    "lmk.run.lock": ("job_identity",),
    "lmk.run.loggers": ("WANDB_ID_FILE", "build_logger", "find_wandb", "finish_loggers", "resolve_wandb_mode",
                        "wandb_credentials", "wandb_info"),
    "lmk.run.quiet_logging": ("quiet_progress_bars", "use_hydra_logging"),
    "lmk.run.results": ("EvalRecord", "Results", "STATUS_DONE", "Timer", "config_hash_of", "git_commit",
                        "read_results", "update_results"),
    "lmk.run.scheduler": ("slurm_job",),
}, modules=("environment", "faults", "lock", "results", "scheduler"))
