"""The typed release contract: frozen dataclasses whose attribute names are the TOML keys.

Build one with :func:`vlad.contract.load_contract`; the format is ``vlad.contract/1``
(docs/contract.md). Parsing and validation live in :mod:`vlad.contract.load` and
:mod:`vlad.contract.checks`, comparison in :mod:`vlad.contract.diff`.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal

CONTRACT_FORMAT = "vlad.contract/1"
SUPPORTED_FORMATS = (CONTRACT_FORMAT,)

# A closed set on purpose: a unit the daemon does not know cannot be converted or
# bounded, and a typo ("rads") must not silently pass as a new unit.
KNOWN_UNITS = (
    "rad",
    "deg",
    "m",
    "mm",
    "rad/s",
    "deg/s",
    "m/s",
    "mm/s",
    "rad/s^2",
    "deg/s^2",
    "m/s^2",
    "N",
    "N*m",
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
TensorDtype = Literal["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
_INT_DTYPES = ("int32", "int64")
_FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")


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
class HistorySpec:
    """``[history]``: the policy sees the last ``frames`` accepted observations, oldest first.

    Camera and proprio inputs then carry a time axis after the batch axis (``NTCHW``,
    ``NTHWC``, ``NTD``). The window restarts (every slot holds the newest frame) at the first
    observation, after a gap longer than ``timing.max_observation_age_ms``, when time runs
    backwards and when another controller's observations arrive
    (:class:`vlad.processing.Preprocessor`).
    """

    frames: int


@dataclass(frozen=True, slots=True)
class RtcSpec:
    """``[rtc]``: real-time chunking inside the model graph (docs/contract.md, "Real-time chunking").

    Besides the observation the graph takes the waypoints the new chunk is to continue
    (``actions_input``, ``[N, chunk_length, dim]``, normalized like the action output) and a
    weight per waypoint in [0, 1] (``weights_input``, ``[N, chunk_length]``): 1 reproduces the
    given waypoint, 0 leaves the policy free, all zeros compute the plain chunk. ``method``
    says how the graph uses them: ``inpaint``, the gradient-free variant (every denoising
    step is pulled onto the straight path towards the given waypoints by their weights).
    """

    method: Literal["inpaint"]
    actions_input: str
    weights_input: str


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
        return len(shape) == len(lo) and all(a <= s <= b for s, a, b in zip(shape, lo, hi, strict=True))


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
    # Left out of to_dict() / canonical_bytes() when absent: a contract without [history]
    # keeps the sha256 it had before the section existed (signed manifests pin it).
    history: HistorySpec | None = field(metadata={"omit_if_none": True})
    rtc: RtcSpec | None = field(metadata={"omit_if_none": True})  # the same: absent, not null
    action: ActionSpec
    timing: TimingSpec
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    path: Path | None = field(default=None, compare=False, repr=False, metadata={"internal": True})
    base_dir: Path | None = field(default=None, compare=False, repr=False, metadata={"internal": True})

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
    def frames(self) -> int:
        """Observations per model input: ``history.frames``, 1 without ``[history]``."""
        return self.history.frames if self.history is not None else 1

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
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")

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


def _plain(value: Any) -> Any:
    """Dataclasses to dicts and tuples to lists (TOML / JSON shaped)."""
    if is_dataclass(value):
        return {
            f.name: _plain(getattr(value, f.name))
            for f in fields(value)
            if f.compare and not (f.metadata.get("omit_if_none") and getattr(value, f.name) is None)
        }
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value
