"""Training: `python -m lmk.train` (command.py: validate -> preflight -> fit.py), Lightning underneath.

    command.py   the entry point (torch-free until the config validated); validate_job for the row sweeper
    trainer_args.py  the trainer section checked against Lightning's Trainer signature; validate_training
    fit.py       one run: model, data, module, callbacks, Trainer, fit, export, results.json
    module.py    ContrastiveModule (LightningModule): InfoNCE / distillation, cross-device negatives, AdamW
    losses.py    the contrastive losses (pure functions)
    gradcache.py gradient caching: paper-scale batches in one chunk's memory
    resume.py    exact resume (RNG states, sampler position, metrics.csv trimmed)
"""
