"""`python -m lmk.sweep SPEC --scale S --out DIR`: the entry point only; the driver is lmk.experiments.sweep."""

from lmk.experiments.sweep import main

__all__ = ["main"]
