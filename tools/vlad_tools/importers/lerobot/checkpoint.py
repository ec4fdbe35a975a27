"""A LeRobot checkpoint folder, read without LeRobot: config, features, normalization.

What ``save_pretrained`` (and ``lerobot-train``'s ``checkpoints/*/pretrained_model``)
writes: ``config.json`` (policy type, input/output features, normalization modes, chunk
and history lengths), ``model.safetensors``, ``policy_preprocessor.json`` /
``policy_postprocessor.json`` (the processor pipelines) and the normalization statistics
in the ``*_normalizer_processor.safetensors`` file the pipeline JSON names (the step
number differs by policy). The dataset's ``meta/info.json`` adds what a checkpoint does
not hold: the control rate and the joint names; ``train_config.json`` says where that
dataset is.

``model.safetensors`` is checked here too: a header that does not cover the file (a
truncated copy) is refused, and the name, shape and dtype of every tensor are kept, so that
the policy is later loaded strictly against them (LeRobot itself loads leniently).

The checkpoint's checksum covers every file of the folder; a symbolic link to a file (the
Hugging Face cache links every snapshot file to its blob) is followed and hashed by what it
points to, so the checksum is that of the bytes the importer reads.

Every problem is a :class:`CheckpointError` whose one line names the missing piece.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vlad.errors import VladError
from vlad.files import FileRefused, open_regular, sha256_file

SUPPORTED_TYPES = ("act", "diffusion", "smolvla")
# Policy types LeRobot 0.4.4 has that the importer refuses, with the reason (docs/lerobot.md).
UNSUPPORTED_TYPES = {
    "pi0": "does not build offline here (PaliGemma from the hub)",
    "pi05": "does not build offline here (PaliGemma from the hub)",
    "pi0fast": "does not build offline here (PaliGemma from the hub)",
    "groot": "does not install here (flash-attn, hub weights)",
    "tdmpc": "a model-based RL policy that plans at inference; not an action-chunk policy",
    "vqbet": "samples discrete codes at inference; not supported yet",
    "sac": "a reinforcement-learning actor; not an action-chunk policy",
}
NORM_MODES = ("MEAN_STD", "MIN_MAX", "QUANTILES", "QUANTILE10", "IDENTITY")
MAX_JSON_BYTES = 4 << 20
MAX_STATS_BYTES = 64 << 20

IMAGE_PREFIX = "observation.images."
STATE = "observation.state"
ACTION = "action"


class CheckpointError(VladError):
    """The checkpoint cannot be imported; the message names the missing or unsupported piece."""


@dataclass(frozen=True)
class Feature:
    """One policy feature from ``config.json``: LeRobot's key, type and per-sample shape."""

    key: str
    type: str  # VISUAL | STATE | ENV | ACTION
    shape: tuple[int, ...]


@dataclass(frozen=True)
class DatasetMeta:
    """What the dataset's ``meta/info.json`` says: rate, robot, feature names and shapes."""

    fps: float
    robot_type: str | None
    names: dict[str, tuple[str, ...]]  # feature key -> entry names
    shapes: dict[str, tuple[int, ...]]
    root: Path | None = None  # the dataset folder, when known (for per-step action statistics)


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint folder as the importer needs it (nothing from LeRobot is imported)."""

    path: Path
    type: str
    config: dict[str, Any]
    cameras: tuple[Feature, ...]  # VISUAL features, in config order (LeRobot stacks them so)
    state: Feature
    action: Feature
    norm_map: dict[str, str]  # feature type -> normalization mode
    stats: dict[str, dict[str, np.ndarray]]  # feature key -> stat name -> values
    eps: float
    sha256: str
    files: dict[str, str] = field(default_factory=dict)  # relative path -> sha256 (of a link's target)
    links: dict[str, str] = field(default_factory=dict)  # relative path of a symbolic link -> its target
    weights: dict[str, tuple[tuple[int, ...], str]] = field(default_factory=dict)  # tensor -> (shape, dtype)

    @property
    def n_obs_steps(self) -> int:
        return int(self.config.get("n_obs_steps", 1))

    @property
    def chunk_length(self) -> int:
        """Actions per predicted chunk, as ``predict_action_chunk`` returns them."""
        if self.type == "diffusion":
            return int(self.config["n_action_steps"])  # LeRobot returns the executed slice
        return int(self.config["chunk_size"])

    @property
    def n_action_steps(self) -> int:
        """Actions LeRobot executes from each chunk before predicting again."""
        return int(self.config.get("n_action_steps", self.chunk_length))

    def mode(self, feature: Feature) -> str:
        return self.norm_map.get(feature.type, "IDENTITY")


def _read_json(path: Path, what: str) -> Any:
    try:
        with open(open_regular(path), "rb", closefd=True) as f:
            data = f.read(MAX_JSON_BYTES + 1)
    except FileNotFoundError:
        raise CheckpointError(f"{path.parent}: no {path.name} ({what}); is this a LeRobot checkpoint folder?") from None
    except (OSError, FileRefused) as exc:
        raise CheckpointError(f"{path}: cannot read {what}: {exc}") from None
    if len(data) > MAX_JSON_BYTES:
        raise CheckpointError(f"{path}: larger than {MAX_JSON_BYTES >> 20} MiB; not a {what}")
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None


def resolve(path: str | Path) -> Path:
    """The ``pretrained_model`` folder: ``path`` itself, or the one inside a training checkpoint."""
    p = Path(path)
    if not p.is_dir():
        raise CheckpointError(f"{p}: no such checkpoint folder")
    if not (p / "config.json").is_file() and (p / "pretrained_model" / "config.json").is_file():
        return p / "pretrained_model"
    return p


def _features(config: dict, key: str, path: Path) -> list[Feature]:
    raw = config.get(key)
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}/config.json: no {key}; re-save the policy with LeRobot >= 0.4")
    out = []
    for name, f in raw.items():
        if not name or len(name) > 200 or not name.isprintable():  # names reach every later message
            raise CheckpointError(f"{path}/config.json: {key} names a feature {name!r:.80}: not a printable name")
        shape = f.get("shape") if isinstance(f, dict) else None
        if not isinstance(shape, list) or not all(type(n) is int and 0 < n <= 1 << 16 for n in shape):
            raise CheckpointError(f"{path}/config.json: {key}.{name!r:.80} has no shape of positive integers")
        out.append(Feature(name, str(f.get("type")), tuple(shape)))
    return out


# Integer settings the importer reads, with the range it accepts (None: optional).
_INT_SETTINGS = {
    "act": {"chunk_size": (1, 10_000), "n_action_steps": (1, 10_000), "n_obs_steps": (1, 1)},
    "diffusion": {
        "horizon": (1, 10_000),
        "n_action_steps": (1, 10_000),
        "n_obs_steps": (1, 64),
        "num_train_timesteps": (1, 100_000),
    },
    "smolvla": {
        "chunk_size": (1, 10_000),
        "n_action_steps": (1, 10_000),
        "n_obs_steps": (1, 1),
        "num_steps": (1, 1000),
        "tokenizer_max_length": (1, 4096),
        "max_state_dim": (1, 4096),
        "max_action_dim": (1, 4096),
    },
}


def _check_settings(config: dict, ptype: str, path: Path) -> None:
    for key, (lo, hi) in _INT_SETTINGS[ptype].items():
        v = config.get(key)
        if type(v) is not int or not lo <= v <= hi:
            raise CheckpointError(f"{path}/config.json: {key} must be an integer in [{lo}, {hi}], got {v!r}")
    if ptype == "act" and config.get("temporal_ensemble_coeff") is not None:
        raise CheckpointError(
            f"{path}/config.json: ACT temporal ensembling (temporal_ensemble_coeff "
            f"{config['temporal_ensemble_coeff']!r}) is not supported: vlad serves whole chunks; set "
            "temporal_ensemble_coeff to null and n_action_steps to the actions to execute per chunk (docs/lerobot.md)"
        )
    if ptype == "smolvla":
        for key, why in (
            ("adapt_to_pi_aloha", "converts Aloha joint spaces inside the policy"),
            ("use_delta_joint_actions_aloha", "not implemented by LeRobot"),
        ):
            if config.get(key):
                raise CheckpointError(f"{path}/config.json: SmolVLA with {key} = true is not supported ({why})")
        if config.get("empty_cameras"):
            raise CheckpointError(
                f"{path}/config.json: SmolVLA with empty_cameras = {config['empty_cameras']!r} is not supported: "
                "a vlad contract has no camera a robot does not send; retrain with empty_cameras = 0"
            )
        if config.get("attention_mode", "cross_attn") != "cross_attn" or not config.get("use_cache", True):
            raise CheckpointError(
                f"{path}/config.json: SmolVLA with attention_mode {config.get('attention_mode')!r} and use_cache "
                f"{config.get('use_cache')!r} is not supported (cross_attn with use_cache = true, LeRobot's default)"
            )
        resize = config.get("resize_imgs_with_padding")
        if resize is not None and (
            not isinstance(resize, list) or len(resize) != 2 or not all(type(n) is int and n > 0 for n in resize)
        ):
            raise CheckpointError(f"{path}/config.json: resize_imgs_with_padding must be [width, height] or null")
    if ptype == "diffusion":
        steps = config.get("num_inference_steps")
        if steps is not None and (type(steps) is not int or not 1 <= steps <= config["num_train_timesteps"]):
            raise CheckpointError(
                f"{path}/config.json: num_inference_steps must be an integer in [1, num_train_timesteps]"
            )
        if config.get("noise_scheduler_type", "DDPM") not in ("DDPM", "DDIM"):
            raise CheckpointError(
                f"{path}/config.json: noise_scheduler_type {config.get('noise_scheduler_type')!r} (DDPM or DDIM)"
            )
        if config.get("prediction_type", "epsilon") not in ("epsilon", "sample"):
            raise CheckpointError(
                f"{path}/config.json: prediction_type {config.get('prediction_type')!r} (epsilon or sample)"
            )
        if config["n_action_steps"] > config["horizon"] - config["n_obs_steps"] + 1:
            raise CheckpointError(f"{path}/config.json: n_action_steps must be <= horizon - n_obs_steps + 1")


def _normalizer_stats(path: Path, pipeline: str, registry: str) -> tuple[dict[str, dict[str, np.ndarray]], float]:
    """The statistics file named by the ``registry`` step of ``pipeline``.json, and its eps."""
    doc = _read_json(path / f"{pipeline}.json", "processor pipeline")
    steps = doc.get("steps") if isinstance(doc, dict) else None
    step = next((s for s in steps or () if isinstance(s, dict) and s.get("registry_name") == registry), None)
    if step is None:
        raise CheckpointError(f"{path}/{pipeline}.json: no {registry} step; the checkpoint carries no normalization")
    state_file = step.get("state_file")
    if not isinstance(state_file, str) or "/" in state_file or not state_file.endswith(".safetensors"):
        raise CheckpointError(f"{path}/{pipeline}.json: the {registry} step names no statistics file")
    stats_path = path / state_file
    if not stats_path.is_file():
        raise CheckpointError(f"{path}: missing {state_file} (the normalization statistics {pipeline}.json names)")
    if stats_path.stat().st_size > MAX_STATS_BYTES:
        raise CheckpointError(f"{stats_path}: larger than {MAX_STATS_BYTES >> 20} MiB; not normalization statistics")
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        flat = load_file(str(stats_path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{stats_path}: not a safetensors file ({exc})") from None
    stats: dict[str, dict[str, np.ndarray]] = {}
    for key, value in flat.items():
        feature, _, stat = key.rpartition(".")
        stats.setdefault(feature, {})[stat] = np.asarray(value, dtype=np.float32)
    eps = (step.get("config") or {}).get("eps", 1e-8) if isinstance(step.get("config"), dict) else 1e-8
    if type(eps) not in (int, float) or not 0 <= eps < 1e-2:
        raise CheckpointError(f"{path}/{pipeline}.json: the {registry} step's eps must be a small number, got {eps!r}")
    return stats, float(eps)


def read_checkpoint(path: str | Path) -> Checkpoint:
    """Read and check a checkpoint folder; :class:`CheckpointError` names what is missing."""
    root = resolve(path)
    config = _read_json(root / "config.json", "policy config")
    if not isinstance(config, dict) or not isinstance(config.get("type"), str):
        raise CheckpointError(f"{root}/config.json: no policy 'type'")
    ptype = config["type"]
    if ptype not in SUPPORTED_TYPES:
        why = UNSUPPORTED_TYPES.get(ptype, "unknown to this importer")
        raise CheckpointError(
            f"policy type {ptype!r} is not supported ({why}); supported: {', '.join(SUPPORTED_TYPES)} (docs/lerobot.md)"
        )
    if not (root / "model.safetensors").is_file():
        raise CheckpointError(f"{root}: missing model.safetensors (the weights)")
    _check_settings(config, ptype, root)
    inputs = _features(config, "input_features", root)
    outputs = _features(config, "output_features", root)
    cameras = tuple(f for f in inputs if f.type == "VISUAL")
    states = [f for f in inputs if f.type == "STATE"]
    others = [f.key for f in inputs if f.type not in ("VISUAL", "STATE")]
    if others:
        raise CheckpointError(
            f"input feature(s) {others} are not supported: a vlad contract has cameras and one proprio vector "
            "(observation.environment_state has no sensor to come from on the robot)"
        )
    if len(states) != 1 or states[0].key != STATE or len(states[0].shape) != 1:
        raise CheckpointError(f"the policy needs exactly one 1-D {STATE} input, has {[f.key for f in states]}")
    for cam in cameras:
        if not cam.key.startswith(IMAGE_PREFIX) or len(cam.shape) != 3 or cam.shape[0] != 3:
            raise CheckpointError(f"camera feature {cam.key}: expected {IMAGE_PREFIX}NAME with shape [3, H, W]")
    if not cameras:
        raise CheckpointError("the policy has no camera input; vlad's contract needs at least one camera")
    if ptype == "diffusion" and len({c.shape for c in cameras}) > 1:
        sizes = ", ".join(f"{c.key.removeprefix(IMAGE_PREFIX)} {c.shape[1]}x{c.shape[2]}" for c in cameras)
        raise CheckpointError(
            f"Diffusion Policy needs every camera at one size (LeRobot stacks them), this config has {sizes}; "
            "retrain with the images resized to one size"
        )
    actions = [f for f in outputs if f.type == "ACTION"]
    if len(actions) != 1 or actions[0].key != ACTION or len(actions[0].shape) != 1:
        raise CheckpointError(f"the policy needs exactly one 1-D {ACTION} output, has {[f.key for f in outputs]}")
    if ptype == "smolvla":
        for feature, limit in ((states[0], "max_state_dim"), (actions[0], "max_action_dim")):
            if feature.shape[0] > config[limit]:
                raise CheckpointError(
                    f"{root}/config.json: {feature.key} has {feature.shape[0]} entries, more than {limit} "
                    f"({config[limit]}): LeRobot pads it to that length"
                )
    norm_map = config.get("normalization_mapping") or {}
    if not isinstance(norm_map, dict):
        raise CheckpointError(f"{root}/config.json: normalization_mapping must be a table")
    bad = {k: v for k, v in norm_map.items() if not isinstance(v, str) or v not in NORM_MODES}
    if bad:
        raise CheckpointError(f"normalization mode(s) {bad} unknown (known: {', '.join(NORM_MODES)})")

    stats, eps = _normalizer_stats(root, "policy_preprocessor", "normalizer_processor")
    post_stats, _ = _normalizer_stats(root, "policy_postprocessor", "unnormalizer_processor")
    for feature in (*cameras, states[0]):
        _require_stats(stats, feature, norm_map.get(feature.type, "IDENTITY"), "policy_preprocessor")
    _require_stats(post_stats, actions[0], norm_map.get("ACTION", "IDENTITY"), "policy_postprocessor")
    stats[ACTION] = post_stats.get(ACTION, {})  # the unnormalizer's statistics decode the actions

    weights = read_weights_header(root / "model.safetensors")
    files, links = _hash_files(root)
    digest = hashlib.sha256("".join(f"{k}\0{v}\n" for k, v in files.items()).encode()).hexdigest()
    return Checkpoint(
        path=root,
        type=ptype,
        config=config,
        cameras=cameras,
        state=states[0],
        action=actions[0],
        norm_map=dict(norm_map),
        stats=stats,
        eps=eps,
        sha256=digest,
        files=files,
        links=links,
        weights=weights,
    )


def read_weights_header(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every tensor of ``model.safetensors`` with its shape and dtype, from the header; a file
    the header does not describe exactly (truncated, or not safetensors) is refused."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            out = {}
            for key in f.keys():
                sl = f.get_slice(key)
                out[key] = (tuple(int(n) for n in sl.get_shape()), str(sl.get_dtype()))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(
            f"{path}: not a complete safetensors file ({str(exc).strip()}); copy the checkpoint again"
        ) from None
    if not out:
        raise CheckpointError(f"{path}: holds no tensors; copy the checkpoint again")
    return out


def _hash_files(root: Path) -> tuple[dict[str, str], dict[str, str]]:
    """sha256 of every file under ``root`` (relative path -> digest) and the symbolic links among
    them (relative path -> target). A link to a file is hashed by its target's bytes: that is
    what the importer reads. Linked folders are not entered (nothing in them is read)."""
    files: dict[str, str] = {}
    links: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath) / name
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                target = p.resolve()
                if not target.is_file():
                    raise CheckpointError(
                        f"{p}: a symbolic link to {os.readlink(p)}, which is not a file; restore it or remove the link"
                    )
                links[rel] = str(target)
            files[rel] = sha256_file(p)
    return dict(sorted(files.items())), links


def release_name(ckpt: Checkpoint) -> tuple[str, str]:
    """A name for the release of ``ckpt``, and where it comes from. In order: the Hugging Face
    repository (``models--ORG--NAME`` in the hub cache; ``policy.repo_id`` in
    ``train_config.json``); the run's ``job_name`` when it is not LeRobot's default (the policy
    type); the policy type and the dataset's name; the training run's folder
    (``outputs/train/RUN/checkpoints/STEP/pretrained_model``); the policy type."""
    parts = ckpt.path.resolve().parts
    for i, part in enumerate(parts[:-1]):
        if part.startswith("models--") and parts[i + 1] == "snapshots" and _slug(part.split("--")[-1]):
            return _slug(part.split("--")[-1]), f"the hub cache folder {part}"
    cfg_path = ckpt.path / "train_config.json"
    cfg = _read_json(cfg_path, "training config") if cfg_path.is_file() else None
    if isinstance(cfg, dict):
        policy, dataset = cfg.get("policy"), cfg.get("dataset")
        repo = policy.get("repo_id") if isinstance(policy, dict) else None
        if isinstance(repo, str) and _slug(repo.rsplit("/", 1)[-1]):
            return _slug(repo.rsplit("/", 1)[-1]), "train_config.json's policy.repo_id"
        job = cfg.get("job_name")
        if isinstance(job, str) and _slug(job) and not job.endswith(ckpt.type):
            return _slug(job), "train_config.json's job_name"
        data = dataset.get("repo_id") if isinstance(dataset, dict) else None
        if isinstance(data, str) and _slug(data.rsplit("/", 1)[-1]):
            return f"{ckpt.type}-{_slug(data.rsplit('/', 1)[-1])}", "the policy type and train_config.json's dataset"
    if "checkpoints" in parts:
        run = parts[len(parts) - 1 - parts[::-1].index("checkpoints") - 1]
        if _slug(run):
            return _slug(run), f"the training run's folder {run}"
    for part in reversed(parts):
        if part not in ("pretrained_model", "last") and not part.isdigit() and _slug(part):
            return _slug(part), f"the folder {part}"
    return ckpt.type, "the policy type"


def _slug(text: str) -> str:
    """``text`` as release-id characters (letters, digits, ``._+-``), at most 48 of them."""
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", text).strip("-._+")[:48]


_STATS_NEEDED = {"MEAN_STD": ("mean", "std"), "MIN_MAX": ("min", "max"), "QUANTILES": ("q01", "q99")}
_STATS_NEEDED["QUANTILE10"] = ("q10", "q90")


def _require_stats(stats: dict, feature: Feature, mode: str, pipeline: str) -> None:
    for stat in _STATS_NEEDED.get(mode, ()):
        value = stats.get(feature.key, {}).get(stat)
        if value is None:
            raise CheckpointError(
                f"{pipeline}: no '{feature.key}.{stat}' statistic ({mode} normalization of {feature.type} needs it)"
            )
        if not np.all(np.isfinite(value)):
            raise CheckpointError(f"{pipeline}: '{feature.key}.{stat}' holds NaN or Inf")


def read_dataset_meta(path: str | Path) -> DatasetMeta:
    """``meta/info.json`` of a LeRobotDataset (the file, its ``meta`` folder or the dataset folder)."""
    p = Path(path)
    if p.is_dir():
        p = p / "info.json" if (p / "info.json").is_file() else p / "meta" / "info.json"
    info = _read_json(p, "dataset meta/info.json")
    if not isinstance(info, dict) or not isinstance(info.get("features"), dict):
        raise CheckpointError(f"{p}: no 'features' table; not a LeRobotDataset meta/info.json")
    fps = info.get("fps")
    if not isinstance(fps, (int, float)) or not 0 < fps <= 10_000:
        raise CheckpointError(f"{p}: fps must be a positive number, got {fps!r}")
    names: dict[str, tuple[str, ...]] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for key, f in info["features"].items():
        if not isinstance(f, dict):
            continue
        shapes[key] = tuple(int(n) for n in f.get("shape") or ())
        n = f.get("names")
        if isinstance(n, dict):  # {"motors": [...]} in some datasets
            n = next(iter(n.values()), None)
        if isinstance(n, list) and all(isinstance(x, str) for x in n):
            names[key] = tuple(n)
    root = p.parent.parent if p.parent.name == "meta" else None
    return DatasetMeta(float(fps), info.get("robot_type"), names, shapes, root)


def dataset_of(ckpt: Checkpoint) -> Path | None:
    """The dataset folder ``train_config.json`` names, when it exists on this machine."""
    cfg_path = ckpt.path / "train_config.json"
    if not cfg_path.is_file():
        return None
    cfg = _read_json(cfg_path, "training config")
    root = (cfg.get("dataset") or {}).get("root") if isinstance(cfg, dict) else None
    if isinstance(root, str) and (Path(root) / "meta" / "info.json").is_file():
        return Path(root)
    return None


def max_action_step(root: Path, dim: int) -> np.ndarray | None:
    """Largest change of each action entry between consecutive frames of an episode, from the
    dataset's parquet files; None when they cannot be read."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        return None
    worst = np.zeros(dim, np.float64)
    files = sorted((root / "data").rglob("*.parquet"))
    if not files:
        return None
    for f in files:
        table = pq.read_table(f, columns=["episode_index", "action"])
        ep = table.column("episode_index").to_numpy()
        act = np.asarray(table.column("action").to_pylist(), dtype=np.float64)
        if act.ndim != 2 or act.shape[1] != dim or len(act) < 2:
            return None
        same = ep[1:] == ep[:-1]
        if same.any():
            worst = np.maximum(worst, np.abs(np.diff(act, axis=0))[same].max(axis=0))
    return worst
