"""The release contract: the frozen input/output contract of one model release.

A contract is a TOML file (format ``vlad.contract/1``, documented in docs/contract.md)
parsed once into frozen dataclasses whose attribute names are the TOML keys. Loading
validates everything and reports *every* problem in one :class:`~vlad.errors.ContractError`
so a broken contract is fixed in one pass. :func:`diff_contracts` compares two contracts
field by field and says which differences break compatibility with the trained model.

Public API:

- :func:`load_contract` / :func:`parse_contract` -> :class:`Contract`
- :func:`diff_contracts` -> list of :class:`FieldDiff`
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import re
import tomllib
import typing
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal

from vlad.errors import ContractError

__all__ = [
    "CONTRACT_FORMAT",
    "KNOWN_UNITS",
    "UNITS_BY_SEMANTICS",
    "ActionSpec",
    "CameraSpec",
    "Contract",
    "DynamicAxis",
    "FieldDiff",
    "JointSpec",
    "LanguageSpec",
    "ModelImageSpec",
    "ModelSpec",
    "NoiseSpec",
    "ProprioSpec",
    "RawImageSpec",
    "TensorSpec",
    "TimingSpec",
    "diff_contracts",
    "load_contract",
    "parse_contract",
]

CONTRACT_FORMAT = "vlad.contract/1"
SUPPORTED_FORMATS = (CONTRACT_FORMAT,)

# A closed set on purpose: a unit the daemon does not know cannot be converted or
# bounded, and a typo ("rads") must not silently pass as a new unit.
KNOWN_UNITS = (
    "rad", "deg", "m", "mm",
    "rad/s", "deg/s", "m/s", "mm/s",
    "rad/s^2", "deg/s^2", "m/s^2",
    "N", "N*m",
    "1",  # dimensionless (gripper opening fraction, normalized values)
)

# Which action units make sense for which semantics. A delta is a change of position
# per control step, so it carries position units.
UNITS_BY_SEMANTICS: dict[str, tuple[str, ...]] = {
    "position": ("rad", "deg", "m", "mm", "1"),
    "velocity": ("rad/s", "deg/s", "m/s", "mm/s"),
    "delta": ("rad", "deg", "m", "mm", "1"),
    "torque": ("N*m", "N"),
}

ColorOrder = Literal["RGB", "BGR"]
ImageLayout = Literal["HWC", "CHW"]
TensorDtype = Literal[
    "bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"
]
_INT_DTYPES = ("int32", "int64")
_FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")


# ---- the typed contract ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """``[model]``: identity of the release; informational for compatibility."""

    id: str
    version: str
    family: str
    description: str = field(default="", metadata={"allow_empty": True})


@dataclass(frozen=True, slots=True)
class RawImageSpec:
    """``[cameras.raw]``: the image as the sensor sends it."""

    height: int
    width: int
    color_order: ColorOrder
    layout: ImageLayout
    dtype: Literal["uint8", "uint16", "float32"]


@dataclass(frozen=True, slots=True)
class ModelImageSpec:
    """``[cameras.model]``: the image as the network was trained on it.

    Preprocessing: crop, resize, reorder channels and layout, then
    ``(pixel / scale - mean[c]) / std[c]`` per channel.
    """

    height: int
    width: int
    color_order: ColorOrder
    layout: ImageLayout
    dtype: Literal["uint8", "float16", "float32"]
    resize: Literal["none", "nearest", "bilinear", "area"]
    crop: Literal["none", "center"]
    scale: float
    mean: tuple[float, ...]
    std: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class CameraSpec:
    """One ``[[cameras]]`` entry; ``input`` names the model input it feeds."""

    name: str
    input: str
    raw: RawImageSpec
    model: ModelImageSpec


@dataclass(frozen=True, slots=True)
class LanguageSpec:
    """``[language]``: the tokenizer, pinned by the sha256 of its file."""

    input: str
    tokenizer: str
    library: str
    library_version: str
    file: str
    sha256: str
    max_tokens: int
    padding_side: Literal["right", "left"]
    pad_id: int
    truncation: Literal["error", "truncate"]


@dataclass(frozen=True, slots=True)
class ProprioSpec:
    """``[proprio]``: proprioception vector, in ``names`` order, normalized by mean/std."""

    input: str
    dim: int
    names: tuple[str, ...]
    units: tuple[str, ...]
    frame: str
    mean: tuple[float, ...]
    std: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class NoiseSpec:
    """``[noise]``: the initial noise of a diffusion / flow-matching head, an explicit input."""

    input: str
    shape: tuple[int, ...]
    dtype: Literal["float16", "float32"]
    seeding: Literal["zeros", "philox-sequence"]
    seed: int
    denoising_steps: int


@dataclass(frozen=True, slots=True)
class JointSpec:
    """One ``[[action.joints]]`` entry, in action-vector order."""

    name: str
    semantics: Literal["position", "velocity", "delta", "torque"]
    unit: str
    mean: float
    std: float
    lower: float
    upper: float
    rate_limit: float


@dataclass(frozen=True, slots=True)
class ActionSpec:
    """``[action]``: how the model output becomes an action chunk, and how it is guarded."""

    output: str
    chunk_length: int
    dim: int
    frame: str
    scale: float
    on_nonfinite: Literal["hold"]
    on_bound_violation: Literal["clamp", "hold"]
    hold_posture: Literal["hold_position", "zero_velocity"]
    joints: tuple[JointSpec, ...]


@dataclass(frozen=True, slots=True)
class TimingSpec:
    """``[timing]``: control cadence and freshness limits, in milliseconds."""

    control_period_ms: float
    max_observation_age_ms: float
    action_validity_ms: float
    e2e_deadline_ms: float


@dataclass(frozen=True, slots=True)
class DynamicAxis:
    """One dynamic axis of a tensor: ``shape[axis]`` may range over ``[min, max]``."""

    axis: int
    name: str
    min: int
    opt: int
    max: int


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One ``[[inputs]]`` / ``[[outputs]]`` entry of the model signature.

    ``shape`` is the optimal shape; ``dynamic`` opens axes within ``[min, max]``.
    """

    name: str
    dtype: TensorDtype
    layout: str
    shape: tuple[int, ...]
    dynamic: tuple[DynamicAxis, ...] = ()

    def _shape_with(self, attr: str) -> tuple[int, ...]:
        shape = list(self.shape)
        for d in self.dynamic:
            shape[d.axis] = getattr(d, attr)
        return tuple(shape)

    @property
    def min_shape(self) -> tuple[int, ...]:
        """Smallest accepted shape (dynamic axes at their ``min``)."""
        return self._shape_with("min")

    @property
    def opt_shape(self) -> tuple[int, ...]:
        """Optimal shape (dynamic axes at their ``opt``; equals ``shape``)."""
        return self._shape_with("opt")

    @property
    def max_shape(self) -> tuple[int, ...]:
        """Largest accepted shape (dynamic axes at their ``max``)."""
        return self._shape_with("max")

    def accepts(self, shape: tuple[int, ...]) -> bool:
        """Whether a concrete ``shape`` lies within this tensor's allowed shape range."""
        lo, hi = self.min_shape, self.max_shape
        return len(shape) == len(lo) and all(a <= s <= b for s, a, b in zip(shape, lo, hi))


@dataclass(frozen=True, slots=True)
class Contract:
    """A validated release contract. Build it with :func:`load_contract`.

    ``path`` and ``base_dir`` say where it was read from; they take no part in equality,
    hashing, :attr:`sha256` or :func:`diff_contracts`.
    """

    format: str
    model: ModelSpec
    cameras: tuple[CameraSpec, ...]
    language: LanguageSpec | None
    proprio: ProprioSpec | None
    noise: NoiseSpec | None
    action: ActionSpec
    timing: TimingSpec
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    path: Path | None = field(default=None, compare=False, repr=False, metadata={"internal": True})
    base_dir: Path | None = field(
        default=None, compare=False, repr=False, metadata={"internal": True}
    )

    def input(self, name: str) -> TensorSpec:
        """The ``[[inputs]]`` entry called ``name`` (KeyError if there is none)."""
        return _by_name(self.inputs, name, "input")

    def output(self, name: str) -> TensorSpec:
        """The ``[[outputs]]`` entry called ``name`` (KeyError if there is none)."""
        return _by_name(self.outputs, name, "output")

    def camera(self, name: str) -> CameraSpec:
        """The ``[[cameras]]`` entry called ``name`` (KeyError if there is none)."""
        return _by_name(self.cameras, name, "camera")

    @property
    def tokenizer_path(self) -> Path | None:
        """The tokenizer file, resolved against the contract's directory; None without language."""
        if self.language is None:
            return None
        return (self.base_dir or Path.cwd()) / self.language.file

    def to_dict(self) -> dict[str, Any]:
        """The contract as plain TOML-shaped data (without ``path`` / ``base_dir``)."""
        return _plain(self)

    def canonical_bytes(self) -> bytes:
        """Canonical JSON of :meth:`to_dict`: same contract, same bytes, whatever the TOML layout."""
        return json.dumps(
            self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False
        ).encode("utf-8")

    @property
    def sha256(self) -> str:
        """Hex sha256 of :meth:`canonical_bytes`; comments and key order do not change it."""
        return hashlib.sha256(self.canonical_bytes()).hexdigest()


def _by_name(items: tuple[Any, ...], name: str, what: str) -> Any:
    for item in items:
        if item.name == name:
            return item
    known = ", ".join(i.name for i in items) or "none"
    raise KeyError(f"no {what} named {name!r} (known: {known})")


# ---- loading --------------------------------------------------------------------------


def load_contract(path: str | Path) -> Contract:
    """Read, parse and validate the contract file at ``path``.

    Raises :class:`ContractError` listing every problem found (unreadable file, invalid
    TOML, missing or unknown keys, bad values, inconsistencies between sections).
    The tokenizer file is not opened here; :attr:`Contract.tokenizer_path` locates it.
    """
    path = Path(path)
    source = str(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ContractError(source, [f"cannot read contract: {exc.strerror or exc}"]) from exc
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ContractError(source, [f"not UTF-8 text: {exc}"]) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ContractError(source, [f"not valid TOML: {exc}"]) from exc
    return parse_contract(data, source, path=path.resolve())


def parse_contract(
    data: dict[str, Any], source: str = "<contract>", *, path: Path | None = None
) -> Contract:
    """Validate TOML-shaped ``data`` and build a :class:`Contract`.

    ``source`` names the data in error messages. ``path`` (the contract file) sets
    ``Contract.path`` and ``base_dir``, against which ``language.file`` is resolved.
    Raises :class:`ContractError` with every problem found.
    """
    problems: list[str] = []
    if not isinstance(data, dict):
        raise ContractError(source, [f"expected a table at top level, got {_kind(data)}"])
    values, complete = _parse_fields(Contract, data, "", problems)
    fmt = values.get("format")
    if fmt is not None and fmt not in SUPPORTED_FORMATS:
        problems.append(
            f"format: unsupported format {fmt!r} (this vlad reads: {', '.join(SUPPORTED_FORMATS)})"
        )
    _check_cross(values, problems)
    if problems or not complete:
        raise ContractError(source, problems)
    return Contract(
        **values, path=path, base_dir=path.parent if path is not None else None
    )


# ---- generic, type-driven parsing -----------------------------------------------------

# Sentinel for a value that failed to parse; its problem is already recorded.
_BROKEN = object()
_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return f"a {type(value).__name__}"


def _parse_fields(
    cls: type, raw: dict[str, Any], path: str, problems: list[str]
) -> tuple[dict[str, Any], bool]:
    """Convert the keys of ``raw`` to ``cls``'s fields; returns (good values, all good)."""
    hints = _hints(cls)
    values: dict[str, Any] = {}
    complete = True
    known = [f.name for f in fields(cls) if not f.metadata.get("internal")]
    for f in fields(cls):
        if f.metadata.get("internal"):
            continue
        fpath = _join(path, f.name)
        tp = hints[f.name]
        if f.name not in raw:
            if f.default is not MISSING:
                values[f.name] = f.default
            elif _optional_arg(tp) is not None:
                values[f.name] = None
            else:
                problems.append(f"{fpath}: missing")
                complete = False
            continue
        value = _convert(tp, raw[f.name], fpath, problems, f.metadata)
        if value is _BROKEN:
            complete = False
        else:
            values[f.name] = value
    for key in raw:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(known)}"
            problems.append(f"{_join(path, key)}: unknown key ({hint})")
            complete = False
    return values, complete


def _optional_arg(tp: Any) -> Any:
    """``X`` for ``X | None``, else None."""
    if typing.get_origin(tp) in (typing.Union, _UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return None


_UnionType = type(int | None)


def _convert(
    tp: Any, value: Any, path: str, problems: list[str], meta: Any = None
) -> Any:
    """Check ``value`` against type ``tp``; returns the converted value or ``_BROKEN``."""
    inner = _optional_arg(tp)
    if inner is not None:
        tp = inner
    origin = typing.get_origin(tp)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if not isinstance(value, str):
            problems.append(f"{path}: expected a string, got {_kind(value)}")
            return _BROKEN
        if value not in allowed:
            problems.append(f"{path}: unknown value {value!r} (known: {', '.join(allowed)})")
            return _BROKEN
        return value
    if origin is tuple:
        (item_tp, _ellipsis) = typing.get_args(tp)
        if not isinstance(value, list):
            problems.append(f"{path}: expected an array, got {_kind(value)}")
            return _BROKEN
        items = [_convert(item_tp, v, f"{path}[{i}]", problems) for i, v in enumerate(value)]
        return _BROKEN if any(i is _BROKEN for i in items) else tuple(items)
    if is_dataclass(tp):
        if not isinstance(value, dict):
            problems.append(f"{path}: expected a table, got {_kind(value)}")
            return _BROKEN
        values, complete = _parse_fields(tp, value, path, problems)
        if not complete:
            return _BROKEN
        obj = tp(**values)
        check = _CHECKS.get(tp)
        if check is not None:
            check(obj, path, problems)
        return obj
    if tp is str:
        if not isinstance(value, str):
            problems.append(f"{path}: expected a string, got {_kind(value)}")
            return _BROKEN
        if not value.strip() and not (meta and meta.get("allow_empty")):
            problems.append(f"{path}: must not be empty")
            return _BROKEN
        return value
    if tp is int:
        # bool is an int in Python but `true` is never a meaningful size in TOML.
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"{path}: expected an integer, got {_kind(value)}")
            return _BROKEN
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            problems.append(f"{path}: expected a number, got {_kind(value)}")
            return _BROKEN
        if not math.isfinite(value):
            problems.append(f"{path}: must be finite, got {value}")
            return _BROKEN
        return float(value)
    raise TypeError(f"contract schema uses an unsupported type {tp!r} at {path}")


# ---- per-section checks (run once a section parsed) -----------------------------------


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
        problems.append(
            f"{path}.layout: {s.layout!r} has {len(s.layout)} letters but shape has rank {rank}"
        )
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
            problems.append(
                f"{dpath}.opt: {d.opt} differs from shape[{d.axis}] = {s.shape[d.axis]}"
            )
        if d.min < 1:
            problems.append(f"{dpath}.min: must be >= 1, got {d.min}")
        if not d.min <= d.opt <= d.max:
            problems.append(
                f"{dpath}: needs min <= opt <= max, got min {d.min}, opt {d.opt}, max {d.max}"
            )


_CHECKS: dict[type, Any] = {
    RawImageSpec: _check_raw_image,
    ModelImageSpec: _check_model_image,
    CameraSpec: _check_camera,
    LanguageSpec: _check_language,
    ProprioSpec: _check_proprio,
    NoiseSpec: _check_noise,
    JointSpec: _check_joint,
    ActionSpec: _check_action,
    TimingSpec: _check_timing,
    TensorSpec: _check_tensor,
}


# ---- cross-section checks: sections vs the tensor signature ----------------------------


def _check_cross(values: dict[str, Any], problems: list[str]) -> None:
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
    for i, cam in enumerate(cameras or ()):
        consumers.append((f"cameras[{i}]", cam.input, cam))
    for key in ("language", "proprio", "noise"):
        if key not in values:
            all_known = False
        elif values[key] is not None:
            consumers.append((key, values[key].input, values[key]))
    if inputs is not None:
        index = {t.name: j for j, t in enumerate(inputs)}
        first_user: dict[str, str] = {}
        for cpath, name, section in consumers:
            if name not in index:
                known = ", ".join(t.name for t in inputs) or "none"
                problems.append(
                    f"{cpath}.input: {name!r} is not declared in [[inputs]] (declared: {known})"
                )
                continue
            if name in first_user:
                problems.append(
                    f"{cpath}.input: {name!r} is already consumed by {first_user[name]}"
                )
                continue
            first_user[name] = f"{cpath}.input"
            j = index[name]
            _check_consumed(section, cpath, inputs[j], f"inputs[{j}]", problems)
        if all_known:
            for j, t in enumerate(inputs):
                if t.name not in first_user:
                    problems.append(
                        f"inputs[{j}].name: input {t.name!r} is not consumed by any camera, "
                        "language, proprio or noise section"
                    )

    action: ActionSpec | None = values.get("action")
    if action is not None and outputs is not None:
        oindex = {t.name: j for j, t in enumerate(outputs)}
        if action.output not in oindex:
            known = ", ".join(t.name for t in outputs) or "none"
            problems.append(
                f"action.output: {action.output!r} is not declared in [[outputs]] (declared: {known})"
            )
        else:
            j = oindex[action.output]
            t = outputs[j]
            _check_wired(
                t, f"outputs[{j}]", (action.chunk_length, action.dim),
                "action (chunk_length, dim)", problems,
            )
            if t.dtype not in _FLOAT_DTYPES:
                problems.append(
                    f"outputs[{j}].dtype: {t.dtype!r} is not a float dtype (action output)"
                )

    if inputs is not None and outputs is not None:
        _check_batch(inputs, outputs, problems)


def _check_consumed(
    section: Any, cpath: str, t: TensorSpec, tpath: str, problems: list[str]
) -> None:
    """Check input tensor ``t`` against the section that feeds it."""
    if isinstance(section, CameraSpec):
        m = section.model
        if m.layout == "CHW":
            layout, tail = "NCHW", (3, m.height, m.width)
        else:
            layout, tail = "NHWC", (m.height, m.width, 3)
        what = f"{cpath}.model ({m.layout} {m.height}x{m.width}, 3 channels)"
        if t.layout != layout:
            problems.append(f"{tpath}.layout: {t.layout!r} but {what} needs {layout!r}")
        _check_wired(t, tpath, tail, what, problems)
        if t.dtype != m.dtype:
            problems.append(f"{tpath}.dtype: {t.dtype!r} differs from {cpath}.model.dtype {m.dtype!r}")
    elif isinstance(section, LanguageSpec):
        _check_wired(t, tpath, (section.max_tokens,), "language.max_tokens", problems)
        if t.dtype not in _INT_DTYPES:
            problems.append(
                f"{tpath}.dtype: {t.dtype!r} but token ids need one of {', '.join(_INT_DTYPES)}"
            )
    elif isinstance(section, ProprioSpec):
        _check_wired(t, tpath, (section.dim,), "proprio.dim", problems)
        if t.dtype not in _FLOAT_DTYPES:
            problems.append(f"{tpath}.dtype: {t.dtype!r} is not a float dtype (proprio input)")
    elif isinstance(section, NoiseSpec):
        _check_wired(t, tpath, section.shape, "noise.shape", problems)
        if t.dtype != section.dtype:
            problems.append(f"{tpath}.dtype: {t.dtype!r} differs from noise.dtype {section.dtype!r}")


def _check_wired(
    t: TensorSpec, tpath: str, tail: tuple[int, ...], what: str, problems: list[str]
) -> None:
    """``t`` must be ``[N, *tail]``, with only the batch axis N dynamic."""
    expected = "[N, " + ", ".join(str(n) for n in tail) + "]"
    if len(t.shape) != len(tail) + 1 or tuple(t.shape[1:]) != tuple(tail):
        problems.append(
            f"{tpath}.shape: {list(t.shape)} does not match {what}: expected {expected}"
        )
    for k, d in enumerate(t.dynamic):
        if d.axis != 0:
            problems.append(
                f"{tpath}.dynamic[{k}].axis: axis {d.axis} is fixed by {what}; "
                "only the batch axis 0 may be dynamic"
            )


def _batch_range(t: TensorSpec) -> tuple[int, int, int]:
    for d in t.dynamic:
        if d.axis == 0:
            return (d.min, d.opt, d.max)
    n = t.shape[0] if t.shape else 0
    return (n, n, n)


def _check_batch(
    inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...], problems: list[str]
) -> None:
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
            problems.append(
                f"{tpath}: batch axis (min, opt, max) {r} differs from {ref_path} ({ref.name}) "
                f"{ref_range}"
            )


# ---- diff -----------------------------------------------------------------------------

# Why each category matters. Breaking = the same weights would be fed or read
# differently, so the release must not pass the contract gate against the other one.
CATEGORY_REASONS: dict[str, tuple[bool, str]] = {
    "format": (True, "contract format version"),
    "structure": (True, "a section, camera, joint or tensor was added or removed"),
    "wiring": (True, "a section now feeds / reads a different model tensor"),
    "dtype": (True, "tensor or image dtype"),
    "shape": (True, "shape, resolution, dynamic range, chunk length, dim or max tokens"),
    "normalization": (True, "mean/std/scale, tokenizer file or padding: values change meaning"),
    "tokenizer": (True, "tokenizer identity or library version"),
    "preprocessing": (True, "image resize or crop method"),
    "unit": (True, "physical unit"),
    "order": (True, "order of cameras, joints or proprio entries"),
    "frame": (True, "reference frame"),
    "color_order": (True, "image color order"),
    "layout": (True, "image or tensor layout"),
    "semantics": (True, "action semantics (position/velocity/delta/torque)"),
    "noise": (True, "noise seeding rule"),
    "safety": (False, "guard setting (bounds, rate limit, fallback behaviour): review"),
    "timing": (False, "control cadence or freshness limit"),
    "info": (False, "informational"),
}

def _leaves(category: str, *names: str) -> dict[str, str]:
    return dict.fromkeys(names, category)


# Category of a changed field by its key; anything not listed is "structure" (breaking).
_LEAF_CATEGORY = {
    **_leaves("format", "format"),
    **_leaves("wiring", "input", "output"),
    **_leaves("dtype", "dtype"),
    **_leaves("shape", "shape", "height", "width", "chunk_length", "dim", "max_tokens",
              "axis", "min", "opt", "max"),
    **_leaves("normalization", "mean", "std", "scale", "sha256", "pad_id", "padding_side",
              "truncation"),
    **_leaves("tokenizer", "tokenizer", "library", "library_version"),
    **_leaves("preprocessing", "resize", "crop"),
    **_leaves("unit", "unit", "units"),
    **_leaves("order", "names"),
    **_leaves("frame", "frame"),
    **_leaves("color_order", "color_order"),
    **_leaves("layout", "layout"),
    **_leaves("semantics", "semantics"),
    **_leaves("noise", "seeding"),
    **_leaves("safety", "lower", "upper", "rate_limit", "on_nonfinite", "on_bound_violation",
              "hold_posture"),
}


@dataclass(frozen=True, slots=True)
class FieldDiff:
    """One differing field between two contracts.

    ``path`` is dotted, with table-array entries keyed by name (``cameras[overhead]``)
    or, for dynamic axes, by axis number (``inputs[tokens].dynamic[0]``). ``old`` /
    ``new`` are plain values (None where absent).
    """

    path: str
    old: Any
    new: Any
    category: str
    breaking: bool

    @property
    def reason(self) -> str:
        """A short human explanation of the category."""
        return CATEGORY_REASONS[self.category][1]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "path": self.path,
            "old": self.old,
            "new": self.new,
            "category": self.category,
            "breaking": self.breaking,
            "reason": self.reason,
        }


def diff_contracts(a: Contract, b: Contract) -> list[FieldDiff]:
    """Every field that differs from ``a`` (old) to ``b`` (new), in contract order.

    Identical contracts give an empty list. Each difference carries a category and
    whether it is breaking (see ``CATEGORY_REASONS`` and docs/contract.md).
    """
    out: list[FieldDiff] = []
    _walk(a, b, "", (), out)
    return out


def _category(parts: tuple[str, ...]) -> str:
    head, leaf = parts[0], parts[-1]
    if head == "model":
        return "info"  # id, version, family, description: identity, not I/O
    if head == "timing":
        return "timing"
    if head == "language" and leaf == "file":
        return "info"  # the content is pinned by language.sha256
    if head == "noise" and leaf in ("seed", "denoising_steps"):
        # The seed changes the sample, not the distribution; denoising steps are baked
        # into the exported graph and compared by the equivalence gate.
        return "info"
    if leaf == "name":
        return "info"  # only dynamic-axis labels reach here; tables are keyed by name
    return _LEAF_CATEGORY.get(leaf, "structure")


def _diff(path: str, parts: tuple[str, ...], old: Any, new: Any, category: str | None = None) -> FieldDiff:
    category = category or _category(parts)
    return FieldDiff(path, _plain(old), _plain(new), category, CATEGORY_REASONS[category][0])


def _walk(a: Any, b: Any, path: str, parts: tuple[str, ...], out: list[FieldDiff]) -> None:
    if a == b:
        return
    if is_dataclass(a) and type(a) is type(b):
        for f in fields(a):
            if f.compare:
                _walk(getattr(a, f.name), getattr(b, f.name), _join(path, f.name),
                      parts + (f.name,), out)
        return
    if isinstance(a, tuple) and isinstance(b, tuple) and any(is_dataclass(x) for x in a + b):
        _walk_tables(a, b, path, parts, out)
        return
    if (a is None) != (b is None):
        out.append(_diff(path, parts, a, b, "structure"))  # optional section added/removed
        return
    out.append(_diff(path, parts, a, b))


def _walk_tables(
    a: tuple[Any, ...], b: tuple[Any, ...], path: str, parts: tuple[str, ...], out: list[FieldDiff]
) -> None:
    """Match table-array entries by key so that a reorder is not read as N changes."""
    dynamic = parts[-1] == "dynamic"

    def key(x: Any) -> str:
        return str(x.axis) if dynamic else x.name

    ka, kb = [key(x) for x in a], [key(x) for x in b]
    if len(set(ka)) != len(ka) or len(set(kb)) != len(kb):
        # Duplicate keys (only in unvalidated data): fall back to comparing by index.
        ka, kb = [str(i) for i in range(len(a))], [str(i) for i in range(len(b))]
    ma, mb = dict(zip(ka, a)), dict(zip(kb, b))
    removed_or_added = "shape" if dynamic else "structure"
    for k in ka:
        if k not in mb:
            out.append(_diff(f"{path}[{k}]", parts, ma[k], None, removed_or_added))
    for k in kb:
        if k not in ma:
            out.append(_diff(f"{path}[{k}]", parts, None, mb[k], removed_or_added))
    common_a = [k for k in ka if k in mb]
    common_b = [k for k in kb if k in ma]
    if common_a != common_b and not dynamic:
        # Camera and joint order is the order of model inputs and action dims; the
        # order of [[inputs]]/[[outputs]] is not, since tensors are bound by name.
        category = "info" if parts[-1] in ("inputs", "outputs") else "order"
        out.append(FieldDiff(path, ka, kb, category, CATEGORY_REASONS[category][0]))
    for k in common_a:
        _walk(ma[k], mb[k], f"{path}[{k}]", parts, out)


def _plain(value: Any) -> Any:
    """Dataclasses to dicts and tuples to lists (TOML / JSON shaped)."""
    if is_dataclass(value):
        return {
            f.name: _plain(getattr(value, f.name)) for f in fields(value) if f.compare
        }
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value
