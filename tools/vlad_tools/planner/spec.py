"""What the planner reasons about: hardware, networks and VLA architectures, from TOML.

The built-in descriptions live in ``tools/vlad_tools/planner/data`` (``hardware.toml``,
``networks.toml``, ``models/*.toml``), each figure with its source. Files are parsed once
into frozen dataclasses; a broken file is reported with every problem at once
(:class:`PlannerError`), never with a traceback.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any, Literal

from vlad import schema
from vlad.errors import ProblemsError, VladError
from vlad.files import load_toml_or_raise

DATA = Path(__file__).resolve().parent / "data"

# Bytes per element (source A: bf16 2, fp8 1, fp4 0.5).
BYTES_PER_ELEMENT = {
    "fp32": 4.0,
    "tf32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "fp4": 0.5,
    "int4": 0.5,
}
# A precision missing from a hardware table may use another of the same width and kind.
_ALIASES = {"bf16": ("fp16",), "fp16": ("bf16",), "tf32": ("fp32",), "fp32": ("tf32",)}
# Field metadata of the files' numbers: counts >= 0, and sizes and rates > 0.
_AT_LEAST_0 = schema.bounded(0)
_TEXT = {"allow_empty": True}


def _positive(default: Any = MISSING) -> Any:
    """A field holding a number > 0."""
    return field(default=default, metadata={"positive": True})


class PlannerError(VladError):
    """The planner cannot answer: unknown name, missing figure, impossible configuration."""


class PlannerFileError(ProblemsError, PlannerError):
    """A hardware, network or model description file has problems (all listed)."""


# ---- hardware and networks ------------------------------------------------------------


@dataclass(frozen=True)
class Hardware:
    """One accelerator: dense peaks per precision (FLOP/s), memory in bytes and bytes/s.

    ``host_link_bandwidth`` is None for unified memory (nothing is copied to the device).
    ``onchip_bandwidth`` applies to tensors an operator keeps on chip.
    """

    key: str
    name: str
    peak_flops: Mapping[str, float]
    memory_bandwidth: float
    memory_bytes: float
    onchip_bandwidth: float = math.inf
    host_link_bandwidth: float | None = None
    kind: str = ""
    source: str = ""
    gb: float = 1e9  # bytes per "GB" in the file it came from (display only)

    def peak(self, precision: str) -> float:
        """Dense FLOP/s at ``precision`` (bf16 and fp16 stand in for each other)."""
        for p in (precision, *_ALIASES.get(precision, ())):
            if p in self.peak_flops:
                return self.peak_flops[p]
        known = ", ".join(sorted(self.peak_flops)) or "none"
        raise PlannerError(f"hardware {self.key!r} has no {precision} peak (it lists: {known})")

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary in TFLOP/s, GB/s and GB, GB as its file reads them (``gb``)."""
        return {
            "key": self.key, "name": self.name, "kind": self.kind,
            "tflops": {k: v / 1e12 for k, v in self.peak_flops.items()},
            "bandwidth_gb_s": self.memory_bandwidth / self.gb, "memory_gb": self.memory_bytes / self.gb,
            "host_link_gb_s": None if self.host_link_bandwidth is None else self.host_link_bandwidth / self.gb,
            "bytes_per_gb": self.gb, "source": self.source,
        }  # fmt: skip


@dataclass(frozen=True)
class Network:
    """One network link: effective Mbit/s each way and one-way base latency."""

    key: str
    name: str
    upload_mbps: float
    download_mbps: float
    latency_ms: float
    source: str = ""
    protocol_overhead: float = 1.05
    jpeg_ratio: float = 0.1
    action_bytes_per_value: int = 4

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary."""
        return {
            "key": self.key,
            "name": self.name,
            "upload_mbps": self.upload_mbps,
            "download_mbps": self.download_mbps,
            "latency_ms": self.latency_ms,
            "source": self.source,
        }


# ---- architectures --------------------------------------------------------------------


@dataclass(frozen=True)
class Transformer:
    """A stack of identical transformer blocks."""

    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    gated_ffn: bool = False

    @property
    def params(self) -> int:
        """Weights of the stack: Q/K/V, output projection, FFN, two norms per block."""
        d, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        ffn = (3 if self.gated_ffn else 2) * d * self.ffn
        return self.layers * (d * (q + 2 * kv) + q * d + ffn + 4 * d)

    def kv_cache_elements(self, tokens: int) -> int:
        """K and V of ``tokens`` positions in every layer."""
        return self.layers * 2 * tokens * self.kv_heads * self.head_dim


@dataclass(frozen=True)
class ConvLayer:
    """One 2-D convolution of a convolutional image encoder."""

    out_channels: int = _positive()
    kernel: int = _positive()
    stride: int = _positive(1)
    padding: int = field(default=0, metadata=_AT_LEAST_0)


@dataclass(frozen=True)
class Vision:
    """The image encoder, run once per camera: a ViT (``transformer``) or convolutions."""

    kind: str  # "vit" | "conv"
    cameras: int
    image_height: int
    image_width: int
    tokens_per_image: int
    transformer: Transformer | None = None
    in_channels: int = 3
    conv: tuple[ConvLayer, ...] = ()


@dataclass(frozen=True)
class Backbone:
    """The VLM / trunk that prefills image, language and state tokens."""

    transformer: Transformer
    language_tokens: int
    state_tokens: int = 0
    vocab: int = 0


@dataclass(frozen=True)
class ActionHead:
    """The action head: a flow/diffusion expert run ``steps`` times over the whole chunk,
    or autoregressive decoding of ``tokens`` action tokens by the backbone."""

    kind: str  # "flow" | "autoregressive"
    chunk: int
    dof: int
    steps: int = 1
    transformer: Transformer | None = None  # None: the backbone decodes (autoregressive)
    context: str = "kv_cache"  # "kv_cache" | "cross_attention"
    qkv_passes: int = 1
    tokens: int = 0  # autoregressive: action tokens per chunk (0: dof * chunk)
    vocab: int = 0  # autoregressive: size of the action-token classifier

    @property
    def decode_tokens(self) -> int:
        """Action tokens an autoregressive head generates per inference."""
        return self.tokens or self.dof * self.chunk


@dataclass(frozen=True)
class VLAModel:
    """A VLA as the planner sees it. ``ids`` are contract ``model.id`` values it describes."""

    name: str
    vision: Vision
    backbone: Backbone
    action: ActionHead
    precision: str = "bf16"
    batch: int = 1
    ids: tuple[str, ...] = ()
    description: str = ""
    source: str = ""
    measure_scopes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    path: Path | None = field(default=None, compare=False)

    @property
    def prefix_tokens(self) -> int:
        """Tokens the backbone prefills: images, language, state."""
        v, b = self.vision, self.backbone
        return v.cameras * v.tokens_per_image + b.language_tokens + b.state_tokens

    def with_overrides(self, **changes: Any) -> VLAModel:
        """A copy with ``steps``, ``chunk``, ``dof``, ``cameras``, ``language_tokens``,
        ``precision`` or ``batch`` replaced (None values are ignored)."""
        changes = {k: v for k, v in changes.items() if v is not None}
        action = dataclasses.replace(
            self.action, **{k: changes.pop(k) for k in ("steps", "chunk", "dof") if k in changes}
        )
        vision = dataclasses.replace(self.vision, **{k: changes.pop(k) for k in ("cameras",) if k in changes})
        backbone = dataclasses.replace(
            self.backbone, **{k: changes.pop(k) for k in ("language_tokens",) if k in changes}
        )
        unknown = set(changes) - {"precision", "batch", "name"}
        if unknown:
            raise PlannerError(f"cannot override {', '.join(sorted(unknown))} of a model")
        if "precision" in changes and changes["precision"] not in BYTES_PER_ELEMENT:
            raise PlannerError(f"unknown precision {changes['precision']!r} (known: {', '.join(BYTES_PER_ELEMENT)})")
        return dataclasses.replace(self, vision=vision, backbone=backbone, action=action, **changes)

    def scaled(self, factor: float) -> VLAModel:
        """Backbone and action expert widened by ``factor`` (hidden, FFN, heads), for
        "latency vs model size" sweeps; the vision encoder is kept."""

        def scale(t: Transformer | None) -> Transformer | None:
            if t is None:
                return None
            heads = max(1, round(t.heads * factor))
            kv = max(1, min(heads, round(t.kv_heads * factor)))
            while heads % kv:
                kv -= 1
            return dataclasses.replace(
                t, hidden=max(1, round(t.hidden * factor)), ffn=max(1, round(t.ffn * factor)), heads=heads, kv_heads=kv
            )

        backbone_t = scale(self.backbone.transformer)
        assert backbone_t is not None  # Backbone.transformer is required, and scale keeps it
        backbone = dataclasses.replace(self.backbone, transformer=backbone_t)
        action = dataclasses.replace(self.action, transformer=scale(self.action.transformer))
        return dataclasses.replace(self, name=f"{self.name} x{factor:g}", backbone=backbone, action=action)


# ---- loading --------------------------------------------------------------------------


@dataclass(frozen=True)
class _HardwareConventions:
    bytes_per_gb: float = _positive(1e9)
    onchip_gb_s: float = _positive(math.inf)


@dataclass(frozen=True)
class _HardwareEntry:
    """One table of a hardware file, in its units (TFLOP/s, GB, GB/s)."""

    tflops: Mapping[str, Any]  # precision -> dense TFLOP/s (see _check_hardware)
    memory_gb: float = _positive()
    bandwidth_gb_s: float = _positive()
    name: str = ""  # default: the table's key
    kind: str = field(default="", metadata=_TEXT)
    onchip_gb_s: float | None = _positive(None)  # default: the conventions'
    host_link_gb_s: float | None = _positive(None)  # None: unified memory
    source: str = field(default="", metadata=_TEXT)
    host_link_source: str = field(default="", metadata=_TEXT)  # for readers of the file

    def hardware(self, key: str, conventions: _HardwareConventions) -> Hardware:
        gb = conventions.bytes_per_gb
        onchip = conventions.onchip_gb_s if self.onchip_gb_s is None else self.onchip_gb_s
        return Hardware(
            key=key, name=self.name or key, kind=self.kind,
            peak_flops={p: float(v) * 1e12 for p, v in self.tflops.items()},
            memory_bytes=self.memory_gb * gb, memory_bandwidth=self.bandwidth_gb_s * gb, onchip_bandwidth=onchip * gb,
            host_link_bandwidth=None if self.host_link_gb_s is None else self.host_link_gb_s * gb,
            source=self.source, gb=float(gb),
        )  # fmt: skip


@dataclass(frozen=True)
class _NetworkConventions:
    protocol_overhead: float = _positive(1.05)
    jpeg_ratio: float = _positive(0.1)
    action_bytes_per_value: int = _positive(4)


@dataclass(frozen=True)
class _NetworkEntry:
    """One table of a network file."""

    latency_ms: float = field(metadata=_AT_LEAST_0)
    upload_mbps: float = _positive()
    download_mbps: float = _positive()
    name: str = ""  # default: the table's key
    source: str = field(default="", metadata=_TEXT)

    def network(self, key: str, conventions: _NetworkConventions) -> Network:
        return Network(
            key, self.name or key, self.upload_mbps, self.download_mbps, self.latency_ms, self.source,
            **dataclasses.asdict(conventions),
        )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class _StackKeys:
    """A transformer stack, its keys written flat in its component's table."""

    layers: int = _positive()
    hidden: int = _positive()
    ffn: int = _positive()
    heads: int = _positive()
    kv_heads: int = _positive()
    head_dim: int | None = _positive(None)  # default: hidden / heads
    gated_ffn: bool = False

    def stack(self) -> Transformer:
        head_dim = self.hidden // self.heads if self.head_dim is None else self.head_dim
        return Transformer(self.layers, self.hidden, self.ffn, self.heads, self.kv_heads, head_dim, self.gated_ffn)


@dataclass(frozen=True, kw_only=True)
class _ImageKeys:
    """The ``[vision]`` keys of every kind of encoder."""

    kind: Literal["vit", "conv"]
    cameras: int = _positive()
    image_height: int = _positive()
    image_width: int = _positive()
    tokens_per_image: int = _positive()

    def image(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("kind", "cameras", "image_height", "image_width", "tokens_per_image")}


@dataclass(frozen=True, kw_only=True)
class _VitKeys(_StackKeys, _ImageKeys):
    def vision(self) -> Vision:
        return Vision(**self.image(), transformer=self.stack())


@dataclass(frozen=True, kw_only=True)
class _ConvKeys(_ImageKeys):
    in_channels: int = _positive(3)
    conv: tuple[ConvLayer, ...] = ()

    def vision(self) -> Vision:
        return Vision(**self.image(), in_channels=self.in_channels, conv=self.conv)


@dataclass(frozen=True, kw_only=True)
class _BackboneKeys(_StackKeys):
    language_tokens: int = field(default=0, metadata=_AT_LEAST_0)
    state_tokens: int = field(default=0, metadata=_AT_LEAST_0)
    vocab: int = field(default=0, metadata=_AT_LEAST_0)

    def backbone(self) -> Backbone:
        return Backbone(self.stack(), self.language_tokens, self.state_tokens, self.vocab)


@dataclass(frozen=True, kw_only=True)
class _HeadKeys:
    """The ``[action]`` keys of every kind of head."""

    kind: Literal["flow", "autoregressive"]
    chunk: int = _positive()
    dof: int = _positive()


@dataclass(frozen=True, kw_only=True)
class _FlowKeys(_StackKeys, _HeadKeys):
    steps: int = _positive()
    context: Literal["kv_cache", "cross_attention"] = "kv_cache"
    qkv_passes: int = _positive(1)

    def head(self) -> ActionHead:
        return ActionHead(
            self.kind, self.chunk, self.dof, self.steps, self.stack(), context=self.context, qkv_passes=self.qkv_passes
        )


@dataclass(frozen=True, kw_only=True)
class _AutoregressiveKeys(_HeadKeys):
    tokens: int = field(default=0, metadata=_AT_LEAST_0)
    vocab: int = field(default=0, metadata=_AT_LEAST_0)

    def head(self) -> ActionHead:
        return ActionHead(self.kind, self.chunk, self.dof, tokens=self.tokens, vocab=self.vocab)


# The keys of [vision] and [action] by their kind; the first stands in for a kind that is
# not given or not known (that problem is reported with the ones of its keys).
_VISION_KINDS: dict[str, type] = {"vit": _VitKeys, "conv": _ConvKeys}
_ACTION_KINDS: dict[str, type] = {"autoregressive": _AutoregressiveKeys, "flow": _FlowKeys}


@dataclass(frozen=True)
class _ModelKeys:
    name: str
    precision: str = "bf16"  # a key of BYTES_PER_ELEMENT
    batch: int = _positive(1)
    ids: tuple[str, ...] = ()
    description: str = field(default="", metadata=_TEXT)
    source: str = field(default="", metadata=_TEXT)


@dataclass(frozen=True)
class _MeasureKeys:
    vision: tuple[str, ...] = ()
    backbone: tuple[str, ...] = ()
    action: tuple[str, ...] = ()


@dataclass(frozen=True)
class _ModelFile:
    """A model file (``data/models/*.toml``)."""

    model: _ModelKeys
    vision: Mapping[str, Any]  # read by its kind (_VISION_KINDS)
    backbone: _BackboneKeys
    action: Mapping[str, Any]  # read by its kind (_ACTION_KINDS)
    measure: _MeasureKeys = _MeasureKeys()


def _check_stack(s: _StackKeys, path: str, problems: list[str]) -> None:
    if s.heads > 0 and s.kv_heads > 0 and s.heads % s.kv_heads:
        problems.append(f"{path}: heads ({s.heads}) must be a multiple of kv_heads ({s.kv_heads})")


def _check_conv(v: _ConvKeys, path: str, problems: list[str]) -> None:
    if not v.conv:
        problems.append(f"{path}.conv: a conv encoder needs at least one [[{path}.conv]] layer")


def _check_model(m: _ModelKeys, path: str, problems: list[str]) -> None:
    if m.precision not in BYTES_PER_ELEMENT:
        problems.append(f"{path}.precision: unknown precision {m.precision!r} (known: {', '.join(BYTES_PER_ELEMENT)})")


def _check_hardware(h: _HardwareEntry, path: str, problems: list[str]) -> None:
    if not h.tflops:
        problems.append(f"{path}.tflops: no compute peak given")
    for precision, value in h.tflops.items():
        where = f"{path}.tflops.{precision}"
        if precision not in BYTES_PER_ELEMENT:
            problems.append(f"{where}: unknown precision (known: {', '.join(BYTES_PER_ELEMENT)})")
        elif isinstance(peak := schema.convert(float, value, where, problems), float) and peak <= 0:
            problems.append(f"{where}: must be > 0, got {value}")


_CHECKS: dict[type, schema.Check] = {
    _VitKeys: _check_stack,
    _BackboneKeys: _check_stack,
    _FlowKeys: _check_stack,
    _ConvKeys: _check_conv,
    _ModelKeys: _check_model,
    _HardwareEntry: _check_hardware,
}


def _convert(cls: type, raw: Any, path: str, problems: list[str]) -> Any:
    """``raw`` as ``cls`` by the schema; None if broken."""
    value = schema.convert(cls, raw, path, problems, checks=_CHECKS)
    return value if isinstance(value, cls) else None


def _by_kind(kinds: Mapping[str, type], raw: Any, path: str, problems: list[str]) -> Any:
    """A ``[vision]`` or ``[action]`` table read as its ``kind`` says (None if broken or
    not a table: the file's schema reports that)."""
    if not isinstance(raw, dict):
        return None
    kind, fallback = raw.get("kind"), next(iter(kinds.values()))
    return _convert(kinds.get(kind, fallback) if isinstance(kind, str) else fallback, raw, path, problems)


def _read_toml(path: Path) -> dict[str, Any]:
    return load_toml_or_raise(path, lambda problem: PlannerError(f"{path}: {problem}"))


def load_hardware_file(path: str | Path = DATA / "hardware.toml") -> dict[str, Hardware]:
    """Every hardware entry of a file, by key."""
    conventions, entries = _load_entries(Path(path), _HardwareConventions, _HardwareEntry)
    return {key: entry.hardware(key, conventions) for key, entry in entries.items()}


def load_network_file(path: str | Path = DATA / "networks.toml") -> dict[str, Network]:
    """Every network entry of a file, by key."""
    conventions, entries = _load_entries(Path(path), _NetworkConventions, _NetworkEntry)
    return {key: entry.network(key, conventions) for key, entry in entries.items()}


def _load_entries(path: Path, conventions_cls: type, entry_cls: type) -> tuple[Any, dict[str, Any]]:
    """A file of ``[conventions]`` and one table per entry, parsed (every problem at once)."""
    doc = _read_toml(path)
    problems: list[str] = []
    conventions = _convert(conventions_cls, doc.get("conventions", {}), "conventions", problems)
    entries = {k: _convert(entry_cls, table, k, problems) for k, table in doc.items() if k != "conventions"}
    if problems:
        raise PlannerFileError(str(path), problems)
    return conventions, entries


def parse_model(doc: Mapping[str, Any], source: str, path: Path | None = None) -> VLAModel:
    """A :class:`VLAModel` from a parsed model file (see ``data/models/*.toml``)."""
    problems: list[str] = []
    doc = dict(doc)
    top = _convert(_ModelFile, doc, "", problems)
    vision = _by_kind(_VISION_KINDS, doc.get("vision"), "vision", problems)
    action = _by_kind(_ACTION_KINDS, doc.get("action"), "action", problems)
    if problems:
        raise PlannerFileError(source, problems)
    m = top.model
    return VLAModel(
        name=m.name,
        vision=vision.vision(),
        backbone=top.backbone.backbone(),
        action=action.head(),
        precision=m.precision,
        batch=m.batch,
        ids=m.ids,
        description=m.description,
        source=m.source,
        measure_scopes=dataclasses.asdict(top.measure),
        path=path,
    )


def builtin_models() -> dict[str, Path]:
    """Built-in model files by name (file stem)."""
    return {p.stem: p for p in sorted((DATA / "models").glob("*.toml"))}


def load_model(ref: str | Path | VLAModel) -> VLAModel:
    """A model from a file path, a built-in name (``pi0``, ``vlad-demo``) or a contract
    ``model.id`` that a built-in file lists under ``ids``."""
    if isinstance(ref, VLAModel):
        return ref
    path = Path(ref)
    if path.suffix == ".toml" or path.exists():
        return parse_model(_read_toml(path), str(path), path.resolve())
    builtin = builtin_models()
    if str(ref) in builtin:
        return load_model(builtin[str(ref)])
    for p in builtin.values():
        model = load_model(p)
        if str(ref) in model.ids:
            return model
    raise PlannerError(f"unknown model {str(ref)!r}: give a model file or one of {', '.join(builtin)}")


def _lookup(kind: str, table: Mapping[str, Any], ref: str) -> Any:
    key = ref.lower().replace("_", "-").replace(" ", "-")
    if key in table:
        return table[key]
    for value in table.values():
        if value.name.lower() == ref.lower():
            return value
    raise PlannerError(f"unknown {kind} {ref!r}; known: {', '.join(table)}")


def load_hardware(ref: str | Hardware, path: str | Path | None = None) -> Hardware:
    """Hardware by key or name from ``path`` (default: the built-in table)."""
    if isinstance(ref, Hardware):
        return ref
    return _lookup("hardware", load_hardware_file(path or DATA / "hardware.toml"), ref)


def load_network(ref: str | Network, path: str | Path | None = None) -> Network:
    """A network by key or name from ``path`` (default: the built-in table)."""
    if isinstance(ref, Network):
        return ref
    return _lookup("network", load_network_file(path or DATA / "networks.toml"), ref)
