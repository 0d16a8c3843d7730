"""The machinery every config schema shares (torch-free): `ConfigError`, typed building of a dataclass from a
mapping with unknown keys rejected by name (`build_section`, `Coercible.coerce`): types by OmegaConf's
structured-config validation, choices from `Literal` annotations, bounds from field metadata (`at_least`,
`above`); options that keep old hashes at their default (`hash_neutral`, read by `to_dict` and the run's config
hash); and plain containers from OmegaConf nodes. A typo fails here, before any compute, naming the key, the
value and what is allowed, in one line."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import os
import re
import types
import typing
from collections import abc
from collections.abc import Mapping
from typing import Any, ClassVar, Literal, Union

from hydra.errors import CompactHydraException
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException


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


def unknown_keys(path: str, keys: set[str], known: set[str]) -> None:
    unknown = sorted(keys - known)
    if not unknown:
        return
    key = unknown[0]
    close = difflib.get_close_matches(key, sorted(known), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    where = f"{path}." if path else ""
    raise ConfigError(f"unknown key {where}{key}{hint}; allowed keys: {', '.join(sorted(known))}")


# ---- bounds: one helper, driven by field metadata ----------------------------------------------
def at_least(minimum: float, default: Any = dataclasses.MISSING, **kwargs: Any) -> Any:
    """A dataclass field whose value is >= `minimum` (or None where the annotation allows it)."""
    return dataclasses.field(default=default, metadata={"ge": minimum}, **kwargs)


def above(minimum: float, default: Any = dataclasses.MISSING) -> Any:
    """A dataclass field whose value is > `minimum` (or None where the annotation allows it)."""
    return dataclasses.field(default=default, metadata={"gt": minimum})


def check_bound(key: str, value: Any, hint: Any, ge: float | None = None, gt: float | None = None) -> None:
    """`value` is a number (an integer where `hint` says int; never a bool) inside the bound; None passes where
    `hint` is Optional. The one check behind every `at_least` / `above` field."""
    args = typing.get_args(hint)
    if value is None and type(None) in args:
        return
    integer = int in (hint, *args)
    what = "an integer" if integer else "a number"
    bound = f">= {ge}" if ge is not None else f"> {gt}"
    bad = isinstance(value, bool) or not isinstance(value, int if integer else int | float) or (
        value < ge if ge is not None else not value > gt)
    if bad:
        null = " or null" if type(None) in args else ""
        raise ConfigError(f"{key}={value!r} is not valid; allowed values: {what} {bound}{null}")


# ---- hash-neutral options: declared on the field, read by `to_dict` and by the run's config hash -------------
HASH_NEUTRAL = "hash_neutral"  # field metadata: "everywhere" | "description" (see hash_neutral)


def hash_neutral(default: Any = dataclasses.MISSING, *, config_hash: bool = True, ge: float | None = None,
                 gt: float | None = None, **kwargs: Any) -> Any:
    """A dataclass field added after models and runs were hashed, whose default computes what they computed: while
    it holds its default it is left out of the schema's description (`Coercible.to_dict`: the model and data
    fingerprints) and of a run's config hash (lmk.run.results.config_hash_of), so everything hashed before it
    existed keeps its hash; any other value is hashed. `config_hash=False`: the description only, for a key the
    config hash has always hashed as written (conf/encoder/tiny-decoder.yaml's `lora: null`). `ge`: as `at_least`,
    `gt`: as `above`."""
    bounds = {**({"ge": ge} if ge is not None else {}), **({"gt": gt} if gt is not None else {})}
    metadata = {HASH_NEUTRAL: "everywhere" if config_hash else "description", **bounds}
    return dataclasses.field(default=default, metadata=metadata, **kwargs)


def neutral_defaults(cls: type, *, config_hash: bool = False) -> dict[str, Any]:
    """{field: default} of dataclass `cls`'s `hash_neutral` fields; `config_hash=True`: those a run's config hash
    leaves out at their default too."""
    out = {}
    for f in dataclasses.fields(cls):
        scope = f.metadata.get(HASH_NEUTRAL)
        if scope == "everywhere" or (scope == "description" and not config_hash):
            out[f.name] = f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]
    return out


def without_neutral(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` (keys of dataclass `cls`) less its `hash_neutral` keys that hold their default: its description."""
    neutral = neutral_defaults(cls)
    return {k: v for k, v in values.items() if not (k in neutral and v == neutral[k])}


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def check_bounds(obj: Any, path: str) -> None:
    """Every `at_least` / `above` field of dataclass `obj`, named `<path>.<field>` in a message."""
    for f in dataclasses.fields(obj):
        if "ge" in f.metadata or "gt" in f.metadata:
            check_bound(f"{path}.{f.name}" if path else f.name, getattr(obj, f.name), _hints(type(obj))[f.name],
                        f.metadata.get("ge"), f.metadata.get("gt"))


# ---- types: OmegaConf's structured-config validation -------------------------------------------
def _typed(hint: Any) -> Any:
    """The annotation OmegaConf 2.3 validates: a Literal is its values' type (the choice is checked after), a
    union it cannot type (other than Optional) is Any (the schema's `__post_init__` checks it)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return type(args[0])
    if origin in (Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1:
            return Any
        return typing.Optional[_typed(rest[0])] if type(None) in args else _typed(rest[0])  # noqa: UP045
    return hint


@functools.cache
def _structured(cls: type) -> Any:
    """The OmegaConf schema of `cls`'s plain fields (nested sections are built on their own), every value MISSING:
    only the keys a config gives are validated and converted."""
    fields = [(f.name, _typed(_hints(cls)[f.name]), dataclasses.field(default=MISSING))
              for f in dataclasses.fields(cls) if not dataclasses.is_dataclass(_hints(cls)[f.name])]
    return OmegaConf.structured(dataclasses.make_dataclass(f"{cls.__name__}Types", fields))


_KINDS = {bool: "true, false", int: "an integer", float: "a number", str: "a string"}


def _allowed(hint: Any) -> str:
    """What a value of annotation `hint` may be, in words."""
    args = typing.get_args(hint)
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _allowed(a) for a in args)
    if origin is Literal:
        return ", ".join(map(str, args))
    if origin in (list, tuple) or hint in (list, tuple):
        return "a list" + (f" of {_allowed(args[0])}" if args else "")
    if origin is dict or hint is dict:
        return "a mapping"
    return _KINDS.get(hint, getattr(hint, "__name__", str(hint)))


def _convert(cls: type, values: dict[str, Any], path: str) -> dict[str, Any]:
    """`values` validated and converted by OmegaConf against `cls`'s annotations, Literal choices checked."""
    for name, value in values.items():  # OmegaConf would read "no" as false and "3" as 3: a string stays a string
        hint = _typed(_hints(cls)[name])
        if isinstance(value, str) and ({bool, int, float} & {hint, *typing.get_args(hint)}):
            raise ConfigError(f"{f'{path}.' if path else ''}{name}={value!r} is not valid; allowed values: "
                              f"{_allowed(_hints(cls)[name])}")
    try:
        typed = OmegaConf.to_container(OmegaConf.merge(_structured(cls), values))
    except OmegaConfBaseException as err:
        name = re.split(r"[.\[]", str(err.full_key or err.key or ""))[0]
        if name not in values:  # not a value's fault (a merge of unlike nodes): name the first key
            name = next(iter(values))
        key = f"{path}.{name}" if path else name
        raise ConfigError(f"{key}={values[name]!r} is not valid; allowed values: "
                          f"{_allowed(_hints(cls)[name])}") from None
    assert isinstance(typed, dict)
    out = {k: typed[k] for k in values}
    for name, value in out.items():
        hint = _hints(cls)[name]
        literal = [a for a in (hint, *typing.get_args(hint)) if typing.get_origin(a) is Literal]
        if literal and value is not None:
            choice(f"{path}.{name}" if path else name, value, typing.get_args(literal[0]))
    return out


# ---- a section that is a callable's keyword arguments (Lightning's Trainer) --------------------------
def _fits(value: Any, hint: Any) -> bool:
    """Whether a config value (bool, int, float, str, null, list, mapping) is of annotation `hint`; a mapping with
    `_target_` is an object Hydra builds (its class checks it)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is inspect.Parameter.empty or hint is Any:
        return True
    if origin in (Union, types.UnionType):
        return any(_fits(value, a) for a in args)
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if isinstance(value, Mapping):
        return "_target_" in value or origin in (dict, abc.Mapping) or hint is dict
    if isinstance(value, list):
        return (origin in (list, tuple, abc.Sequence, abc.Iterable) or hint in (list, tuple)) and (
            not args or all(_fits(v, args[0]) for v in value))
    if hint in (int, float) or hint is bool:
        integer = isinstance(value, int) and not isinstance(value, bool)
        return isinstance(value, bool) if hint is bool else integer or (hint is float and isinstance(value, float))
    if isinstance(hint, type) and issubclass(hint, os.PathLike):
        return isinstance(value, str)
    return isinstance(hint, type) and isinstance(value, hint)


def call_arguments(signature: inspect.Signature, node: Any, path: str,
                   set_elsewhere: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Every keyword argument of a call of `signature`, from a config section: each key a parameter (else the
    closest one is named), each value of the parameter's annotation as far as a config can write it, the
    signature's defaults for the rest. `set_elsewhere` {parameter: where it is set}: keys the section may not give.
    The schema is the callable's own signature, so nothing here copies its parameters."""
    set_elsewhere = set_elsewhere or {}
    params = {n: p for n, p in signature.parameters.items()
              if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and n != "self"}
    if not isinstance(node, Mapping):
        raise ConfigError(f"{path}={node!r} is not valid; allowed values: a mapping of {', '.join(params)}")
    for key in node:
        if key in set_elsewhere:
            raise ConfigError(f"{path}.{key} is set by lmk ({set_elsewhere[key]}); remove {path}.{key}")
    unknown_keys(path, set(node), set(params) - set(set_elsewhere))
    for key, value in node.items():
        if not _fits(value, params[key].annotation):
            raise ConfigError(f"{path}.{key}={value!r} is not valid; allowed values: {_allowed(params[key].annotation)}")
    missing = [n for n, p in params.items() if n not in node and n not in set_elsewhere and p.default is p.empty]
    if missing:
        raise ConfigError(f"{path}.{missing[0]} is missing; set it in the {path} config")
    return {n: node.get(n, p.default) for n, p in params.items() if n not in set_elsewhere}


def build_section(cls: type, node: Any, path: str) -> Any:
    """Build dataclass `cls` from a mapping, checking keys and types; errors name `path.key`.

    The one way every schema is built (root sections and the groups alike): unknown keys (with the closest
    known one), then the values against the annotations (OmegaConf's structured-config validation), then the
    dataclass's own checks (`__post_init__`: bounds from field metadata, rules between fields).
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
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown_keys(path, set(node), set(fields))
    sections = {k: v for k, v in node.items() if dataclasses.is_dataclass(_hints(cls)[k])}
    kwargs = _convert(cls, {k: v for k, v in node.items() if k not in sections}, path)
    for name, value in sections.items():
        kwargs[name] = build_section(_hints(cls)[name], value, f"{path}.{name}" if path else name)
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


def without_base(cfg: dict[str, Any], path: str) -> dict[str, Any]:
    """A group file read as it is, not composed by Hydra (`OmegaConf.load(conf/pooling/cls.yaml)`): a defaults list
    of `_`-prefixed bases only (`_base`, `_encode`: the schema's own defaults, tests/test_config_defaults.py holds
    them equal) stands for those defaults; one that names another option (decoder-mini's `table2-mini`) needs Hydra."""
    if "defaults" not in cfg:
        return cfg
    others = [d for d in cfg["defaults"] or [] if not (isinstance(d, str) and d.startswith("_"))]
    if others:
        raise ConfigError(f"{path}: its defaults list names {others}, which only Hydra merges; compose the config "
                          "(hydra.compose, or the command line) instead of reading the file as it is")
    return {k: v for k, v in cfg.items() if k != "defaults"}


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
        return build_section(cls, without_base(cfg, path), path)

    def __post_init__(self) -> None:
        self.check_fields()

    def check_fields(self) -> None:
        """The bounds its fields declare (`at_least` / `above`), in this schema's error."""
        try:
            check_bounds(self, self.section)
        except ConfigError as err:
            raise err if isinstance(err, self._error) else self._error(str(err)) from None

    def to_dict(self) -> dict[str, Any]:
        """The fields, less the `hash_neutral` ones at their default (what was described before they existed)."""
        return without_neutral(type(self), dataclasses.asdict(self))  # type: ignore[call-overload]
