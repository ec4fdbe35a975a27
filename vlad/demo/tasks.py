"""The demo's simulated tasks, offered to the gates through the ``vlad_sim_tasks`` hook.

Registered as a built-in plugin (:data:`vlad.plugins.DEFAULT_PLUGINS`). Listing the tasks
imports nothing heavy; making one imports the simulator (:mod:`vlad.demo.sim`: MuJoCo and
Gymnasium, the ``sim`` extra) and says which extra to install when it is missing.
"""

from __future__ import annotations

from types import ModuleType

from vlad.episodes import SimTask, Task
from vlad.errors import VladError
from vlad.hookspecs import hookimpl


def _sim() -> ModuleType:
    try:
        from vlad.demo import sim
    except ImportError as exc:
        raise VladError(f"the simulated tasks need {exc.name or 'the simulator'}: pip install 'vlad[sim]'") from None
    return sim


def _all_instructions() -> tuple[str, ...]:
    return tuple(_sim().INSTRUCTIONS)


def _first_instruction() -> tuple[str, ...]:
    return tuple(_sim().INSTRUCTIONS[:1])


def _reacher() -> Task:
    return _sim().ReacherTask(render=False)


@hookimpl
def vlad_sim_tasks() -> list[SimTask]:
    # The Reacher with both instructions, and with only the first (policies without a
    # language input, e.g. a LeRobot ACT trained on that one).
    return [
        SimTask("reacher", _all_instructions, _reacher),
        SimTask("reacher-target", _first_instruction, _reacher),
    ]
