"""Observations to check an import on: recorded from the training dataset, or synthetic.

A window is a list of consecutive frames (oldest first), as long as the policy's
``n_obs_steps``. Recorded windows come from the dataset's own frames (read by LeRobot's
``LeRobotDataset``, images back to the robot's uint8 HWC); synthetic ones are random images
and states drawn inside the statistics' range, so they exercise the whole input range.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vlad.importers.lerobot.checkpoint import IMAGE_PREFIX, STATE, Checkpoint
from vlad.importers.lerobot.policies import Frame


def synthetic_windows(ckpt: Checkpoint, n: int, seed: int = 0) -> list[list[Frame]]:
    """``n`` windows of random frames (images uniform in 0..255, states within the data's range)."""
    rng = np.random.default_rng(seed)
    s = ckpt.stats.get(STATE, {})
    dim = ckpt.state.shape[0]
    if "min" in s and "max" in s:
        lo, hi = s["min"].reshape(-1), s["max"].reshape(-1)
    elif "mean" in s and "std" in s:
        lo, hi = s["mean"].reshape(-1) - 2 * s["std"].reshape(-1), s["mean"].reshape(-1) + 2 * s["std"].reshape(-1)
    else:
        lo, hi = -np.ones(dim), np.ones(dim)
    out = []
    for _ in range(n):
        window = []
        for _ in range(ckpt.n_obs_steps):
            images = {
                c.key.removeprefix(IMAGE_PREFIX): rng.integers(0, 256, (c.shape[1], c.shape[2], 3), dtype=np.uint8)
                for c in ckpt.cameras
            }
            window.append(Frame(images, rng.uniform(lo, hi).astype(np.float32)))
        out.append(window)
    return out


def recorded_windows(ckpt: Checkpoint, root: Path, n: int, seed: int = 0) -> list[list[Frame]]:
    """``n`` windows of consecutive frames of one episode each, spread over the dataset."""
    from vlad.importers.lerobot.runtime import load_lerobot

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
            window.append(Frame(images, item[STATE].numpy().astype(np.float32)))
        out.append(window)
    return out
