"""The vlad contract of a LeRobot checkpoint: what LeRobot does around the network, written down.

LeRobot's inference path for a robot observation is ``prepare_observation_for_inference``
(uint8 HWC image -> float CHW / 255, batch axis) -> the preprocessor (normalization from
the statistics file) -> the policy -> the postprocessor (unnormalization). Every one of
those steps is an affine map per channel or per entry, so the contract states them
exactly (docs/contract.md): the camera's ``scale = 255`` and per-channel ``mean``/``std``,
the proprio and action ``mean``/``std``. Each normalization mode is rewritten as
``(x - mean) / std``:

- ``MEAN_STD``: ``mean``, ``std + eps`` (LeRobot divides by ``std + eps``; it
  unnormalizes with ``std`` alone, which is what ``[[action.joints]]`` gets);
- ``MIN_MAX`` (to [-1, 1]): ``mean = min + (max - min) / 2``, ``std = (max - min) / 2``
  (``max - min`` replaced by ``eps`` where it is 0, as LeRobot does); likewise
  ``QUANTILES`` (q01, q99) and ``QUANTILE10`` (q10, q90);
- ``IDENTITY``: 0 and 1.

What a checkpoint does not know (units, joint limits for the guard, the control rate
when no dataset is given) comes from the dataset's ``meta/info.json`` and the options;
a missing piece is a one-line :class:`CheckpointError`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vlad.contract import KNOWN_UNITS, Contract, parse_contract
from vlad.importers.lerobot.checkpoint import ACTION, Checkpoint, CheckpointError, DatasetMeta, Feature
from vlad.tomlwrite import dumps

MAX_BATCH = 8


@dataclass(frozen=True)
class ContractOptions:
    """Choices the checkpoint cannot make: names, units, guard settings, timing."""

    release_id: str
    version: str = "1.0.0"
    cameras: Mapping[str, str] = field(default_factory=dict)  # LeRobot camera name -> robot camera name
    state_units: tuple[str, ...] = ()  # one for all entries, or one per entry
    action_units: tuple[str, ...] = ()
    action_semantics: str = "position"
    frame: str = "joint"
    fps: float | None = None  # overrides the dataset's
    bounds_margin: float = 0.1  # guard bounds: the data's [min, max] widened by this fraction of the range
    rate_limit_factor: float = 1.5  # guard rate limit: this times the largest step in the data
    max_age_periods: float = 3.0
    deadline_ms: float | None = None  # default: one control period
    seed: int = 0


def affine(ckpt: Checkpoint, feature: Feature, *, decode: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``(mean, std)`` with LeRobot's normalization of ``feature`` = ``(x - mean) / std`` (float32).

    ``decode``: the unnormalization's ``std`` (LeRobot adds ``eps`` only when dividing).
    """
    mode = ckpt.mode(feature)
    s = ckpt.stats.get(feature.key, {})
    eps = np.float32(ckpt.eps)
    if mode == "IDENTITY" or not s:
        n = feature.shape[0]
        return np.zeros(n, np.float32), np.ones(n, np.float32)
    if mode == "MEAN_STD":
        mean, std = s["mean"].reshape(-1), s["std"].reshape(-1)
        return mean.astype(np.float32), (std if decode else std + eps).astype(np.float32)
    lo_key, hi_key = {"MIN_MAX": ("min", "max"), "QUANTILES": ("q01", "q99"), "QUANTILE10": ("q10", "q90")}[mode]
    lo, hi = s[lo_key].reshape(-1), s[hi_key].reshape(-1)
    denom = (hi - lo).astype(np.float32)
    denom = np.where(denom == 0, eps, denom).astype(np.float32)
    half = denom / np.float32(2)
    return (lo + half).astype(np.float32), half.astype(np.float32)


def _units(given: tuple[str, ...], n: int, what: str, names: tuple[str, ...], flag: str) -> list[str]:
    if not given:
        raise CheckpointError(
            f"units of {what} are unknown (a checkpoint does not record them): pass {flag} UNIT or "
            f"{flag} U1,U2,... for {', '.join(names)} (known: {', '.join(KNOWN_UNITS)})"
        )
    if len(given) == 1:
        return [given[0]] * n
    if len(given) != n:
        raise CheckpointError(f"{flag}: {len(given)} units for {n} entries ({', '.join(names)})")
    return list(given)


def _names(meta: DatasetMeta | None, key: str, n: int, default: str) -> tuple[str, ...]:
    names = meta.names.get(key) if meta else None
    if names and len(names) == n:
        return tuple(names)
    return tuple(f"{default}{i}" for i in range(n))


def proprio_name(name: str) -> str:
    """LeRobot's ``shoulder.pos`` is vlad's ``shoulder.position`` (how the guard finds a
    joint's measured position: ``<joint>.position``); likewise ``.vel``."""
    for short, long in ((".pos", ".position"), (".vel", ".velocity")):
        if name.endswith(short):
            return name[: -len(short)] + long
    return name


def joint_name(name: str) -> str:
    """LeRobot's action ``shoulder.pos`` commands joint ``shoulder``."""
    return name[:-4] if name.endswith(".pos") else name


def camera_names(ckpt: Checkpoint, mapping: Mapping[str, str]) -> list[tuple[Feature, str]]:
    """Each camera feature with the robot's name for it (``--camera NAME=ROBOT_CAMERA``)."""
    known = {c.key.removeprefix("observation.images.") for c in ckpt.cameras}
    unknown = sorted(set(mapping) - known)
    if unknown:
        raise CheckpointError(
            f"--camera {unknown[0]}=...: the policy has no such camera (has: {', '.join(sorted(known))})"
        )
    return [
        (c, mapping.get(c.key.removeprefix("observation.images."), c.key.removeprefix("observation.images.")))
        for c in ckpt.cameras
    ]


def _f(values: np.ndarray | float) -> Any:
    """float32 values as Python floats: the TOML round trip gives back the same float32."""
    a = np.asarray(values, np.float32)
    return [float(v) for v in a.reshape(-1)] if a.ndim else float(a)


def contract_data(
    ckpt: Checkpoint, meta: DatasetMeta | None, opts: ContractOptions, max_step: np.ndarray | None = None
) -> dict[str, Any]:
    """The contract as TOML-shaped data (validate with :func:`build_contract`)."""
    fps = opts.fps or (meta.fps if meta else None)
    if not fps:
        raise CheckpointError(
            "the control rate is unknown: pass --dataset-meta DATASET/meta/info.json (its fps) or --fps"
        )
    period = 1000.0 / fps
    frames = ckpt.n_obs_steps
    time_axis = [frames] if frames > 1 else []
    t_letter = "T" if frames > 1 else ""
    dyn = [{"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": MAX_BATCH}]

    cameras, inputs = [], []
    for feature, robot_name in camera_names(ckpt, opts.cameras):
        _, h, w = feature.shape
        mean, std = affine(ckpt, feature)
        tensor = f"image_{robot_name}"
        cameras.append(
            {
                "name": robot_name,
                "input": tensor,
                "raw": {"height": h, "width": w, "color_order": "RGB", "layout": "HWC", "dtype": "uint8"},
                "model": {
                    "height": h,
                    "width": w,
                    "color_order": "RGB",
                    "layout": "CHW",
                    "dtype": "float32",
                    "resize": "none",
                    "crop": "none",
                    "scale": 255.0,
                    "mean": _f(mean),
                    "std": _f(std),
                },
            }
        )
        inputs.append(
            {
                "name": tensor,
                "dtype": "float32",
                "layout": f"N{t_letter}CHW",
                "shape": [1, *time_axis, 3, h, w],
                "dynamic": dyn,
            }
        )

    dim = ckpt.state.shape[0]
    state_names = _names(meta, ckpt.state.key, dim, "state")
    p_names = [proprio_name(n) for n in state_names]
    p_mean, p_std = affine(ckpt, ckpt.state)
    proprio = {
        "input": "state",
        "dim": dim,
        "names": p_names,
        "units": _units(opts.state_units, dim, ckpt.state.key, state_names, "--state-units"),
        "frame": opts.frame,
        "mean": _f(p_mean),
        "std": _f(p_std),
    }
    inputs.append(
        {"name": "state", "dtype": "float32", "layout": f"N{t_letter}D", "shape": [1, *time_axis, dim], "dynamic": dyn}
    )

    adim = ckpt.action.shape[0]
    action_names = _names(meta, ACTION, adim, "joint")
    units = _units(opts.action_units, adim, ACTION, action_names, "--action-units")
    a_mean, a_std = affine(ckpt, ckpt.action, decode=True)
    a_std = np.where(a_std > 0, a_std, np.float32(ckpt.eps)).astype(np.float32)  # a constant action dimension
    lo, hi = _action_range(ckpt, a_mean, a_std)
    margin = np.float64(opts.bounds_margin) * np.maximum(hi - lo, 1e-6)
    lower, upper = lo - margin, hi + margin
    if max_step is not None and np.all(max_step > 0):
        rate = max_step * opts.rate_limit_factor
    else:  # no data to measure steps on: the bounds are the only limit (say so in the report)
        rate = upper - lower
    joints = [
        {
            "name": joint_name(n),
            "semantics": opts.action_semantics,
            "unit": units[i],
            "mean": _f(a_mean[i]),
            "std": _f(a_std[i]),
            "lower": _round(lower[i]),
            "upper": _round(upper[i]),
            "rate_limit": _round(rate[i]),
        }
        for i, n in enumerate(action_names)
    ]
    chunk = ckpt.chunk_length
    data: dict[str, Any] = {
        "format": "vlad.contract/1",
        "model": {
            "id": opts.release_id,
            "version": opts.version,
            "family": f"lerobot-{ckpt.type}",
            "description": f"LeRobot {ckpt.type} policy imported by vladctl import lerobot",
        },
        "cameras": cameras,
        "proprio": proprio,
        "action": {
            "output": "actions",
            "chunk_length": chunk,
            "dim": adim,
            "frame": opts.frame,
            "scale": 1.0,
            "on_nonfinite": "hold",
            "on_bound_violation": "clamp",
            "hold_posture": "hold_position" if opts.action_semantics in ("position", "delta") else "zero_velocity",
            "joints": joints,
        },
        "timing": {
            "control_period_ms": period,
            "max_observation_age_ms": opts.max_age_periods * period,
            # LeRobot executes n_action_steps actions of a chunk before it predicts again.
            "action_validity_ms": max(1, min(ckpt.n_action_steps, chunk)) * period,
            "e2e_deadline_ms": opts.deadline_ms or period,
        },
        "inputs": inputs,
        "outputs": [
            {"name": "actions", "dtype": "float32", "layout": "NHD", "shape": [1, chunk, adim], "dynamic": dyn}
        ],
    }
    if frames > 1:
        data["history"] = {"frames": frames}
    noise = noise_shape(ckpt)
    if noise is not None:
        data["noise"] = {
            "input": "noise",
            "shape": list(noise),
            "dtype": "float32",
            "seeding": "philox-sequence",
            "seed": opts.seed,
            "denoising_steps": denoising_steps(ckpt),
        }
        inputs.append(
            {
                "name": "noise",
                "dtype": "float32",
                "layout": "N" + "SHD"[-len(noise) :],
                "shape": [1, *noise],
                "dynamic": dyn,
            }
        )
    return data


def _round(x: float) -> float:
    """Guard limits: 6 significant digits are plenty and read well."""
    x = float(x)
    return float(f"{x:.6g}") if math.isfinite(x) else x


def _action_range(ckpt: Checkpoint, mean: np.ndarray, std: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = ckpt.stats.get(ACTION, {})
    if "min" in s and "max" in s:
        return s["min"].astype(np.float64).reshape(-1), s["max"].astype(np.float64).reshape(-1)
    return (mean - 5 * std).astype(np.float64), (mean + 5 * std).astype(np.float64)


def denoising_steps(ckpt: Checkpoint) -> int:
    c = ckpt.config
    return int(c.get("num_inference_steps") or c.get("num_train_timesteps") or 1)


def noise_shape(ckpt: Checkpoint) -> tuple[int, ...] | None:
    """Per-sample shape of the explicit noise input; None for a policy that does not sample.

    Diffusion Policy: the initial sample ``[horizon, action dim]``; with DDPM, whose every
    step but the last adds fresh noise, one more ``[horizon, action dim]`` per step
    (``[1 + steps, horizon, action dim]``). DDIM (eta = 0) adds none.
    """
    if ckpt.type != "diffusion":
        return None
    c = ckpt.config
    base = (int(c["horizon"]), ckpt.action.shape[0])
    if c.get("noise_scheduler_type", "DDPM") == "DDPM":
        return (1 + denoising_steps(ckpt), *base)
    return base


def build_contract(data: dict[str, Any]) -> Contract:
    """Validate the contract data with the one contract parser (every problem at once)."""
    return parse_contract(data, "imported contract")


def contract_toml(data: Mapping[str, Any], header: str = "") -> str:
    """TOML text of contract-shaped ``data`` (``dynamic`` stays an inline array)."""
    return dumps(data, header=header, inline=("dynamic",))
