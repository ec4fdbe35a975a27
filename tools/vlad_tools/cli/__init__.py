"""The workstation's ``vladctl`` commands, offered through the ``vladctl`` entry-point group
(tools/pyproject.toml): :mod:`.plan` (the latency planner), :mod:`.importer` (``vladctl import
lerobot``), :mod:`.export` (the demo policy's artifacts); the gate commands live with the gates
(:mod:`vlad_tools.gates.cli`)."""
