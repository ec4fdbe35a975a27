"""The plugin machinery: entry points, VLAD_PLUGINS, duplicate names, documented hooks."""

from __future__ import annotations

import inspect
import json
import os
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


# -- pluggy's own API: distribution info, unknown hooks --------------------------------------


def test_distribution_info_comes_from_pluggy():
    """plugin_infos reports what pluggy's list_plugin_distinfo says provided each plugin."""
    pm = plugins.make_plugin_manager()
    from_pluggy = {pm.get_name(p): d.metadata["Name"] for p, d in pm.list_plugin_distinfo()}
    assert from_pluggy, "no plugin came through load_setuptools_entrypoints"
    infos = {i.name: i.distribution for i in plugins.plugin_infos(pm)}
    assert {k: infos[k] for k in from_pluggy} == from_pluggy
    # the backends are attributed to the plugin that provides them, not guessed from modules
    providers = plugins.backend_plugins(pm)
    assert providers["torch-aoti"] == "torch" and providers["onnxruntime"] == "onnxruntime"


def test_a_plugin_registered_by_code_is_reported_as_unpackaged():
    pm = plugins.make_plugin_manager(load_entry_points=False)
    pm.register(_plugin("local_plugin", "local"), name="local_plugin")
    assert plugins.plugin_infos(pm) == [plugins.PluginInfo("local_plugin", "local_plugin", plugins.UNPACKAGED, "-")]
    assert plugins.backend_plugins(pm) == {"local": "local_plugin"}


def _misspelt_plugin(name: str) -> types.ModuleType:
    """A real plugin whose author wrote vlad_backend for vlad_backends: pluggy accepts the
    registration (it cannot know the hook) and would never call it."""
    mod = types.ModuleType(name)

    @hookimpl
    def vlad_backend():
        return [_Fake("never-offered")]

    mod.vlad_backend = vlad_backend
    return mod


def test_a_misspelt_hookimpl_fails_with_one_clear_line():
    pm = plugins.make_plugin_manager(load_entry_points=False)
    pm.register(_misspelt_plugin("typo_plugin"), name="typo_plugin")
    assert "never-offered" not in plugins.backends(pm)  # what silently happens without the check
    with pytest.raises(VladError) as err:
        plugins.check(pm)
    msg = str(err.value)
    assert "\n" not in msg
    assert "'typo_plugin'" in msg and "unknown hook 'vlad_backend'" in msg and "'vlad_backends'" in msg


def test_a_misspelt_plugin_module_stops_the_start(monkeypatch):
    """Through VLAD_PLUGIN_MODULES (how an integrator's local plugin is loaded), the manager
    the daemon builds refuses it instead of running without the plugin."""
    monkeypatch.setitem(sys.modules, "typo_plugin_mod", _misspelt_plugin("typo_plugin_mod"))
    monkeypatch.setenv("VLAD_PLUGIN_MODULES", "typo_plugin_mod")
    monkeypatch.setenv("VLAD_PLUGINS", "")
    with pytest.raises(VladError, match=r"plugin 'typo_plugin_mod' implements unknown hook 'vlad_backend'"):
        plugins.make_plugin_manager()


def test_an_optional_unknown_hook_is_allowed():
    """pluggy's optionalhook is the documented way to implement a hook of a newer vlad."""
    mod = types.ModuleType("future_plugin")

    @hookimpl(optionalhook=True)
    def vlad_future_hook():
        return None

    mod.vlad_future_hook = vlad_future_hook
    pm = plugins.make_plugin_manager(load_entry_points=False)
    pm.register(mod, name="future_plugin")
    plugins.check(pm)


def test_a_hookimpl_with_wrong_arguments_is_one_line():
    mod = types.ModuleType("bad_args")

    @hookimpl
    def vlad_monitors(cfg):  # the spec's argument is "config"
        return []

    mod.vlad_monitors = vlad_monitors
    pm = plugins.make_plugin_manager(load_entry_points=False)
    with pytest.raises(VladError, match="plugin 'bad_args'"):
        plugins._register(pm, mod, "bad_args")  # what make_plugin_manager uses


def _vladctl(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vlad.cli", *args],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", **env},
        timeout=120,
        check=False,
    )


def test_vladctl_plugins_names_each_backends_distribution():
    out = _vladctl("plugins", "--json", env={"VLAD_PLUGINS": "torch,onnxruntime"})
    assert out.returncode == 0, out.stderr
    rows = {r["backend"]: r for r in json.loads(out.stdout)["backends"]}
    assert {k: (r["plugin"], r["distribution"]) for k, r in rows.items()} == {
        "torch": ("torch", "vlad-torch"),
        "torch-aoti": ("torch", "vlad-torch"),
        "onnxruntime": ("onnxruntime", "vlad-onnxruntime"),
    }


def test_vladctl_refuses_a_misspelt_plugin_in_one_line(tmp_path):
    (tmp_path / "typo_plugin_cli.py").write_text(
        "from vlad.hookspecs import hookimpl\n\n\n@hookimpl\ndef vlad_sensor():\n    return []\n"
    )
    path = os.pathsep.join([str(tmp_path), *sys.path])
    out = _vladctl("plugins", env={"VLAD_PLUGIN_MODULES": "typo_plugin_cli", "VLAD_PLUGINS": "", "PYTHONPATH": path})
    assert out.returncode == 2
    expected = (
        "error: plugin 'typo_plugin_cli' implements unknown hook 'vlad_sensor' "
        "(did you mean 'vlad_sensors'?): fix or remove its @hookimpl"
    )
    assert out.stderr.strip().splitlines() == [expected]


def test_an_installed_plugin_that_does_not_import_is_named_in_one_line(tmp_path, monkeypatch):
    """A broken entry point (what `pip install` of a bad plugin leaves) stops loading with
    one line naming it and its distribution, not a traceback from deep in importlib."""
    info = tmp_path / "vlad_broken-0.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vlad-broken\nVersion: 0.3\n")
    (info / "entry_points.txt").write_text("[vlad]\nbroken = vlad_broken_nowhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        VladError,
        match=r"^plugin 'broken' \(entry point 'vlad_broken_nowhere' of vlad-broken 0\.3\) does not load: ModuleNotFoundError",
    ) as exc:
        plugins.make_plugin_manager()
    assert "\n" not in str(exc.value)
    monkeypatch.setenv("VLAD_PLUGINS", "onnxruntime")  # the way out the message names
    assert set(plugins.backends(plugins.make_plugin_manager())) == {"onnxruntime"}


def test_a_plugin_module_that_raises_on_import_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "vlad_raises.py").write_text("raise RuntimeError('needs /dev/gpio0')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("VLAD_PLUGIN_MODULES", "vlad_raises")
    with pytest.raises(VladError, match=r"cannot import 'vlad_raises': RuntimeError: needs /dev/gpio0"):
        plugins.make_plugin_manager(load_entry_points=False)


def test_only_a_backend_that_builds_artifacts_offers_compile(tmp_path):
    """The gates build an AOTInductor package through the torch-aoti backend's ``compile``
    (no gate imports a plugin); a backend that loads its files as they are refuses, in one line."""
    from vlad.errors import BackendError
    from vlad.plugins import get_backend

    with pytest.raises(BackendError, match="onnxruntime: builds no artifact"):
        get_backend("onnxruntime").compile(tmp_path / "a.onnx", tmp_path / "b")
    assert type(get_backend("torch-aoti")).compile is not type(get_backend("onnxruntime")).compile
