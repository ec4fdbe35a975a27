"""Kept while other branches still load it (``VLAD_PLUGIN_MODULES=tests.gates.slow_plugin``):
the wrapper of :mod:`vlad.testing.plugin` under its former backend name ``gate-slow``."""

from vlad.backend import Backend
from vlad.hookspecs import hookimpl
from vlad.testing.plugin import WrappedBackend


@hookimpl
def vlad_backends() -> list[Backend]:
    return [WrappedBackend("gate-slow")]
