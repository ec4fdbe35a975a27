"""A plugin offering a task name the demo already offers (tests/gates/test_sim_tasks.py)."""

from vlad.demo import tasks as demo_tasks
from vlad.hookspecs import hookimpl


@hookimpl
def vlad_sim_tasks():
    return demo_tasks.vlad_sim_tasks()[:1]
