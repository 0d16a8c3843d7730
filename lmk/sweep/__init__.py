"""Orchestration: a paper's table from spec to sweep to table (`python -m lmk.sweep`, `lmk.tables`).

    spec.py        a paper table as data (rows, columns, scales) + validation before compute
    jobs.py        every job of a scale (train, zero-shot, eval stage), composed by one set of functions
    driver.py      spec -> one Hydra multirun per block (`hydra/sweeper=rows`) -> eval stage -> table
    eval_stage.py  evaluation as a stage of its own: plan, prepare, launch, merge; one job per (row, shard)
    hub_mirror.py  a scale's hub mirror: every job reads it (hub.mirror); missing replicas written first
    scale_artifacts.py  `python -m lmk.download`: download what every job of a scale loads
    cost/          the cost model by its parts: rates, a training job, the eval stage, time limits, the dry run's
                   table and per-job report (memory: lmk.train.memory; the encoder's shape: lmk.model.shape)
    table_renderer.py  run folders' results.json -> Markdown / LaTeX / CSV / JSON / plot
    authors.py     the authors' values (experiments/*/authors.yaml) against the composed configs
The row sweeper these drive is the Hydra plugin `hydra_plugins/lmk_row_sweeper` (Hydra discovers plugins only
in that namespace package).
"""

from lmk import interface

__all__, __getattr__ = interface(__name__, {
    "lmk.sweep.driver": ("main", "mark_interrupted"),
    "lmk.sweep.eval_stage": ("merge", "model_fingerprint", "run_stage", "trained_fingerprint"),
    "lmk.sweep.hub_mirror": ("prepare",),
    "lmk.sweep.jobs": ("ENTRY_CONFIG", "compose_config", "job_id", "job_overrides", "plan", "plan_shards",
                       "rescore_block", "stage_overrides", "train_block", "zeroshot_block"),
    "lmk.sweep.scale_artifacts": ("scale_artifacts",),
    "lmk.sweep.provenance": ("provenance_lines",),
    "lmk.sweep.report": ("print_line", "quiet_launcher", "result_line", "start_line"),
    "lmk.sweep.rows": ("RowState", "decide", "finished_after_all", "lock_verdict", "recorded_job"),
    "lmk.sweep.spec": ("Column", "Scale", "SpecError", "load_spec", "validate_spec"),
    "lmk.sweep.table_renderer": ("MixedResultsError", "aggregate", "table_commits"),
    "lmk.sweep.two_by_two": ("Quad", "quads"),
    "lmk.sweep.wandb_table": ("log_row_summaries", "log_table", "sweep_wandb"),
}, modules=("authors", "pinned", "rows", "scale_artifacts", "table_renderer"))
