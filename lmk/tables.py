"""`python -m lmk.tables`: the command is `lmk.sweep.table_renderer`."""

if __name__ == "__main__":
    from lmk.run.cli import guard
    from lmk.sweep.table_renderer import main

    guard(main)()  # a user error (no results, mixed configs): what is wrong and the fix, exit 2
