"""Deprecated alias: `python -m lmk.prefetch` is `python -m lmk.download` (`eval.prefetch` is the encode setting)."""

if __name__ == "__main__":
    import sys
    import warnings

    from lmk.run.cli import guard
    from lmk.sweep.scale_artifacts import main

    warnings.warn("python -m lmk.prefetch is deprecated: use python -m lmk.download", DeprecationWarning,
                  stacklevel=1)  # __main__: shown by default
    sys.exit(guard(main)())  # a user error: what is wrong and the fix, exit 2
