"""Where the checkout's folders are: found by looking for the repository's markers, never from a module's depth.

A module that moves between layers (or a package installed from a checkout with `pip install -e .`) keeps
finding `conf/`, `notebooks/`, `requirements.lock` and `outputs/`, because the root is the first folder above
the package that holds `pyproject.toml` beside `conf/`.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # lmk/ itself: this file's own package is not a guess
_MARKERS = ("pyproject.toml", "conf")


@lru_cache(maxsize=1)
def repo_root() -> Path | None:
    """The checkout holding this package (the first folder above it with pyproject.toml and conf/), or None
    for a wheel install without one."""
    for folder in PACKAGE_DIR.parents:
        if all((folder / marker).exists() for marker in _MARKERS):
            return folder
    return None


def in_repo(*parts: str) -> Path:
    """`<repo root>/<parts>`; outside a checkout, a clear error naming what needs one."""
    root = repo_root()
    if root is None:
        raise FileNotFoundError(
            f"{'/'.join(parts)} lives in the lmk repository, and this package ({PACKAGE_DIR}) is not inside a "
            "checkout; clone the repository and `pip install -e .` from it")
    return root.joinpath(*parts)
