"""The one schema parser: TOML-shaped data -> frozen typed dataclasses, every problem at once.

Config, contract and manifest are all parsed here, driven by their dataclasses' type
hints, so a value of the wrong type is one clear line (``serve.warmup: expected an
integer, got a float``) wherever it appears, and nothing downstream re-checks types.

Supported field types: ``str`` (non-empty unless ``metadata={"allow_empty": True}``),
``int`` (a TOML integer, never a boolean or float), ``float`` (finite; integers accepted),
``bool``, ``Literal[...]`` of strings, ``X | None``, ``tuple[X, ...]`` (from an array),
nested dataclasses (from a table), ``datetime`` (TOML datetime or RFC 3339 string, with a
UTC offset) and ``Mapping[str, Any]`` / ``dict[str, Any]`` (a free-form table, e.g. backend
options, whose values the owner checks). Unknown keys are problems with a "did you mean"
hint. Field metadata: ``internal`` (not read from data), ``allow_empty``, and ``min`` /
``max`` bounds for numbers.

After a dataclass parsed, an optional check ``checks[cls](obj, path, problems)`` runs its
cross-field rules. :func:`parse` raises ``error(source, problems)``.
"""

from __future__ import annotations

import collections.abc
import datetime as dt
import difflib
import math
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, fields, is_dataclass
from typing import Any, Literal, TypeVar

from vlad.errors import ProblemsError

T = TypeVar("T")
Check = Callable[[Any, str, list[str]], None]

# Sentinel for a value that failed to parse; its problem is already recorded.
BROKEN: Any = object()
_HINTS: dict[type, dict[str, Any]] = {}
_UnionType = type(int | None)
# TOML nests at most this deep in any of our files; deeper is hostile input.
MAX_DEPTH = 32


def parse(
    cls: type[T], data: Any, source: str, error: type[ProblemsError], checks: Mapping[type, Check] | None = None
) -> T:
    """Validate ``data`` into ``cls`` or raise ``error(source, problems)`` listing every problem."""
    problems: list[str] = []
    if not isinstance(data, dict):
        raise error(source, [f"expected a table at top level, got {kind(data)}"])
    value = convert(cls, data, "", problems, checks=checks or {})
    if problems or value is BROKEN:
        raise error(source, problems or ["invalid"])
    return typing.cast(T, value)


def hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def kind(value: Any) -> str:
    """A TOML-ish name for the type of ``value`` (for messages)."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, dt.datetime):
        return "a datetime"
    return f"a {type(value).__name__}"


def parse_fields(
    cls: type, raw: Mapping[str, Any], path: str, problems: list[str], checks: Mapping[type, Check], depth: int = 0
) -> tuple[dict[str, Any], bool]:
    """Convert the keys of ``raw`` to ``cls``'s fields; returns (good values, all good)."""
    types = hints(cls)
    values: dict[str, Any] = {}
    complete = True
    known = [f.name for f in fields(cls) if not f.metadata.get("internal") and f.init]
    for f in fields(cls):
        if f.metadata.get("internal") or not f.init:
            continue
        fpath = join(path, f.name)
        tp = types[f.name]
        if f.name not in raw:
            if f.default is not MISSING:
                values[f.name] = f.default
            elif f.default_factory is not MISSING:
                values[f.name] = f.default_factory()
            elif optional_arg(tp) is not None:
                values[f.name] = None
            else:
                problems.append(f"{fpath}: missing")
                complete = False
            continue
        value = convert(tp, raw[f.name], fpath, problems, f.metadata, checks, depth + 1)
        if value is BROKEN:
            complete = False
        else:
            values[f.name] = value
    for key in raw:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(known)}"
            problems.append(f"{join(path, str(key))}: unknown key ({hint})")
            complete = False
    return values, complete


def optional_arg(tp: Any) -> Any:
    """``X`` for ``X | None``, else None."""
    if typing.get_origin(tp) in (typing.Union, _UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return None


def convert(
    tp: Any,
    value: Any,
    path: str,
    problems: list[str],
    meta: Any = None,
    checks: Mapping[type, Check] | None = None,
    depth: int = 0,
) -> Any:
    """Check ``value`` against type ``tp``; returns the converted value or :data:`BROKEN`."""
    checks = checks or {}
    if depth > MAX_DEPTH:
        problems.append(f"{path}: nested deeper than {MAX_DEPTH} levels")
        return BROKEN
    inner = optional_arg(tp)
    if inner is not None:
        tp = inner
    origin = typing.get_origin(tp)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if not isinstance(value, str):
            problems.append(f"{path}: expected a string, got {kind(value)}")
            return BROKEN
        if value not in allowed:
            problems.append(f"{path}: unknown value {value!r} (known: {', '.join(allowed)})")
            return BROKEN
        return value
    if origin is tuple:
        item_tp = typing.get_args(tp)[0]
        if not isinstance(value, list):
            problems.append(f"{path}: expected an array, got {kind(value)}")
            return BROKEN
        items = [convert(item_tp, v, f"{path}[{i}]", problems, None, checks, depth + 1) for i, v in enumerate(value)]
        return BROKEN if any(i is BROKEN for i in items) else tuple(items)
    if origin in (dict, collections.abc.Mapping) or tp in (dict, Mapping):
        if not isinstance(value, dict):
            problems.append(f"{path}: expected a table, got {kind(value)}")
            return BROKEN
        if _depth(value) + depth > MAX_DEPTH:
            problems.append(f"{path}: nested deeper than {MAX_DEPTH} levels")
            return BROKEN
        return dict(value)
    if is_dataclass(tp):
        if not isinstance(value, dict):
            problems.append(f"{path}: expected a table, got {kind(value)}")
            return BROKEN
        values, complete = parse_fields(typing.cast(type, tp), value, path, problems, checks, depth)
        if not complete:
            return BROKEN
        obj = typing.cast(Callable[..., Any], tp)(**values)
        check = checks.get(typing.cast(type, tp))
        if check is not None:
            check(obj, path, problems)
        return obj
    if tp is str:
        if not isinstance(value, str):
            problems.append(f"{path}: expected a string, got {kind(value)}")
            return BROKEN
        if not value.strip() and not (meta and meta.get("allow_empty")):
            problems.append(f"{path}: must not be empty")
            return BROKEN
        if "\x00" in value:
            problems.append(f"{path}: must not contain NUL characters")
            return BROKEN
        if meta and meta.get("max_len") is not None and len(value) > meta["max_len"]:
            problems.append(f"{path}: longer than {meta['max_len']} characters")
            return BROKEN
        return value
    if tp is bool:
        if not isinstance(value, bool):
            problems.append(f"{path}: expected true or false, got {kind(value)}")
            return BROKEN
        return value
    if tp is int:
        # bool is an int in Python but `true` is never a meaningful size in TOML.
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"{path}: expected an integer, got {kind(value)}")
            return BROKEN
        return _bounded(value, path, problems, meta)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            problems.append(f"{path}: expected a number, got {kind(value)}")
            return BROKEN
        if not math.isfinite(value):
            problems.append(f"{path}: must be finite, got {value}")
            return BROKEN
        return _bounded(float(value), path, problems, meta)
    if tp is dt.datetime:
        if isinstance(value, str):
            try:
                value = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                problems.append(f"{path}: not an RFC 3339 timestamp: {value!r}")
                return BROKEN
        if not isinstance(value, dt.datetime):
            problems.append(f"{path}: expected a datetime, got {kind(value)}")
            return BROKEN
        if value.tzinfo is None:
            problems.append(f"{path}: needs a UTC offset (e.g. 2025-01-01T00:00:00Z)")
            return BROKEN
        return value.astimezone(dt.UTC)
    if tp is Any:
        return value
    raise TypeError(f"schema uses an unsupported type {tp!r} at {path}")


def _bounded(value: Any, path: str, problems: list[str], meta: Any) -> Any:
    if meta:
        lo, hi = meta.get("min"), meta.get("max")
        if lo is not None and value < lo:
            problems.append(f"{path}: must be >= {lo}, got {value}")
            return BROKEN
        if hi is not None and value > hi:
            problems.append(f"{path}: must be <= {hi}, got {value}")
            return BROKEN
    return value


def _depth(value: Any, limit: int = MAX_DEPTH + 1) -> int:
    """Nesting depth of tables and arrays (iterative: hostile input must not recurse)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        v, d = stack.pop()
        deepest = max(deepest, d)
        if d > limit:
            return d
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v)
    return deepest


def bounded(lo: float | None = None, hi: float | None = None, **extra: Any) -> dict[str, Any]:
    """Field metadata for a number range: ``field(default=5, metadata=bounded(1))``."""
    return {"min": lo, "max": hi, **extra}
