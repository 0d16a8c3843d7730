"""The local SLURM rig: a real two-node SLURM cluster with accounting on this machine, for the scheduler tests
(`make slurm-up | slurm-down | slurm-status`, `make test-slurm`). A development tool, not part of the `lmk`
library: it installs Debian packages and starts daemons, as root. Stdlib only, run by the system python3 with
`tools/` on the path (`PYTHONPATH=tools python3 -m local_slurm status`).

    cluster.py  up | down | status: the packages, the daemons, the nodes' states
    conf.py     its nodes, paths and config files (what the scheduler tests rely on)
"""
