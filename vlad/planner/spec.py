"""What the planner reasons about: hardware, networks and VLA architectures, from TOML.

The built-in descriptions live in ``vlad/planner/data`` (``hardware.toml``,
``networks.toml``, ``models/*.toml``), each figure with its source. Files are parsed once
into frozen dataclasses; a broken file is reported with every problem at once
(:class:`PlannerError`), never with a traceback.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlad.errors import ProblemsError, VladError

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

    out_channels: int
    kernel: int
    stride: int = 1
    padding: int = 0


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


class _Fields:
    """Typed reads from one TOML table that record problems instead of raising."""

    def __init__(self, table: Any, where: str, problems: list[str]) -> None:
        self.where, self.problems = where, problems
        if not isinstance(table, Mapping):
            problems.append(f"{where}: must be a table")
            table = {}
        self.table = table
        self.used: set[str] = set()

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ..., *, positive: bool = False) -> Any:
        self.used.add(key)
        if key not in self.table:
            if default is ...:
                self.problems.append(f"{self.where}.{key}: missing")
                return kind[0]() if isinstance(kind, tuple) else kind()
            return default
        value = self.table[key]
        ok = isinstance(value, kind) and not (isinstance(value, bool) and kind in (int, float, (int, float)))
        if not ok:
            want = "/".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
            self.problems.append(f"{self.where}.{key}: expected {want}, got {type(value).__name__}")
            return default if default is not ... else (kind[0]() if isinstance(kind, tuple) else kind())
        if positive and not value > 0:
            self.problems.append(f"{self.where}.{key}: must be > 0, got {value}")
        return value

    def choice(self, key: str, choices: tuple[str, ...], default: Any = ...) -> str:
        value = self.get(key, str, default)
        if value not in choices:
            self.problems.append(f"{self.where}.{key}: {value!r} is not one of {', '.join(choices)}")
        return value

    def check_unused(self) -> None:
        for key in self.table:
            if key not in self.used:
                self.problems.append(f"{self.where}.{key}: unknown key")


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlannerError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PlannerError(f"{path}: cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise PlannerError(f"{path}: not valid TOML: {exc}") from None


def load_hardware_file(path: str | Path = DATA / "hardware.toml") -> dict[str, Hardware]:
    """Every hardware entry of a file, by key."""
    path = Path(path)
    doc = _read_toml(path)
    problems: list[str] = []
    conv = _Fields(doc.get("conventions", {}), "conventions", problems)
    gb = conv.get("bytes_per_gb", (int, float), 1e9, positive=True)
    onchip = conv.get("onchip_gb_s", (int, float), math.inf, positive=True)
    conv.check_unused()
    out = {}
    for key, table in doc.items():
        if key == "conventions":
            continue
        f = _Fields(table, key, problems)
        tflops = f.get("tflops", dict, {})
        peaks = {}
        for p, v in tflops.items():
            if p not in BYTES_PER_ELEMENT or isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
                problems.append(f"{key}.tflops.{p}: expected a known precision with a number > 0")
            else:
                peaks[p] = float(v) * 1e12
        if not peaks:
            problems.append(f"{key}.tflops: no compute peak given")
        link = f.get("host_link_gb_s", (int, float), None, positive=True)
        out[key] = Hardware(
            key=key, name=f.get("name", str, key), kind=f.get("kind", str, ""), peak_flops=peaks,
            memory_bytes=f.get("memory_gb", (int, float), positive=True) * gb,
            memory_bandwidth=f.get("bandwidth_gb_s", (int, float), positive=True) * gb,
            onchip_bandwidth=f.get("onchip_gb_s", (int, float), onchip, positive=True) * gb,
            host_link_bandwidth=None if link is None else link * gb,
            source=f.get("source", str, ""), gb=float(gb),
        )  # fmt: skip
        f.get("host_link_source", str, "")
        f.check_unused()
    if problems:
        raise PlannerFileError(str(path), problems)
    return out


def load_network_file(path: str | Path = DATA / "networks.toml") -> dict[str, Network]:
    """Every network entry of a file, by key."""
    path = Path(path)
    doc = _read_toml(path)
    problems: list[str] = []
    conv = _Fields(doc.get("conventions", {}), "conventions", problems)
    defaults = {
        "protocol_overhead": conv.get("protocol_overhead", (int, float), 1.05, positive=True),
        "jpeg_ratio": conv.get("jpeg_ratio", (int, float), 0.1, positive=True),
        "action_bytes_per_value": conv.get("action_bytes_per_value", int, 4, positive=True),
    }
    conv.check_unused()
    out = {}
    for key, table in doc.items():
        if key == "conventions":
            continue
        f = _Fields(table, key, problems)
        out[key] = Network(
            key=key,
            name=f.get("name", str, key),
            upload_mbps=f.get("upload_mbps", (int, float), positive=True),
            download_mbps=f.get("download_mbps", (int, float), positive=True),
            latency_ms=f.get("latency_ms", (int, float)),
            source=f.get("source", str, ""),
            **defaults,
        )
        f.check_unused()
    if problems:
        raise PlannerFileError(str(path), problems)
    return out


_TRANSFORMER_KEYS = ("layers", "hidden", "ffn", "heads", "kv_heads")


def _transformer(f: _Fields) -> Transformer:
    layers, hidden, ffn, heads, kv = (f.get(k, int, positive=True) for k in _TRANSFORMER_KEYS)
    head_dim = f.get("head_dim", int, (hidden // heads) if heads else 0, positive=True)
    if heads and kv and heads % kv:
        f.problems.append(f"{f.where}: heads ({heads}) must be a multiple of kv_heads ({kv})")
    return Transformer(layers, hidden, ffn, heads, kv, head_dim, f.get("gated_ffn", bool, False))


def parse_model(doc: Mapping[str, Any], source: str, path: Path | None = None) -> VLAModel:
    """A :class:`VLAModel` from a parsed model file (see ``data/models/*.toml``)."""
    problems: list[str] = []
    m = _Fields(doc.get("model", {}), "model", problems)
    name = m.get("name", str)
    precision = m.choice("precision", tuple(BYTES_PER_ELEMENT), "bf16")
    batch = m.get("batch", int, 1, positive=True)
    ids = tuple(m.get("ids", list, []))
    description, src = m.get("description", str, ""), m.get("source", str, "")
    m.check_unused()

    v = _Fields(doc.get("vision", {}), "vision", problems)
    kind = v.choice("kind", ("vit", "conv"))
    common = dict(
        cameras=v.get("cameras", int, positive=True),
        image_height=v.get("image_height", int, positive=True),
        image_width=v.get("image_width", int, positive=True),
        tokens_per_image=v.get("tokens_per_image", int, positive=True),
    )
    if kind == "conv":
        layers = []
        for i, t in enumerate(v.get("conv", list, [])):
            c = _Fields(t, f"vision.conv[{i}]", problems)
            layers.append(
                ConvLayer(
                    c.get("out_channels", int, positive=True),
                    c.get("kernel", int, positive=True),
                    c.get("stride", int, 1, positive=True),
                    c.get("padding", int, 0),
                )
            )
            c.check_unused()
        if not layers:
            problems.append("vision.conv: a conv encoder needs at least one [[vision.conv]] layer")
        vision = Vision(kind, **common, in_channels=v.get("in_channels", int, 3, positive=True), conv=tuple(layers))
    else:
        vision = Vision(kind, **common, transformer=_transformer(v))
    v.check_unused()

    b = _Fields(doc.get("backbone", {}), "backbone", problems)
    backbone = Backbone(
        _transformer(b), b.get("language_tokens", int, 0), b.get("state_tokens", int, 0), b.get("vocab", int, 0)
    )
    b.check_unused()

    a = _Fields(doc.get("action", {}), "action", problems)
    akind = a.choice("kind", ("flow", "autoregressive"))
    head = dict(chunk=a.get("chunk", int, positive=True), dof=a.get("dof", int, positive=True))
    if akind == "flow":
        action = ActionHead(
            akind,
            **head,
            steps=a.get("steps", int, positive=True),
            transformer=_transformer(a),
            context=a.choice("context", ("kv_cache", "cross_attention"), "kv_cache"),
            qkv_passes=a.get("qkv_passes", int, 1, positive=True),
        )
    else:
        action = ActionHead(akind, **head, tokens=a.get("tokens", int, 0), vocab=a.get("vocab", int, 0))
    a.check_unused()

    scopes = {}
    ms = _Fields(doc.get("measure", {}), "measure", problems)
    for comp in ("vision", "backbone", "action"):
        scopes[comp] = tuple(ms.get(comp, list, []))
    ms.check_unused()
    for key in doc:
        if key not in ("model", "vision", "backbone", "action", "measure"):
            problems.append(f"{key}: unknown table")
    if problems:
        raise PlannerFileError(source, problems)
    return VLAModel(
        name=name,
        vision=vision,
        backbone=backbone,
        action=action,
        precision=precision,
        batch=batch,
        ids=ids,
        description=description,
        source=src,
        measure_scopes=scopes,
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
