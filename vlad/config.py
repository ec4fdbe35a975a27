"""Daemon configuration: one TOML file, parsed once into frozen typed objects.

``vlad serve --config etc/vlad/vlad.toml --set serve.warmup=5 --set sockets.control=...``
applies ``--set`` overrides (dotted keys, TOML-typed values) before validation. Parsing
is :mod:`vlad.schema`'s, like the contract's and the manifest's: unknown keys, wrong
types (``cpu_temp_warn_c = "hot"``, ``heartbeat_missing_periods = 2.7``) and out-of-range
values are one clear error each, all reported at once. Durations are converted to
nanoseconds once, here (the ``*_ns`` attributes), so nothing downstream converts units.
:func:`config_toml` writes a config built in code back as TOML that :func:`load_config`
reads to the same config.
"""

from __future__ import annotations

import difflib
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Literal

from vlad import schema
from vlad.errors import ProblemsError
from vlad.files import load_toml_or_raise
from vlad.schema import bounded
from vlad.tomlwrite import dumps

_NS = {"internal": True}


class ConfigError(ProblemsError):
    """The configuration file is missing, unreadable or invalid."""


def _derived(obj: Any, **values: Any) -> None:
    """Set derived (unit-converted) attributes on a frozen dataclass, once, at load."""
    for k, v in values.items():
        object.__setattr__(obj, k, v)


@dataclass(frozen=True)
class ReleaseConfig:
    path: str = "/var/lib/vlad/releases/active"  # folder holding contract.toml and the artifacts
    # Which backend runs which artifact with which options. A signed release's manifest says
    # so; these keys are then left empty (a different value is refused at start, not
    # silently ignored). Unsigned releases (verify = false, development) need them.
    backend: str = field(default="", metadata={"allow_empty": True})
    artifact: str = field(default="", metadata={"allow_empty": True})
    options: dict[str, Any] = field(default_factory=dict)  # backend options (threads, providers ...)
    # Options that belong to this robot, not to the release (a remote backend's endpoint or
    # credential files): merged over the signed manifest's options, only for keys the
    # manifest does not set.
    site_options: dict[str, Any] = field(default_factory=dict)
    # Signed releases: with verify on, the daemon serves only a release whose manifest is
    # signed by a key in keys_dir and whose files match it. Off only for development, loudly.
    verify: bool = True
    keys_dir: str = "/etc/vlad/keys.d"


@dataclass(frozen=True)
class SocketsConfig:
    observations: str = "ipc:///run/vlad/obs"  # SUB: controllers PUB observations and heartbeats
    actions: str = "ipc:///run/vlad/actions"  # PUB: action chunks
    status: str = "ipc:///run/vlad/status"  # PUB: status at status_hz
    control: str = "ipc:///run/vlad/control"  # ROUTER (answers like REP): vladctl
    # XPUB: the recording tap (vladctl record). Empty: "tap" beside an ipc:// control
    # endpoint (ipc:///run/vlad/tap); "off": none.
    tap: str = field(default="", metadata={"allow_empty": True})
    ipc_group: str = "vlad"  # group owning the ipc directory (mode 0770); absent group: left as is
    linger_ms: int = field(default=200, metadata=bounded(0, 10_000))
    # tcp:// endpoints are served only with CurveZMQ: this server's secret key file
    # (zmq.auth.create_certificates format) and a folder of authorized client public keys.
    curve_secret_key: str = field(default="", metadata={"allow_empty": True})
    curve_clients_dir: str = field(default="", metadata={"allow_empty": True})
    # Who may publish observations and heartbeats (docs/protocol.md, "Who may send"):
    # "uid:1001", "user:robot", "group:vlad-controllers" (ipc peer credentials) or
    # "key:<Z85 CurveZMQ public key>" (tcp). Empty: anyone who can reach the endpoint.
    observation_producers: tuple[str, ...] = ()
    # Who may subscribe to the recording tap (it carries the camera frames), in the same
    # forms. Empty: only the daemon's own user and root (ipc); on tcp list the keys.
    tap_subscribers: tuple[str, ...] = ()
    # Control requests: a bound on requests in flight per peer and in all, and a time limit
    # for each (release operations have their own, longer one).
    control_in_flight_per_peer: int = field(default=4, metadata=bounded(1, 1000))
    control_in_flight: int = field(default=64, metadata=bounded(1, 10_000))
    control_timeout_s: float = field(default=5.0, metadata=bounded(0.1, 3600))
    release_op_timeout_s: float = field(default=300.0, metadata=bounded(1, 86_400))


@dataclass(frozen=True)
class ServeConfig:
    warmup: int = field(default=20, metadata=bounded(0, 100_000))  # inferences before READY=1
    status_hz: float = field(default=2.0, metadata=bounded(1.0, 100.0))
    latency_window: int = field(default=2000, metadata=bounded(10, 1_000_000))  # samples per stage
    shutdown_timeout_s: float = field(default=2.0, metadata=bounded(0.0, 60.0))
    hang_timeout_s: float = field(default=1.0, metadata=bounded(0.01, 600.0))
    observation_hwm: int = field(default=4, metadata=bounded(1, 1000))  # ZeroMQ receive queue bound
    # An observation stamped later than now + this skew is refused (future_timestamp): a
    # clock mismatch would make its chunk "valid" far too long and e2e negative.
    max_clock_skew_ms: float = field(default=5.0, metadata=bounded(0.0, 10_000.0))
    # Real-time chunking (vlad.serving.rtc) for a release whose contract has [rtc]: "on"
    # continues the chunk the robot executes; "off" serves every chunk plain.
    rtc: Literal["on", "off"] = "on"
    hang_timeout_ns: int = field(default=0, init=False, metadata=_NS)
    max_clock_skew_ns: int = field(default=0, init=False, metadata=_NS)

    def __post_init__(self) -> None:
        _derived(
            self, hang_timeout_ns=int(self.hang_timeout_s * 1e9), max_clock_skew_ns=int(self.max_clock_skew_ms * 1e6)
        )


@dataclass(frozen=True)
class RealtimeConfig:
    """Real-time knobs for the hot-path threads (docs/operations.md). Each is off by default
    where it needs privileges; one that cannot be applied stops the start with the reason."""

    cpu_affinity: tuple[int, ...] = ()  # CPUs for the hot-path thread; empty: no pinning
    fifo_priority: int = field(default=0, metadata=bounded(0, 99))  # SCHED_FIFO priority; 0: off
    mlockall: bool = False  # lock all current and future pages in RAM (needs LimitMEMLOCK=infinity)
    gc_freeze: bool = True  # gc.freeze() after warm-up: the loaded model never gets scanned again
    busy_poll_us: int = field(default=0, metadata=bounded(0, 100_000))  # spin this long before blocking
    # Rehearse the hot path's first stages on scratch copies this long before a steady
    # controller's next observation is due, so that it finds warm caches
    # (vlad.serving.rehearsal); 0: off.
    rehearse_lead_us: int = field(default=1000, metadata=bounded(0, 50_000))


@dataclass(frozen=True)
class SafetyConfig:
    """The external safety PLC / e-stop, as vlad sees it. vlad only reads this state."""

    estop_endpoint: str = field(default="", metadata={"allow_empty": True})  # SUB bound by vlad
    estop_file: str = field(default="", metadata={"allow_empty": True})  # "1"/"engaged"/"true": engaged
    require_bridge: bool = False  # true: silence from the bridge counts as engaged (fail-safe)
    bridge_timeout_ms: float = field(default=500.0, metadata=bounded(1.0, 60_000.0))
    estop_output: Literal["hold", "silence"] = "hold"  # what vlad publishes while engaged
    # Who may publish on the e-stop topic (same forms as sockets.observation_producers).
    # Empty: anyone who can reach the endpoint; set it on every robot.
    estop_producers: tuple[str, ...] = ()
    bridge_timeout_ns: int = field(default=0, init=False, metadata=_NS)

    def __post_init__(self) -> None:
        _derived(self, bridge_timeout_ns=int(self.bridge_timeout_ms * 1e6))


@dataclass(frozen=True)
class ChainEntry:
    """One ``[[fallback.chain]]`` step after the release being served."""

    kind: Literal["release", "hold"]
    path: str | None = None  # kind "release": the release folder
    backend: str = field(default="", metadata={"allow_empty": True})  # unsigned releases only
    artifact: str = field(default="", metadata={"allow_empty": True})
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FallbackConfig:
    """The fallback chain, tried in order after the release being served; the hold posture
    is always the last resort."""

    chain: tuple[ChainEntry, ...] = ()
    healthy_window_s: float = field(default=2.0, metadata=bounded(0.0, 3600.0))
    monitor_hz: float = field(default=20.0, metadata=bounded(1.0, 1000.0))
    healthy_window_ns: int = field(default=0, init=False, metadata=_NS)

    def __post_init__(self) -> None:
        _derived(self, healthy_window_ns=int(self.healthy_window_s * 1e9))


@dataclass(frozen=True)
class GuardConfig:
    """How far a measured joint state is trusted (docs/health.md, "Trusted state")."""

    # Proprio beyond a joint's [lower, upper] by more than this fraction of its range is
    # implausible (refused): a real arm never reports that.
    proprio_limit_margin: float = field(default=0.1, metadata=bounded(0.0, 10.0))
    # Proprio that moved more than rate_limit x periods x this factor since the last trusted
    # state is implausible unless a run of observations confirms it (an external move).
    proprio_rate_factor: float = field(default=3.0, metadata=bounded(1.0, 1000.0))
    # Consistent observations needed before the trusted state re-anchors after a jump.
    reanchor_observations: int = field(default=3, metadata=bounded(1, 1000))
    # An observation flagged `reanchor` (the controller's announcement of an intended jump:
    # an episode reset, homing) is trusted at once, at most once per this interval; more
    # often it is judged like any other (docs/protocol.md).
    reanchor_min_interval_ms: float = field(default=100.0, metadata=bounded(0.0, 60_000.0))


@dataclass(frozen=True)
class StoreConfig:
    """The release store used by ``vladctl deploy`` / ``rollback`` (overridable by --root)."""

    root: str = "/var/lib/vlad"
    lock_timeout_s: float = field(default=5.0, metadata=bounded(0.0, 600.0))


@dataclass(frozen=True)
class MemoryConfig:
    """``[memory]``: the memory the loaded policies may hold together (docs/operations.md,
    "Memory planning"). A deploy, shadow run or canary whose release would not fit beside
    the loaded ones is refused with the numbers; 0 leaves that kind of memory unchecked."""

    host_budget_mb: float = field(default=0.0, metadata=bounded(0.0))
    device_budget_mb: float = field(default=0.0, metadata=bounded(0.0))
    # "fallback": a deploy or rollback that fits only in place of the serving release is
    # done by serving the fallback chain while the old release is closed and the new loads.
    swap: Literal["refuse", "fallback"] = "refuse"


@dataclass(frozen=True)
class MonitorsConfig:
    """``[monitors]``: the built-in monitors' thresholds (documented in docs/health.md), which
    monitors run, and a table per plugin monitor that declares one (``[monitors.<name>]``,
    :func:`parse_monitor_tables`)."""

    cpu_temp_warn_c: float = 85.0
    cpu_temp_fault_c: float = 95.0
    gpu_temp_warn_c: float = 83.0
    gpu_temp_fault_c: float = 90.0
    min_available_memory_mb: float = field(default=512.0, metadata=bounded(0.0))
    max_rss_mb: float = field(default=4096.0, metadata=bounded(0.0))
    heartbeat_missing_periods: int = field(default=5, metadata=bounded(1))  # a silent controller is gone
    sensor_stall_periods: int = field(default=5, metadata=bounded(1))  # no observation this long: stalled
    # Bad input is judged by rate over a sliding window, not by one message (a stray stale
    # or malformed observation is counted, not an outage).
    input_window_s: float = field(default=1.0, metadata=bounded(0.05, 600.0))
    stale_fraction_fault: float = field(default=0.5, metadata=bounded(0.0, 1.0))
    rejected_fraction_warn: float = field(default=0.5, metadata=bounded(0.0, 1.0))
    min_input_events: int = field(default=5, metadata=bounded(1))  # in the window before judging
    deadline_miss_fraction_warn: float = field(default=0.05, metadata=bounded(0.0, 1.0))
    p99_budget_fraction: float = field(default=1.0, metadata=bounded(0.0))
    artifact_check_interval_s: float = field(default=5.0, metadata=bounded(0.05))
    enabled: tuple[str, ...] = ()  # monitor names to run; empty: all
    # Monitor name -> its own table, ``[monitors.<name>]``: parsed into the dataclass the
    # monitor declares (Monitor.Settings) when the parser is given the monitors (the daemon's
    # start), else the table as it is.
    settings: Mapping[str, Any] = field(default_factory=dict, metadata={"internal": True, "tables": True})


@dataclass(frozen=True)
class LoggingConfig:
    level: Literal["debug", "info", "warning", "error"] = "info"
    journald: Literal["auto", "on", "off"] = "auto"  # auto: journald when started by systemd


@dataclass(frozen=True)
class OpenPIConfig:
    """``[compat.openpi]``: an openpi-compatible websocket endpoint (docs/operations.md).

    It runs in its own process; each request goes through the daemon's observation socket
    like a ZeroMQ controller's. The keys below say which entries of openpi's observation
    dict are which contract input, and bound what a peer may take."""

    enabled: bool = False
    # "HOST:PORT" (tcp; beyond loopback only with tls_cert, tls_key and token_file) or
    # "unix:/path" (clients that can open a unix socket; openpi's stock client cannot).
    listen: str = "127.0.0.1:8000"
    # Contract camera name -> openpi observation key ("a.b" also finds obs["a"]["b"]).
    cameras: dict[str, Any] = field(default_factory=dict)
    # openpi keys whose arrays, concatenated in this order, are the contract's proprio.
    proprio: tuple[str, ...] = ()
    prompt: str = "prompt"  # key of the language instruction
    # Key of an optional boolean: true on the first request after an intended jump of the
    # joint state (an episode reset): vlad's `reanchor` (docs/protocol.md). openpi's own
    # runtimes do not send it; a robot program adds it to its observation dict.
    reanchor: str = "reanchor"
    default_prompt: str = field(default="", metadata={"allow_empty": True})  # when a request has none
    # A request whose policy chunk has not come back within this is answered with an error.
    request_timeout_ms: float = field(default=500.0, metadata=bounded(1.0, 60_000.0))
    max_message_mb: float = field(default=16.0, metadata=bounded(0.001, 1024.0))  # websocket max_size
    max_clients: int = field(default=1, metadata=bounded(1, 64))  # websocket clients served at once
    # TCP connections open at once (handshakes included), in all and from one address;
    # beyond, closed at accept. They size the process's file descriptors.
    max_connections: int = field(default=16, metadata=bounded(1, 4096))
    max_connections_per_peer: int = field(default=4, metadata=bounded(1, 4096))
    handshake_timeout_s: float = field(default=5.0, metadata=bounded(0.1, 60.0))  # TLS + websocket handshake
    # A client that sent nothing for this long gives its slot to a new client that asks.
    idle_timeout_s: float = field(default=30.0, metadata=bounded(1.0, 86_400.0))
    tls_cert: str = field(default="", metadata={"allow_empty": True})  # PEM; with tls_key: wss://
    tls_key: str = field(default="", metadata={"allow_empty": True})
    token_file: str = field(default="", metadata={"allow_empty": True})  # clients send "Api-Key <token>"


@dataclass(frozen=True)
class CompatConfig:
    openpi: OpenPIConfig = field(default_factory=OpenPIConfig)


@dataclass(frozen=True)
class MetricsConfig:
    """``[metrics]``: Prometheus text exposition over HTTP (docs/operations.md)."""

    enabled: bool = False
    listen: str = "127.0.0.1:9464"  # "HOST:PORT" or "unix:/path"
    allow_remote: bool = False  # a non-loopback HOST must be asked for explicitly
    # Connections open at once, in all and from one address (beyond: closed at accept), and
    # how long one may wait for a complete request (after connecting or the last answer).
    max_connections: int = field(default=16, metadata=bounded(1, 4096))
    max_connections_per_peer: int = field(default=4, metadata=bounded(1, 4096))
    idle_timeout_s: float = field(default=10.0, metadata=bounded(0.1, 3600.0))


@dataclass(frozen=True)
class Config:
    release: ReleaseConfig = field(default_factory=ReleaseConfig)
    sockets: SocketsConfig = field(default_factory=SocketsConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    realtime: RealtimeConfig = field(default_factory=RealtimeConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    safety: SafetyConfig = field(default_factory=SafetyConfig)
    fallback: FallbackConfig = field(default_factory=FallbackConfig)
    guard: GuardConfig = field(default_factory=GuardConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    monitors: MonitorsConfig = field(default_factory=MonitorsConfig)
    compat: CompatConfig = field(default_factory=CompatConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    source: str = field(default="<defaults>", metadata={"internal": True})


def _check_chain(entry: ChainEntry, path: str, problems: list[str]) -> None:
    if entry.kind == "release" and not entry.path:
        problems.append(f"{path}.path: a release entry needs the release folder")
    if entry.kind == "hold" and (entry.path or entry.backend or entry.artifact or entry.options):
        problems.append(f"{path}: a hold entry takes no path, backend, artifact or options")


def _check_monitors(m: MonitorsConfig, path: str, problems: list[str]) -> None:
    for warn, fault in (("cpu_temp_warn_c", "cpu_temp_fault_c"), ("gpu_temp_warn_c", "gpu_temp_fault_c")):
        if getattr(m, warn) > getattr(m, fault):
            problems.append(f"{path}.{warn}: {getattr(m, warn)} is above {fault} {getattr(m, fault)}")


def _check_fallback(f: FallbackConfig, path: str, problems: list[str]) -> None:
    kinds = [e.kind for e in f.chain]
    if "hold" in kinds[:-1]:
        problems.append(f"{path}.chain: entries after a hold entry can never be reached")


# -- listen = "HOST:PORT" | "unix:/path": the openpi endpoint and the metrics endpoint ---------


@dataclass(frozen=True)
class Listen:
    host: str = ""  # empty for unix
    port: int = 0
    path: str = ""  # unix socket path

    @property
    def unix(self) -> bool:
        return bool(self.path)

    def __str__(self) -> str:
        if self.unix:
            return f"unix:{self.path}"
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_listen(text: str) -> Listen:
    """Raises ValueError with a one-line reason."""
    if text.startswith("unix:"):
        path = text[len("unix:") :]
        if not path.startswith("/"):
            raise ValueError(f"{text!r}: a unix socket needs an absolute path (unix:/run/vlad/x.sock)")
        return Listen(path=path)
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{text!r}: expected HOST:PORT (e.g. 127.0.0.1:8000) or unix:/path")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        p = int(port)
    except ValueError:
        raise ValueError(f"{text!r}: port {port!r} is not a number") from None
    if not 0 < p < 65536:
        raise ValueError(f"{text!r}: port must be 1..65535")
    return Listen(host=host, port=p)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name that may resolve anywhere: not loopback


def listen_problem(text: str, *, remote_ok: bool) -> str | None:
    try:
        listen = parse_listen(text)
    except ValueError as exc:
        return str(exc)
    if not listen.unix and not is_loopback(listen.host) and not remote_ok:
        return f"{text!r} is reachable beyond loopback; refused"
    return None


def _check_openpi(o: OpenPIConfig, path: str, problems: list[str]) -> None:
    problem = listen_problem(o.listen, remote_ok=bool(o.tls_cert and o.tls_key and o.token_file))
    if problem:
        problems.append(
            f"{path}.listen: {problem}"
            + (" unless tls_cert, tls_key and token_file are set" if "loopback" in problem else "")
        )
    if bool(o.tls_cert) != bool(o.tls_key):
        problems.append(f"{path}: tls_cert and tls_key go together")
    for cam, key in o.cameras.items():
        if not isinstance(key, str) or not key:
            problems.append(f"{path}.cameras.{cam}: expected the openpi observation key (a string)")
    if o.max_clients > o.max_connections:
        problems.append(f"{path}.max_clients: {o.max_clients} is above max_connections {o.max_connections}")


def _check_metrics(m: MetricsConfig, path: str, problems: list[str]) -> None:
    problem = listen_problem(m.listen, remote_ok=m.allow_remote)
    if problem:
        problems.append(f"{path}.listen: {problem}" + (" unless allow_remote = true" if "loopback" in problem else ""))


CHECKS: dict[type, schema.Check] = {
    ChainEntry: _check_chain,
    MonitorsConfig: _check_monitors,
    FallbackConfig: _check_fallback,
    OpenPIConfig: _check_openpi,
    MetricsConfig: _check_metrics,
}


def _parse_value(text: str) -> Any:
    """A ``--set`` value as TOML (numbers, booleans, arrays, quoted strings), else a string."""
    import tomllib

    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError("--set", [f"{item!r}: expected KEY=VALUE, e.g. serve.warmup=5"])
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError("--set", [f"{item!r}: {part!r} is not a table"])
        node[parts[-1]] = _parse_value(value.strip())
    return data


def parse_monitor_tables(
    tables: Mapping[str, Any],
    monitors: Mapping[str, type | None],
    enabled: tuple[str, ...] = (),
    problems: list[str] | None = None,
) -> dict[str, Any]:
    """Each ``[monitors.<name>]`` table parsed into the dataclass its monitor declares.

    ``monitors``: every monitor offered, name -> its settings dataclass (None: it takes no
    table), as the monitors themselves say (:func:`vlad.plugins.monitor_settings`). A table
    for no such monitor, or ``enabled`` naming one that is not offered, is a problem (with
    the closest name); a monitor with settings and no table gets its defaults. A table that
    is already its dataclass (a config built in code) is kept. Problems are appended to
    ``problems`` (raised as one :class:`ConfigError` when it is None).
    """
    found: list[str] = [] if problems is None else problems
    out: dict[str, Any] = {}
    takes = sorted(name for name, tp in monitors.items() if tp is not None)
    for name, table in tables.items():
        path = f"monitors.{schema.shown(name)[1:-1]}"
        tp = monitors.get(name)
        if tp is None:
            close = difflib.get_close_matches(str(name), takes, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"monitors with settings: {', '.join(takes) or 'none'}"
            what = "takes no settings" if name in monitors else "is not a monitor offered by the loaded plugins"
            found.append(f"{path}: {schema.shown(name)} {what} ({hint})")
        elif isinstance(table, tp):
            out[name] = table
        else:
            value = schema.convert(tp, table, path, found)
            if not isinstance(value, schema.Broken):
                out[name] = value
    for name, tp in monitors.items():
        if tp is not None and name not in tables:
            out[name] = tp()
    for i, name in enumerate(enabled):
        if name not in monitors:
            close = difflib.get_close_matches(name, list(monitors), n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"offered: {', '.join(sorted(monitors))}"
            found.append(f"monitors.enabled[{i}]: no monitor named {schema.shown(name)} ({hint})")
    if problems is None and found:
        raise ConfigError("[monitors]", found)
    return out


def _split_monitor_tables(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(``data`` without the per-monitor tables, those tables): a table under ``[monitors]``
    whose name is not one of :class:`MonitorsConfig`'s keys is a monitor's own table."""
    section = data.get("monitors")
    if not isinstance(section, dict):
        return data, {}
    own = {f.name for f in fields(MonitorsConfig) if not f.metadata.get("internal")}
    tables = {k: v for k, v in section.items() if k not in own and isinstance(v, dict)}
    if not tables:
        return data, {}
    return {**data, "monitors": {k: v for k, v in section.items() if k not in tables}}, tables


def parse_config(
    data: dict[str, Any], source: str = "<config>", monitors: Mapping[str, type | None] | None = None
) -> Config:
    """Validate a config mapping into :class:`Config` (every problem reported at once).

    ``monitors`` (every monitor offered: name -> its settings dataclass or None, see
    :func:`parse_monitor_tables`) parses the ``[monitors.<name>]`` tables and checks
    ``monitors.enabled``; without it (a tool that reads the config for its sockets) those
    tables are kept as they are, for the daemon to parse.
    """
    if not isinstance(data, dict):
        raise ConfigError(source, [f"expected a table at top level, got {schema.kind(data)}"])
    data, tables = _split_monitor_tables(data)
    problems: list[str] = []
    cfg = schema.convert(Config, data, "", problems, checks=CHECKS)
    settings: Mapping[str, Any] = tables
    if monitors is not None:
        enabled = cfg.monitors.enabled if not isinstance(cfg, schema.Broken) else ()
        settings = parse_monitor_tables(tables, monitors, enabled, problems)
    if problems or isinstance(cfg, schema.Broken):
        raise ConfigError(source, problems or ["invalid"])
    return replace(cfg, source=source, monitors=replace(cfg.monitors, settings=settings))


def load_config(
    path: str | Path | None, overrides: list[str] | None = None, monitors: Mapping[str, type | None] | None = None
) -> Config:
    """Read ``path`` (``None``: defaults only), apply ``overrides``, validate.

    Relative paths in the file resolve against the file's folder. ``monitors``: see
    :func:`parse_config` (the daemon passes :func:`vlad.plugins.monitor_settings`).
    """
    data: dict[str, Any] = {}
    source = "<defaults>"
    base = Path.cwd()
    if path is not None:
        p = Path(path)
        source = str(p)
        data = load_toml_or_raise(p, lambda problem: ConfigError(source, [problem]), "config file does not exist")
        base = p.resolve().parent
    apply_overrides(data, overrides or [])
    cfg = parse_config(data, source, monitors)

    def resolve(p: str) -> str:
        return p if not p or Path(p).is_absolute() else str((base / p).resolve())

    chain = tuple(replace(e, path=resolve(e.path)) if e.path else e for e in cfg.fallback.chain)
    o = cfg.compat.openpi
    return replace(
        cfg,
        release=replace(cfg.release, path=resolve(cfg.release.path), keys_dir=resolve(cfg.release.keys_dir)),
        fallback=replace(cfg.fallback, chain=chain),
        store=replace(cfg.store, root=resolve(cfg.store.root)),
        safety=replace(cfg.safety, estop_file=resolve(cfg.safety.estop_file)),
        compat=replace(
            cfg.compat,
            openpi=replace(
                o, tls_cert=resolve(o.tls_cert), tls_key=resolve(o.tls_key), token_file=resolve(o.token_file)
            ),
        ),
    )


def _as_mapping(obj: Any) -> Any:
    if is_dataclass(obj) and not isinstance(obj, type):
        # None has no TOML form: such a field is left out (its default, None, applies);
        # derived fields (``*_ns``, the source) are the loader's, not the file's.
        out = {
            f.name: _as_mapping(getattr(obj, f.name))
            for f in fields(obj)
            if not f.metadata.get("internal") and getattr(obj, f.name) is not None
        }
        for f in fields(obj):
            if f.metadata.get("tables"):  # a mapping of sub-tables ([monitors.<name>]), written as such
                out.update(_as_mapping(getattr(obj, f.name)))
        return out
    if isinstance(obj, (list, tuple)):
        return [_as_mapping(v) for v in obj]
    if isinstance(obj, Mapping):
        return {k: _as_mapping(v) for k, v in obj.items()}
    return obj


def config_toml(cfg: Any) -> str:
    """A :class:`Config` (or any section of it) as TOML text (:func:`vlad.tomlwrite.dumps`),
    leaving out the fields the loader derives and those set to None, so that
    :func:`load_config` of the text gives the same config."""
    return dumps(_as_mapping(cfg))
