"""Observations to check an import on: recorded from the training dataset, or synthetic.

A window is a list of consecutive frames (oldest first), as long as the policy's
``n_obs_steps``. Recorded windows come from the dataset's own frames (read by LeRobot's
``LeRobotDataset``, images back to the robot's uint8 HWC); synthetic ones are random images
and states drawn inside the range the state's normalization maps to [-1, 1] (MEAN_STD:
two standard deviations around the mean), so they exercise the whole input range. An
entry whose range is empty (``max = min``: a joint held still in the data) is the constant
in every synthetic frame, the one value LeRobot maps into [-1, 1], so the checks compare it.
A policy that reads an instruction (SmolVLA) gets one per synthetic window, in turn from the
given ones (``--instruction``) or :data:`INSTRUCTIONS`; recorded windows carry the
dataset's own ``task``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vlad_tools.importers.lerobot.checkpoint import IMAGE_PREFIX, STATE, Checkpoint
from vlad_tools.importers.lerobot.contract import RANGE_STATS
from vlad_tools.importers.lerobot.policies import Frame


def state_range(ckpt: Checkpoint) -> tuple[np.ndarray, np.ndarray]:
    """Where synthetic states are drawn, per entry: the range the state's normalization maps to
    [-1, 1] (its statistics), or the data's range, or [-1, 1]."""
    s = ckpt.stats.get(STATE, {})
    dim = ckpt.state.shape[0]
    keys = RANGE_STATS.get(ckpt.mode(ckpt.state), ("min", "max"))
    if all(k in s for k in keys):
        return s[keys[0]].reshape(-1), s[keys[1]].reshape(-1)
    if "mean" in s and "std" in s:
        return s["mean"].reshape(-1) - 2 * s["std"].reshape(-1), s["mean"].reshape(-1) + 2 * s["std"].reshape(-1)
    return -np.ones(dim, np.float32), np.ones(dim, np.float32)


# Instructions of synthetic windows: plain, punctuated, ending in a newline or a space, non-ASCII.
INSTRUCTIONS = (
    "pick up the red cube and put it in the box",
    "Grasp the handle, then open the drawer.",
    "stack the blocks\n",
    "move left ",
    "place the mug on the coaster (carefully) -- 2 cm from the edge",
    "déplace le cube",
)


def synthetic_windows(ckpt: Checkpoint, n: int, seed: int = 0, instructions: Sequence[str] = ()) -> list[list[Frame]]:
    """``n`` windows of random frames (images uniform in 0..255, states in :func:`state_range`;
    an entry with an empty range is its constant, exactly); an instruction each (SmolVLA)."""
    rng = np.random.default_rng(seed)
    lo, hi = state_range(ckpt)
    tasks = tuple(instructions) or INSTRUCTIONS
    out = []
    for k in range(n):
        window = []
        for _ in range(ckpt.n_obs_steps):
            images = {
                c.key.removeprefix(IMAGE_PREFIX): rng.integers(0, 256, (c.shape[1], c.shape[2], 3), dtype=np.uint8)
                for c in ckpt.cameras
            }
            state = np.where(hi > lo, rng.uniform(lo, hi), lo).astype(np.float32)
            window.append(Frame(images, state, tasks[k % len(tasks)] if ckpt.type == "smolvla" else ""))
        out.append(window)
    return out


def recorded_windows(ckpt: Checkpoint, root: Path, n: int, seed: int = 0) -> list[list[Frame]]:
    """``n`` windows of consecutive frames of one episode each, spread over the dataset."""
    from vlad_tools.importers.lerobot.runtime import load_lerobot

    load_lerobot()
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset(repo_id=root.name, root=root, video_backend="pyav")
    rng = np.random.default_rng(seed)
    t = ckpt.n_obs_steps
    episode_of = np.asarray(ds.hf_dataset["episode_index"])
    starts = [i for i in range(len(episode_of) - t + 1) if episode_of[i] == episode_of[i + t - 1]]
    if not starts:
        return []
    picks = sorted(rng.choice(starts, size=min(n, len(starts)), replace=False).tolist())
    out = []
    for start in picks:
        window = []
        for i in range(start, start + t):
            item = ds[i]
            images = {}
            for c in ckpt.cameras:
                img = item[c.key].numpy()  # float CHW in [0, 1]
                images[c.key.removeprefix(IMAGE_PREFIX)] = np.clip(
                    np.rint(np.transpose(img, (1, 2, 0)) * 255), 0, 255
                ).astype(np.uint8)
            task = item.get("task", "") if ckpt.type == "smolvla" else ""
            window.append(Frame(images, item[STATE].numpy().astype(np.float32), str(task)))
        out.append(window)
    return out
