"""``python -m vlad_tools.importers.lerobot.train ARGS``: LeRobot's own training entry point.

Exactly ``lerobot-train ARGS`` (``lerobot.scripts.lerobot_train.main``), run after
:func:`~vlad_tools.importers.lerobot.runtime.load_lerobot` has prepared torchvision for vlad's
torch and set the hub offline (docs/lerobot.md, "One torch").
"""

from __future__ import annotations

import sys

from vlad_tools.importers.lerobot.runtime import LeRobotMissing, load_lerobot


def main() -> int:
    try:
        load_lerobot()
    except LeRobotMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from lerobot.scripts.lerobot_train import main as lerobot_train

    sys.argv[0] = "lerobot-train"
    lerobot_train()
    return 0


if __name__ == "__main__":
    sys.exit(main())
