"""`python -m lmk.sweep ... --push-to-hub <org>/<prefix>`: once the table is built, every finished row of its
training block goes to the hub as `<org>/<prefix>-<row>`, its card carrying its row (lmk.sharing.publish)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lmk.hub.push import PushError, check_push
from lmk.run.cli import error_line


def push_target(prefix: str) -> str:
    """argparse type of --push-to-hub: a usable `<org>/<prefix>` (and a token), checked before any training."""
    try:
        check_push(prefix, verify=True)  # a token the hub refuses fails here too, before any training
    except PushError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return prefix


def publish_rows(table_json: Path, prefix: str | None) -> int:
    """Push every finished row of the table's training block; returns the number that failed (0 without prefix)."""
    if not prefix:
        return 0
    # fast path: the model and mteb load only when a sweep publishes
    from lmk.sharing.publish import publish

    table = json.loads(Path(table_json).read_text())
    runs = {c["row"]: c["run_dir"] for c in table["cells"]
            if c["block"] == "train" and c.get("run_dir") and c.get("value") is not None}
    failed = 0
    for row, run_dir in sorted(runs.items()):
        repo = f"{prefix}-{row}"
        try:
            pub = publish(run_dir, repo_id=repo, table=table_json)
        except Exception as err:  # one row's failure is reported; the others still go
            print(f"[lmk.sweep] {row}: not pushed to {repo}: {error_line(err)}", file=sys.stderr)
            failed += 1
            continue
        print(f"[lmk.sweep] {row}: pushed to {repo} ({pub.pushed.url})")
    return failed
