"""The docs name real code: every `lmk.<module>[.<attribute>]` reference in the README and docs resolves, and
every `python -m lmk.<command>` they show is a runnable module. Paths cannot drift from the layout."""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "experiments").rglob("*.md"))]
REFERENCE = re.compile(r"(?<![\w./-])(lmk(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
COMMAND = re.compile(r"python -m (lmk(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")


def _references() -> list[tuple[str, str]]:
    found = set()
    for doc in DOCS:
        for ref in REFERENCE.findall(doc.read_text(encoding="utf-8")):
            found.add((doc.name, ref.rstrip(".")))
    return sorted(found)


def _resolves(ref: str) -> bool:
    parts = ref.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module)
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


@pytest.mark.parametrize(("doc", "ref"), _references())
def test_every_code_reference_in_the_docs_resolves(doc: str, ref: str) -> None:
    assert _resolves(ref), f"{doc} names {ref}, which does not exist (moved? update the doc)"


def test_every_documented_command_runs_as_a_module() -> None:
    commands = {c for doc in DOCS for c in COMMAND.findall(doc.read_text(encoding="utf-8"))}
    assert "lmk.train" in commands and "lmk.sweep" in commands
    for command in sorted(commands):
        spec = importlib.util.find_spec(command)
        assert spec is not None, f"`python -m {command}` is documented but {command} does not exist"
        if spec.submodule_search_locations:  # a package runs its __main__
            assert importlib.util.find_spec(f"{command}.__main__") is not None, f"{command} has no __main__"
