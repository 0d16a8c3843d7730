"""Benchmarks of `lmk` against what a user would otherwise run (`python -m benchmarks.run`)."""
