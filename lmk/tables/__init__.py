"""`python -m lmk.tables SPEC --scale S --out DIR`: the entry point only; the code is lmk.experiments.tables."""

from lmk.experiments.tables import main

__all__ = ["main"]
