"""Training: `python -m lmk.train` (command.py: validate -> preflight -> fit.py), Lightning underneath.

    command.py   the entry point (torch-free until the config validated); validate_job for the row sweeper
    trainer_args.py  the trainer section checked against Lightning's Trainer signature; validate_training
    fit.py       one run: model, data, module, callbacks, Trainer, fit, export, results.json
    module.py    ContrastiveModule (LightningModule): InfoNCE / distillation, cross-device negatives, AdamW
    objectives.py  the training objectives (train.objective: single, maxsim), one registered class each
    losses.py    the contrastive losses (pure functions): InfoNCE on vectors, on MaxSim scores
    embeddings.py  an embedding as the objectives give it: a Tensor, or padded multi-vector (states, mask)
    gradcache.py gradient caching: paper-scale batches in one chunk's memory
    chunks.py    a step's mini-batches: by rows, or by a token budget (each padded to its own longest row)
    resume.py    exact resume (RNG states, sampler position, metrics.csv trimmed)
"""

from lmk import interface

__all__, __getattr__ = interface(__name__, {
    "lmk.train.command": ("run", "validate_job"),
    "lmk.train.chunks": ("ChunkPlan", "plan_chunks", "take_rows"),
    "lmk.train.gradcache": ("backward_chunks", "cached_step", "embed_without_grad", "grad_cache_step",
                            "split_features"),
    "lmk.train.guard": ("NonFiniteError", "NonFiniteGuard"),
    "lmk.train.embeddings": ("Embedding", "concat", "grad_slice", "pad_width"),
    "lmk.train.losses": ("info_nce", "maxsim", "maxsim_info_nce", "scores_loss"),
    "lmk.train.objectives": ("OBJECTIVE_CLASSES", "MaxSim", "Objective", "SingleVector", "build_objective",
                             "register_objective"),
    "lmk.train.memory": ("FIT_HINT", "GIB", "Precision", "decide_checkpointing", "estimate_memory",
                         "job_lora", "job_memory", "job_world_size", "sections"),
    "lmk.train.module": ("ContrastiveModule", "WARMUP_CURVES", "build_module", "warmup_decay"),
    "lmk.train.progress": ("progress_line",),
    "lmk.train.trainer_args": ("SET_BY_LMK", "validate_training"),
}, modules=("checkpoints",))
