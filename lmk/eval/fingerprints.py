"""Content fingerprints of every data set the offline scales generate or replicate, pinned and printed.

The rehearsal and mini scales read no downloaded data: their training pairs (`lmk.data.offline_pairs`, the
`cfli/bge-full-data` replica of `lmk.data.replica`), eval replicas (`lmk.eval.replicas`) and local tasks
(passkey / needle of `lmk.data.longembed`, the long documents of `lmk.data.longdocs` and `lmk.data.prose`, RULER
NIAH of `lmk.data.ruler`) are built here, some
from the text of installed packages (the standard library, numpy, scipy, pandas, scikit-learn). Two machines
get the same table only when they build the same data, so:

- `fingerprints()` hashes the CONTENT of each set (ids, texts, qrels, rows) at the sizes the scales use;
- `environment()` lists what that content is read from (Python, the text packages' versions, the lock);
- `lmk/resources/data_fingerprints.json` pins both (tests/test_fingerprints.py compares);
- the table prints, per sweep, the replicas' content revisions and each row's environment.

Reading a difference: same environment fingerprint + other data fingerprint = the code changed; another
environment fingerprint = your environment differs (`python -m lmk.run.environment check` says how).

    python -m lmk.eval.fingerprints          # computes every fingerprint and compares with the pinned ones
    python -m lmk.eval.fingerprints --pin    # rewrites the pinned file (after an intended change)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from numpy._core import _multiarray_umath as umath

from lmk.config.eval import LENGTHS, RULER_VARIANTS
from lmk.data import longembed, offline_pairs, prose, replica, ruler
from lmk.eval.replicas import REPLICAS, Sizes, replica_fingerprint
from lmk.run.environment import lock_hash

PINNED = "data_fingerprints.json"
# The sets whose content is read from installed packages (the others come from lmk/resources only).
FROM_PACKAGES = ("offline-pairs", "bge-full-data-replica", "replica:SciFact", "replica:MSMARCO", "replica:ArguAna",
                 "replica:CQADupstackUnixRetrieval", "replica:AppsRetrieval", "replica:MultiLongDocRetrieval",
                 "replica:LEMBNarrativeQARetrieval", "replica:LEMBQMSumRetrieval",
                 "replica:LEMBSummScreenFDRetrieval", "replica:LEMBWikimQARetrieval", "local:prose")


PROSE_DOCS = 50  # conf/eval/table2-mini.yaml's longdoc_n_docs


def cpu_simd() -> list[str]:
    """The SIMD targets numpy dispatches to on this CPU (e.g. ["X86_V3"]; AVX-512 machines add more), recorded
    with the pins as where they were measured. Not part of the environment fingerprint: the one CPU-dependent step
    (BM25 hard negatives among tied scores, once ordered by numpy's per-CPU sort kernels) breaks ties by index now
    (`lmk.data.offline_pairs.top_hits`), and the sets are the same with AVX-512 on and off."""
    return [f for f in umath.__cpu_dispatch__ if umath.__cpu_features__.get(f)]


def environment() -> dict[str, Any]:
    """What the generated content is read from: Python (its standard library), the text packages, the CPU's SIMD
    targets, the lock."""
    return {"versions": offline_pairs._versions(offline_pairs.DEFAULT_PACKAGES), "cpu": cpu_simd(),
            "lock": lock_hash()}


def environment_fingerprint(env: dict[str, Any] | None = None) -> str:
    env = environment() if env is None else env
    key = {"versions": env["versions"]}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def _rows_hash(folder: Path) -> str:
    """A hash of a BGE-layout folder's rows (not its bytes: parquet metadata may name the writer)."""
    h = hashlib.sha256()
    for path in sorted((folder / "data").glob("*.parquet")):
        h.update(path.name.split("-", 1)[0].encode())
        for row in pq.read_table(path).to_pylist():
            h.update(json.dumps(row, sort_keys=True).encode())
    return h.hexdigest()[:16]


def fingerprints(sizes: Sizes | None = None) -> dict[str, str]:
    """{set name: content fingerprint} of every generated set at the sizes the offline scales use: the
    training pairs, the bge-full-data replica, each eval replica (the rehearsal's `hub_mirror.replicas`) and
    the mini suite's passkey / needle sets (all `LENGTHS`) and its prose task."""
    sizes = sizes or Sizes()
    out = {"offline-pairs": _rows_hash(offline_pairs.ensure_offline_pairs()),
           "bge-full-data-replica": _rows_hash(replica.replica_folder("bge-full-data"))}
    for name, rep in REPLICAS.items():
        out[f"replica:{name}"] = replica_fingerprint(name, rep.splits(sizes))
    out["local:passkey"] = longembed.fingerprint(longembed.generate_passkey(LENGTHS))
    out["local:needle"] = longembed.fingerprint(longembed.generate_needle(LENGTHS))
    # the prose task at the mini suite's size (its text is the interpreter's own reference: Python's version pins it)
    out["local:prose"] = longembed.fingerprint({0: prose.build_prose_corpus(n_docs=PROSE_DOCS)})
    return {**out, **ruler_fingerprints()}


def ruler_fingerprints() -> dict[str, str]:
    """{"ruler:<variant>": fingerprint} of the RULER NIAH sets at the ruler-niah suite's sizes (conf/eval/ruler-niah.yaml:
    512..16k, 110 documents and queries) over lmk's own essays (the Paul Graham essays are not shipped)."""
    return {f"ruler:{v}": longembed.fingerprint(ruler.generate_ruler(
        v, lengths=(512, 1024, 2048, 4096, 8192, 16384), n_docs=110, n_queries=110, haystack="lmk-essays"))
        for v in RULER_VARIANTS}


def pinned() -> dict[str, Any]:
    """The pinned record: {"environment": {...}, "environment_fingerprint": ..., "data": {name: fp}}."""
    return json.loads(resources.files("lmk").joinpath(f"resources/{PINNED}").read_text())


def compare(current: dict[str, str], env_fp: str, pins: dict[str, Any] | None = None) -> list[str]:
    """One line per set whose fingerprint differs from the pinned one, saying which cause it points to."""
    pins = pinned() if pins is None else pins
    same_env = env_fp == pins["environment_fingerprint"]
    out = []
    for name, fp in sorted(current.items()):
        want = pins["data"].get(name)
        if want == fp:
            continue
        cause = "the code changed" if same_env or name not in FROM_PACKAGES else "your environment differs"
        out.append(f"{name}: {fp}, pinned {want} ({cause})")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lmk.eval.fingerprints", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pin", action="store_true", help=f"rewrite lmk/resources/{PINNED}")
    args = parser.parse_args(argv)
    env = environment()
    current = fingerprints()
    if args.pin:
        path = Path(__file__).resolve().parents[1] / "resources" / PINNED
        record = {"environment": env, "environment_fingerprint": environment_fingerprint(env), "data": current}
        path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        print(f"pinned {len(current)} fingerprints in {path}")
        return 0
    print(f"environment {environment_fingerprint(env)} (pinned {pinned()['environment_fingerprint']}): {env}")
    for name, fp in sorted(current.items()):
        print(f"  {name:<40} {fp}")
    diff = compare(current, environment_fingerprint(env))
    print("every fingerprint matches the pinned one" if not diff else "differ:\n  " + "\n  ".join(diff))
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
