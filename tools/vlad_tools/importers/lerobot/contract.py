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
- ``MIN_MAX`` (to [-1, 1]): ``mean = min + (max - min) / 2``, ``std = (max - min) / 2``;
  likewise ``QUANTILES`` (q01, q99) and ``QUANTILE10`` (q10, q90). Where ``max = min``
  LeRobot divides by ``eps`` instead, so the constant itself maps to -1: ``mean`` is then
  the nearest float32 above ``min + eps / 2`` that differs from ``min`` and ``std = mean -
  min``, which maps the constant to exactly -1 (float32 cannot hold ``min + eps / 2`` for
  most constants: ``eps`` is 1e-8);
- ``IDENTITY``: 0 and 1.

What a checkpoint does not know (units, joint limits for the guard, the control rate
when no dataset is given) comes from the dataset's ``meta/info.json`` and the options;
a missing piece is a one-line :class:`CheckpointError`. A joint whose range in the data
is empty (a gripper never moved) has no guard bounds to derive: ``--joint-limits`` gives
them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vlad.contract import KNOWN_UNITS, Contract, parse_contract
from vlad.tomlwrite import dumps
from vlad_tools.importers.lerobot.checkpoint import ACTION, Checkpoint, CheckpointError, DatasetMeta, Feature

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
    joint_limits: Mapping[str, tuple[float, float]] = field(default_factory=dict)  # joint -> the robot's (lower, upper)


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
    lo_key, hi_key = RANGE_STATS[mode]
    lo, hi = s[lo_key].reshape(-1).astype(np.float32), s[hi_key].reshape(-1).astype(np.float32)
    denom = (hi - lo).astype(np.float32)
    constant = denom == 0
    denom = np.where(constant, eps, denom).astype(np.float32)
    half = (denom / np.float32(2)).astype(np.float32)
    mean = (lo + half).astype(np.float32)
    if decode or not constant.any():
        return mean, half
    # LeRobot: 2 * (x - min) / eps - 1, i.e. -1 at the constant. min + eps / 2 rounds back to
    # min for most constants, which would map it to 0: take the next float32 above min
    # instead, and std = mean - min (exact), so (min - mean) / std is exactly -1.
    above = np.maximum(mean, np.nextafter(lo, np.float32(np.inf), dtype=np.float32))
    mean = np.where(constant, above, mean).astype(np.float32)
    std = np.where(constant, mean - lo, half).astype(np.float32)
    return mean, std


# The statistics that bound each range-based normalization mode.
RANGE_STATS = {"MIN_MAX": ("min", "max"), "QUANTILES": ("q01", "q99"), "QUANTILE10": ("q10", "q90")}


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


def naming_warnings(ckpt: Checkpoint, meta: DatasetMeta | None) -> list[str]:
    """One line per feature whose entries get generic names (no dataset meta naming them)."""
    out = []
    for feature, default in ((ckpt.state, "state"), (ckpt.action, "joint")):
        n = feature.shape[0]
        names = meta.names.get(feature.key) if meta else None
        if names and len(names) == n:
            continue
        if meta is None:
            why = "no dataset meta/info.json"
        elif names:
            why = f"the dataset meta names {len(names)} entries, the policy has {n}"
        else:
            why = "the dataset meta names none"
        out.append(
            f"{feature.key} entries are named {default}0..{default}{n - 1} ({why}): pass --dataset-meta "
            "DATASET/meta/info.json for the robot's names (the guard finds a joint's measured position by name)"
        )
    return out


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
    ckpt: Checkpoint,
    meta: DatasetMeta | None,
    opts: ContractOptions,
    max_step: np.ndarray | None = None,
    language: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The contract as TOML-shaped data (validate with :func:`build_contract`).

    ``language``: the ``[language]`` table of a policy that reads an instruction (SmolVLA:
    :func:`vlad_tools.importers.lerobot.vlm.language_table`); its ``input`` is added here."""
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

    if ckpt.type == "smolvla":
        if language is None:
            raise CheckpointError("SmolVLA reads an instruction: its contract needs the VLM's tokenizer (--vlm-dir)")
        max_tokens = int(language["max_tokens"])
        inputs.append({"name": "tokens", "dtype": "int64", "layout": "NL", "shape": [1, max_tokens], "dynamic": dyn})

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
    lower, upper = _guard_bounds(ckpt, a_mean, a_std, action_names, units, opts)
    # The rate limit: a multiple of the largest step in the data; where there is no data (or
    # the joint never moved in it) the bounds are the only limit (the report says which).
    steps = max_step if max_step is not None else np.zeros(adim)
    rate = np.where(steps > 0, steps * opts.rate_limit_factor, upper - lower)
    joints = [
        {
            "name": joint_name(n),
            "semantics": opts.action_semantics,
            "unit": units[i],
            "mean": _f(a_mean[i]),
            "std": _f(a_std[i]),
            "lower": float(lower[i]),
            "upper": float(upper[i]),
            "rate_limit": _round(rate[i], up=True),
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
    if ckpt.type == "smolvla" and language is not None:
        data["language"] = {"input": "tokens", **language}
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
    if ckpt.type == "smolvla":
        # real-time chunking by inpainting: the export takes the waypoints to continue and their weights
        data["rtc"] = {"method": "inpaint", "actions_input": "rtc_actions", "weights_input": "rtc_weights"}
        inputs.append(
            {"name": "rtc_actions", "dtype": "float32", "layout": "NHD", "shape": [1, chunk, adim], "dynamic": dyn}
        )
        inputs.append({"name": "rtc_weights", "dtype": "float32", "layout": "NH", "shape": [1, chunk], "dynamic": dyn})
    return data


def _round(x: float, up: bool) -> float:
    """Guard limits: 6 significant digits are plenty and read well; rounded ``up`` (or down)
    when the nearest such number would not hold what the limit bounds (beyond float noise)."""
    x = float(x)
    r = float(f"{x:.6g}")
    if not math.isfinite(x) or x == 0 or (r >= x if up else r <= x) or abs(r - x) <= 1e-9 * abs(x):
        return r
    step = 10.0 ** (math.floor(math.log10(abs(x))) - 5)
    return float(f"{r + step if up else r - step:.6g}")


def _guard_bounds(
    ckpt: Checkpoint,
    mean: np.ndarray,
    std: np.ndarray,
    names: tuple[str, ...],
    units: list[str],
    opts: ContractOptions,
) -> tuple[np.ndarray, np.ndarray]:
    """The guard's ``lower``/``upper`` per joint: ``--joint-limits`` where given, else the data's
    range widened by ``bounds_margin`` of it. A joint the data never moved has no range to
    widen: a one-line error asks for its limits."""
    joints = [joint_name(n) for n in names]
    limits = {joint_name(k): v for k, v in opts.joint_limits.items()}
    unknown = sorted(set(limits) - set(joints))
    if unknown:
        raise CheckpointError(f"--joint-limits {unknown[0]}=...: no such joint (joints: {', '.join(joints)})")
    lo, hi = _action_range(ckpt, mean, std)
    margin = np.float64(opts.bounds_margin) * (hi - lo)
    lower = np.array([_round(v, up=False) for v in lo - margin])
    upper = np.array([_round(v, up=True) for v in hi + margin])
    frozen = []
    for i, joint in enumerate(joints):
        if joint in limits:
            lower[i], upper[i] = limits[joint]
        elif not hi[i] > lo[i]:
            frozen.append(i)
    if frozen:
        i = frozen[0]
        more = f" (and {', '.join(joints[j] for j in frozen[1:])})" if len(frozen) > 1 else ""
        value = f"{lo[i]:g}" + (f" {units[i]}" if units[i] != "1" else "")
        raise CheckpointError(
            f"joint {joints[i]}{more} never moved in the training data (its actions are all {value}), "
            f"so the guard has no range for it: give the robot's limits with --joint-limits {joints[i]}=LOWER:UPPER"
        )
    return lower, upper


def _action_range(ckpt: Checkpoint, mean: np.ndarray, std: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = ckpt.stats.get(ACTION, {})
    if "min" in s and "max" in s:
        return s["min"].astype(np.float64).reshape(-1), s["max"].astype(np.float64).reshape(-1)
    return (mean - 5 * std).astype(np.float64), (mean + 5 * std).astype(np.float64)


def denoising_steps(ckpt: Checkpoint) -> int:
    c = ckpt.config
    if ckpt.type == "smolvla":
        return int(c["num_steps"])
    return int(c.get("num_inference_steps") or c.get("num_train_timesteps") or 1)


def noise_shape(ckpt: Checkpoint) -> tuple[int, ...] | None:
    """Per-sample shape of the explicit noise input; None for a policy that does not sample.

    Diffusion Policy: the initial sample ``[horizon, action dim]``; with DDPM, whose every
    step but the last adds fresh noise, one more ``[horizon, action dim]`` per step
    (``[1 + steps, horizon, action dim]``). DDIM (eta = 0) adds none.

    SmolVLA: the flow's starting point ``[chunk_size, max_action_dim]``; LeRobot pads the
    action to ``max_action_dim`` entries and draws noise for all of them.
    """
    c = ckpt.config
    if ckpt.type == "smolvla":
        return (int(c["chunk_size"]), int(c["max_action_dim"]))
    if ckpt.type != "diffusion":
        return None
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
