"""Reading a training checkpoint without running any code it holds.

A `.ckpt` is a pickle: loaded in full it can call anything (a planted `__reduce__`). lmk loads every checkpoint
(evaluation of a run without an export, the resume rule, Lightning's resume) with `weights_only=True` under
`safe_globals(CHECKPOINT_TYPES)`: torch's tensors and plain containers, plus the few types lmk's checkpoints hold
beyond them. A checkpoint that needs any other type is refused in one line naming the file and the type.
"""

from __future__ import annotations

import collections
import contextlib
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from lmk.config import UserError

# What a Lightning checkpoint written by lmk holds besides tensors and builtins (torch's weights_only default list):
# the module's state_dict is an OrderedDict. Anything else is not lmk's.
CHECKPOINT_TYPES: tuple[Any, ...] = (collections.OrderedDict,)


class CheckpointRefused(UserError, pickle.UnpicklingError):
    """A checkpoint that holds a type lmk's checkpoints never hold: it is not loaded (its code could run)."""


@contextlib.contextmanager
def allowed_types() -> Iterator[None]:
    """torch.load(weights_only=True) inside accepts lmk's checkpoint types (Lightning's resume loads under it)."""
    with torch.serialization.safe_globals(list(CHECKPOINT_TYPES)):
        yield


def _unsafe(path: Path) -> list[str]:
    try:  # reads the pickle's opcodes only; nothing is imported or called
        return list(torch.serialization.get_unsafe_globals_in_checkpoint(path))
    except Exception:  # noqa: BLE001 - a file torch cannot parse: the load's own error says why
        return []


def check_checkpoint(path: str | os.PathLike) -> None:
    """CheckpointRefused when `path` holds a type outside torch's safe list and CHECKPOINT_TYPES."""
    path = Path(path)
    allowed = {f"{t.__module__}.{t.__qualname__}" for t in CHECKPOINT_TYPES}
    foreign = [name for name in _unsafe(path) if name not in allowed]
    if foreign:
        raise CheckpointRefused(f"{path} holds {', '.join(foreign)}, a type lmk's checkpoints never hold, so it was not "
                                "loaded (loading it could run code); use a checkpoint lmk wrote, or retrain")


def load_checkpoint(path: str | os.PathLike, *, mmap: bool = False) -> dict[str, Any]:
    """The checkpoint's dict on the CPU, loaded with weights_only=True (see the module doc)."""
    check_checkpoint(path)
    with allowed_types():
        try:
            return torch.load(path, map_location="cpu", mmap=mmap, weights_only=True)
        except pickle.UnpicklingError as err:  # a type the scan above missed: still refused, in one line
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise CheckpointRefused(f"{path} was not loaded (it needs a type lmk's checkpoints never hold: {first}); "
                                    "use a checkpoint lmk wrote, or retrain") from err
