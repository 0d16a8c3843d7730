"""`python -m lmk.evaluate`: the command is `lmk.eval.command`."""

if __name__ == "__main__":
    from lmk.eval.command import cli

    cli()
