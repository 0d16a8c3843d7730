"""`python -m lmk.prefetch`: the command is `lmk.sweep.prefetch`."""

if __name__ == "__main__":
    import sys

    from lmk.sweep.prefetch import main

    sys.exit(main())
