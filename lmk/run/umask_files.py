"""File permissions that follow the umask.

`tempfile.mkstemp` / `mkdtemp` create 0600 files and 0700 folders whatever the umask; renamed into
place they would make results.json and cache folders private while everything else a run writes is
0644/0755. `follow_umask` gives them the mode a plain `open` / `mkdir` would have.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import platformdirs


def current_umask() -> int:
    mask = os.umask(0)  # the only portable way to read it is to set it
    os.umask(mask)
    return mask


def follow_umask(path: str | os.PathLike, directory: bool = False) -> None:
    """chmod `path` to 0666 (files) or 0777 (folders) minus the umask."""
    os.chmod(path, (0o777 if directory else 0o666) & ~current_umask())


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """lmk's cache folder (built data sets, replicas, tokenizers): `cache_dir`, else $LMK_CACHE, else the
    platform's user cache dir for "lmk"."""
    if cache_dir is not None:
        return Path(cache_dir)
    if os.environ.get("LMK_CACHE"):
        return Path(os.environ["LMK_CACHE"])
    return Path(platformdirs.user_cache_dir("lmk"))


def write_json(path: str | os.PathLike, data: Any, indent: int = 2) -> None:
    """Write `data` as JSON atomically (temp file in the same folder, then rename: a crash never leaves half
    a file, and two writers never share a temp name), with the permissions the umask gives."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=indent, sort_keys=True, default=str)
    follow_umask(tmp)  # mkstemp makes it 0600
    os.replace(tmp, path)
