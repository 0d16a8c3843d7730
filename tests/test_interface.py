"""Each lmk package names its interface in its `__init__.py`'s `__all__`; everything else is its inside.

The rule (docs/architecture.md, "Interfaces"): code outside a package (a module of another lmk package, tests/,
benchmarks/, experiments/, notebooks/, hydra_plugins/) imports from it only names its `__all__` lists, by either
path: `from lmk.run import write_json` or `from lmk.run.umask_files import write_json`. A name there may be a module
(`from lmk.hub import mirror`: a module used as a namespace); such a public module's names without a leading
underscore are interface too (`from lmk.hub.mirror import apply_mirror`). A subpackage is a package of its own
(lmk.model.landmark, lmk.sweep.cost); a command module at the top (lmk/export.py) is one too, with its own
`__all__`. Every name an `__all__` lists resolves. Read with `ast` (nothing imported but the packages themselves).
"""

from __future__ import annotations

import ast
import importlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OUTSIDE = ("tests", "benchmarks", "experiments", "hydra_plugins", "tools")
PACKAGES = sorted(".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "lmk").rglob("__init__.py")
                  if "resources" not in p.parts)
# a package, or a command module directly under lmk/: the units whose insides are their own
UNITS = set(PACKAGES[1:]) | {f"lmk.{p.stem}" for p in (ROOT / "lmk").glob("*.py") if p.stem != "__init__"}


def unit_of(module: str) -> str:
    """The innermost unit holding `module` ("lmk" for the root package itself)."""
    parts = module.split(".")
    return next((".".join(parts[:i]) for i in range(len(parts), 1, -1) if ".".join(parts[:i]) in UNITS), "lmk")


def _sources() -> Iterator[tuple[str, str | None, str]]:
    """(file, the unit it belongs to (None outside lmk), its Python text); a notebook's code cells joined."""
    for path in sorted((ROOT / "lmk").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        yield str(path.relative_to(ROOT)), unit_of(module), path.read_text(encoding="utf-8")
    for top in OUTSIDE:
        for path in sorted((ROOT / top).rglob("*.py")):
            yield str(path.relative_to(ROOT)), None, path.read_text(encoding="utf-8")
    for path in sorted((ROOT / "notebooks").rglob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
        yield str(path.relative_to(ROOT)), None, "\n".join(c for c in code if not c.lstrip().startswith(("%", "!")))


def imports(text: str) -> Iterator[tuple[int, str, str | None]]:
    """(line, module, name) of every absolute lmk import: `from M import n` -> (M, n); `import M` -> (M, None)."""
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "lmk":
            for alias in node.names:
                yield node.lineno, node.module, alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "lmk":
                    yield node.lineno, alias.name, None


def interface(unit: str) -> set[str]:
    return set(getattr(importlib.import_module(unit), "__all__", ()))


def crossings(unit_here: str | None, module: str, name: str | None) -> list[tuple[str, str, str | None]]:
    """(unit, name, the unit's module it is taken from (None: the unit itself)) for each thing an import takes
    from another unit."""
    if name is None:  # import lmk.a.b.c: each module on the way that is inside another unit
        parts = module.split(".")
        steps = [(".".join(parts[:i]), parts[i]) for i in range(1, len(parts))]
        return [(owner, last, None) for owner, last in steps
                if f"{owner}.{last}" not in UNITS and unit_of(owner) == owner and owner != unit_here]
    if f"{module}.{name}" in UNITS:  # a unit itself (from lmk import analysis): always importable
        return []
    owner = unit_of(module)
    if owner == unit_here or owner == "lmk":
        return []
    return [(owner, name, module[len(owner) + 1:].split(".")[0] if module != owner else None)]


def allowed(owner: str, name: str, via: str | None) -> bool:
    """In the unit's `__all__`, or a name without a leading underscore of a module its `__all__` lists."""
    return name in interface(owner) or (via in interface(owner) and not name.startswith("_"))


def declares_all(path: Path) -> bool:
    """The file assigns `__all__` at its top level (a list, or `__all__, __getattr__ = ...`)."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        for target in node.targets if isinstance(node, ast.Assign) else []:
            if "__all__" in [e.id for e in getattr(target, "elts", [target]) if isinstance(e, ast.Name)]:
                return True
    return False


def test_every_package_names_its_interface():
    missing = [p for p in PACKAGES if not declares_all(ROOT / p.replace(".", "/") / "__init__.py")]
    assert not missing, f"packages without __all__ in their __init__.py: {missing}"


def test_cross_package_imports_use_only_the_interface():
    wrong = []
    for file, unit_here, text in _sources():
        for line, module, name in imports(text):
            for owner, used, via in crossings(unit_here, module, name):
                if not allowed(owner, used, via):
                    wrong.append(f"{file}:{line}: {used} from {owner} (not in its __all__)")
    assert not wrong, "imports of a package's inside from outside it:\n" + "\n".join(wrong)


@pytest.mark.parametrize("unit", sorted(UNITS | {"lmk"}))
def test_every_exported_name_resolves(unit):
    package = importlib.import_module(unit)
    assert [n for n in getattr(package, "__all__", ()) if not hasattr(package, n)] == []


def test_the_checker_sees_a_name_outside_the_interface():
    text = ("from lmk.run.umask_files import _private\nfrom lmk.run import nothing_exported\nimport lmk.hub.offline\n"
            "from lmk.hub.mirror import _inside\n")
    found = [c for _, module, name in imports(text) for c in crossings(None, module, name)]
    assert found == [("lmk.run", "_private", "umask_files"), ("lmk.run", "nothing_exported", None),
                     ("lmk.hub", "offline", None), ("lmk.hub", "_inside", "mirror")]
    assert not any(allowed(*c) for c in found)
    assert allowed("lmk.hub", "apply_mirror", "mirror")  # a public module's public name
    assert crossings("lmk.run", "lmk.run.umask_files", "_private") == []  # inside its own package: free
    assert crossings(None, "lmk", "analysis") == []  # a package itself
