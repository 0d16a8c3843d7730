"""`python -m lmk.train`."""

from lmk.train.command import cli

cli()
