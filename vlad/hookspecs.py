"""Every hook a vlad plugin can implement (pluggy project name ``vlad``).

Plugins are plain modules (or objects) with functions named after the hooks and marked with
:data:`hookimpl`. The built-in backends in ``plugins/`` are registered through the ``vlad``
entry-point group exactly like a third-party plugin (see :mod:`vlad.plugins`).

Hooks are synchronous and return objects; anything long-running or asynchronous lives in
the objects they return.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Callable
    from pathlib import Path

    from vlad.backend import Backend
    from vlad.config import Config
    from vlad.health.base import Monitor, Sensor
    from vlad_tools.episodes import SimTask

PROJECT = "vlad"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# ---------------------------------------------------------------------------------------
# Backend hooks
# ---------------------------------------------------------------------------------------


@hookspec
def vlad_backends() -> list[Backend]:
    """Return the inference backends this plugin provides.

    Each :class:`vlad.backend.Backend` names one engine (e.g. ``"onnxruntime"``), says
    whether its runtime is usable on this machine and loads release artifacts into
    sessions. Backend names must be unique across all plugins.
    """


# ---------------------------------------------------------------------------------------
# Health hooks
# ---------------------------------------------------------------------------------------


@hookspec
def vlad_monitors(config: dict) -> list[Monitor]:
    """Return the health monitors this plugin provides.

    A monitor with thresholds of its own declares them as ``Monitor.Settings``; the daemon
    parses its ``[monitors.<name>]`` table with it and sets ``monitor.settings``.

    :param config: the ``[monitors]`` table of the daemon configuration (read-only): the
        built-in monitors' thresholds, which a plugin may reuse.
    """


@hookspec
def vlad_sensors() -> list[Sensor]:
    """Return sensors whose readings the monitors check.

    Readings are named ``temperature.<where>`` (°C), ``memory.<what>`` (bytes) or
    ``<device>.<what>``; e.g. a board-specific thermal zone or a GPU through NVML.
    """


# ---------------------------------------------------------------------------------------
# Gate hooks
# ---------------------------------------------------------------------------------------


@hookspec
def vlad_sim_tasks() -> list[SimTask]:
    """Return the simulated tasks this plugin offers the closed-loop and equivalence gates.

    Each :class:`vlad_tools.episodes.SimTask` is named (a gate plan's ``closed_loop.task``) and
    makes its task lazily: listing tasks must not import the simulator. Task names must be
    unique across all plugins.
    """


# ---------------------------------------------------------------------------------------
# Demo hooks
# ---------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def vlad_remote_demo() -> Callable[[Path, Path], tuple[Config, subprocess.Popen]] | None:
    """Return the function that starts a remote inference server for ``./scripts/demo
    --remote``, or None (the first plugin that returns one wins).

    The function is called with the demo's config file and a temporary folder of its own; it
    starts the server (its log in ``<folder>/server.log``) and returns the daemon config that
    serves the demo release from it, and the server process (the demo stops it). A server that
    fails raises :class:`SystemExit` with one line. The hook itself starts nothing.
    """
