"""Plugin loading: the ``vlad`` entry-point group, for built-in and third-party plugins alike.

Everything goes through pluggy's own API: :meth:`pluggy.PluginManager.load_setuptools_entrypoints`
discovers the installed plugins, :meth:`~pluggy.PluginManager.list_plugin_distinfo` says which
distribution provided each (``vladctl plugins``), and :meth:`~pluggy.PluginManager.check_pending`
refuses a plugin that implements a hook vlad does not have (a misspelt ``@hookimpl`` would
otherwise be silently ignored, and the daemon would run without it).

``VLAD_PLUGINS=onnxruntime,torch`` restricts loading to those entry-point names (an empty
value loads none); ``VLAD_PLUGIN_MODULES=pkg.module,...`` registers extra plugin modules by
import path (an integrator's local plugin, or a test's fault injection) without packaging
them; ``VLAD_TRACE_PLUGINS=1`` prints every hook call and result to stderr.

Built-in plugins (:data:`DEFAULT_PLUGINS`, e.g. the health monitors) are registered the
same way, as modules implementing hooks.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, cast

import pluggy

from vlad import hookspecs
from vlad.errors import BackendUnavailable, VladError

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Callable
    from pathlib import Path

    from vlad.config import Config

    # the function a plugin offers ./scripts/demo --remote (hook vlad_remote_demo)
    RemoteDemo = Callable[[Path, Path], tuple[Config, subprocess.Popen]]

ENTRY_POINT_GROUP = "vlad"
DEFAULT_PLUGINS = ("vlad.health.monitors", "vlad.health.sensors")
# Distribution shown for a plugin registered by import path (VLAD_PLUGIN_MODULES) or by
# code (pm.register): it came from no installed distribution.
UNPACKAGED = "(module)"


@dataclass(frozen=True)
class PluginInfo:
    name: str  # entry-point name (or module path for an unpackaged plugin)
    module: str
    distribution: str
    version: str


def _allowed() -> set[str] | None:
    raw = os.environ.get("VLAD_PLUGINS")
    if raw is None:
        return None
    return {p.strip() for p in raw.split(",") if p.strip()}


def _hook_names() -> list[str]:
    marker = f"{hookspecs.PROJECT}_spec"
    return sorted(name for name, f in vars(hookspecs).items() if callable(f) and hasattr(f, marker))


def _plugin_label(pm: pluggy.PluginManager, plugin: object) -> str:
    return pm.get_name(plugin) or str(getattr(plugin, "__name__", repr(plugin)))


def check(pm: pluggy.PluginManager) -> None:
    """Refuse hook implementations that match no hookspec, in one line that says which.

    pluggy only validates an implementation against a spec it knows; ``vlad_backend``
    (for ``vlad_backends``) would be registered and never called. This turns pluggy's
    :meth:`~pluggy.PluginManager.check_pending` into a :class:`VladError` naming the
    plugin, the unknown hook, and the closest real hook.
    """
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise VladError(_unknown_hook_message(pm, exc)) from None


def _unknown_hook_message(pm: pluggy.PluginManager, exc: pluggy.PluginValidationError) -> str:
    known = _hook_names()
    plugin = _plugin_label(pm, exc.plugin)
    # check_pending stops at the first unknown hook; name it from the manager's own table.
    unknown = sorted(
        name
        for name in vars(pm.hook)
        if not name.startswith("_")
        and not getattr(pm.hook, name).has_spec()
        and any(impl.plugin is exc.plugin for impl in getattr(pm.hook, name).get_hookimpls())
    )
    name = unknown[0] if unknown else "?"
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else f" (vlad's hooks: {', '.join(known)})"
    return f"plugin {plugin!r} implements unknown hook {name!r}{hint}: fix or remove its @hookimpl"


def _broken_entry_point(exc: Exception, allowed: set[str] | None) -> str:
    """One line naming the entry point that failed to load, its distribution, and the way out."""
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if allowed is not None and ep.name not in allowed:
            continue
        try:
            ep.load()
        except Exception as err:
            dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist else "an unknown distribution"
            return (
                f"plugin {ep.name!r} (entry point {ep.value!r} of {dist}) does not load: "
                f"{type(err).__name__}: {err}; fix or uninstall it, or name the plugins to load in VLAD_PLUGINS"
            )
    return f"a {ENTRY_POINT_GROUP!r} entry-point plugin does not load: {type(exc).__name__}: {exc}"


def _register(pm: pluggy.PluginManager, plugin: object, name: str) -> None:
    """Register, turning pluggy's validation error (a hook with wrong arguments) into one line."""
    try:
        pm.register(plugin, name=name)
    except pluggy.PluginValidationError as exc:
        raise VladError(f"plugin {name!r}: {exc}") from None


def make_plugin_manager(load_entry_points: bool = True) -> pluggy.PluginManager:
    """A fresh plugin manager with the hookspecs, the (allowed) entry-point plugins, the
    built-ins and ``VLAD_PLUGIN_MODULES``; every implemented hook checked against a spec."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    if load_entry_points:
        allowed = _allowed()
        try:
            if allowed is None:
                pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
            else:
                for name in sorted(allowed):  # a name no distribution provides loads nothing
                    pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP, name=name)
        except pluggy.PluginValidationError as exc:
            raise VladError(f"plugin {_plugin_label(pm, exc.plugin)!r}: {exc}") from None
        except Exception as exc:  # an installed plugin that does not import: name it in one line
            raise VladError(_broken_entry_point(exc, allowed)) from None
    for module in DEFAULT_PLUGINS:
        _register(pm, importlib.import_module(module), module)
    for module in filter(None, (m.strip() for m in os.environ.get("VLAD_PLUGIN_MODULES", "").split(","))):
        if pm.has_plugin(module):
            continue
        try:
            imported = importlib.import_module(module)
        except Exception as exc:  # ImportError, or any error the module raises while it imports
            raise VladError(f"VLAD_PLUGIN_MODULES: cannot import {module!r}: {type(exc).__name__}: {exc}") from None
        _register(pm, imported, module)
    check(pm)
    if os.environ.get("VLAD_TRACE_PLUGINS"):
        pm.trace.root.setwriter(lambda msg: print(msg, end="", file=sys.stderr))
        pm.enable_tracing()
    return pm


@lru_cache(maxsize=1)
def plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager (loaded once)."""
    return make_plugin_manager()


def plugin_infos(pm: pluggy.PluginManager | None = None) -> list[PluginInfo]:
    """Every plugin that is not built into vlad: the distribution that provided it (pluggy's
    :meth:`~pluggy.PluginManager.list_plugin_distinfo`), or :data:`UNPACKAGED`."""
    pm = pm or plugin_manager()
    from_dist = {id(plugin): dist for plugin, dist in pm.list_plugin_distinfo()}
    out = []
    for name, plugin in pm.list_name_plugin():
        if plugin is None or name in DEFAULT_PLUGINS:
            continue
        module = getattr(plugin, "__name__", type(plugin).__module__)
        dist = from_dist.get(id(plugin))
        if dist is not None:
            out.append(PluginInfo(name, module, dist.metadata["Name"], dist.version))
        else:
            out.append(PluginInfo(name, module, UNPACKAGED, "-"))
    return out


def _backends_by_plugin(pm: pluggy.PluginManager) -> dict[str, tuple[Any, str]]:
    """Backend name -> (backend, the name of the plugin that provides it)."""
    found: dict[str, tuple[Any, str]] = {}
    # Each implementation is called on its own (not through pm.hook) so that every backend
    # is attributed to its plugin, and a duplicate names both plugins.
    for impl in reversed(pm.hook.vlad_backends.get_hookimpls()):  # pluggy's call order
        offered = cast("list[Any]", impl.function() or [])
        for backend in offered:
            if backend.name in found:
                raise VladError(
                    f"two plugins provide a backend named {backend.name!r}: "
                    f"{found[backend.name][1]!r} and {impl.plugin_name!r}"
                )
            found[backend.name] = (backend, impl.plugin_name)
    return found


def backends(pm: pluggy.PluginManager | None = None) -> dict:
    """All backends offered by the loaded plugins, by name; a duplicate name is an error."""
    return {name: b for name, (b, _) in _backends_by_plugin(pm or plugin_manager()).items()}


def backend_plugins(pm: pluggy.PluginManager | None = None) -> dict[str, str]:
    """Backend name -> the name of the plugin providing it (see :func:`plugin_infos`)."""
    return {name: plugin for name, (_, plugin) in _backends_by_plugin(pm or plugin_manager()).items()}


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


def monitor_settings(pm: pluggy.PluginManager | None = None) -> dict[str, type | None]:
    """Every monitor the loaded plugins offer: its name -> the dataclass of its own config
    table ``[monitors.<name>]`` (its ``Settings``; None: it takes none). What the config
    parser reads the monitors' tables with (:func:`vlad.config.parse_monitor_tables`): the
    monitors declare them, no second list does. The monitors are made once to be asked,
    with the default thresholds (making one must be cheap and do nothing)."""
    from dataclasses import asdict

    from vlad.config import MonitorsConfig

    offered = monitors(asdict(MonitorsConfig()), pm)
    return {m.name: getattr(m, "Settings", None) for m in offered}


def sensors(pm: pluggy.PluginManager | None = None) -> list:
    pm = pm or plugin_manager()
    return [s for result in pm.hook.vlad_sensors() for s in (result or ())]


def remote_demo(pm: pluggy.PluginManager | None = None) -> RemoteDemo | None:
    """What a plugin offers ``./scripts/demo --remote`` (hook ``vlad_remote_demo``), or None."""
    return cast("RemoteDemo | None", (pm or plugin_manager()).hook.vlad_remote_demo())
