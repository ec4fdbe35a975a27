"""Simulated tasks reach the gates through the ``vlad_sim_tasks`` hook (the demo registers
the Reacher); the gates name no simulator."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from vlad_tools.gates import closed_loop
from vlad_tools.gates.results import GateError

GATES = Path(closed_loop.__file__).parent


def test_the_demo_offers_its_reacher_tasks():
    tasks = closed_loop.sim_tasks()
    assert {"reacher", "reacher-target"} <= set(tasks)
    assert len(closed_loop.task_instructions("reacher")) == 2
    assert closed_loop.task_instructions("reacher-target") == closed_loop.task_instructions("reacher")[:1]


def test_make_task_returns_a_runnable_task():
    task, instructions = closed_loop.make_task("reacher-target")
    task.reset(0, instructions[0])
    frame = task.observe(render=False)
    assert frame.instruction == instructions[0] and frame.proprio.size > 0


def test_an_unknown_task_is_one_gate_error_listing_the_known_ones():
    with pytest.raises(GateError, match=r"unknown task \(known: reacher, reacher-target"):
        closed_loop.task_instructions("juggler")


def test_a_task_offered_twice_is_refused(monkeypatch):
    monkeypatch.setenv("VLAD_PLUGIN_MODULES", "tests.gates.twin_tasks")
    with pytest.raises(GateError, match="offered by two plugins"):
        closed_loop.sim_tasks()


@pytest.mark.parametrize("path", sorted(GATES.glob("*.py")), ids=lambda p: p.name)
def test_gates_import_no_simulator(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)  # `from vlad_tools.demo import sim`
    banned = {n for n in names if n.split(".")[0] in {"mujoco", "gymnasium"} or n.startswith("vlad_tools.demo.sim")}
    assert not banned, banned
