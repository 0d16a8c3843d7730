"""`python -m lmk.download`: the command is `lmk.sweep.scale_artifacts` (download what a scale's jobs load)."""

if __name__ == "__main__":
    import sys

    from lmk.run.cli import guard
    from lmk.sweep.scale_artifacts import main

    sys.exit(guard(main)())  # a user error: what is wrong and the fix, exit 2
