"""The on-robot install (``pip install vlad`` plus one backend extra) pulls in and imports
no tool package and nothing of the workstation tools (``vlad-tools``): the daemon and the
robot's CLI commands run without them, and a tools command says in one line what to install."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import requires
from pathlib import Path

import pytest

import vlad.cli
from vlad.cli import WORKSTATION_COMMANDS, vladctl_main, vladctl_parser

ROOT = Path(__file__).resolve().parent.parent

# Packages only the tools, gates, demo and tests use: none of them may be a core requirement
# of vlad, nor be imported by the daemon or the robot's commands.
TOOL_PACKAGES = (
    "matplotlib",
    "mcap",
    "mujoco",
    "gymnasium",
    "kserve",
    "hypothesis",
    "pytest",
    "onnx",
    "onnxscript",
    "lerobot",
    "torch",
)

# A meta path finder that refuses every tool package, so an import of one fails loudly in
# the child as it would on a robot where it is not installed.
BLOCKER = """
import sys
BLOCKED = {blocked!r}

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".", 1)[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked: not on the robot)", name=name)
        return None

sys.meta_path.insert(0, Blocker())
"""


def _core_requirement_names() -> set[str]:
    names = set()
    for req in requires("vlad") or []:
        if "extra ==" in req:
            continue
        name = req.split(";")[0].strip()
        for sep in "<>=!~[ ":
            name = name.split(sep, 1)[0]
        names.add(name.lower())
    return names


def test_core_requirements_hold_no_tool_package():
    core = _core_requirement_names()
    assert core, "vlad declares no core requirements (is it installed?)"
    assert not core & set(TOOL_PACKAGES), sorted(core & set(TOOL_PACKAGES))


def _run_blocked(code: str) -> subprocess.CompletedProcess[str]:
    prog = BLOCKER.format(blocked=set(TOOL_PACKAGES)) + code
    return subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=120)


def test_blocker_blocks():
    """The finder does refuse a tool package (else the tests below could not fail)."""
    out = _run_blocked("import matplotlib\n")
    assert out.returncode != 0 and "blocked: not on the robot" in out.stderr, out.stderr


def test_daemon_and_robot_commands_import_without_tool_packages():
    code = """
import vlad.daemon, vlad.cli, vlad.daemon.supervisor, vlad.cli.daemon
loaded = sorted(m for m in sys.modules if m.split(".", 1)[0] in BLOCKED)
assert not loaded, loaded
"""
    out = _run_blocked(code)
    assert out.returncode == 0, out.stderr


def test_robot_commands_answer_help_without_tool_packages():
    for main, argv in (("vlad_main", ["vlad", "serve", "--help"]), ("vladctl_main", ["vladctl", "status", "--help"])):
        code = f"""
from vlad.cli import {main} as main
sys.argv = {argv!r}
try:
    main()
except SystemExit as exc:
    assert exc.code in (0, None), exc.code
"""
        out = _run_blocked(code)
        assert out.returncode == 0, (argv, out.stderr)
        assert "usage" in out.stdout.lower(), (argv, out.stdout)


def test_tool_commands_name_the_extra_they_need():
    """On the robot a tool command that needs a missing package says, in one line, which
    extra installs it; never a traceback."""
    cases = (
        (["replay", "none.mcap", "--release", "manifests/demo"], "pip install 'vlad[gates]'"),
        (["plan", "--model", "pi0", "--plot", "steps", "--out", "x.png"], "pip install 'vlad[plot]'"),
    )
    for argv, hint in cases:
        code = f"""
from vlad.cli import vladctl_main
sys.exit(vladctl_main({argv!r}))
"""
        out = _run_blocked(code)
        assert out.returncode == 2, (argv, out.stderr)
        assert hint in out.stderr and "Traceback" not in out.stderr, (argv, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_a_gate_without_its_packages_names_the_gates_extra(tmp_path):
    code = f"""
from vlad.cli import vladctl_main
sys.exit(vladctl_main(["gate", "manifests/demo", "--baseline", "manifests/demo", "--report", {str(tmp_path)!r}]))
"""
    out = _run_blocked(code)
    assert out.returncode == 1, out.stderr  # a gate failed (in error), the report is written
    assert (
        "equivalence: this needs torch, which is not installed here: pip install 'vlad[gates]'"
        in out.stdout + out.stderr
    )
    assert (tmp_path / "report.json").is_file() or any(tmp_path.iterdir())


def test_serving_and_operating_import_nothing_of_the_tools():
    """`vlad serve`, the endpoints, the Mender module and a controller's client load no tools module."""
    code = (
        "import json, sys\n"
        "import vlad.cli, vlad.daemon.supervisor, vlad.compat.openpi, vlad.compat.endpoint\n"
        "import vlad.fleet.mender, vlad.client, vlad.plugins\n"
        "vlad.cli.vlad_parser()\n"
        "vlad.plugins.plugin_manager()\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'vlad_tools')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert json.loads(out.stdout) == []


def test_the_installed_tools_add_their_commands():
    commands = set(vladctl_parser()[1].choices)
    assert set(WORKSTATION_COMMANDS) <= commands
    assert {"status", "deploy", "rollback", "verify", "pull"} <= commands


def test_a_tools_command_without_the_tools_is_one_line(monkeypatch, capsys):
    """On a robot (no vladctl entry points), `vladctl gate` names the package to install."""
    monkeypatch.setattr(vlad.cli, "entry_points", lambda group: [])
    assert vladctl_main(["gate", "manifests/demo"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "workstation command of vlad-tools" in err[0] and "pip install vlad-tools" in err[0]
    assert vladctl_main(["contract", "check", str(ROOT / "manifests" / "demo" / "contract.toml")]) == 0


@pytest.mark.parametrize("command", ["verify", "status"])
def test_a_broken_tools_install_leaves_the_operator_commands(tmp_path, command):
    """A distribution whose vladctl commands do not import is named on stderr; the rest work."""
    dist = tmp_path / "broken_tools-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-tools\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[vladctl]\nbroken = no_such_module_for_vladctl:add\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-m", "vlad.cli", command, "--help"], capture_output=True, text=True, env=env, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    assert "usage: vladctl " + command in out.stdout
    assert "warning: commands 'broken' from broken-tools did not load: ModuleNotFoundError" in out.stderr
