"""Random-weight LeRobot checkpoints for the importer's tests, written by LeRobot itself
(``save_pretrained`` of the policy and of its processor pipelines), small enough to build
and export in seconds.

Two shapes: the demo's (one 64x64 camera, a 4-D state in radians, 2-D actions) and an
SO-101-like one (:data:`SO101`: a front and a wrist camera, 6-D state and action in degrees,
the gripper 0..100), the shape most LeRobot users record with.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

STATE_DIM, ACTION_DIM, SIZE = 4, 2, 64


@dataclass(frozen=True)
class Robot:
    """Feature shapes and the data's range per state/action entry."""

    cameras: Mapping[str, tuple[int, int]]  # LeRobot camera name -> (height, width)
    state_range: tuple[tuple[float, float], ...]  # (min, max) per entry
    action_range: tuple[tuple[float, float], ...]
    names: tuple[str, ...] = field(default=())  # dataset names of the state/action entries, when the robot has them
    random_ranges: bool = False  # statistics somewhere inside the ranges (no two entries alike)


DEMO = Robot({"overhead": (SIZE, SIZE)}, ((-2.0, 2.0),) * STATE_DIM, ((-2.0, 2.0),) * ACTION_DIM, random_ranges=True)
SO101_JOINTS = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper")
# Degrees (LeRobot's SO-101 with use_degrees), the gripper in 0..100; ranges as a teleoperated dataset gives them.
SO101_RANGE = ((-95.0, 88.0), (-98.0, 99.0), (-97.0, 96.0), (-100.0, 92.0), (-160.0, 150.0), (1.0, 60.0))
SO101 = Robot(
    {"front": (48, 64), "wrist": (36, 48)},
    SO101_RANGE,
    SO101_RANGE,
    tuple(f"{j}.pos" for j in SO101_JOINTS),
)


def stats(rng: np.random.Generator, robot: Robot = DEMO) -> dict:
    """Dataset statistics in LeRobot's layout (images per channel [3, 1, 1]), every mode's keys,
    the ranges ``robot`` gives (the demo's: random inside them)."""
    import torch

    def ranged(bounds: tuple[tuple[float, float], ...]) -> tuple[np.ndarray, np.ndarray]:
        lo = np.array([b[0] for b in bounds], np.float32)
        hi = np.array([b[1] for b in bounds], np.float32)
        if robot.random_ranges:
            lo = lo * rng.uniform(0.25, 1.0, lo.shape).astype(np.float32)
            hi = hi * rng.uniform(0.25, 1.0, hi.shape).astype(np.float32)
        return lo, hi

    out = {}
    entries = {
        f"observation.images.{name}": (np.zeros(3, np.float32), np.ones(3, np.float32)) for name in robot.cameras
    }
    entries["observation.state"] = ranged(robot.state_range)
    entries["action"] = ranged(robot.action_range)
    for key, (lo, hi) in entries.items():
        n = lo.shape[0]
        shape = (3, 1, 1) if key.startswith("observation.images") else (n,)
        width = hi - lo
        s = {
            "mean": (lo + hi) / 2 + rng.uniform(-0.05, 0.05, n).astype(np.float32) * width,
            "std": np.maximum(rng.uniform(0.1, 0.3, n).astype(np.float32) * width, np.float32(1e-3)),
            "min": lo,
            "max": hi,
            "q01": lo + 0.02 * width,
            "q99": hi - 0.02 * width,
            "q10": lo + 0.1 * width,
            "q90": hi - 0.1 * width,
        }
        out[key] = {k: torch.from_numpy(np.asarray(v, np.float32)).reshape(shape) for k, v in s.items()}
    return out


def make_checkpoint(path: Path, kind: str = "act", seed: int = 0, robot: Robot = DEMO, **overrides) -> Path:
    """A random-weight ``kind`` checkpoint at ``path`` (``act``, ``diffusion``) for ``robot``;
    overrides go to the policy config, e.g. ``n_obs_steps``, ``noise_scheduler_type``,
    ``normalization_mapping``."""
    from vlad_tools.importers.lerobot.runtime import load_lerobot

    load_lerobot()
    import torch
    from lerobot.configs.types import FeatureType, NormalizationMode, PolicyFeature
    from lerobot.policies.factory import make_pre_post_processors

    torch.manual_seed(seed)
    inputs = {
        f"observation.images.{name}": PolicyFeature(FeatureType.VISUAL, (3, h, w))
        for name, (h, w) in robot.cameras.items()
    }
    inputs["observation.state"] = PolicyFeature(FeatureType.STATE, (len(robot.state_range),))
    outputs = {"action": PolicyFeature(FeatureType.ACTION, (len(robot.action_range),))}
    if "normalization_mapping" in overrides:
        overrides["normalization_mapping"] = {
            k: NormalizationMode(v) for k, v in overrides["normalization_mapping"].items()
        }
    common = dict(input_features=inputs, output_features=outputs, device="cpu", pretrained_backbone_weights=None)
    if kind == "act":
        from lerobot.policies.act.configuration_act import ACTConfig
        from lerobot.policies.act.modeling_act import ACTPolicy

        settings = dict(
            dim_model=64,
            dim_feedforward=128,
            n_heads=4,
            n_encoder_layers=1,
            n_decoder_layers=1,
            use_vae=False,
            chunk_size=8,
            n_action_steps=8,
        )
        settings.update(overrides)
        cfg = ACTConfig(**common, **settings)
        policy = ACTPolicy(cfg)
    else:
        from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig
        from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy

        settings = dict(
            crop_shape=None,
            down_dims=(16, 32),
            diffusion_step_embed_dim=16,
            spatial_softmax_num_keypoints=8,
            n_obs_steps=2,
            horizon=8,
            n_action_steps=4,
            noise_scheduler_type="DDIM",
            num_inference_steps=2,
        )
        settings.update(overrides)
        cfg = DiffusionConfig(**common, **settings)
        policy = DiffusionPolicy(cfg)
    # Random, not zero-initialised, outputs: perturb every parameter a little.
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.02 * torch.randn_like(p))
    pre, post = make_pre_post_processors(cfg, dataset_stats=stats(np.random.default_rng(seed), robot))
    path.mkdir(parents=True, exist_ok=True)
    policy.save_pretrained(path)
    pre.save_pretrained(path)
    post.save_pretrained(path)
    return path


def write_dataset_meta(path: Path, robot: Robot, fps: float = 30) -> Path:
    """A LeRobotDataset ``meta/info.json`` naming ``robot``'s entries (no frames: an import then
    checks on synthetic windows)."""
    import json

    path.mkdir(parents=True, exist_ok=True)
    features: dict = {
        key: {"dtype": "float32", "shape": [len(robot.names)], "names": list(robot.names)}
        for key in ("observation.state", "action")
    }
    for name, (h, w) in robot.cameras.items():
        features[f"observation.images.{name}"] = {
            "dtype": "video",
            "shape": [h, w, 3],
            "names": ["height", "width", "channels"],
        }
    (path / "info.json").write_text(json.dumps({"fps": fps, "robot_type": "so101_follower", "features": features}))
    return path / "info.json"
