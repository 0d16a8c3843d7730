"""A package's interface, loaded on first use (PEP 562): in its `__init__.py`,

    __all__, __getattr__ = exports(__name__, {"lmk.run.files": ("write_json", ...)}, modules=("results",))

names what other packages, the tests, benchmarks and notebooks may import from it (tests/test_interface.py checks
every such import against `__all__`), and `from lmk.run import write_json` works without importing the package's
other modules, so a torch-free layer stays torch-free. `modules` are modules used as namespaces
(`from lmk.hub import mirror`)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["exports"]


def exports(package: str, names: Mapping[str, Iterable[str]],
            modules: Iterable[str] = ()) -> tuple[list[str], Callable[[str], Any]]:
    """`__all__` (sorted) and the module `__getattr__` that imports a name's module when the name is first used."""
    where = {name: module for module, group in names.items() for name in group}
    namespaces = set(modules)

    def __getattr__(name: str) -> Any:
        if name in namespaces:
            return importlib.import_module(f"{package}.{name}")
        if name in where:
            return getattr(importlib.import_module(where[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return sorted(where.keys() | namespaces), __getattr__
