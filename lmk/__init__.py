"""Landmark (LMK) pooling for dense embeddings."""

from lmk._exports import exports

# the layers and the commands (`python -m lmk.<command>`), each with its own __all__
__all__, __getattr__ = exports(__name__, {}, modules=(
    "analysis", "config", "data", "eval", "evaluate", "export", "hub", "model", "notebooks", "prefetch", "run",
    "sweep", "tables", "train"))
