"""`python -m lmk.prefetch`: the command is `lmk.sweep.prefetch`."""

if __name__ == "__main__":
    import sys

    from lmk.run.cli import guard
    from lmk.sweep.prefetch import main

    sys.exit(guard(main)())  # a user error: what is wrong and the fix, exit 2
