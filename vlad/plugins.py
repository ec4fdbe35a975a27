"""Plugin loading: the ``vlad`` entry-point group, for built-in and third-party plugins alike.

``VLAD_PLUGINS=onnxruntime,torch`` restricts loading to those entry-point names (an empty
value loads none); ``VLAD_PLUGIN_MODULES=pkg.module,...`` registers extra plugin modules by
import path (an integrator's local plugin, or a test's fault injection) without packaging
them; ``VLAD_TRACE_PLUGINS=1`` prints every hook call and result to stderr.

Built-in plugins (:data:`DEFAULT_PLUGINS`, e.g. the health monitors) are registered the
same way, as modules implementing hooks.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
from dataclasses import dataclass
from functools import lru_cache

import pluggy

from vlad import hookspecs
from vlad.errors import BackendUnavailable, VladError

ENTRY_POINT_GROUP = "vlad"
DEFAULT_PLUGINS = ("vlad.health.monitors", "vlad.health.sensors")


@dataclass(frozen=True)
class PluginInfo:
    name: str  # entry-point name
    module: str
    distribution: str
    version: str


def _allowed() -> set[str] | None:
    raw = os.environ.get("VLAD_PLUGINS")
    if raw is None:
        return None
    return {p.strip() for p in raw.split(",") if p.strip()}


def _infos(pm: pluggy.PluginManager) -> dict[str, PluginInfo]:
    """The plugin metadata vlad keeps on its manager (our own attribute, made on first use)."""
    infos: dict[str, PluginInfo] = vars(pm).setdefault("_vlad_info", {})
    return infos


def make_plugin_manager(load_entry_points: bool = True) -> pluggy.PluginManager:
    """A fresh plugin manager with the hookspecs and the (allowed) entry-point plugins."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    if load_entry_points:
        allowed = _allowed()
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            if allowed is not None and ep.name not in allowed:
                continue
            if pm.get_plugin(ep.name) is not None:
                continue
            pm.register(ep.load(), name=ep.name)
            dist = ep.dist
            _infos(pm)[ep.name] = PluginInfo(
                ep.name, ep.value, dist.name if dist else "?", dist.version if dist else "?"
            )
    for module in DEFAULT_PLUGINS:
        pm.register(importlib.import_module(module), name=module)
    for module in filter(None, (m.strip() for m in os.environ.get("VLAD_PLUGIN_MODULES", "").split(","))):
        try:
            pm.register(importlib.import_module(module), name=module)
        except ImportError as exc:
            raise VladError(f"VLAD_PLUGIN_MODULES: cannot import {module!r}: {exc}") from None
        _infos(pm)[module] = PluginInfo(module, module, "(module)", "-")
    if os.environ.get("VLAD_TRACE_PLUGINS"):
        pm.trace.root.setwriter(lambda msg: print(msg, end="", file=sys.stderr))
        pm.enable_tracing()
    return pm


@lru_cache(maxsize=1)
def plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager (loaded once)."""
    return make_plugin_manager()


def plugin_infos(pm: pluggy.PluginManager | None = None) -> list[PluginInfo]:
    pm = pm or plugin_manager()
    return list(getattr(pm, "_vlad_info", {}).values())


def backends(pm: pluggy.PluginManager | None = None) -> dict:
    """All backends offered by the loaded plugins, by name; a duplicate name is an error."""
    pm = pm or plugin_manager()
    found: dict = {}
    for result in pm.hook.vlad_backends():
        for backend in result or ():
            if backend.name in found:
                raise VladError(f"two plugins provide a backend named {backend.name!r}")
            found[backend.name] = backend
    return found


def get_backend(name: str, pm: pluggy.PluginManager | None = None):
    """The backend called ``name``; a clear error if no loaded plugin provides it."""
    available = backends(pm)
    if name not in available:
        hint = "" if available else " (no backend plugins are loaded: check VLAD_PLUGINS and the installed plugins)"
        known = ", ".join(sorted(available)) or "none"
        raise BackendUnavailable(f"no backend {name!r}; loaded backends: {known}{hint}")
    return available[name]


def monitors(config: dict, pm: pluggy.PluginManager | None = None) -> list:
    pm = pm or plugin_manager()
    return [m for result in pm.hook.vlad_monitors(config=config) for m in (result or ())]


def sensors(pm: pluggy.PluginManager | None = None) -> list:
    pm = pm or plugin_manager()
    return [s for result in pm.hook.vlad_sensors() for s in (result or ())]
