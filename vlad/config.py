"""Daemon configuration: one TOML file, parsed once into frozen typed objects.

``vlad serve --config etc/vlad/vlad.toml --set serve.warmup=5 --set sockets.control=...``
applies ``--set`` overrides (dotted keys, TOML-typed values) before validation. Unknown
keys are errors (a typo must not silently fall back to a default).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from vlad.errors import VladError


class ConfigError(VladError):
    """The configuration file is missing, unreadable or invalid."""


@dataclass(frozen=True)
class ReleaseConfig:
    path: str = "/var/lib/vlad/releases/active"  # folder holding contract.toml and the artifacts
    # Which backend runs which artifact with which options. A signed release's manifest says
    # so; these keys are then left empty (a different value is refused at start, not
    # silently ignored). Unsigned releases (verify = false, development) need them.
    backend: str = ""
    artifact: str = ""
    options: dict[str, Any] = field(default_factory=dict)  # backend options (threads, providers ...)
    # Signed releases: with verify on, the daemon serves only a release whose manifest is
    # signed by a key in keys_dir and whose files match it. Off only for development, loudly.
    verify: bool = True
    keys_dir: str = "/etc/vlad/keys.d"


@dataclass(frozen=True)
class SocketsConfig:
    observations: str = "ipc:///run/vlad/obs"  # SUB: controllers PUB observations and heartbeats
    actions: str = "ipc:///run/vlad/actions"  # PUB: action chunks
    status: str = "ipc:///run/vlad/status"  # PUB: status at status_hz
    control: str = "ipc:///run/vlad/control"  # REP: vladctl
    ipc_group: str = "vlad"  # group owning the ipc directory (mode 0770); absent group: left as is
    linger_ms: int = 200
    # tcp:// endpoints are served only with CurveZMQ: this server's secret key file
    # (zmq.auth.create_certificates format) and a folder of authorized client public keys.
    curve_secret_key: str = ""
    curve_clients_dir: str = ""


@dataclass(frozen=True)
class ServeConfig:
    warmup: int = 20  # inferences before READY=1
    status_hz: float = 2.0
    latency_window: int = 2000  # samples per stage in the rolling percentiles
    shutdown_timeout_s: float = 2.0  # bound on finishing the in-flight inference at shutdown
    hang_timeout_s: float = 1.0  # an inference running longer stops the systemd watchdog pings
    observation_hwm: int = 4  # ZeroMQ receive queue bound; the newest observation wins anyway


@dataclass(frozen=True)
class SafetyConfig:
    """The external safety PLC / e-stop, as vlad sees it. vlad only reads this state."""

    estop_endpoint: str = ""  # SUB bound by vlad; the robot's safety bridge publishes `estop`
    estop_file: str = ""  # a file (or GPIO value file) whose content "1"/"engaged" means engaged
    require_bridge: bool = False  # true: silence from the bridge counts as engaged (fail-safe)
    bridge_timeout_ms: float = 500.0
    estop_output: Literal["hold", "silence"] = "hold"  # what vlad publishes while engaged


@dataclass(frozen=True)
class FallbackConfig:
    """The fallback chain, tried in order after the release being served.

    Each entry: ``{kind = "release", path = ..., backend = ..., artifact = ..., options = {}}``
    (the previous stable release, or a slow conservative policy) or ``{kind = "hold"}`` (the
    contract's hold posture; always appended as the last resort).
    """

    chain: list = field(default_factory=list)
    healthy_window_s: float = 2.0  # no fault for this long before going back up the chain
    monitor_hz: float = 20.0


@dataclass(frozen=True)
class StoreConfig:
    """The release store used by ``vladctl deploy`` / ``rollback`` on the running daemon."""

    root: str = "/var/lib/vlad"


@dataclass(frozen=True)
class LoggingConfig:
    level: Literal["debug", "info", "warning", "error"] = "info"
    journald: Literal["auto", "on", "off"] = "auto"  # auto: journald when started by systemd


@dataclass(frozen=True)
class Config:
    release: ReleaseConfig = field(default_factory=ReleaseConfig)
    sockets: SocketsConfig = field(default_factory=SocketsConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    safety: SafetyConfig = field(default_factory=SafetyConfig)
    fallback: FallbackConfig = field(default_factory=FallbackConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    monitors: dict = field(default_factory=dict)  # thresholds, see vlad.monitors.MonitorThresholds
    source: str = "<defaults>"


_SECTIONS = {"release": ReleaseConfig, "sockets": SocketsConfig, "serve": ServeConfig, "logging": LoggingConfig,
             "safety": SafetyConfig, "fallback": FallbackConfig, "store": StoreConfig}


def _parse_value(text: str) -> Any:
    """A ``--set`` value as TOML (numbers, booleans, arrays, quoted strings), else a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. serve.warmup=5")
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item!r}: {part!r} is not a table")
        node[parts[-1]] = _parse_value(value.strip())
    return data


def _check_type(path: str, value: Any, default: Any, annotation: Any) -> Any:
    if isinstance(annotation, str) and annotation.startswith("Literal"):
        allowed = [a.strip().strip("'\"") for a in annotation[len("Literal[") : -1].split(",")]
        if value not in allowed:
            raise ConfigError(f"{path} = {value!r}: must be one of {', '.join(allowed)}")
        return value
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, str):
        ok = isinstance(value, str)
    elif isinstance(default, dict):
        ok = isinstance(value, dict)
    elif isinstance(default, list):
        ok = isinstance(value, list)
    else:
        ok = True
    if not ok:
        raise ConfigError(f"{path} = {value!r}: expected {type(default).__name__}")
    return value


def parse_config(data: dict[str, Any], source: str = "<config>") -> Config:
    """Validate a config mapping into :class:`Config`; relative paths resolve against the file."""
    unknown = set(data) - set(_SECTIONS) - {"monitors"}
    if unknown:
        raise ConfigError(f"{source}: unknown section(s) {sorted(unknown)}; known: {sorted(_SECTIONS)}")
    sections = {}
    for name, cls in _SECTIONS.items():
        table = data.get(name, {})
        if not isinstance(table, dict):
            raise ConfigError(f"{source}: [{name}] must be a table")
        defaults = cls()
        known = {f.name: f for f in fields(cls)}
        extra = set(table) - set(known)
        if extra:
            raise ConfigError(f"{source}: unknown key(s) in [{name}]: {sorted(extra)}; known: {sorted(known)}")
        values = {
            key: _check_type(f"{name}.{key}", table[key], getattr(defaults, key), known[key].type)
            for key in table
        }
        sections[name] = cls(**values)
    monitors = data.get("monitors", {})
    if not isinstance(monitors, dict):
        raise ConfigError(f"{source}: [monitors] must be a table")
    from vlad.health.monitors import MonitorThresholds

    MonitorThresholds.from_config(monitors)  # validate now: unknown keys are typos
    for i, entry in enumerate(sections["fallback"].chain):
        kind = entry.get("kind") if isinstance(entry, dict) else None
        if kind not in ("release", "hold"):
            raise ConfigError(f"{source}: fallback.chain[{i}]: kind must be 'release' or 'hold', got {kind!r}")
        if kind == "release" and not isinstance(entry.get("path"), str):
            raise ConfigError(f"{source}: fallback.chain[{i}]: a release entry needs a path")
    cfg = Config(**sections, monitors=monitors, source=source)
    if cfg.serve.status_hz < 1.0:
        raise ConfigError(f"{source}: serve.status_hz = {cfg.serve.status_hz}: status must go out at least at 1 Hz")
    return cfg


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> Config:
    """Read ``path`` (``None``: defaults only), apply ``overrides``, validate.

    ``release.path`` is resolved relative to the config file's folder when relative.
    """
    data: dict[str, Any] = {}
    source = "<defaults>"
    base = Path.cwd()
    if path is not None:
        p = Path(path)
        source = str(p)
        try:
            data = tomllib.loads(p.read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {p} does not exist") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config file {p} cannot be read: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {p} is not valid TOML: {exc}") from None
        base = p.resolve().parent
    apply_overrides(data, overrides or [])
    cfg = parse_config(data, source)
    from dataclasses import replace

    def resolve(p: str) -> str:
        return p if Path(p).is_absolute() else str((base / p).resolve())

    chain = [({**e, "path": resolve(e["path"])} if e.get("kind") == "release" else dict(e)) for e in cfg.fallback.chain]
    return replace(cfg, release=replace(cfg.release, path=resolve(cfg.release.path), keys_dir=resolve(cfg.release.keys_dir)),
                   fallback=replace(cfg.fallback, chain=chain), store=replace(cfg.store, root=resolve(cfg.store.root)))
