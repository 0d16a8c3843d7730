"""Landmark (LMK) pooling for dense embeddings.

`interface` is how each package names what other packages, the tests, benchmarks and notebooks may import from
it: in its `__init__.py`, `__all__, __getattr__ = interface(__name__, {"lmk.run.umask_files": ("write_json", ...)},
modules=("results",))`. `from lmk.run import write_json` then loads only lmk.run.umask_files (PEP 562), so a torch-free
layer stays torch-free; `modules` are modules used as namespaces (`from lmk.hub import mirror`).
tests/test_interface.py checks every such import against `__all__`.

`moved` is the module `__getattr__` of a path whose names went elsewhere: the old path keeps working for users, with
a one-line DeprecationWarning naming the new one."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def interface(package: str, names: Mapping[str, Iterable[str]],
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


def moved(old: str, new: str | Mapping[str, str], inner: Callable[[str], Any] | None = None) -> Callable[[str], Any]:
    """The module `__getattr__` of the deprecated path `old`: a name is looked up in `new` (a module, or per name its
    new `module.name`), with a DeprecationWarning naming the new path; `inner`, the package's own, answers first."""

    def __getattr__(name: str) -> Any:
        if inner is not None:
            try:
                return inner(name)
            except AttributeError:
                pass  # not the package's own: perhaps one that moved
        target = f"{new}.{name}" if isinstance(new, str) else new.get(name)
        if target is None or (name.startswith("__") and name != "__all__"):
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        module, _, attr = target.rpartition(".")
        if name != "__all__":
            warnings.warn(f"{old}.{name} is deprecated: use {target}", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(module), attr)

    return __getattr__


# the layers and the commands (`python -m lmk.<command>`), each with its own __all__
_PARTS, __getattr__ = interface(__name__, {}, modules=(
    "analysis", "config", "data", "download", "eval", "evaluate", "export", "hub", "model", "notebooks", "prefetch",
    "run", "sharing", "sweep", "tables", "train"))
__all__ = ["interface", "moved", *_PARTS]
