"""The names (and declared needs) of registered components, read from their source without importing it.

Config validation must stay torch-free, yet the poolers and tokenization strategies are torch code. Rather
than keep a second list of their names here, this module reads the declarations the implementations
themselves use, with `ast` (no import, milliseconds):

- poolers: the classes decorated with `@register_pooler` in `lmk/model/landmark/*.py`, with their literal
  class attributes (`name`, `needs_pool_mask`, ...), inherited ones included;
- strategies: the `STRATEGY_TRAITS` table of `lmk/model/landmark/layouts.py`;
- sentence splitters: the `SPLITTERS` of `lmk/model/landmark/sentences.py`.

The model layer builds its runtime registries from the same classes and table when imported (a duplicate
name fails there and here); tests/test_registry.py checks that both views agree.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path
from typing import Any

from lmk.config.schema import ConfigError

MODEL_DIR = Path(__file__).resolve().parents[1] / "model"
POOLING_DIR = MODEL_DIR / "landmark"  # the code every export carries (poolers among other files)
LAYOUTS_FILE = POOLING_DIR / "layouts.py"
SENTENCES_FILE = POOLING_DIR / "sentences.py"
POOLER_DECORATOR = "register_pooler"


def _literal_attrs(node: ast.ClassDef) -> dict[str, Any]:
    """The class body's `x = <literal>` / `x: T = <literal>` assignments."""
    out: dict[str, Any] = {}
    for stmt in node.body:
        target, value = None, None
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            target, value = stmt.targets[0].id, stmt.value
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
            target, value = stmt.target.id, stmt.value
        if target is None:
            continue
        try:
            out[target] = ast.literal_eval(value)
        except ValueError:  # not a literal (a computed attribute): not a declaration
            continue
    return out


def _decorated(node: ast.ClassDef, decorator: str) -> bool:
    for d in node.decorator_list:
        name = d.id if isinstance(d, ast.Name) else d.attr if isinstance(d, ast.Attribute) else None
        if name == decorator:
            return True
    return False


def declared_classes(folder: Path, decorator: str) -> dict[str, dict[str, Any]]:
    """{registry name: declared attributes} of the classes in `folder/*.py` decorated with `decorator`; a class
    inherits the literal attributes of the classes it derives from in the same folder."""
    classes: dict[str, tuple[list[str], dict[str, Any], bool, str]] = {}
    for path in sorted(folder.glob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8"), filename=str(path)).body:
            if isinstance(node, ast.ClassDef):
                bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
                classes[node.name] = (bases, _literal_attrs(node), _decorated(node, decorator), path.name)

    def attrs(name: str) -> dict[str, Any]:
        bases, own, _, _ = classes[name]
        merged: dict[str, Any] = {}
        for base in bases:
            if base in classes:
                merged.update(attrs(base))
        merged.update(own)
        return merged

    found: dict[str, dict[str, Any]] = {}
    where: dict[str, str] = {}
    for cls, (_, _, registered, file) in classes.items():
        if not registered:
            continue
        declared = attrs(cls)
        name = declared.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{folder / file}: class {cls} is @{decorator} but declares no literal `name = \"...\"`")
        if name in found:
            raise ConfigError(f"two classes register the name {name!r}: {where[name]} and {file}:{cls}; rename one")
        found[name], where[name] = declared, f"{file}:{cls}"
    return found


def literal(path: Path, variable: str) -> Any:
    """The literal value of module-level `variable` in `path` (`x = ...` or `x: T = ...`)."""
    for node in ast.parse(path.read_text(encoding="utf-8"), filename=str(path)).body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else \
            node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and target.id == variable and node.value is not None:
            return ast.literal_eval(node.value)
    raise ConfigError(f"{path}: no literal {variable} (lmk.config reads it from the source; keep it a literal)")


@lru_cache(maxsize=1)
def poolers() -> dict[str, dict[str, Any]]:
    """{pooler name: declared needs} of every registered pooler (lmk/model/landmark)."""
    return declared_classes(POOLING_DIR, POOLER_DECORATOR)


@lru_cache(maxsize=1)
def strategies() -> dict[str, dict[str, bool]]:
    """{strategy name: traits} of every tokenization strategy (lmk.model.landmark.layouts.STRATEGY_TRAITS)."""
    return dict(literal(LAYOUTS_FILE, "STRATEGY_TRAITS"))
