"""The architecture as a test: the robot runtime (``vlad``) never reaches the workstation
tools (``vlad_tools``), imports inside either only go down through the layers, and no code
path can unpickle or run code shipped with a model.

Every module under ``vlad/`` and ``tools/vlad_tools/`` is parsed with :mod:`ast` (nothing is
imported), and every ``import`` counts: top level, inside functions (lazy imports) and under
``TYPE_CHECKING``. An import of a higher layer fails unless it is in :data:`ALLOWED_UPWARD`,
with its reason. Imports within one layer are allowed (e.g. ``health`` reads ``serving``'s
typed counters), but never in a cycle between modules at import time.

The tools sit above the whole runtime, and the product (``vlad``, the plugins, the plugin
example) names them nowhere, not even by a module name in a string. ``vlad_tools.testing``
(the test harness) is the top layer: nothing but tests and scripts imports it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"vlad": ROOT / "vlad", "vlad_tools": ROOT / "tools" / "vlad_tools"}

# Lowest first. A module belongs to the layer of its longest matching prefix. Where a
# package straddles layers the modules are named one by one (the demo: its simulated
# robot and model are what the gates drive; its release builder and its runner sit on top).
LAYERS: list[tuple[str, ...]] = [
    # -- the robot runtime: the `vlad` distribution --
    ("vlad", "vlad.errors"),  # the package root holds only __version__
    ("vlad.files", "vlad.schema", "vlad.logs", "vlad.tomlwrite", "vlad.threads"),
    ("vlad.config", "vlad.contract"),
    ("vlad.processing", "vlad.backend", "vlad.protocol", "vlad.hookspecs", "vlad.plugins"),
    ("vlad.serving", "vlad.health", "vlad.client", "vlad.snapshot"),
    ("vlad.release",),
    # daemon.child: the daemon as a child process (the gates and the demo run it so).
    # compat: the endpoint processes the daemon starts (vlad.daemon.endpoints reads their spec type).
    # fleet.registry: releases to and from OCI registries (verified with release.signing).
    ("vlad.daemon", "vlad.compat", "vlad.fleet"),
    # fleet.mender: the Mender update module drives the daemon as vladctl does.
    ("vlad.cli", "vlad.fleet.mender"),
    # -- the workstation: the `vlad-tools` distribution (tools/) --
    # The episode runner, its evaluation layer and the demo's simulated robot, model and tasks:
    # what the gates drive.
    (
        "vlad_tools",
        "vlad_tools.episodes",
        "vlad_tools.evaluation",
        "vlad_tools.demo.sim",
        "vlad_tools.demo.model",
        "vlad_tools.demo.tasks",
    ),
    # The planner reads signed manifests; importers write releases from other frameworks.
    ("vlad_tools.gates", "vlad_tools.planner", "vlad_tools.importers"),
    # vlad_tools.pi0 builds a release from the planner's description with the demo's builders.
    ("vlad_tools.cli", "vlad_tools.demo", "vlad_tools.pi0"),
    # The test harness, on top of everything: nothing but tests and scripts import it
    # (test_the_product_never_imports_the_test_harness).
    ("vlad_tools.testing",),
]
TOOLS = "vlad_tools"
HARNESS = "vlad_tools.testing"

# (importer, imported) -> why an upward import is acceptable. Keep this short.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {
    # The hookspecs name the hooks' return types for type checkers only (under
    # TYPE_CHECKING): at run time hookspecs imports nothing from vlad, so a plugin that
    # imports hookspecs does not pull in the health package.
    ("vlad.hookspecs", "vlad.health.base"): "TYPE_CHECKING only: vlad_monitors/vlad_sensors return types",
    # The one place the runtime names the tools: the hook a tools-side plugin implements.
    ("vlad.hookspecs", "vlad_tools.episodes"): "TYPE_CHECKING only: the vlad_sim_tasks return type",
}


def scan(packages: dict[str, Path]) -> dict[str, Path]:
    """Module name -> file, for every module of the packages (name -> folder)."""
    out = {}
    for name, folder in packages.items():
        for path in sorted(folder.rglob("*.py")):
            parts = [name, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def ours(name: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in PACKAGES)


def imports(modules: dict[str, Path], module: str, top_level_only: bool = False) -> set[str]:
    """The vlad modules ``module`` imports; ``from vlad import x`` resolves to ``vlad.x``
    where that is a module, ``vlad.contract.Contract`` to ``vlad.contract``."""
    tree = ast.parse(modules[module].read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else ast.walk(tree)
    out: set[str] = set()
    for node in nodes:
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against the importing module's package
                pkg = module.split(".")
                pkg = pkg[: len(pkg) - node.level + (1 if modules[module].name == "__init__.py" else 0)]
                base = ".".join(pkg + ([node.module] if node.module else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        for name in names:
            if ours(name):
                while name not in modules and "." in name:
                    name = name.rsplit(".", 1)[0]
                if name != module:
                    out.add(name)
    return out


def layer_of(module: str) -> int:
    best, best_len = None, -1
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = i, len(prefix)
    assert best is not None, f"{module} is in no layer: add it to LAYERS in tests/test_layers.py"
    return best


def upward_imports(modules: dict[str, Path]) -> list[str]:
    out = []
    for module in modules:
        for imported in sorted(imports(modules, module)):
            if layer_of(imported) > layer_of(module) and (module, imported) not in ALLOWED_UPWARD:
                out.append(f"{module} (layer {layer_of(module)}) imports {imported} (layer {layer_of(imported)})")
    return out


def import_cycle(modules: dict[str, Path]) -> list[str] | None:
    """One cycle of top-level imports, or None."""
    graph = {m: imports(modules, m, top_level_only=True) for m in modules}
    # a package's own submodule importing the package (for a shared name) is no cycle:
    # the package is already being initialised when its submodule runs
    graph = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in graph.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                return stack[stack.index(d) :] + [d]
            if d not in state and (found := visit(d)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


MODULES = scan(PACKAGES)


def test_every_module_has_a_layer():
    for module in MODULES:
        layer_of(module)


def test_imports_only_go_down():
    upward = upward_imports(MODULES)
    assert not upward, "imports against the layer order:\n" + "\n".join(upward)


def test_the_allow_list_has_no_dead_entries():
    """An exception that no longer happens must go, or the list grows into a second layout."""
    for importer, imported in ALLOWED_UPWARD:
        assert imported in imports(MODULES, importer), f"{importer} no longer imports {imported}: drop it"


def test_no_import_cycles_at_import_time():
    """Lazy imports may close a loop (they run after both modules are loaded); top-level
    imports must not: a cycle there breaks depending on which module is imported first."""
    cycle = import_cycle(MODULES)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


# Loops that only lazy imports close (a module's entry point reaching a sibling that imports
# it): harmless at run time, but each one is named here with its reason, so no new one creeps in
# (vlad_tools.testing.releases <-> vlad_tools.testing.golden was one: the payload now reads the golden
# fixtures through the gate's reader).
LAZY_LOOPS: dict[frozenset[str], str] = {
    frozenset({"vlad.cli.daemon", "vlad.cli.watch"}): "status --watch reuses the status command's summaries",
}


def import_loops(modules: dict[str, Path]) -> list[frozenset[str]]:
    """The groups of modules that import each other around a loop, lazy imports included
    (strongly connected components of more than one module)."""
    graph = {m: {d for d in imports(modules, m) if not m.startswith(d + ".")} for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    loops: list[frozenset[str]] = []

    def visit(m: str) -> None:
        index[m] = low[m] = len(index)
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if d not in index:
                visit(d)
                low[m] = min(low[m], low[d])
            elif d in stack:
                low[m] = min(low[m], index[d])
        if low[m] == index[m]:
            group = set()
            while True:
                d = stack.pop()
                group.add(d)
                if d == m:
                    break
            if len(group) > 1:
                loops.append(frozenset(group))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return loops


def test_no_import_loops_even_lazily():
    loops = import_loops(MODULES)
    new = [", ".join(sorted(g)) for g in loops if g not in LAZY_LOOPS]
    assert not new, "modules importing each other (lazy imports included): " + "; ".join(new)
    gone = [", ".join(sorted(g)) for g in LAZY_LOOPS if g not in loops]
    assert not gone, "no longer a loop, drop it from LAZY_LOOPS: " + "; ".join(gone)


ENTRY_POINT = "vlad.daemon.supervisor"  # the Daemon's module: `vlad serve` starts it


def entry_point_importers(modules: dict[str, Path]) -> list[str]:
    """Modules other than the CLI that import the supervisor, at any level."""
    return sorted(
        m for m in modules if m != "vlad.cli" and not m.startswith("vlad.cli.") and ENTRY_POINT in imports(modules, m)
    )


def test_only_the_cli_imports_the_supervisor():
    """The daemon's components (status, control, releases, endpoints, compat) receive the
    parts they use, never the whole ``Daemon``: only the CLI that starts it may import it."""
    importers = entry_point_importers(MODULES)
    assert not importers, f"{', '.join(importers)} import {ENTRY_POINT}: give them a narrow port instead"


def test_plugins_use_only_the_plugin_facing_layers():
    """The backend plugins build on the plugin API (errors, contract, backend, hookspecs, the
    health interface), never on the daemon, the release store or the CLI: a plugin must
    keep working when those change."""
    highest = layer_of("vlad.health")
    found = []
    for path in sorted((ROOT / "plugins").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            )
            for name in names:
                if name.startswith("vlad.") and layer_of(name) > highest:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}")
    assert not found, "\n".join(found)


def _tuple_of_strings(path: Path, name: str) -> set[str]:
    """The ``"pkg.module"`` strings of the module-level tuple ``name`` in ``path`` (parsed, not imported)."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return {e.value for e in ast.walk(node.value) if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    raise AssertionError(f"no {name} in {path}")


def test_built_in_plugins_use_only_the_plugin_facing_layers():
    """``vlad.plugins`` registers its built-in plugins by module name (``DEFAULT_PLUGINS``),
    the way it loads an entry point: an import that the layer check cannot see. So a
    built-in plugin is held to the plugins' rule: it and what it imports (lazily too) stay in
    the layers a plugin may use, and loading plugins never pulls in the daemon, the gates
    or the CLI."""
    builtins = _tuple_of_strings(ROOT / "vlad" / "plugins.py", "DEFAULT_PLUGINS")
    assert builtins, "DEFAULT_PLUGINS is empty"
    highest = layer_of("vlad.health")
    for module in sorted(builtins):
        assert module in MODULES, f"DEFAULT_PLUGINS names {module}, which is not a module of vlad"
        too_high = sorted(m for m in imports(MODULES, module) | {module} if layer_of(m) > highest)
        assert not too_high, f"built-in plugin {module}: {', '.join(too_high)} above the plugin-facing layers"


# The robot's product: the runtime, its backend plugins, the plugin example.
PRODUCT_SOURCES = sorted(p for d in ("vlad", "plugins", "docs/examples") for p in (ROOT / d).rglob("*.py"))
# Everything that ships, tools included, but the harness itself.
SHIPPED_SOURCES = PRODUCT_SOURCES + sorted(
    p for p in (ROOT / "tools" / "vlad_tools").rglob("*.py") if "testing" not in p.relative_to(ROOT / "tools").parts
)


def package_uses(text: str, package: str) -> list[str]:
    """Where ``text`` reaches ``package``, as "line: what": an import at any level, or a
    string naming one of its modules (``importlib.import_module("vlad_tools.testing.x")``,
    ``__import__``, ``VLAD_PLUGIN_MODULES="a,vlad_tools.testing.plugin"``, ``"vlad_tools.testing.x:attr"``)."""

    def named(name: str) -> bool:
        return name == package or name.startswith(package + ".")

    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [part.strip().split(":")[0] for part in node.value.split(",")]
            if any(named(n) for n in names):
                out.append(f"{node.lineno}: names {node.value!r}")
            continue
        else:
            continue
        if any(named(n) for n in names):
            out.append(f"{node.lineno}: imports {package}")
    return out


def harness_uses(text: str) -> list[str]:
    return package_uses(text, HARNESS)


# (file, what) -> why the product names the tools there. Keep this short.
PRODUCT_NAMES_TOOLS: dict[tuple[str, str], str] = {
    ("vlad/hookspecs.py", "imports vlad_tools"): "TYPE_CHECKING only: the vlad_sim_tasks hook's return type",
}


@pytest.mark.parametrize("path", PRODUCT_SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_robot_runtime_never_reaches_the_tools(path):
    """What a robot installs (``vlad``, the plugins) works without ``vlad-tools``: it never
    imports it nor names one of its modules for a later import."""
    rel = str(path.relative_to(ROOT))
    found = [
        f
        for f in package_uses(path.read_text(encoding="utf-8"), TOOLS)
        if (rel, f.split(": ", 1)[1]) not in PRODUCT_NAMES_TOOLS
    ]
    assert not found, f"{rel}: " + "; ".join(found)


@pytest.mark.parametrize("path", SHIPPED_SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_product_never_imports_the_test_harness(path):
    """``vlad_tools.testing`` is for tests and benchmarks: what the product or the tools need
    of it (the daemon as a child process, the gates' latency wrapper) lives with them."""
    found = harness_uses(path.read_text(encoding="utf-8"))
    assert not found, f"{path.relative_to(ROOT)}: " + "; ".join(found)


@pytest.mark.parametrize(
    "text",
    [
        "from vlad_tools.testing import launch\n",
        "import vlad_tools.testing.daemon\n",
        "from vlad_tools import testing\n",
        "def f():\n    from vlad_tools.testing.plugin import PLUGIN_ENV\n",
        "import importlib\nm = importlib.import_module('vlad_tools.testing.kserve')\n",
        "m = __import__('vlad_tools.testing')\n",
        "ENV = {'VLAD_PLUGIN_MODULES': 'vlad_tools.gates.wrapped, vlad_tools.testing.plugin'}\n",
    ],
)
def test_the_harness_scan_catches(text):
    assert harness_uses(text)


def test_the_harness_scan_lets_words_be():
    assert not harness_uses(
        '"""Tests run the daemon through vlad_tools.testing, and vlad_tools.testingfoo is no module."""\n'
    )


def _fake_package(root: Path, files: dict[str, str]) -> dict[str, Path]:
    for rel, text in {"vlad/__init__.py": "", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return scan({"vlad": root / "vlad"})


def test_the_checks_see_violations(tmp_path):
    """Not vacuous: a lazy upward import, a relative one and a cycle are all caught."""
    modules = _fake_package(
        tmp_path,
        {
            "vlad/errors.py": "def f():\n    from vlad.daemon import supervisor\n",
            "vlad/daemon/__init__.py": "",
            "vlad/daemon/supervisor.py": "from ..cli import main\n",
            "vlad/cli/__init__.py": "",
            "vlad/cli/main.py": "from vlad.daemon.supervisor import x\n",
        },
    )
    assert imports(modules, "vlad.errors") == {"vlad.daemon.supervisor"}
    assert imports(modules, "vlad.daemon.supervisor") == {"vlad.cli.main"}
    assert upward_imports(modules) == [
        "vlad.daemon.supervisor (layer 6) imports vlad.cli.main (layer 7)",
        "vlad.errors (layer 0) imports vlad.daemon.supervisor (layer 6)",
    ]
    assert import_cycle(modules) == ["vlad.cli.main", "vlad.daemon.supervisor", "vlad.cli.main"]
    assert import_loops(modules) == [frozenset({"vlad.cli.main", "vlad.daemon.supervisor"})]
    assert entry_point_importers(modules) == ["vlad.errors"]  # the CLI's import is the allowed one


# -- nothing in vlad executes code that came with a model ------------------------------------

SOURCES = sorted(p for d in ("vlad", "tools", "plugins", "scripts") for p in (ROOT / d).rglob("*.py"))
PICKLERS = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "shelve"}


def _calls(tree: ast.AST, owner: str, attr: str):
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == attr
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == owner
        ):
            yield node


def _keyword(call: ast.Call, name: str):
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value.value if isinstance(kw.value, ast.Constant) else kw.value
    return None


def unsafe_code(text: str) -> list[str]:
    """Where ``text`` could run code that came with a model file, as "line: what"."""
    tree = ast.parse(text)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bad = {a.name.split(".")[0] for a in node.names} & PICKLERS
        elif isinstance(node, ast.ImportFrom):
            bad = {(node.module or "").split(".")[0]} & PICKLERS
        else:
            bad = set()
        if bad:
            out.append(f"{node.lineno}: imports {min(bad)} (unpickling runs code from the file)")
    for call in _calls(tree, "torch", "load"):
        # exactly the constant True: a variable could be False at run time
        if _keyword(call, "weights_only") is not True:
            out.append(f"{call.lineno}: torch.load without weights_only=True")
    for call in _calls(tree, "np", "load"):
        if _keyword(call, "allow_pickle") not in (None, False):
            out.append(f"{call.lineno}: np.load with allow_pickle")
    for node in ast.walk(tree):
        if (
            (isinstance(node, ast.keyword) and node.arg == "trust_remote_code")
            or (isinstance(node, ast.Name) and node.id == "trust_remote_code")
            or (isinstance(node, ast.Constant) and isinstance(node.value, str) and "trust_remote_code" in node.value)
        ):
            out.append(f"{getattr(node, 'lineno', '?')}: trust_remote_code (runs code shipped with a model)")
    return out


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_pickle_and_no_remote_code(path):
    problems = unsafe_code(path.read_text(encoding="utf-8"))
    assert not problems, f"{path.relative_to(ROOT)}: " + "; ".join(problems)


@pytest.mark.parametrize(
    "text, problem",
    [
        ("import torch\nm = torch.load('x.pt')\n", "torch.load without weights_only=True"),
        ("import torch\nm = torch.load('x.pt', weights_only=safe)\n", "torch.load without weights_only=True"),
        ("from pickle import loads\n", "imports pickle"),
        ("import numpy as np\nnp.load('a.npy', allow_pickle=True)\n", "allow_pickle"),
        ("from_pretrained('m', trust_remote_code=True)\n", "trust_remote_code"),
    ],
)
def test_the_safety_scan_catches(text, problem):
    assert any(problem in p for p in unsafe_code(text))
