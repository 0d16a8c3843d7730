"""Run infrastructure: what every command needs around its work, below the model and the data.

    results.py  <run_dir>/results.json (merged, atomic), config hash, git commit, timings
    environment.py  requirements.lock: its hash and what the installed environment differs in (results.json)
    umask_files.py  atomic JSON writes, umask-following permissions, the lmk cache folder
    lock.py     one live owner per run folder (run.lock), finished-folder reuse
    scheduler.py  what SLURM says of a job (alive, dead, unknown: never "nothing visible" read as dead)
    checkpoint_dir.py  a run folder's checkpoint files, torch-free (moving them aside, interrupted saves)
    faults.py   fault plans: a bad day rehearsed through the real path
    loggers.py  W&B (offline without credentials, never fatal) + CSV; quiet console logging
    cli.py      a command line that does not compose -> one line on stderr
    cluster.py  Lightning's view of the ranks submitit's local executor starts
    local_slurm.py  a real two-node SLURM cluster with accounting on this machine (up | down | status)
    local_slurm_conf.py  its nodes, paths and config files (what the scheduler tests rely on)
"""
