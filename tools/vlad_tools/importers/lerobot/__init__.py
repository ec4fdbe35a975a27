"""``vladctl import lerobot``: a LeRobot checkpoint becomes a checked, signed vlad release.

- :mod:`~vlad_tools.importers.lerobot.checkpoint`: the checkpoint folder and dataset meta, read
  without LeRobot; one-line errors naming the missing piece;
- :mod:`~vlad_tools.importers.lerobot.contract`: LeRobot's pre/post-processing as a vlad contract;
- :mod:`~vlad_tools.importers.lerobot.policies`: export modules per policy type and LeRobot's own
  inference as the reference;
- :mod:`~vlad_tools.importers.lerobot.vlm`: SmolVLA's VLM folder (``--vlm-dir``), checked
  against the checkpoint, and the tokenizer its release ships;
- :mod:`~vlad_tools.importers.lerobot.fixtures`: check windows, recorded or synthetic;
- :mod:`~vlad_tools.importers.lerobot.importer`: the steps, the checks, the release;
- :mod:`~vlad_tools.importers.lerobot.runtime`: LeRobot on vlad's torch, offline;
- :mod:`~vlad_tools.importers.lerobot.dataset` and :mod:`~vlad_tools.importers.lerobot.train`: the
  demo's dataset from the simulated expert, and LeRobot's training entry point.

docs/lerobot.md walks through it.
"""
