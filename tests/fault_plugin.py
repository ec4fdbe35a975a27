"""Kept while other branches still load it (``VLAD_PLUGIN_MODULES=tests.fault_plugin``): the
wrapper of :mod:`vlad.testing.plugin` under its former backend name ``faulty``, and the
injected sensor."""

from vlad.backend import Backend
from vlad.hookspecs import hookimpl
from vlad.testing.plugin import WrappedBackend, vlad_sensors

__all__ = ["vlad_backends", "vlad_sensors"]


@hookimpl
def vlad_backends() -> list[Backend]:
    return [WrappedBackend("faulty")]
