"""A plugin offering a task name the demo already offers (tests/gates/test_sim_tasks.py)."""

from vlad.hookspecs import hookimpl
from vlad_tools.demo import tasks as demo_tasks


@hookimpl
def vlad_sim_tasks():
    return demo_tasks.demo_tasks()[:1]
