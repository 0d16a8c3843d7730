"""`python -m lmk.tables`: the command is `lmk.sweep.tables`."""

if __name__ == "__main__":
    from lmk.sweep.tables import main

    main()
