"""`python -m lmk.export <run dir>` (lmk/export.py runs this): a trained run -> a shareable model folder, and the hub.

    python -m lmk.export outputs/table2/mini/train/lmk-fixed-32 --out shared/lmk-fixed-32
    python -m lmk.export outputs/table2/mini/train/lmk-fixed-32 --multi-vector --out shared/lmk-fixed-32-maxsim
    python -m lmk.export outputs/table2/mini/train/lmk-fixed-32-mt --out shared/lmk-fixed-32-mt   # MaxSim-trained:
        a MultiVectorEncoder by default (--single-vector: its one vector)
    HF_TOKEN=... python -m lmk.export outputs/table2/mini/train/lmk-fixed-32 --push-to-hub me/lmk-fixed-32 [--private]

The folder holds the model (its code travels, so sentence-transformers loads it without lmk), a model card built
from the run (the Table 2 row when a table was built over its sweep) and the run's mteb results in the results
repository's layout (lmk.sharing.publish; docs/sharing.md).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from lmk.run.cli import guard
from lmk.sharing.refusals import check_publish


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lmk.export", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", help="a finished training run folder (results.json status done, evaluated)")
    p.add_argument("--out", default=None, help="write the folder here (without --push-to-hub: only this)")
    p.add_argument("--push-to-hub", default=None, metavar="REPO_ID", help="upload to <user or org>/<name> (HF_TOKEN)")
    p.add_argument("--private", action="store_true", help="create the hub repo private")
    p.add_argument("--revision", default=None, help="the hub branch to commit to (created when missing; default main)")
    p.add_argument("--table", default=None, help="the table JSON holding the run's row (default: found above the run)")
    p.add_argument("--license", default=None, help="the card's licence (default: the base model's, or lmk's for a "
                   "random init)")
    kind = p.add_mutually_exclusive_group()  # default: as the run was trained (train.objective)
    kind.add_argument("--multi-vector", dest="multi_vector", action="store_true", default=None,
                      help="a sentence-transformers MultiVectorEncoder folder: each text's landmark states, scored by "
                      "MaxSim (LMK poolings only; the default for a run trained with train.objective=maxsim)")
    kind.add_argument("--single-vector", dest="multi_vector", action="store_false",
                      help="one vector per text (the default for a run trained for one vector)")
    p.add_argument("--base-model", default=None, help="the hub id of the base model (default: read from the encoder)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    check_publish(args.run_dir, args.out, args.push_to_hub)  # a wrong token or folder: refused before torch loads
    # fast path: the model side (torch, transformers, mteb) loads only once nothing refuses
    from lmk.run.quiet_logging import quiet_progress_bars
    from lmk.sharing.publish import publish  # (as above)

    with quiet_progress_bars():  # loading and writing one model: seconds, one line of result below
        pub = publish(args.run_dir, out=args.out, repo_id=args.push_to_hub, private=args.private,
                      revision=args.revision, table=args.table, license_=args.license, base=args.base_model,
                      multi_vector=args.multi_vector, checked=True)
    if args.out:
        print(f"[lmk.export] {pub.meta.name} (weights {pub.meta.revision}) written to {pub.folder}")
    if pub.pushed:
        print(f"[lmk.export] pushed to {pub.pushed.repo_id}@{pub.pushed.revision}: {pub.pushed.url}")
    return 0


def cli() -> None:
    """`python -m lmk.export`: a user error (no token, an unfinished run) is what is wrong and the fix, exit 2."""
    sys.exit(guard(main)())
