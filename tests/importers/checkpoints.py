"""Random-weight LeRobot checkpoints for the importer's tests, written by LeRobot itself
(``save_pretrained`` of the policy and of its processor pipelines), small enough to build
and export in seconds."""

from __future__ import annotations

from pathlib import Path

import numpy as np

STATE_DIM, ACTION_DIM, SIZE = 4, 2, 64


def stats(rng: np.random.Generator) -> dict:
    """Dataset statistics in LeRobot's layout (images per channel [3, 1, 1]), every mode's keys."""
    import torch

    def vec(n, lo, hi):
        a = rng.uniform(lo, hi, n).astype(np.float32)
        return torch.from_numpy(a)

    out = {}
    for key, n, shape in (
        ("observation.images.overhead", 3, (3, 1, 1)),
        ("observation.state", STATE_DIM, (STATE_DIM,)),
        ("action", ACTION_DIM, (ACTION_DIM,)),
    ):
        lo, hi = vec(n, -2.0, -0.5), vec(n, 0.5, 2.0)
        if key.startswith("observation.images"):
            lo, hi = torch.zeros(n), torch.ones(n)
        s = {
            "mean": (lo + hi) / 2 + vec(n, -0.1, 0.1),
            "std": vec(n, 0.1, 0.5),
            "min": lo,
            "max": hi,
            "q01": lo + 0.05,
            "q99": hi - 0.05,
            "q10": lo + 0.2,
            "q90": hi - 0.2,
        }
        out[key] = {k: v.reshape(shape) for k, v in s.items()}
    return out


def make_checkpoint(path: Path, kind: str = "act", seed: int = 0, **overrides) -> Path:
    """A random-weight ``kind`` checkpoint at ``path`` (``act``, ``diffusion``; overrides go to
    the policy config, e.g. ``n_obs_steps``, ``noise_scheduler_type``, ``normalization_mapping``)."""
    from vlad.importers.lerobot.runtime import load_lerobot

    load_lerobot()
    import torch
    from lerobot.configs.types import FeatureType, NormalizationMode, PolicyFeature
    from lerobot.policies.factory import make_pre_post_processors

    torch.manual_seed(seed)
    inputs = {
        "observation.images.overhead": PolicyFeature(FeatureType.VISUAL, (3, SIZE, SIZE)),
        "observation.state": PolicyFeature(FeatureType.STATE, (STATE_DIM,)),
    }
    outputs = {"action": PolicyFeature(FeatureType.ACTION, (ACTION_DIM,))}
    if "normalization_mapping" in overrides:
        overrides["normalization_mapping"] = {
            k: NormalizationMode(v) for k, v in overrides["normalization_mapping"].items()
        }
    common = dict(input_features=inputs, output_features=outputs, device="cpu", pretrained_backbone_weights=None)
    if kind == "act":
        from lerobot.policies.act.configuration_act import ACTConfig
        from lerobot.policies.act.modeling_act import ACTPolicy

        cfg = ACTConfig(
            **common,
            dim_model=64,
            dim_feedforward=128,
            n_heads=4,
            n_encoder_layers=1,
            n_decoder_layers=1,
            use_vae=False,
            chunk_size=8,
            n_action_steps=8,
            **overrides,
        )
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
    pre, post = make_pre_post_processors(cfg, dataset_stats=stats(np.random.default_rng(seed)))
    path.mkdir(parents=True, exist_ok=True)
    policy.save_pretrained(path)
    pre.save_pretrained(path)
    post.save_pretrained(path)
    return path
