"""Daemon configs written as TOML.

:func:`dumps` is :func:`vlad.tomlwrite.dumps` (the one TOML writer).
:func:`config_toml` writes a :class:`vlad.config.Config` built in code, leaving out the
fields the loader derives (``*_ns``) and those set to None, so ``load_config`` of the text
gives the same config.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from vlad.tomlwrite import dumps

__all__ = ["config_toml", "dumps"]


def _as_mapping(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        # None has no TOML form: such a field is left out (its default, None, applies).
        out = {
            f.name: _as_mapping(getattr(obj, f.name))
            for f in dataclasses.fields(obj)
            if not f.metadata.get("internal") and getattr(obj, f.name) is not None
        }
        for f in dataclasses.fields(obj):
            if f.metadata.get("tables"):  # a mapping of sub-tables ([monitors.<name>]), written as such
                out.update(_as_mapping(getattr(obj, f.name)))
        return out
    if isinstance(obj, (list, tuple)):
        return [_as_mapping(v) for v in obj]
    if isinstance(obj, Mapping):
        return {k: _as_mapping(v) for k, v in obj.items()}
    return obj


def config_toml(cfg: Any) -> str:
    """A :class:`vlad.config.Config` (or any section of it) as TOML text."""
    return dumps(_as_mapping(cfg))
