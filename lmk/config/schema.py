"""The machinery every config schema shares (torch-free): `ConfigError`, typed building of a dataclass from a
mapping with unknown keys rejected by name (`build_section`, `Coercible.coerce`), the value checks, and plain
containers from OmegaConf nodes. A typo fails here, before any compute, naming the key and what is allowed."""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, Literal, Union

from hydra.errors import CompactHydraException
from omegaconf import DictConfig, ListConfig, OmegaConf


class UserError(Exception):
    """An error in what the user gave (config, data, model reference, task names, hub availability, a busy run
    folder): the console shows `what` is wrong and the `fix`, no traceback (lmk.run.cli). Raise it (or a subclass)
    as `UserError("<what is wrong>; <the fix>")` or `UserError(what, fix=...)`; without `fix`, the part after the
    last "Fix: ", else after the last "; ", is the fix. Mixing it into another exception class (`class X(UserError, ValueError)`) marks
    that class as a user error everywhere, pickled through submitit included."""

    def __init__(self, what: object = "", *args: object, fix: str | None = None) -> None:
        text = str(what)
        if fix is None:
            # "... Fix: <fix>" (a multi-line report) or "<what>; <fix>" (the house form)
            marker = "Fix: " if "Fix: " in text else "; " if "; " in text else None
            if marker:
                text, _, fix = text.rpartition(marker)
                text = text.rstrip(" .;\n")
        self.what, self.fix = text, fix
        super().__init__(f"{text}; {fix}" if fix else text, *args)


def is_user_error(err: BaseException | None) -> bool:
    """Whether `err` reports a fault in the user's input (see UserError); anything else keeps its traceback."""
    return isinstance(err, UserError)


class ConfigError(UserError, CompactHydraException, ValueError):
    """A bad config value or key; the message names the key, the value and what is allowed.

    A Hydra "compact" error: Hydra prints its message alone (no traceback) unless HYDRA_FULL_ERROR=1.
    """



def choice(key: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not valid; allowed values: {', '.join(map(str, allowed))}")


def number(key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{key}={value!r} is not valid; allowed values: a number")


def positive(key: str, value: Any) -> None:
    number(key, value)
    if not value > 0:
        raise ConfigError(f"{key}={value!r} is not valid; allowed values: a number > 0")


def at_least(key: str, value: Any, minimum: int) -> None:
    number(key, value)
    if value < minimum:
        raise ConfigError(f"{key}={value!r} is not valid; allowed values: >= {minimum}")


def unknown_keys(path: str, keys: set[str], known: set[str]) -> None:
    unknown = sorted(keys - known)
    if not unknown:
        return
    key = unknown[0]
    close = difflib.get_close_matches(key, sorted(known), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    where = f"{path}." if path else ""
    raise ConfigError(f"unknown key {where}{key}{hint}; allowed keys: {', '.join(sorted(known))}")


def check_type(key: str, value: Any, hint: Any) -> Any:
    """Check `value` against a type hint (the subset the schemas use); ints are accepted for floats."""
    if hint is Any or hint is object:
        return value
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is Literal:
        choice(key, value, args)
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors: list[ConfigError] = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return check_type(key, value, arg)
            except ConfigError as err:
                errors.append(err)
        raise errors[0] if len(errors) == 1 else ConfigError(
            f"{key}={value!r} is not valid; allowed: {' or '.join(_type_name(a) for a in args)}")
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key}={value!r} is not valid; allowed values: a list")
        return [check_type(f"{key}[{i}]", v, args[0]) for i, v in enumerate(value)] if args else list(value)
    if origin is dict or hint is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}={value!r} is not valid; allowed values: a mapping")
        return dict(value)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}={value!r} is not valid; allowed values: true, false")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}={value!r} is not valid; allowed values: an integer")
        return value
    if hint is float:
        number(key, value)
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}={value!r} is not valid; allowed values: a string")
        return value
    if value is None:
        raise ConfigError(f"{key}=None is not valid; allowed: {_type_name(hint)}")
    return value


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", str(hint))


def build_section(cls: type, node: Any, path: str) -> Any:
    """Build dataclass `cls` from a mapping, checking keys and types; errors name `path.key`.

    The one way every schema is built (root sections and the groups alike): unknown keys (with the closest
    known one), then each value against its type hint, then the dataclass's own checks (`__post_init__`).
    Errors are ConfigError, or the schema's own subclass of it (`_error`)."""
    error = getattr(cls, "_error", ConfigError)
    try:
        return _build(cls, node, path)
    except ConfigError as err:
        if isinstance(err, error):
            raise
        raise error(str(err)) from None


def _build(cls: type, node: Any, path: str) -> Any:
    if node is None:
        node = {}
    if not isinstance(node, Mapping):
        raise ConfigError(f"{path}={node!r} is not valid; allowed values: a mapping with keys "
                          f"{', '.join(f.name for f in dataclasses.fields(cls))}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown_keys(path, set(node), set(fields))
    kwargs = {}
    for name, value in node.items():
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            kwargs[name] = build_section(hint, value, f"{path}.{name}" if path else name)
        else:
            kwargs[name] = check_type(f"{path}.{name}" if path else name, value, hint)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as err:
        raise ConfigError(str(err) if not path or str(err).startswith(path) else f"{path}: {err}") from err



def to_container(cfg: Any) -> dict[str, Any]:
    """A DictConfig (resolved) or mapping as plain containers."""
    if isinstance(cfg, DictConfig):
        try:
            return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)  # type: ignore[return-value]
        except Exception as err:  # an interpolation / missing value: name it
            raise ConfigError(f"config does not resolve: {err}") from err
    return dict(cfg)



def plain(value: Any) -> Any:
    """DictConfig/ListConfig -> plain containers (hydra's instantiate passes OmegaConf nodes through)."""
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=True)
    return value


def get_key(node: Any, key: str, default: Any = None) -> Any:
    """`node[key]` for a mapping, `node.key` for a dataclass / DictConfig; `default` when absent or None node."""
    if node is None:
        return default
    if isinstance(node, Mapping):
        return node.get(key, default)
    return getattr(node, key, default)


class Coercible:
    """Mixin for the group schemas: `coerce(x)` (through `build_section`) and `to_dict()`."""

    _error: type[Exception] = ConfigError  # the error a bad key or value raises (ConfigError or a subclass)
    section: ClassVar[str] = ""  # the config key the schema validates: messages name `<section>.<key>`

    @classmethod
    def _prepare(cls, cfg: Any) -> Any:
        """Hook: turn a shorthand (e.g. a bare path) into a mapping."""
        return cfg

    @classmethod
    def coerce(cls, cfg: Any, path: str | None = None):  # noqa: ANN206 - returns cls
        """A checked instance from a dataclass, DictConfig or dict (`path`: the key messages name)."""
        if isinstance(cfg, cls):
            return cfg
        if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
            cfg = dataclasses.asdict(cfg)
        cfg = cls._prepare(plain(cfg))
        path = cls.section if path is None else path
        if not isinstance(cfg, dict):
            raise cls._error(f"{path}: expected a mapping (dataclass, DictConfig or dict), got {type(cfg).__name__}")
        return build_section(cls, cfg, path)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]
