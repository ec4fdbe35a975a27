"""Random-weight LeRobot checkpoints for the importer's tests and ``scripts/smolvla_full.py``,
written by LeRobot itself (``save_pretrained`` of the policy and of its processor pipelines):
small enough to build and export in seconds, or at a real SmolVLA's size.

Two shapes: the demo's (one 64x64 camera, a 4-D state in radians, 2-D actions) and an
SO-101-like one (:data:`SO101`: a front and a wrist camera, 6-D state and action in degrees,
the gripper 0..100), the shape most LeRobot users record with.

SmolVLA builds only from a local VLM folder (:func:`make_vlm_folder`): a ``SmolVLMConfig``,
a byte-level BPE tokenizer trained here with the special tokens SmolVLM's processor reads,
and the processor's settings, all written by transformers' own ``save_pretrained``; tiny
(:data:`TINY_VLM`: text 128 x 4 layers, vision 96 x 2 on 64x64 images), SmolVLM2-500M's
(:data:`SMOLVLM2_500M`) or of any other :class:`VLMShape`.
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


@dataclass(frozen=True)
class VLMShape:
    """A SmolVLM's dimensions (transformers' ``SmolVLMConfig``)."""

    text_hidden: int
    text_layers: int
    text_heads: int
    text_kv_heads: int
    text_ffn: int
    vision_hidden: int
    vision_layers: int
    vision_heads: int
    vision_ffn: int
    image_size: int
    patch_size: int
    scale_factor: int
    vocab: int  # the embedding table's rows (at least the tokenizer's size)


TINY_VLM = VLMShape(128, 4, 4, 2, 256, 96, 2, 4, 192, 64, 16, 2, 320)
# HuggingFaceTB/SmolVLM2-500M-Video-Instruct (the VLM of LeRobot's SmolVLA): a SmolLM2-360M text
# model (960 wide, 32 layers, 15 heads over 5 KV heads, FFN 2560, 49280 tokens) and a SigLIP
# vision tower (768 wide, 12 layers, 12 heads, FFN 3072) on 512x512 images in 16x16 patches,
# pixel shuffle 4 (64 image tokens).
SMOLVLM2_500M = VLMShape(960, 32, 15, 5, 2560, 768, 12, 12, 3072, 512, 16, 4, 49280)
VLM_SPECIAL = {
    "fake_image_token": "<fake_token_around_image>",
    "image_token": "<image>",
    "global_image_token": "<global-img>",
    "end_of_utterance_token": "<end_of_utterance>",
}
_CORPUS = (
    "pick up the red cube and put it in the box",
    "grasp the handle, then open the drawer.",
    "stack the blocks\n",
    "place the mug on the coaster carefully",
    "move left and right, up and down",
)


def make_vlm_folder(path: Path, shape: VLMShape = TINY_VLM) -> Path:
    """A local SmolVLM folder as ``--vlm-dir`` takes it (configuration, tokenizer, processor;
    no weights), written by transformers' ``save_pretrained``."""
    from vlad_tools.importers.lerobot.runtime import load_lerobot

    load_lerobot()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import (
        PreTrainedTokenizerFast,
        SmolVLMConfig,
        SmolVLMImageProcessor,
        SmolVLMProcessor,
    )
    from transformers.models.smolvlm.video_processing_smolvlm import (
        SmolVLMVideoProcessor,
    )  # not in the stubs' top level

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=shape.vocab,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>", *VLM_SPECIAL.values()],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(list(_CORPUS) * 20, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<end_of_utterance>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
        extra_special_tokens=VLM_SPECIAL,
    )
    assert len(fast) <= shape.vocab
    config = SmolVLMConfig(
        text_config={
            "model_type": "llama",
            "hidden_size": shape.text_hidden,
            "intermediate_size": shape.text_ffn,
            "num_hidden_layers": shape.text_layers,
            "num_attention_heads": shape.text_heads,
            "num_key_value_heads": shape.text_kv_heads,
            "head_dim": shape.text_hidden // shape.text_heads,
            "vocab_size": shape.vocab,
            "max_position_embeddings": 8192,
            "rope_theta": 100000.0,
            "rms_norm_eps": 1e-5,
        },
        vision_config={
            "hidden_size": shape.vision_hidden,
            "intermediate_size": shape.vision_ffn,
            "num_hidden_layers": shape.vision_layers,
            "num_attention_heads": shape.vision_heads,
            "image_size": shape.image_size,
            "patch_size": shape.patch_size,
        },
        scale_factor=shape.scale_factor,
        image_token_id=fast.convert_tokens_to_ids(VLM_SPECIAL["image_token"]),
        pad_token_id=fast.pad_token_id,
    )
    path.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(path)
    edge = {"longest_edge": shape.image_size}
    seq = (shape.image_size // shape.patch_size) ** 2 // shape.scale_factor**2
    processor = SmolVLMProcessor(
        image_processor=SmolVLMImageProcessor(size=edge, max_image_size=edge),
        tokenizer=fast,
        video_processor=SmolVLMVideoProcessor(),
        image_seq_len=seq,
    )
    processor.save_pretrained(path)
    return path


def make_checkpoint(
    path: Path, kind: str = "act", seed: int = 0, robot: Robot = DEMO, *, full_size: bool = False, **overrides
) -> Path:
    """A random-weight ``kind`` checkpoint at ``path`` (``act``, ``diffusion``, ``smolvla``) for
    ``robot``; overrides go to the policy config, e.g. ``n_obs_steps``, ``noise_scheduler_type``,
    ``normalization_mapping``. SmolVLA: ``vlm_model_name`` is the VLM folder
    (:func:`make_vlm_folder`), which the written config.json names unless ``hub_name`` says
    which hub id to write instead (what a real checkpoint holds); ``full_size`` keeps LeRobot's
    own settings (chunk 50, 10 steps, 16 VLM layers, 512x512 images, 48 tokens) instead of the
    tests' small ones."""
    if full_size and kind != "smolvla":
        raise ValueError(f"full_size: a smolvla checkpoint only (not {kind})")
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
    hub_name = overrides.pop("hub_name", None)
    if kind == "smolvla":
        import contextlib
        import io

        from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig
        from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

        del common["pretrained_backbone_weights"]
        settings: dict = dict(load_vlm_weights=False)
        if not full_size:
            settings.update(
                resize_imgs_with_padding=(64, 64),
                chunk_size=10,
                n_action_steps=10,
                num_steps=3,
                num_vlm_layers=4,
                tokenizer_max_length=16,
            )
        settings.update(overrides)
        settings["vlm_model_name"] = str(settings["vlm_model_name"])
        cfg = SmolVLAConfig(**common, **settings)
        with contextlib.redirect_stdout(io.StringIO()):
            policy = SmolVLAPolicy(cfg)
    elif kind == "act":
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
    if hub_name is not None:  # a real checkpoint names the hub model it was trained from
        cfg.vlm_model_name = hub_name
        for step in pre.steps:
            if getattr(step, "tokenizer_name", None) is not None:
                step.tokenizer_name = hub_name
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
