"""`python -m lmk.download <spec> --scale paper [--mirror DIR]` (`make download`): on a login node, download
everything the sweep's jobs load (the union of `lmk.hub.artifacts.required_artifacts` over every job of the
scale) into the Hugging Face cache or a mirror folder, and write a manifest."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from lmk.hub import mirror
from lmk.hub.artifacts import Artifact, cache_manifest_path, required_artifacts
from lmk.hub.fetch import download
from lmk.sweep.hub_mirror import prepare
from lmk.sweep.jobs import Job, plan
from lmk.sweep.spec import load_spec


def scale_jobs(spec_path: str, scale_name: str, out: str | None = None) -> list[Job]:
    """Every job a sweep of `scale_name` launches (`lmk.sweep.jobs.plan`: train, zero-shot, eval stage)."""
    spec = load_spec(spec_path)
    scale = spec.scale(scale_name)
    folder = Path(out or f"outputs/{spec.name}/{scale_name}")
    return [job for block in plan(scale, spec.rows_for(scale, None), folder) for job in block.jobs()]


def scale_artifacts(spec_path: str, scale_name: str) -> list[Artifact]:
    """The union of `required_artifacts` over every job of the scale."""
    unique: dict[tuple[str, str, str | None], Artifact] = {}
    for job in scale_jobs(spec_path, scale_name):
        for art in required_artifacts(job.compose()):
            unique.setdefault(art.key, art)
    return list(unique.values())



def _write_scale_replicas(args: argparse.Namespace) -> int | None:
    """A scale whose `hub_mirror` says `replicas` (the rehearsal) stands local replicas in for the downloads:
    the download writes them where the sweep's jobs will look (the --mirror folder, else the scale's own)."""
    spec = load_spec(args.spec)
    scale = spec.scale(args.scale)
    if not (scale.hub_mirror or {}).get("replicas"):
        return None
    if args.mirror:
        scale = dataclasses.replace(scale, hub_mirror={**scale.hub_mirror, "path": str(Path(args.mirror).resolve())})
    root = prepare(scale, Path(args.out or f"outputs/{spec.name}/{args.scale}"), dry_run=args.dry_run)
    print(f"[lmk.download] scale {args.scale!r} reads offline replicas, nothing to download: "
          f"{'would write' if args.dry_run else 'wrote'} them into {root}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Download everything a sweep's jobs load, for offline compute nodes.")
    parser.add_argument("spec", help="table spec, e.g. experiments/table2/spec.yaml")
    parser.add_argument("--scale", default="paper")
    parser.add_argument("--mirror", default=None, help="a folder mirror (default: the Hugging Face cache)")
    parser.add_argument("--dry-run", action="store_true", help="list what would be fetched and what is on disk")
    parser.add_argument("--keep-going", action="store_true", help="after a failed download, fetch the others "
                        "(the failures are named at the end; a rerun fetches only what is missing)")
    parser.add_argument("--out", default=None, help="the sweep folder a relative hub_mirror path is under "
                        "(default outputs/<table>/<scale>, as lmk.sweep)")
    args = parser.parse_args(argv)
    replicated = _write_scale_replicas(args)
    if replicated is not None:
        return replicated
    arts = scale_artifacts(args.spec, args.scale)
    print(f"[lmk.download] scale {args.scale!r}: {len(arts)} artifacts", flush=True)
    entries = download(arts, args.mirror, dry_run=args.dry_run, keep_going=args.keep_going)
    missing = [e for e in entries if e["status"] == "missing"]
    if args.dry_run:
        print(f"[lmk.download] dry run: {len(missing)} of {len(entries)} not on disk")
    else:
        where = Path(args.mirror) / mirror.MANIFEST if args.mirror else cache_manifest_path()
        print(f"[lmk.download] manifest: {where}")
    return 0



if __name__ == "__main__":
    sys.exit(main())
