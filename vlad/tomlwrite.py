"""The one TOML writer: mappings to text that :mod:`tomllib` reads back to the same mapping.

Every file vlad writes as TOML (daemon configs, release manifests, imported contracts, pi0
planner files) is built as a dict and written by :func:`dumps`: scalars (strings through
JSON escaping, which TOML basic strings accept; datetimes as RFC 3339), arrays, inline
tables, nested tables as ``[a.b]`` sections and arrays of tables as ``[[a.b]]``. Keys that
are not bare TOML keys are quoted.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Collection, Mapping
from typing import Any

__all__ = ["dumps", "value"]


def value(v: Any) -> str:
    """One TOML value (a scalar, an array or an inline table)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, dt.datetime):
        if v.tzinfo is None:
            return v.isoformat()
        t = v.astimezone(dt.UTC)  # RFC 3339 in UTC, microseconds only when non-zero
        return t.replace(tzinfo=None).isoformat(timespec="microseconds" if t.microsecond else "seconds") + "Z"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{ " + ", ".join(f"{key(k)} = {value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def key(k: str) -> str:
    """``k`` as a TOML key: bare when it can be, quoted otherwise."""
    bare = k and all(c.isascii() and (c.isalnum() or c in "-_") for c in k)
    return k if bare else json.dumps(k, ensure_ascii=False)


def _is_table_array(v: Any) -> bool:
    return isinstance(v, (list, tuple)) and bool(v) and all(isinstance(x, Mapping) for x in v)


def dumps(data: Mapping[str, Any], header: str = "", inline: Collection[str] = ()) -> str:
    """``data`` as a TOML document.

    ``header`` becomes leading ``#`` comment lines. Keys in ``inline`` that hold arrays of
    tables are written as inline arrays rather than ``[[...]]`` sections. Within each table,
    plain values come first (TOML puts them before any section), then sub-tables, then
    arrays of tables, each in the mapping's order.
    """
    comments = [f"# {line}" if line else "#" for line in header.splitlines()]
    body: list[str] = []
    _table(data, [], body, frozenset(inline))
    return "\n".join([*comments, "\n".join(body).lstrip("\n")]) + "\n"


def _table(data: Mapping[str, Any], path: list[str], out: list[str], inline: frozenset[str]) -> None:
    def nested(k: str, v: Any) -> bool:
        return _is_table_array(v) and k not in inline

    for k, v in data.items():
        if not isinstance(v, Mapping) and not nested(k, v):
            out.append(f"{key(k)} = {value(v)}")
    for k, v in data.items():
        if isinstance(v, Mapping):
            sub = [*path, k]
            out.extend(["", "[" + ".".join(map(key, sub)) + "]"])
            _table(v, sub, out, inline)
    for k, v in data.items():
        if nested(k, v):
            sub = [*path, k]
            for item in v:
                out.extend(["", "[[" + ".".join(map(key, sub)) + "]]"])
                _table(item, sub, out, inline)
