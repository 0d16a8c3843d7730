"""lmk/model/landmark is the code every export carries: it must run where only sentence-transformers is installed, and
load through the Hugging Face loader of a model's own code (flat files, relative imports one level deep)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
from transformers.dynamic_module_utils import get_imports, get_relative_import_files

from lmk.sharing.st_folder import CODE_DIR, code_files

# what an environment with sentence-transformers has anyway (its own requirements and theirs)
ALLOWED = {"torch", "transformers", "sentence_transformers", "numpy", "regex"}
FILES = sorted(CODE_DIR.glob("*.py"))


def _imports(tree: ast.AST, in_try: bool = False) -> list[tuple[ast.AST, bool]]:
    """Every import statement with whether it sits inside a `try` (an optional package)."""
    found = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append((node, in_try))
        found += _imports(node, in_try or isinstance(node, ast.Try))
    return found


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_imports_only_what_sentence_transformers_brings(path: Path) -> None:
    for node, optional in _imports(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            assert node.level == 1 and node.module and "." not in node.module, \
                f"{path.name}:{node.lineno}: import siblings as `from .<file> import ...` (one level, no package)"
            assert (CODE_DIR / f"{node.module}.py").is_file(), f"{path.name}:{node.lineno}: no {node.module}.py"
            continue
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        for name in names:
            top = name.split(".")[0]
            assert top != "lmk", f"{path.name}:{node.lineno}: imports lmk; the exported copy must run without it"
            if not optional:
                assert top in ALLOWED or top in sys.stdlib_module_names or top == "__future__", \
                    f"{path.name}:{node.lineno}: imports {top!r}; import optional packages inside `try`"


@pytest.mark.parametrize("path", code_files(), ids=lambda p: p.name)
def test_the_hugging_face_loader_finds_every_file_a_module_needs(path: Path) -> None:
    """transformers copies a module's file and its relative imports (recursively): all of them are exported files,
    and the packages it checks before running the code are the allowed ones."""
    needed = {Path(f).name for f in get_relative_import_files(str(path))}
    assert needed <= {p.name for p in code_files()}
    assert set(get_imports(str(path))) - {"__future__"} <= ALLOWED | set(sys.stdlib_module_names)
