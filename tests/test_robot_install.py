"""The on-robot install (``pip install vlad`` plus one backend extra) pulls in and imports
no tool package: the daemon and the robot's CLI commands run without them."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import requires

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
