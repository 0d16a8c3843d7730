"""Evaluation: `python -m lmk.evaluate` (command.py), mteb underneath; the suite also runs inside training.

    command.py    the entry point (torch-free until the config validated); evaluation.py: one model, one suite, as
                  stages: open_job -> prepare -> encode_suite -> score_suite -> record
    preflight.py  checks before compute that read this machine (data paths, task names, hub data on disk)
    suites.py     suite config -> mteb tasks (names checked, hub tasks pointed at the mirror)
    task_names.py  task names checked before mteb loads (local names declared in lmk.config.eval, mteb's cached)
    tasks.py      local tasks (@local_task): regenerated passkey / needle, long documents, docstrings
    encoder.py    the mteb encoder adapter around EmbeddingModel (the `single` scoring)
    scorings.py   the scoring registry: one class per eval.scoring (@register_scoring), needs declared in
                  lmk.config.scorings; refusal(scoring, model) from the declared needs
    runner.py     the suite's stages encode_suite (mteb.evaluate per task, resumable cache, per-query scores),
                  score_suite, record_suite; run_suite runs the three; build_encoder (the scoring's class)
    maxsim.py     eval.scoring=maxsim: exact blocked MaxSim over landmark states, mteb's multi-vector search
    compressed_maxsim.py  eval.scoring=maxsim-compressed: MaxSim over residual codes, top candidates re-scored
    residual_codes.py  residual compression of unit vectors (k-means centroid id + quantized residual)
    residual_sizes.py  its byte arithmetic, torch-free (the sweep's cost model sizes an index with it)
    callback.py   the Lightning callback (suite during / at the end of training)
    score_stats.py  scores as the paper reports them: group means, LongEmbed averaging, paired t-tests
    replicas.py   offline replicas of the paper's eval datasets in their hub layout
    prepared.py   hub tasks' data prepared once (python -m lmk.eval.prepared), read-only in many jobs (hub.prepared)

Sharing a model (export, model card, mteb meta, hub) is lmk.sharing; the old paths here (publish, card, mteb_model,
export_command) still resolve, with a DeprecationWarning.
"""

from lmk import interface, moved

__all__, _own = interface(__name__, {
    "lmk.eval.callback": ("EvalCallback", "build_eval_callback"),
    "lmk.eval.command": ("cli", "validate_config"),
    "lmk.eval.encoder": ("LmkEncoder",),
    "lmk.eval.replicas": ("REPLICAS", "Sizes", "replica_fingerprint", "task_dataset", "write_replicas"),
    "lmk.eval.compressed_maxsim": ("CompressedIndex", "LmkCompressedMaxSimEncoder", "centroid_scores",
                                    "compressed_search"),
    "lmk.eval.residual_codes": ("ResidualCodec", "kmeans"),
    "lmk.eval.residual_sizes": ("BITS", "auto_centroids", "codebook_bytes", "vector_bytes"),
    "lmk.eval.maxsim": ("LmkMaxSimEncoder", "NoLandmarksError", "maxsim_blocks", "maxsim_scores",
                         "maxsim_winners"),
    "lmk.eval.runner": ("build_encoder", "run_suite"),
    "lmk.eval.scorings": ("SCORING_CLASSES", "refusal", "register_scoring", "scoring_class"),
    "lmk.eval.score_stats": ("LONGEMBED6", "group_scores", "load_per_query", "longembed6_score", "paired_ttest",
                         "per_query_scores", "pytrec_measure", "summarize_scores"),
    "lmk.eval.suites": ("build_tasks",),
    "lmk.eval.task_names": ("UnknownTaskError", "check_task_names", "valid_task_names"),
    "lmk.eval.tasks": ("LOCAL_TASKS", "LOCAL_TASK_CLASSES", "LocalNeedle", "LocalPasskey", "LocalShort",
                       "RulerNiahMultiKey", "RulerNiahMultiQuery", "RulerNiahMultiValue", "RulerNiahSingle",
                       "build_local_task", "local_task"),
}, modules=("command", "evaluation", "fingerprints", "preflight", "prepared"))
__getattr__ = moved(__name__, {name: f"lmk.sharing.{name}" for name in (
    "TableRow", "card_row", "eval_results", "load_model", "model_meta", "n_parameters", "save_results")}, inner=_own)
