"""Two questions every layer asks of the hub, answered once: are we offline, and is this string a hub id?"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

_TRUE = {"1", "true", "yes", "on"}
OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_BARE_ID = re.compile(r"^[A-Za-z0-9][\w.-]*$")  # a legacy hub id without owner (bert-base-uncased)


def hub_offline() -> bool:
    """True when the environment says the hub must not be contacted (never probes the network)."""
    return offline_setting() is not None


def offline_setting() -> str | None:
    """The first variable that makes us offline, as "NAME=value" (for messages), else None."""
    for var in OFFLINE_VARS:
        value = os.environ.get(var, "")
        if value.strip().lower() in _TRUE:
            return f"{var}={value}"
    return None


def is_repo_id(ref: Any, bare: bool = False) -> bool:
    """`ref` is spelled like a hub repo id: "owner/name" (or, with `bare`, a legacy "name" too)."""
    return isinstance(ref, str) and bool(_REPO_ID.match(ref) or (bare and _BARE_ID.match(ref)))


def is_hub_id(ref: Any, bare: bool = False) -> bool:
    """A hub repo id that is not a path on this machine (a folder of that name is read as the folder)."""
    return is_repo_id(ref, bare) and not Path(ref).expanduser().exists()
