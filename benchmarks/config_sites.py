"""Counts where each training (`train.*`) and data (`data.*`) setting is defined, and the untyped reads of
results.json, in a checkout (this one, or the folder given): a measure of "each setting defined once".

    python benchmarks/config_sites.py [REPO]

Per setting, the sites counted (read with `ast`, nothing imported):
  yaml       the default in conf/train.yaml (train.*) or conf/data/local.yaml (data.*)
  schema     a field of the schema dataclass (TrainSection / DataConfig)
  param      a parameter of the constructor of the object built from it (ContrastiveModule / PairDataModule)
  copy       a hand copy `name=<x>.name` or `name=name` in a call of the schema or the object under lmk/ (a field
             list written out again)
  check      a value check outside the schema: an `if` naming the setting whose body raises, under lmk/model,
             lmk/train or lmk/data
Then the lines of config code (lmk/config/*.py) and the `.get(...) or {}` chains on results.json dicts.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import yaml

OBJECTS = {"train": ("TrainSection", "ContrastiveModule"), "data": ("DataConfig", "PairDataModule")}
YAML_DEFAULTS = {"train": ("conf/train.yaml", "train"), "data": ("conf/data/local.yaml", None)}
# Receivers that hold a results.json record (or one of its sections) in the readers
RESULT_NAMES = r"(results|res|previous|ev|section)"
RESULT_CHAIN = re.compile(rf"\b{RESULT_NAMES}\.get\([^()]*\)\s*or\s*\{{\}}")


def _trees(root: Path) -> dict[Path, ast.Module]:
    return {p: ast.parse(p.read_text(encoding="utf-8")) for p in sorted((root / "lmk").rglob("*.py"))}


def _classes(trees: dict[Path, ast.Module], name: str) -> list[ast.ClassDef]:
    return [n for t in trees.values() for n in ast.walk(t) if isinstance(n, ast.ClassDef) and n.name == name]


def _fields(cls: ast.ClassDef) -> list[str]:
    return [s.target.id for s in cls.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            and not s.target.id.startswith("_") and "ClassVar" not in ast.unparse(s.annotation)]


def _params(cls: ast.ClassDef) -> set[str]:
    for stmt in cls.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == "__init__":
            return {a.arg for a in [*stmt.args.args, *stmt.args.kwonlyargs]}
    return set()


def _copies(trees: dict[Path, ast.Module], name: str, callees: tuple[str, ...]) -> int:
    count = 0
    calls = [n for t in trees.values() for n in ast.walk(t) if isinstance(n, ast.Call)
             and (getattr(n.func, "id", None) or getattr(n.func, "attr", None)) in callees]
    for call in calls:
        for node in call.keywords:
            if node.arg == name and (
                    (isinstance(node.value, ast.Attribute) and node.value.attr == name)
                    or (isinstance(node.value, ast.Name) and node.value.id == name)):
                count += 1
    return count


def _checks(root: Path, trees: dict[Path, ast.Module], name: str) -> int:
    count = 0
    for path, tree in trees.items():
        if path.parent.name not in ("train", "data", "model"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and any(isinstance(b, ast.Raise) for b in node.body):
                named = {n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)} | {
                    n.attr for n in ast.walk(node.test) if isinstance(n, ast.Attribute)}
                count += name in named
    return count


def setting_sites(root: Path) -> dict[str, dict[str, int]]:
    trees = _trees(root)
    out: dict[str, dict[str, int]] = {}
    for section, (schema, obj) in OBJECTS.items():
        file, key = YAML_DEFAULTS[section]
        doc = yaml.safe_load((root / file).read_text()) or {}
        yaml_keys = set((doc.get(key) if key else doc) or {})
        schema_cls = _classes(trees, schema)[0]
        params = set().union(*(_params(c) for c in _classes(trees, obj)))
        for name in _fields(schema_cls):
            out[f"{section}.{name}"] = {"yaml": int(name in yaml_keys), "schema": 1, "param": int(name in params),
                                        "copy": _copies(trees, name, (schema, obj)), "check": _checks(root, trees, name)}
    return out


def result_chains(root: Path) -> list[str]:
    hits = []
    for path in sorted([*(root / "lmk").rglob("*.py"), *(root / "hydra_plugins").rglob("*.py")]):
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            hits += [f"{path.relative_to(root)}:{i}"] * len(RESULT_CHAIN.findall(line))
    return hits


def main(argv: list[str]) -> None:
    root = Path(argv[1] if len(argv) > 1 else Path(__file__).resolve().parents[1])
    sites = setting_sites(root)
    print(f"{'setting':34} yaml schema param copy check total")
    for name, s in sites.items():
        print(f"{name:34} {s['yaml']:4} {s['schema']:6} {s['param']:5} {s['copy']:4} {s['check']:5} "
              f"{sum(s.values()):5}")
    totals = {k: sum(s[k] for s in sites.values()) for k in ("yaml", "schema", "param", "copy", "check")}
    print(f"{'all ' + str(len(sites)) + ' settings':34} {totals['yaml']:4} {totals['schema']:6} {totals['param']:5} "
          f"{totals['copy']:4} {totals['check']:5} {sum(totals.values()):5}")
    lines = sum(len(p.read_text().splitlines()) for p in (root / "lmk" / "config").glob("*.py"))
    print(f"lines of config code (lmk/config/*.py): {lines}")
    chains = result_chains(root)
    files = sorted({c.rsplit(':', 1)[0] for c in chains})
    print(f"`.get(...) or {{}}` chains on results records: {len(chains)} in {len(files)} files")
    for c in chains:
        print(f"  {c}")


if __name__ == "__main__":
    main(sys.argv)
