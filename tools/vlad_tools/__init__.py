"""vlad's workstation tools: what builds, judges and exercises releases, apart from the robot runtime.

:mod:`.gates` (release gates), :mod:`.planner` (latency planner), :mod:`.importers`
(LeRobot checkpoints), :mod:`.demo` (the simulated robot, the demo model and its release),
:mod:`.pi0` (the π0 builder), :mod:`.episodes` (the episode runner the gates and the demo
share), :mod:`.cli` (their ``vladctl`` commands) and :mod:`.testing` (the test harness, the
top layer nothing else imports). All of it imports :mod:`vlad`; nothing in :mod:`vlad`
imports it (tests/test_layers.py).
"""

__version__ = "0.1.0"
