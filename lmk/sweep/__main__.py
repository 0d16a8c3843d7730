import sys

from lmk.experiments.sweep import main

sys.exit(main())
