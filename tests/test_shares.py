"""The CPU share of tests/conftest.py (run at the lowest CPU priority beside the daemon tests)
holds what it says: every entry exists, and no test in it that runs by default starts a daemon
or waits on the clock (a starved daemon or a late deadline there would fail for the wrong reason).
Tests marked slow may (under --slow the whole suite is long anyway), and so may the helpers
only they call. The functional share's entries exist and are in no other share (what they
judge, the conftest comment says, is read in review: no source scan tells "how soon")."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import CPU_SHARE, FUNCTIONAL_SHARE, TESTS, in_cpu_share, share_of

# What starting a daemon or waiting on the clock looks like in this suite's source.
MARKERS = ("start_daemon", "launcher import serve", "ControllerSim", "wait_until(", "time.sleep(")


def _is_slow(fn: ast.FunctionDef) -> bool:
    return any("slow" in ast.unparse(d) for d in fn.decorator_list)


def _default_source(path: Path) -> str:
    """The module's source without its slow tests and the helpers only they call."""
    source = path.read_text()
    tree = ast.parse(source)
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    slow = {f.name for f in functions if _is_slow(f)}
    called_by = {f.name: {n.id for n in ast.walk(f) if isinstance(n, ast.Name)} for f in functions}
    for f in functions:
        if f.name.startswith("_") and f.name not in slow:
            callers = [g for g, names in called_by.items() if f.name in names and g != f.name]
            if callers and all(g in slow for g in callers):
                slow.add(f.name)
    lines = source.splitlines()
    for f in sorted((f for f in functions if f.name in slow), key=lambda f: -f.lineno):
        start = min([f.lineno, *(d.lineno for d in f.decorator_list)]) - 1
        del lines[start : f.end_lineno]
    return "\n".join(lines)


def test_every_entry_exists_in_one_share():
    missing = [e for e in CPU_SHARE + FUNCTIONAL_SHARE if not (TESTS / e).exists()]
    assert not missing, f"CPU_SHARE or FUNCTIONAL_SHARE names what tests/ does not hold: {missing}"
    both = [e for e in FUNCTIONAL_SHARE if in_cpu_share(TESTS / e)]
    assert not both, f"in CPU_SHARE and FUNCTIONAL_SHARE: {both}"
    assert [share_of(TESTS / e) for e in FUNCTIONAL_SHARE] == ["functional"] * len(FUNCTIONAL_SHARE)
    assert share_of(TESTS / "gates" / "test_gates.py") == "timed"


def test_no_default_test_in_the_cpu_share_starts_a_daemon_or_waits_on_the_clock():
    files = [p for p in sorted(TESTS.rglob("*.py")) if in_cpu_share(p)]
    assert len(files) > 30
    found = [
        f"{p.relative_to(TESTS)}: {m}"
        for p in files
        for m in MARKERS
        if m in _default_source(p) and p != Path(__file__)
    ]
    assert not found, f"move these to the timed share (drop them from CPU_SHARE): {found}"


def test_the_checker_sees_a_daemon(tmp_path):
    """The check above fails where it should: a default test starting a daemon is seen, the
    same test marked slow (and its helper) is not."""
    body = "def _helper():\n    start_daemon()\n\n\n{mark}def test_x():\n    _helper()\n"
    plain = tmp_path / "plain.py"
    plain.write_text(body.format(mark=""))
    marked = tmp_path / "marked.py"
    marked.write_text(body.format(mark="@pytest.mark.slow\n"))
    assert "start_daemon" in _default_source(plain)
    assert "start_daemon" not in _default_source(marked)
