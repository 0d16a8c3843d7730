"""Running a paper's table: the spec as data, the sweep driver, the aggregated table.

    spec.py     a paper table as data (rows, columns, scales) + validation before compute
    sweep.py    spec -> one Hydra multirun per block (`hydra/sweeper=rows`) -> table
    hub_mirror.py  a scale's hub mirror: every job reads it (hub.mirror); missing replicas written first
    tables.py   run folders' results.json -> Markdown / LaTeX / CSV / JSON / plot

Entry points: `python -m lmk.sweep` and `python -m lmk.tables` (thin wrappers around `main` here).
The row sweeper these drive is the Hydra plugin `hydra_plugins/lmk_row_sweeper` (Hydra discovers
plugins only in that namespace package).
"""
