"""Command-line entry points: ``vlad`` (the daemon side) and ``vladctl`` (operators).

Expected failures (:class:`vlad.errors.VladError`) print one line, ``error: ...``, and exit
with status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from vlad import __version__
from vlad.errors import VladError

EXIT_ERROR = 2


def _run(parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return EXIT_ERROR
    try:
        return int(func(args) or 0)
    except VladError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


# ---------------------------------------------------------------------------------------
# vladctl
# ---------------------------------------------------------------------------------------


def cmd_plugins(args: argparse.Namespace) -> int:
    """List loaded plugins, their backends, versions and whether each runtime is usable."""
    from vlad.plugins import backends, plugin_infos

    rows = []
    by_plugin = {info.name: info for info in plugin_infos()}
    for name, backend in sorted(backends().items()):
        module = type(backend).__module__.split(".")[0]
        info = next((i for i in by_plugin.values() if i.module.split(":")[0].split(".")[0] == module), None)
        avail = backend.availability()
        rows.append(
            {
                "backend": name,
                "plugin": info.name if info else module,
                "distribution": info.distribution if info else "?",
                "plugin_version": info.version if info else "?",
                "runtime": avail.runtime,
                "runtime_version": avail.version,
                "usable": avail.usable,
                "devices": list(avail.devices),
                "reason": avail.reason,
            }
        )
    if args.json:
        print(json.dumps({"plugins": [vars(i) for i in plugin_infos()], "backends": rows}, indent=2))
        return 0
    if not rows:
        print("no backend plugins loaded (check VLAD_PLUGINS and the installed plugins)")
        return 0
    print(f"{'backend':<12} {'plugin':<22} {'runtime':<24} {'usable':<7} devices / reason")
    for r in rows:
        runtime = f"{r['runtime']} {r['runtime_version'] or '-'}"
        plugin = f"{r['distribution']} {r['plugin_version']}"
        detail = ", ".join(r["devices"]) if r["usable"] else r["reason"]
        print(f"{r['backend']:<12} {plugin:<22} {runtime:<24} {'yes' if r['usable'] else 'no':<7} {detail}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Re-export the demo policy's .pt2 and ONNX from its weights and check them."""
    from vlad.contract import load_contract
    from vlad.demo.release import export_release, load_trained_model
    from vlad.processing import Tokenizer

    release = Path(args.release)
    contract = load_contract(release / "contract.toml")
    model = load_trained_model(release)
    comparisons = export_release(
        model, contract, Tokenizer.from_contract(contract), release, Path(args.fixtures), log=print
    )
    worst = max(c.max_abs for c in comparisons if c.name != "prefix")
    print(f"export OK: ONNX Runtime vs PyTorch max abs error {worst:.3g}")
    return 0


def _control_endpoint(args: argparse.Namespace) -> str:
    from vlad.config import load_config

    if args.endpoint:
        return args.endpoint
    return load_config(args.config).sockets.control


def cmd_status(args: argparse.Namespace) -> int:
    """Show what the daemon is doing: state, release, backend, rates, latency."""
    import zmq

    from vlad.client import control_request

    st = control_request(zmq.Context.instance(), _control_endpoint(args), "status", args.timeout_ms)
    if args.json:
        print(json.dumps(st, indent=2, sort_keys=True))
        return 0
    print(format_status(st))
    return 0


def format_status(st: dict) -> str:
    b = st["backend"]
    c = st["counters"]
    lines = [
        f"state        {st['state']} (for {st['state_since_s']:.0f} s)   uptime {st['uptime_s']:.0f} s   pid {st['pid']}",
        f"release      {st['release']}",
        f"backend      {b['name']} ({b['runtime']}, {b['device']}, {b['precision']}"
        + (f", providers {', '.join(b['providers'])}" if b["providers"] else "") + ")",
        f"rates        {st['rates']['observations_hz']:.1f} observations/s, {st['rates']['actions_hz']:.1f} actions/s"
        f" (control period {st['control_period_ms']:g} ms)",
        f"counters     published {c.get('published', 0)}, stale {c.get('stale', 0)}, superseded {c.get('superseded', 0)},"
        f" deadline misses {c.get('deadline_misses', 0)}, interventions {c.get('interventions', 0)},"
        f" rejected {sum(c.get('rejected', {}).values())}",
    ]
    hb = st.get("heartbeat_age_s")
    lines.append(f"heartbeat    {'none received' if hb is None else f'{hb:.2f} s ago'}")
    lines.append(f"memory       RSS {st['memory']['host_rss_bytes'] / 2**20:.0f} MiB")
    lat = st.get("latency_ms", {})
    if lat:
        lines.append("latency ms   stage         p50      p95      p99      max    count")
        for stage, v in lat.items():
            lines.append(f"             {stage:<10} {v['p50']:8.3f} {v['p95']:8.3f} {v['p99']:8.3f} {v['max']:8.3f} {v['count']:8d}")
    return "\n".join(lines)


def cmd_events(args: argparse.Namespace) -> int:
    import time as _time

    import zmq

    from vlad.client import control_request

    events = control_request(zmq.Context.instance(), _control_endpoint(args), "events", args.timeout_ms, limit=args.limit)
    if args.json:
        print(json.dumps(events, indent=2))
        return 0
    for e in events:
        when = _time.strftime("%Y-%m-%d %H:%M:%S", _time.localtime(e["time"]))
        arrow = f"{e['state_from']} -> {e['state_to']}" if e["state_from"] != e["state_to"] else e["state_to"]
        print(f"{when}  {e['kind']:<10} {arrow:<22} {e['reason']}")
    return 0


def _add_daemon_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="/etc/vlad/vlad.toml", help="daemon config, for the control endpoint")
    p.add_argument("--endpoint", help="control endpoint (overrides the config)")
    p.add_argument("--timeout-ms", type=int, default=2000)
    p.add_argument("--json", action="store_true", help="machine-readable output")


def vladctl_parser() -> argparse.ArgumentParser:
    from vlad.contract_cli import add_contract_commands

    parser = argparse.ArgumentParser(prog="vladctl", description="Operate vlad: contracts, plugins, releases.")
    parser.add_argument("--version", action="version", version=f"vladctl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_contract_commands(sub)

    p = sub.add_parser("status", help="state, release, backend, rates and latency of the running daemon")
    _add_daemon_args(p)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("events", help="state transitions and faults recorded by the running daemon")
    _add_daemon_args(p)
    p.add_argument("--limit", type=int, default=50)
    p.set_defaults(func=cmd_events)

    p = sub.add_parser("plugins", help="list plugins, backends and whether their runtime is usable here")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_plugins)

    p = sub.add_parser("export", help="export the demo policy to .pt2 and ONNX and check them against PyTorch")
    p.add_argument("--release", default="manifests/demo", help="release folder with policy_weights.pt (default: %(default)s)")
    p.add_argument("--fixtures", default="tests/fixtures/golden.npz", help="golden fixtures to (re)write")
    p.set_defaults(func=cmd_export)
    return parser


def vladctl_main(argv: list[str] | None = None) -> int:
    return _run(vladctl_parser(), argv)


# ---------------------------------------------------------------------------------------
# vlad
# ---------------------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the daemon in the foreground (systemd runs exactly this)."""
    from vlad.config import load_config
    from vlad.daemon import serve
    from vlad.systemd import setup_logging

    cfg = load_config(args.config, args.set)
    setup_logging(cfg.logging.level, cfg.logging.journald)
    return serve(cfg)


def vlad_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vlad", description="Serve a VLA policy release.")
    parser.add_argument("--version", action="version", version=f"vlad {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("serve", help="run the daemon (foreground; systemd Type=notify)")
    p.add_argument("--config", default="/etc/vlad/vlad.toml", help="config file (default: %(default)s)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set serve.warmup=5 (repeatable)")
    p.set_defaults(func=cmd_serve)
    return parser


def vlad_main(argv: list[str] | None = None) -> int:
    return _run(vlad_parser(), argv)


if __name__ == "__main__":
    sys.exit(vladctl_main())
