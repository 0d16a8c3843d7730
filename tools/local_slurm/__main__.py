"""`python -m local_slurm up|down|status` (with `tools/` on the path; the make targets set it)."""

from .cluster import main

raise SystemExit(main())
