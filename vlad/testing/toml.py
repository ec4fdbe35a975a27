"""Mappings and daemon configs written as TOML.

:func:`dumps` writes what :mod:`tomllib` reads back to the same mapping: scalars (strings
through JSON escaping, which TOML basic strings accept), arrays, inline tables inside
arrays, nested tables as ``[a.b]`` sections and arrays of tables as ``[[a.b]]``.
:func:`config_toml` writes a :class:`vlad.config.Config` built in code, leaving out the
fields the loader derives (``*_ns``) and those set to None, so ``load_config`` of the text
gives the same config.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_scalar(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{_key(k)} = {_scalar(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def _key(key: str) -> str:
    bare = key and all(c.isalnum() or c in "-_" for c in key)
    return key if bare else json.dumps(key)


def _is_table_array(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(v, Mapping) for v in value)


def dumps(data: Mapping[str, Any]) -> str:
    """``data`` as a TOML document."""
    out: list[str] = []
    _table(data, [], out)
    return "\n".join(out).lstrip("\n") + "\n"


def _table(data: Mapping[str, Any], path: list[str], out: list[str]) -> None:
    plain = {k: v for k, v in data.items() if not isinstance(v, Mapping) and not _is_table_array(v)}
    for k, v in plain.items():
        out.append(f"{_key(k)} = {_scalar(v)}")
    for k, v in data.items():
        if isinstance(v, Mapping):
            sub = [*path, k]
            out.append("")
            out.append("[" + ".".join(map(_key, sub)) + "]")
            _table(v, sub, out)
        elif _is_table_array(v):
            sub = [*path, k]
            for item in v:
                out.append("")
                out.append("[[" + ".".join(map(_key, sub)) + "]]")
                _table(item, sub, out)


def _as_mapping(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        # None has no TOML form: such a field is left out (its default, None, applies).
        return {
            f.name: _as_mapping(getattr(obj, f.name))
            for f in dataclasses.fields(obj)
            if not f.metadata.get("internal") and getattr(obj, f.name) is not None
        }
    if isinstance(obj, (list, tuple)):
        return [_as_mapping(v) for v in obj]
    if isinstance(obj, Mapping):
        return {k: _as_mapping(v) for k, v in obj.items()}
    return obj


def config_toml(cfg: Any) -> str:
    """A :class:`vlad.config.Config` (or any section of it) as TOML text."""
    return dumps(_as_mapping(cfg))
