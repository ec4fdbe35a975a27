"""What the planner reasons about: hardware, networks and VLA architectures, from TOML.

The built-in descriptions live in ``tools/vlad_tools/planner/data`` (``hardware.toml``,
``networks.toml``, ``models/*.toml``), each figure with its source. :mod:`vlad.schema`
parses a file once, straight into the frozen dataclasses below, which keep the file's
units (TFLOP/s, GB, GB/s, a transformer's keys flat in its component's table) and give
the SI values and the :class:`Transformer` as properties; a broken file is reported with
every problem at once (:class:`PlannerError`), never with a traceback.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any, Literal, Self

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
_INTERNAL = {"internal": True}  # filled in by the loader, not read from the file


def _positive(default: Any = MISSING) -> Any:
    """A field holding a number > 0."""
    return field(default=default, metadata={"positive": True})


class PlannerError(VladError):
    """The planner cannot answer: unknown name, missing figure, impossible configuration."""


class PlannerFileError(ProblemsError, PlannerError):
    """A hardware, network or model description file has problems (all listed)."""


# ---- hardware and networks ------------------------------------------------------------
#
# Parsed as their files write them (TFLOP/s, GB, GB/s, Mbit/s); the properties give the SI
# values the model computes with. The key of an entry's table and the file's
# ``[conventions]`` are filled in by the loader.


@dataclass(frozen=True)
class HardwareConventions:
    """A hardware file's ``[conventions]``: bytes per "GB" in the file, and the on-chip
    bandwidth (GB/s) of the entries that give none."""

    bytes_per_gb: float = _positive(1e9)
    onchip_gb_s: float = _positive(math.inf)


@dataclass(frozen=True, kw_only=True)
class Hardware:
    """One accelerator: dense TFLOP/s per precision, memory in GB and GB/s ("GB" as
    ``conventions.bytes_per_gb`` bytes); in FLOP/s, bytes and bytes/s as properties.

    ``host_link_gb_s`` is None for unified memory (nothing is copied to the device).
    ``onchip_gb_s`` applies to tensors an operator keeps on chip (None: the conventions').
    """

    tflops: Mapping[str, Any]  # precision -> dense TFLOP/s (see _check_hardware)
    memory_gb: float = _positive()
    bandwidth_gb_s: float = _positive()
    name: str = ""  # the loader gives the table's key when the file does not
    kind: str = field(default="", metadata=_TEXT)
    onchip_gb_s: float | None = _positive(None)
    host_link_gb_s: float | None = _positive(None)
    source: str = field(default="", metadata=_TEXT)
    host_link_source: str = field(default="", metadata=_TEXT)  # for readers of the file
    key: str = field(default="", metadata=_INTERNAL)  # the table's key
    conventions: HardwareConventions = field(default=HardwareConventions(), metadata=_INTERNAL)

    @property
    def gb(self) -> float:
        """Bytes per "GB" in the file this came from (display in its units)."""
        return self.conventions.bytes_per_gb

    @property
    def peak_flops(self) -> dict[str, float]:
        """Dense FLOP/s per precision."""
        return {p: float(v) * 1e12 for p, v in self.tflops.items()}

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * self.gb

    @property
    def memory_bandwidth(self) -> float:
        """Device memory bandwidth, bytes/s."""
        return self.bandwidth_gb_s * self.gb

    @property
    def onchip_bandwidth(self) -> float:
        """Bandwidth of on-chip tensors, bytes/s."""
        return (self.conventions.onchip_gb_s if self.onchip_gb_s is None else self.onchip_gb_s) * self.gb

    @property
    def host_link_bandwidth(self) -> float | None:
        """Host <-> device copies, bytes/s one way; None for unified memory."""
        return None if self.host_link_gb_s is None else self.host_link_gb_s * self.gb

    def peak(self, precision: str) -> float:
        """Dense FLOP/s at ``precision`` (bf16 and fp16 stand in for each other)."""
        for p in (precision, *_ALIASES.get(precision, ())):
            if p in self.tflops:
                return float(self.tflops[p]) * 1e12
        known = ", ".join(sorted(self.tflops)) or "none"
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
class NetworkConventions:
    """A network file's ``[conventions]``: what travels, and the protocol's overhead."""

    protocol_overhead: float = _positive(1.05)
    jpeg_ratio: float = _positive(0.1)
    action_bytes_per_value: int = _positive(4)


@dataclass(frozen=True, kw_only=True)
class Network:
    """One network link: effective Mbit/s each way and one-way base latency."""

    latency_ms: float = field(metadata=_AT_LEAST_0)
    upload_mbps: float = _positive()
    download_mbps: float = _positive()
    name: str = ""  # the loader gives the table's key when the file does not
    source: str = field(default="", metadata=_TEXT)
    key: str = field(default="", metadata=_INTERNAL)  # the table's key
    conventions: NetworkConventions = field(default=NetworkConventions(), metadata=_INTERNAL)

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


# The keys of a transformer stack every component that has one needs, and all of them.
_STACK_NEEDS = ("layers", "hidden", "ffn", "heads", "kv_heads")
_STACK_KEYS = (*_STACK_NEEDS, "head_dim", "gated_ffn")


@dataclass(frozen=True, kw_only=True)
class _Stacked:
    """A component whose table may hold a transformer stack's keys, written flat (None:
    not given; which kinds need them is checked by :func:`_kind_problems`)."""

    layers: int | None = _positive(None)
    hidden: int | None = _positive(None)
    ffn: int | None = _positive(None)
    heads: int | None = _positive(None)
    kv_heads: int | None = _positive(None)
    head_dim: int | None = _positive(None)  # default: hidden / heads
    gated_ffn: bool = False

    @property
    def transformer(self) -> Transformer | None:
        """The stack its keys describe; None for a component without one."""
        if self.layers is None or self.hidden is None or self.ffn is None or self.heads is None:
            return None
        if self.kv_heads is None:
            return None
        head_dim = self.hidden // self.heads if self.head_dim is None else self.head_dim
        return Transformer(self.layers, self.hidden, self.ffn, self.heads, self.kv_heads, head_dim, self.gated_ffn)

    def with_transformer(self, t: Transformer | None) -> Self:
        """A copy whose stack is ``t`` (None: no stack)."""
        if t is None:
            return dataclasses.replace(self, **dict.fromkeys(_STACK_KEYS[:-1]), gated_ffn=False)
        return dataclasses.replace(self, **{k: getattr(t, k) for k in _STACK_KEYS})


@dataclass(frozen=True)
class ConvLayer:
    """One 2-D convolution of a convolutional image encoder."""

    out_channels: int = _positive()
    kernel: int = _positive()
    stride: int = _positive(1)
    padding: int = field(default=0, metadata=_AT_LEAST_0)


@dataclass(frozen=True, kw_only=True)
class Vision(_Stacked):
    """The image encoder, run once per camera: a ViT (its stack's keys) or convolutions."""

    kind: Literal["vit", "conv"]
    cameras: int = _positive()
    image_height: int = _positive()
    image_width: int = _positive()
    tokens_per_image: int = _positive()
    in_channels: int = _positive(3)  # conv
    conv: tuple[ConvLayer, ...] = ()  # conv


@dataclass(frozen=True, kw_only=True)
class Backbone(_Stacked):
    """The VLM / trunk that prefills image, language and state tokens."""

    language_tokens: int = field(default=0, metadata=_AT_LEAST_0)
    state_tokens: int = field(default=0, metadata=_AT_LEAST_0)
    vocab: int = field(default=0, metadata=_AT_LEAST_0)

    @property
    def transformer(self) -> Transformer:
        t = super().transformer
        assert t is not None  # a backbone's table needs its stack's keys (parse_model)
        return t


@dataclass(frozen=True, kw_only=True)
class ActionHead(_Stacked):
    """The action head: a flow/diffusion expert (its stack's keys) run ``steps`` times over
    the whole chunk, or autoregressive decoding of ``tokens`` action tokens by the backbone."""

    kind: Literal["flow", "autoregressive"]
    chunk: int = _positive()
    dof: int = _positive()
    steps: int = _positive(1)  # flow
    context: Literal["kv_cache", "cross_attention"] = "kv_cache"  # flow
    qkv_passes: int = _positive(1)  # flow
    tokens: int = field(default=0, metadata=_AT_LEAST_0)  # autoregressive: tokens per chunk (0: dof * chunk)
    vocab: int = field(default=0, metadata=_AT_LEAST_0)  # autoregressive: size of the action-token classifier

    @property
    def decode_tokens(self) -> int:
        """Action tokens an autoregressive head generates per inference."""
        return self.tokens or self.dof * self.chunk


# What schema cannot tell by type in [vision], [backbone] and [action]: by the table's
# kind, (the keys it needs, the keys of its kind); a key another kind takes is refused.
_KIND_KEYS: dict[str, dict[str | None, tuple[tuple[str, ...], tuple[str, ...]]]] = {
    "vision": {"vit": (_STACK_NEEDS, _STACK_KEYS), "conv": ((), ("in_channels", "conv"))},
    "backbone": {None: (_STACK_NEEDS, _STACK_KEYS)},
    "action": {
        "flow": ((*_STACK_NEEDS, "steps"), (*_STACK_KEYS, "steps", "context", "qkv_passes")),
        "autoregressive": ((), ("tokens", "vocab")),
    },
}
_COMPONENTS = ("vision", "backbone", "action")


@dataclass(frozen=True, kw_only=True)
class _About:
    """A model file's ``[model]`` table: what the model is, apart from its components."""

    name: str
    precision: str = "bf16"  # a key of BYTES_PER_ELEMENT
    batch: int = _positive(1)
    ids: tuple[str, ...] = ()  # contract model.id values it describes
    description: str = field(default="", metadata=_TEXT)
    source: str = field(default="", metadata=_TEXT)


@dataclass(frozen=True, kw_only=True)
class VLAModel(_About):
    """A VLA as the planner sees it. ``ids`` are contract ``model.id`` values it describes."""

    vision: Vision
    backbone: Backbone
    action: ActionHead
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

        backbone = self.backbone.with_transformer(scale(self.backbone.transformer))
        action = self.action.with_transformer(scale(self.action.transformer))
        return dataclasses.replace(self, name=f"{self.name} x{factor:g}", backbone=backbone, action=action)


# ---- loading --------------------------------------------------------------------------


@dataclass(frozen=True)
class _ModelFile:
    """A model file (``data/models/*.toml``): its tables."""

    model: _About
    vision: Vision
    backbone: Backbone
    action: ActionHead
    measure: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # component -> module scopes


def _kind_problems(table: Any, section: str, problems: list[str]) -> None:
    """The keys of ``[section]`` its kind needs and the keys it refuses (see _KIND_KEYS);
    nothing when it is not a table or its kind is missing or unknown (schema reports that)."""
    kinds = _KIND_KEYS[section]
    if not isinstance(table, dict):
        return
    kind = table.get("kind") if None not in kinds else None
    if not isinstance(kind, str | None) or kind not in kinds:
        return
    needs, takes = kinds[kind]
    others = {k for _, keys in kinds.values() for k in keys} - set(takes)
    problems += [f"{section}.{k}: missing" for k in needs if k not in table]
    problems += [
        f"{section}.{k}: unknown key for kind = {kind!r} (it takes: {', '.join(takes)})" for k in table if k in others
    ]


def _check_stack(s: _Stacked, path: str, problems: list[str]) -> None:
    if s.heads is not None and s.kv_heads is not None and s.heads % s.kv_heads:
        problems.append(f"{path}: heads ({s.heads}) must be a multiple of kv_heads ({s.kv_heads})")


def _check_vision(v: Vision, path: str, problems: list[str]) -> None:
    _check_stack(v, path, problems)
    if v.kind == "conv" and not v.conv:
        problems.append(f"{path}.conv: a conv encoder needs at least one [[{path}.conv]] layer")


def _check_about(m: _About, path: str, problems: list[str]) -> None:
    if m.precision not in BYTES_PER_ELEMENT:
        problems.append(f"{path}.precision: unknown precision {m.precision!r} (known: {', '.join(BYTES_PER_ELEMENT)})")


def _check_model_file(f: _ModelFile, path: str, problems: list[str]) -> None:
    for key in f.measure:
        if key not in _COMPONENTS:
            problems.append(f"measure.{key}: unknown key (known: {', '.join(_COMPONENTS)})")


def _check_hardware(h: Hardware, path: str, problems: list[str]) -> None:
    if not h.tflops:
        problems.append(f"{path}.tflops: no compute peak given")
    for precision, value in h.tflops.items():
        where = f"{path}.tflops.{precision}"
        if precision not in BYTES_PER_ELEMENT:
            problems.append(f"{where}: unknown precision (known: {', '.join(BYTES_PER_ELEMENT)})")
        elif isinstance(peak := schema.convert(float, value, where, problems), float) and peak <= 0:
            problems.append(f"{where}: must be > 0, got {value}")


_CHECKS: dict[type, schema.Check] = {
    Vision: _check_vision,
    Backbone: _check_stack,
    ActionHead: _check_stack,
    _About: _check_about,
    _ModelFile: _check_model_file,
    Hardware: _check_hardware,
}


def _convert(cls: type, raw: Any, path: str, problems: list[str]) -> Any:
    """``raw`` as ``cls`` by the schema; None if broken."""
    value = schema.convert(cls, raw, path, problems, checks=_CHECKS)
    return value if isinstance(value, cls) else None


def _read_toml(path: Path) -> dict[str, Any]:
    return load_toml_or_raise(path, lambda problem: PlannerError(f"{path}: {problem}"))


def load_hardware_file(path: str | Path = DATA / "hardware.toml") -> dict[str, Hardware]:
    """Every hardware entry of a file, by key."""
    conventions, entries = _load_entries(Path(path), HardwareConventions, Hardware)
    return {
        key: dataclasses.replace(entry, key=key, name=entry.name or key, conventions=conventions)
        for key, entry in entries.items()
    }


def load_network_file(path: str | Path = DATA / "networks.toml") -> dict[str, Network]:
    """Every network entry of a file, by key."""
    conventions, entries = _load_entries(Path(path), NetworkConventions, Network)
    return {
        key: dataclasses.replace(entry, key=key, name=entry.name or key, conventions=conventions)
        for key, entry in entries.items()
    }


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
    for section in _COMPONENTS:
        _kind_problems(doc.get(section), section, problems)
    top = _convert(_ModelFile, doc, "", problems)
    if problems:
        raise PlannerFileError(source, problems)
    about = {f.name: getattr(top.model, f.name) for f in dataclasses.fields(_About)}
    return VLAModel(
        **about,
        vision=top.vision,
        backbone=top.backbone,
        action=top.action,
        measure_scopes={k: tuple(top.measure.get(k, ())) for k in _COMPONENTS},
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
