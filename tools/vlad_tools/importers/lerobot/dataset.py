"""The demo's LeRobotDataset: the scripted Reacher expert recorded the way LeRobot records a robot.

Every control period of each expert episode becomes one frame: the 64x64 camera image
(uint8 HWC, stored as PNG: no video codec needed), ``observation.state`` = joint positions
and velocities, ``action`` = the expert's next joint-position waypoint from that state, and
the instruction as LeRobot's ``task``. LeRobot builds its action chunks from consecutive
frames' actions, as it does for a teleoperated recording. Written by LeRobot's own
``LeRobotDataset.create / add_frame / save_episode / finalize``.

The demo's instructions pick different goals for the same image; ACT and Diffusion Policy
take no language, so the demo records one instruction (``INSTRUCTION``) and the policy is
judged on it (docs/lerobot.md).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from vlad_tools.demo import sim

INSTRUCTION = sim.INSTRUCTIONS[0]  # "reach the red target"
CAMERA = "overhead"
STATE_NAMES = ["joint0.position", "joint1.position", "joint0.velocity", "joint1.velocity"]
ACTION_NAMES = ["joint0", "joint1"]
FPS = round(1.0 / sim.CONTROL_DT)  # 50


def features(size: int = 64) -> dict:
    return {
        f"observation.images.{CAMERA}": {
            "dtype": "image",
            "shape": (size, size, 3),
            "names": ["height", "width", "channels"],
        },
        "observation.state": {"dtype": "float32", "shape": (4,), "names": STATE_NAMES},
        "action": {"dtype": "float32", "shape": (2,), "names": ACTION_NAMES},
    }


def write_reacher_dataset(
    root: Path,
    episodes: int,
    seed0: int = 0,
    action_noise: float = 0.05,
    instruction: str = INSTRUCTION,
    size: int = 64,
    progress: Callable[[str], None] = print,
) -> Path:
    """Record ``episodes`` expert episodes (seeds ``seed0 ..``) into a new dataset at ``root``."""
    from vlad_tools.importers.lerobot.runtime import load_lerobot

    load_lerobot()
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset.create(
        repo_id=f"local/{root.name}",
        fps=FPS,
        features=features(size),
        root=root,
        robot_type="mujoco-reacher",
        use_videos=False,
    )
    current = None
    done = 0
    for s in sim.collect_demonstrations(
        episodes, seed0=seed0, every=1, action_noise=action_noise, instructions=(instruction,), size=size
    ):
        if current is not None and s.episode != current:
            ds.save_episode()
            done += 1
            if done % 10 == 0 or done == episodes:
                progress(f"dataset: {done}/{episodes} episodes")
        current = s.episode
        ds.add_frame(
            {
                f"observation.images.{CAMERA}": s.image,
                "observation.state": np.asarray(s.proprio, np.float32),
                "action": np.asarray(s.chunk[0], np.float32),
                "task": s.instruction,
            }
        )
    ds.save_episode()
    ds.finalize()
    progress(f"dataset: {episodes}/{episodes} episodes, {ds.num_frames} frames -> {root}")
    return root


def main(argv: list[str] | None = None) -> int:
    """``python -m vlad_tools.importers.lerobot.dataset ROOT --episodes N``: record the demo dataset."""
    import argparse

    p = argparse.ArgumentParser(description="Record the scripted Reacher expert as a LeRobotDataset.")
    p.add_argument("root", help="dataset folder to create (must not exist)")
    p.add_argument("--episodes", type=int, default=200)
    p.add_argument("--seed", type=int, default=0, help="first episode seed (evaluation uses 10000..)")
    p.add_argument("--action-noise", type=float, default=0.05, help="rad (std) on the executed waypoints")
    args = p.parse_args(argv)
    write_reacher_dataset(Path(args.root), args.episodes, args.seed, args.action_noise)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
