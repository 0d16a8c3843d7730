"""`python -m lmk.sweep`."""

import sys

from lmk.sweep.driver import main

sys.exit(main())
