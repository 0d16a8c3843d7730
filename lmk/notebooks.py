"""`python -m lmk.notebooks`: the command is `lmk.analysis.notebooks`."""

if __name__ == "__main__":
    from lmk.analysis.notebooks import main

    raise SystemExit(main())
