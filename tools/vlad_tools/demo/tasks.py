"""The demo's simulated tasks: the gates' own (:func:`vlad_tools.gates.closed_loop.sim_tasks`
lists them before the tasks plugins offer through the ``vlad_sim_tasks`` hook). Listing the tasks
imports nothing heavy; making one imports the simulator (:mod:`vlad_tools.demo.sim`: MuJoCo and
Gymnasium, the ``sim`` extra) and says which extra to install when it is missing.
"""

from __future__ import annotations

from types import ModuleType

from vlad.errors import VladError
from vlad_tools.episodes import SimTask, Task


def _sim() -> ModuleType:
    try:
        from vlad_tools.demo import sim
    except ImportError as exc:
        raise VladError(f"the simulated tasks need {exc.name or 'the simulator'}: pip install 'vlad[sim]'") from None
    return sim


def _all_instructions() -> tuple[str, ...]:
    return tuple(_sim().INSTRUCTIONS)


def _first_instruction() -> tuple[str, ...]:
    return tuple(_sim().INSTRUCTIONS[:1])


def _reacher() -> Task:
    return _sim().ReacherTask(render=False)


def demo_tasks() -> list[SimTask]:
    # The Reacher with both instructions, and with only the first (policies without a
    # language input, e.g. a LeRobot ACT trained on that one).
    return [
        SimTask("reacher", _all_instructions, _reacher),
        SimTask("reacher-target", _first_instruction, _reacher),
    ]
