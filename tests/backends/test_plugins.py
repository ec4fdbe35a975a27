"""The plugin machinery: entry points, VLAD_PLUGINS, duplicate names, documented hooks."""

from __future__ import annotations

import inspect
import subprocess
import sys
import types

import pytest

from vlad import hookspecs, plugins
from vlad.backend import Availability, Backend
from vlad.errors import BackendUnavailable, VladError
from vlad.hookspecs import hookimpl

BUILTIN = {"torch": "vlad-torch", "onnxruntime": "vlad-onnxruntime"}


@pytest.fixture(autouse=True)
def _all_plugins(monkeypatch):
    monkeypatch.delenv("VLAD_PLUGINS", raising=False)
    monkeypatch.delenv("VLAD_TRACE_PLUGINS", raising=False)


def test_entry_points_load_the_builtin_plugins():
    pm = plugins.make_plugin_manager()
    infos = {i.name: i for i in plugins.plugin_infos(pm)}
    for name, dist in BUILTIN.items():
        assert name in infos, f"entry point {name!r} not loaded; is {dist} installed (scripts/bootstrap)?"
        assert infos[name].distribution == dist
    names = set(plugins.backends(pm))
    assert {"torch", "torch-aoti", "onnxruntime"} <= names
    pm.check_pending()  # every hookimpl in the plugins matches a hookspec


def test_loading_plugins_imports_no_runtime():
    """`vladctl plugins` must stay fast and the daemon must run without torch installed."""
    code = (
        "import sys; from vlad import plugins; "
        "b = plugins.backends(plugins.make_plugin_manager()); "
        "print(sorted(m for m in ('torch', 'onnxruntime') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_vlad_plugins_restricts(monkeypatch):
    monkeypatch.setenv("VLAD_PLUGINS", "onnxruntime")
    pm = plugins.make_plugin_manager()
    assert [i.name for i in plugins.plugin_infos(pm)] == ["onnxruntime"]
    assert set(plugins.backends(pm)) == {"onnxruntime"}
    with pytest.raises(BackendUnavailable, match="no backend 'torch'"):
        plugins.get_backend("torch", pm)


def test_vlad_plugins_empty_loads_none(monkeypatch):
    monkeypatch.setenv("VLAD_PLUGINS", "")
    pm = plugins.make_plugin_manager()
    assert plugins.backends(pm) == {}
    with pytest.raises(BackendUnavailable, match="VLAD_PLUGINS"):
        plugins.get_backend("onnxruntime", pm)


def test_vlad_plugins_in_a_subprocess():
    env = {"VLAD_PLUGINS": "torch", "PATH": "/usr/bin:/bin"}
    code = "from vlad import plugins; print(','.join(sorted(plugins.backends())))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "torch,torch-aoti"


class _Fake(Backend):
    def __init__(self, name: str) -> None:
        self.name = name

    def availability(self) -> Availability:
        return Availability(True, "fake")

    def load(self, artifact, contract, options=None):
        raise NotImplementedError


def _plugin(name: str, backend_name: str) -> types.ModuleType:
    mod = types.ModuleType(name)

    @hookimpl
    def vlad_backends():
        return [_Fake(backend_name)]

    mod.vlad_backends = vlad_backends
    return mod


def test_duplicate_backend_names_error():
    pm = plugins.make_plugin_manager(load_entry_points=False)
    pm.register(_plugin("a", "same"), name="a")
    pm.register(_plugin("b", "same"), name="b")
    with pytest.raises(VladError, match="two plugins provide a backend named 'same'"):
        plugins.backends(pm)


def test_duplicate_of_a_builtin_backend_errors():
    pm = plugins.make_plugin_manager()
    pm.register(_plugin("impostor", "onnxruntime"), name="impostor")
    with pytest.raises(VladError, match="'onnxruntime'"):
        plugins.backends(pm)


def _hookspecs():
    marker = f"{hookspecs.PROJECT}_spec"
    return [f for _, f in inspect.getmembers(hookspecs, inspect.isfunction) if hasattr(f, marker)]


def test_every_hook_is_documented():
    specs = _hookspecs()
    assert specs, "no hookspecs found"
    for spec in specs:
        doc = inspect.getdoc(spec)
        assert doc and len(doc.split()) >= 5, f"hook {spec.__name__} has no docstring"
        assert spec.__name__.startswith("vlad_"), spec.__name__
        assert spec.__annotations__.get("return"), f"hook {spec.__name__} has no return type"


def test_builtin_hookimpls_are_documented():
    import vlad_onnxruntime
    import vlad_torch

    for mod in (vlad_torch, vlad_onnxruntime):
        assert inspect.getdoc(mod.vlad_backends), f"{mod.__name__}.vlad_backends has no docstring"
        for backend in mod.vlad_backends():
            assert inspect.getdoc(type(backend).load) and inspect.getdoc(type(backend).availability)
