"""Validation rules of a contract beyond types: per section, and between sections."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from vlad.contract.model import (
    _FLOAT_DTYPES,
    _INT_DTYPES,
    _SHA256_RE,
    KNOWN_UNITS,
    UNITS_BY_SEMANTICS,
    ActionSpec,
    CameraSpec,
    HistorySpec,
    JointSpec,
    LanguageSpec,
    ModelImageSpec,
    NoiseSpec,
    ProprioSpec,
    RawImageSpec,
    RtcSpec,
    TensorSpec,
    TimingSpec,
)


def _positive(problems: list[str], path: str, value: float) -> None:
    if value <= 0:
        problems.append(f"{path}: must be > 0, got {value}")


def _check_normalization(
    problems: list[str], path: str, mean: tuple[float, ...], std: tuple[float, ...], n: int, what: str
) -> None:
    if len(mean) != n:
        problems.append(f"{path}.mean: has {len(mean)} values, expected {n} ({what})")
    if len(std) != n:
        problems.append(f"{path}.std: has {len(std)} values, expected {n} ({what})")
    for i, s in enumerate(std):
        if s <= 0:
            problems.append(f"{path}.std[{i}]: must be > 0, got {s}")


def _check_unique(problems: list[str], path: str, names: list[str], what: str) -> None:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            problems.append(f"{path}[{i}]: duplicate {what} {name!r}")
        seen.add(name)


def _check_unit(problems: list[str], path: str, unit: str) -> bool:
    if unit not in KNOWN_UNITS:
        problems.append(f"{path}: unknown unit {unit!r} (known: {', '.join(KNOWN_UNITS)})")
        return False
    return True


def _check_raw_image(s: RawImageSpec, path: str, problems: list[str]) -> None:
    _positive(problems, f"{path}.height", s.height)
    _positive(problems, f"{path}.width", s.width)


def _check_model_image(s: ModelImageSpec, path: str, problems: list[str]) -> None:
    _positive(problems, f"{path}.height", s.height)
    _positive(problems, f"{path}.width", s.width)
    _positive(problems, f"{path}.scale", s.scale)
    _check_normalization(problems, path, s.mean, s.std, 3, "one per color channel")


def _check_camera(s: CameraSpec, path: str, problems: list[str]) -> None:
    raw, model = s.raw, s.model
    if model.resize == "none":
        # Without resize the pixels must already be at model resolution (after a crop).
        if model.crop == "none" and (raw.height, raw.width) != (model.height, model.width):
            problems.append(
                f"{path}.model.resize: 'none' but raw {raw.height}x{raw.width} differs from "
                f"model {model.height}x{model.width} and crop is 'none'"
            )
        if model.crop == "center" and (raw.height < model.height or raw.width < model.width):
            problems.append(
                f"{path}.model.resize: 'none' but raw {raw.height}x{raw.width} is smaller than "
                f"model {model.height}x{model.width}"
            )


def _check_language(s: LanguageSpec, path: str, problems: list[str]) -> None:
    if not _SHA256_RE.fullmatch(s.sha256):
        problems.append(f"{path}.sha256: expected 64 lowercase hex digits, got {s.sha256!r}")
    _positive(problems, f"{path}.max_tokens", s.max_tokens)
    if s.pad_id < 0:
        problems.append(f"{path}.pad_id: must be >= 0, got {s.pad_id}")


def _check_proprio(s: ProprioSpec, path: str, problems: list[str]) -> None:
    _positive(problems, f"{path}.dim", s.dim)
    for key in ("names", "units"):
        n = len(getattr(s, key))
        if n != s.dim:
            problems.append(f"{path}.{key}: has {n} entries, expected dim = {s.dim}")
    _check_unique(problems, f"{path}.names", list(s.names), "name")
    for i, unit in enumerate(s.units):
        _check_unit(problems, f"{path}.units[{i}]", unit)
    _check_normalization(problems, path, s.mean, s.std, s.dim, "one per proprio dim")


def _check_noise(s: NoiseSpec, path: str, problems: list[str]) -> None:
    if not s.shape:
        problems.append(f"{path}.shape: must not be empty")
    for i, n in enumerate(s.shape):
        _positive(problems, f"{path}.shape[{i}]", n)
    if not 0 <= s.seed < 2**64:
        problems.append(f"{path}.seed: must be in [0, 2**64), got {s.seed}")
    _positive(problems, f"{path}.denoising_steps", s.denoising_steps)


# A window is held per policy on the serving path (frames x every camera's model image):
# bound it so a contract cannot ask for an unbounded buffer.
MAX_HISTORY_FRAMES = 64


def _check_history(s: HistorySpec, path: str, problems: list[str]) -> None:
    if not 1 <= s.frames <= MAX_HISTORY_FRAMES:
        problems.append(f"{path}.frames: must be in [1, {MAX_HISTORY_FRAMES}], got {s.frames}")


def _check_joint(s: JointSpec, path: str, problems: list[str]) -> None:
    if _check_unit(problems, f"{path}.unit", s.unit):
        fitting = UNITS_BY_SEMANTICS[s.semantics]
        if s.unit not in fitting:
            problems.append(
                f"{path}.unit: unit {s.unit!r} does not fit semantics {s.semantics!r} "
                f"(expected one of: {', '.join(fitting)})"
            )
    _positive(problems, f"{path}.std", s.std)
    if s.lower >= s.upper:
        problems.append(f"{path}.lower: must be < upper, got lower {s.lower} >= upper {s.upper}")
    _positive(problems, f"{path}.rate_limit", s.rate_limit)


def _check_action(s: ActionSpec, path: str, problems: list[str]) -> None:
    _positive(problems, f"{path}.chunk_length", s.chunk_length)
    _positive(problems, f"{path}.dim", s.dim)
    _positive(problems, f"{path}.scale", s.scale)
    if len(s.joints) != s.dim:
        problems.append(f"{path}.joints: has {len(s.joints)} joints, expected dim = {s.dim}")
    _check_unique(problems, f"{path}.joints", [j.name for j in s.joints], "joint name")


def _check_timing(s: TimingSpec, path: str, problems: list[str]) -> None:
    for f in fields(s):
        _positive(problems, f"{path}.{f.name}", getattr(s, f.name))
    if s.action_validity_ms < s.control_period_ms:
        problems.append(
            f"{path}.action_validity_ms: {s.action_validity_ms} is shorter than "
            f"control_period_ms {s.control_period_ms}: an action would expire before the next"
        )


def _check_tensor(s: TensorSpec, path: str, problems: list[str]) -> None:
    rank = len(s.shape)
    if rank == 0:
        problems.append(f"{path}.shape: must not be empty")
    for i, n in enumerate(s.shape):
        _positive(problems, f"{path}.shape[{i}]", n)
    if len(s.layout) != rank:
        problems.append(f"{path}.layout: {s.layout!r} has {len(s.layout)} letters but shape has rank {rank}")
    _check_unique(problems, f"{path}.dynamic", [d.name for d in s.dynamic], "dynamic axis name")
    seen: set[int] = set()
    for k, d in enumerate(s.dynamic):
        dpath = f"{path}.dynamic[{k}]"
        if d.axis in seen:
            problems.append(f"{dpath}.axis: axis {d.axis} is already dynamic")
        seen.add(d.axis)
        if not 0 <= d.axis < rank:
            problems.append(f"{dpath}.axis: {d.axis} is outside the shape's rank {rank}")
        elif d.opt != s.shape[d.axis]:
            problems.append(f"{dpath}.opt: {d.opt} differs from shape[{d.axis}] = {s.shape[d.axis]}")
        if d.min < 1:
            problems.append(f"{dpath}.min: must be >= 1, got {d.min}")
        if not d.min <= d.opt <= d.max:
            problems.append(f"{dpath}: needs min <= opt <= max, got min {d.min}, opt {d.opt}, max {d.max}")


CHECKS: dict[type, Any] = {
    RawImageSpec: _check_raw_image,
    ModelImageSpec: _check_model_image,
    CameraSpec: _check_camera,
    LanguageSpec: _check_language,
    ProprioSpec: _check_proprio,
    NoiseSpec: _check_noise,
    HistorySpec: _check_history,
    JointSpec: _check_joint,
    ActionSpec: _check_action,
    TimingSpec: _check_timing,
    TensorSpec: _check_tensor,
}


# ---- cross-section checks: sections vs the tensor signature ----------------------------


def check_cross(values: dict[str, Any], problems: list[str]) -> None:
    """Checks between sections; a section that failed to parse is skipped, not re-reported."""
    inputs: tuple[TensorSpec, ...] | None = values.get("inputs")
    outputs: tuple[TensorSpec, ...] | None = values.get("outputs")
    cameras: tuple[CameraSpec, ...] | None = values.get("cameras")
    for key, items in (("cameras", cameras), ("inputs", inputs), ("outputs", outputs)):
        if items is not None:
            if not items:
                problems.append(f"{key}: needs at least one entry")
            _check_unique(problems, key, [i.name for i in items], "name")
    if inputs is not None and outputs is not None:
        input_names = {t.name for t in inputs}
        for j, t in enumerate(outputs):
            if t.name in input_names:
                problems.append(f"outputs[{j}].name: {t.name!r} is also an input name")

    # Who consumes which input. If a consuming section is broken we cannot know, so the
    # "input consumed by nobody" check is skipped rather than reported falsely.
    consumers: list[tuple[str, str, Any]] = []  # (path of the .input key, input name, section)
    all_known = cameras is not None
    rtc: RtcSpec | None = values.get("rtc")
    action: ActionSpec | None = values.get("action")
    if "rtc" not in values or "action" not in values:
        all_known = False
    for i, cam in enumerate(cameras or ()):
        consumers.append((f"cameras[{i}]", cam.input, cam))
    for key in ("language", "proprio", "noise"):
        if key not in values:
            all_known = False
        elif values[key] is not None:
            consumers.append((key, values[key].input, values[key]))
    if rtc is not None and action is not None:
        consumers.append(("rtc.actions", rtc.actions_input, _RtcInput((action.chunk_length, action.dim))))
        consumers.append(("rtc.weights", rtc.weights_input, _RtcInput((action.chunk_length,))))
    # With [history], camera and proprio inputs carry a time axis; a broken [history]
    # section leaves their shapes unknown, so those checks are skipped.
    history_known = "history" in values
    history: HistorySpec | None = values.get("history")
    frames = history.frames if history is not None else 1
    if inputs is not None:
        index = {t.name: j for j, t in enumerate(inputs)}
        first_user: dict[str, str] = {}
        for cpath, name, section in consumers:
            if name not in index:
                known = ", ".join(t.name for t in inputs) or "none"
                key = f"{cpath}_input" if isinstance(section, _RtcInput) else f"{cpath}.input"
                problems.append(f"{key}: {name!r} is not declared in [[inputs]] (declared: {known})")
                continue
            if name in first_user:
                problems.append(f"{cpath}.input: {name!r} is already consumed by {first_user[name]}")
                continue
            first_user[name] = f"{cpath}.input"
            j = index[name]
            if history_known or not isinstance(section, (CameraSpec, ProprioSpec)):
                _check_consumed(section, cpath, inputs[j], f"inputs[{j}]", problems, frames)
        if all_known:
            for j, t in enumerate(inputs):
                if t.name not in first_user:
                    problems.append(
                        f"inputs[{j}].name: input {t.name!r} is not consumed by any camera, "
                        "language, proprio, noise or rtc section"
                    )

    if action is not None and outputs is not None:
        oindex = {t.name: j for j, t in enumerate(outputs)}
        if action.output not in oindex:
            known = ", ".join(t.name for t in outputs) or "none"
            problems.append(f"action.output: {action.output!r} is not declared in [[outputs]] (declared: {known})")
        else:
            j = oindex[action.output]
            t = outputs[j]
            _check_wired(
                t,
                f"outputs[{j}]",
                (action.chunk_length, action.dim),
                "action (chunk_length, dim)",
                problems,
            )
            if t.dtype not in _FLOAT_DTYPES:
                problems.append(f"outputs[{j}].dtype: {t.dtype!r} is not a float dtype (action output)")

    if inputs is not None and outputs is not None:
        _check_batch(inputs, outputs, problems)


def _check_consumed(section: Any, cpath: str, t: TensorSpec, tpath: str, problems: list[str], frames: int = 1) -> None:
    """Check input tensor ``t`` against the section that feeds it (``frames``: ``history.frames``
    when the contract has ``[history]``, which adds a time axis T to camera and proprio inputs)."""
    time_axis: tuple[int, ...] = (frames,) if frames > 1 else ()
    t_letter = "T" if frames > 1 else ""
    if isinstance(section, CameraSpec):
        m = section.model
        if m.layout == "CHW":
            layout, tail = f"N{t_letter}CHW", (*time_axis, 3, m.height, m.width)
        else:
            layout, tail = f"N{t_letter}HWC", (*time_axis, m.height, m.width, 3)
        what = f"{cpath}.model ({m.layout} {m.height}x{m.width}, 3 channels" + (
            f", history.frames {frames})" if frames > 1 else ")"
        )
        if t.layout != layout:
            problems.append(f"{tpath}.layout: {t.layout!r} but {what} needs {layout!r}")
        _check_wired(t, tpath, tail, what, problems)
        if t.dtype != m.dtype:
            problems.append(f"{tpath}.dtype: {t.dtype!r} differs from {cpath}.model.dtype {m.dtype!r}")
    elif isinstance(section, LanguageSpec):
        _check_wired(t, tpath, (section.max_tokens,), "language.max_tokens", problems)
        if t.dtype not in _INT_DTYPES:
            problems.append(f"{tpath}.dtype: {t.dtype!r} but token ids need one of {', '.join(_INT_DTYPES)}")
    elif isinstance(section, ProprioSpec):
        what = f"proprio.dim and history.frames {frames}" if frames > 1 else "proprio.dim"
        _check_wired(t, tpath, (*time_axis, section.dim), what, problems)
        if t.dtype not in _FLOAT_DTYPES:
            problems.append(f"{tpath}.dtype: {t.dtype!r} is not a float dtype (proprio input)")
    elif isinstance(section, _RtcInput):
        _check_wired(
            t,
            tpath,
            section.tail,
            "action (chunk_length, dim)" if len(section.tail) == 2 else "action.chunk_length",
            problems,
        )
        if t.dtype != "float32":
            problems.append(f"{tpath}.dtype: {t.dtype!r} but {cpath}_input must be float32")
    elif isinstance(section, NoiseSpec):
        _check_wired(t, tpath, section.shape, "noise.shape", problems)
        if t.dtype != section.dtype:
            problems.append(f"{tpath}.dtype: {t.dtype!r} differs from noise.dtype {section.dtype!r}")


@dataclass(frozen=True)
class _RtcInput:
    """One of the two inputs ``[rtc]`` feeds, with the shape it must have after the batch axis."""

    tail: tuple[int, ...]


def _check_wired(t: TensorSpec, tpath: str, tail: tuple[int, ...], what: str, problems: list[str]) -> None:
    """``t`` must be ``[N, *tail]``, with only the batch axis N dynamic."""
    expected = "[N, " + ", ".join(str(n) for n in tail) + "]"
    if len(t.shape) != len(tail) + 1 or tuple(t.shape[1:]) != tuple(tail):
        problems.append(f"{tpath}.shape: {list(t.shape)} does not match {what}: expected {expected}")
    for k, d in enumerate(t.dynamic):
        if d.axis != 0:
            problems.append(
                f"{tpath}.dynamic[{k}].axis: axis {d.axis} is fixed by {what}; only the batch axis 0 may be dynamic"
            )


def _batch_range(t: TensorSpec) -> tuple[int, int, int]:
    for d in t.dynamic:
        if d.axis == 0:
            return (d.min, d.opt, d.max)
    n = t.shape[0] if t.shape else 0
    return (n, n, n)


def _check_batch(inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...], problems: list[str]) -> None:
    """Every tensor shares one batch axis, so all must agree on its range."""
    tensors = [(f"inputs[{j}]", t) for j, t in enumerate(inputs)]
    tensors += [(f"outputs[{j}]", t) for j, t in enumerate(outputs)]
    if not tensors:
        return
    ref_path, ref = tensors[0]
    ref_range = _batch_range(ref)
    for tpath, t in tensors[1:]:
        r = _batch_range(t)
        if r != ref_range:
            problems.append(f"{tpath}: batch axis (min, opt, max) {r} differs from {ref_path} ({ref.name}) {ref_range}")
