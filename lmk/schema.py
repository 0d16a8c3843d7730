"""Shared plumbing of the structured-config dataclasses: build one from a dataclass, DictConfig or
dict, rejecting unknown keys by name (so a typo fails before any compute, listing the allowed keys)."""

from __future__ import annotations

import dataclasses
from typing import Any


def plain(value: Any) -> Any:
    """DictConfig/ListConfig -> plain containers (hydra's instantiate passes OmegaConf nodes through)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=True)
    return value


def get_key(node: Any, key: str, default: Any = None) -> Any:
    """`node[key]` for a mapping, `node.key` for a dataclass / DictConfig; `default` when absent or None node."""
    from collections.abc import Mapping

    if node is None:
        return default
    if isinstance(node, Mapping):
        return node.get(key, default)
    return getattr(node, key, default)


class Coercible:
    """Mixin for config dataclasses: `coerce(x)` and `to_dict()`."""

    _error: type[Exception] = ValueError  # the error a bad key raises (a ValueError subclass)

    @classmethod
    def _prepare(cls, cfg: Any) -> Any:
        """Hook: turn a shorthand (e.g. a bare path) into a mapping."""
        return cfg

    @classmethod
    def coerce(cls, cfg: Any):  # noqa: ANN206 - returns cls
        if isinstance(cfg, cls):
            return cfg
        if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
            cfg = dataclasses.asdict(cfg)
        cfg = cls._prepare(plain(cfg))
        if not isinstance(cfg, dict):
            raise TypeError(f"{cls.__name__}: expected a dataclass, DictConfig or dict, got {type(cfg).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(cfg) - known)
        if unknown:
            raise cls._error(f"{cls.__name__}: unknown keys {unknown}; allowed keys: {', '.join(sorted(known))}")
        return cls(**cfg)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]
