"""`python -m lmk.export`: the command is `lmk.export.command`."""

import sys

from lmk.export.command import main
from lmk.run.cli import guard

sys.exit(guard(main)())  # a user error (no token, an unfinished run): what is wrong and the fix, exit 2
