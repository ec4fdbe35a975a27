"""Command-line entry points: ``vlad`` (the daemon side) and ``vladctl`` (operators).

Expected failures (:class:`vlad.errors.VladError`) print one line, ``error: ...``, and exit
with status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import os
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


    st = _daemon(args, "status")
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
        f" holds {c.get('published_hold', 0)},"
        f" rejected {sum(c.get('rejected', {}).values())}",
    ]
    serving = st.get("serving", "")
    if serving and not serving.startswith("release:"):
        lines.append(f"serving      {serving} (fallback chain: {' > '.join(st.get('chain', []))})")
    if st.get("quarantined"):
        lines.append(f"quarantined  {', '.join(f'{k} ({v})' for k, v in st['quarantined'].items())}"
                     " -- `vladctl resume --why ...` after fixing")
    if st.get("estop", {}).get("engaged"):
        lines.append(f"e-stop       ENGAGED ({st['estop']['source'] or 'safety system'}): no motion is published")
    for f in st.get("findings", []):
        lines.append(f"{f['severity']:<12} {f['message']}")
    if st.get("canary"):
        c = st["canary"]
        lines.append(f"canary       {c['release']} for {c['elapsed_s']:.0f}/{c['window_s']:.0f} s (previous {c['previous']})")
    if st.get("shadow"):
        sh = st["shadow"]
        lines.append(f"shadow       {sh['release']} ({sh['purpose']}): {sh['divergence']['pairs']} chunks compared,"
                     f" mean abs divergence {sh['divergence']['mean_abs']:.4g}")
    temps = st.get("temperatures_c") or {}
    if temps:
        lines.append("temperature  " + ", ".join(f"{k} {v:.0f} °C" for k, v in sorted(temps.items())[:6]))
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



    events = _daemon(args, "events", limit=args.limit)
    if args.json:
        print(json.dumps(events, indent=2))
        return 0
    for e in events:
        when = _time.strftime("%Y-%m-%d %H:%M:%S", _time.localtime(e["time"]))
        arrow = f"{e['state_from']} -> {e['state_to']}" if e["state_from"] != e["state_to"] else e["state_to"]
        print(f"{when}  {e['kind']:<10} {arrow:<22} {e['reason']}")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:


    r = _daemon(args, "resume", who=args.who, why=args.why)
    print(f"quarantine cleared; state {r['state']} (the release serves again after a healthy window)")
    return 0


def _who(args: argparse.Namespace) -> str:
    return args.who or os.environ.get("VLAD_OPERATOR") or os.environ.get("SUDO_USER") or os.environ.get("USER") or "operator"


def _daemon(args: argparse.Namespace, cmd: str, timeout_ms: int | None = None, **kw):
    import zmq

    from vlad.client import control_request

    from vlad.client import load_curve

    curve = load_curve((args.curve_key, args.curve_server_key)) if args.curve_key else None
    return control_request(zmq.Context.instance(), _control_endpoint(args), cmd, timeout_ms or args.timeout_ms,
                           curve=curve, **kw)


def _daemon_down(exc: Exception) -> bool:
    return "did not answer" in str(exc)


def cmd_deploy(args: argparse.Namespace) -> int:
    """verify -> stage -> warm -> hot-swap on the running daemon (or refuse with the reason)."""
    r = _daemon(args, "deploy", max(args.timeout_ms, 120_000), path=str(Path(args.release).resolve()), who=_who(args),
                why=args.why, canary=args.canary, force=args.force)
    extra = " as a canary (auto-rollback armed)" if r["canary"] else ""
    print(f"deployed {r['release']}{extra}; previous {r['previous']}")
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    """One command back to the previous release: live on the daemon, else in the store."""
    from vlad.client import ClientError

    try:
        r = _daemon(args, "rollback", max(args.timeout_ms, 120_000), who=_who(args), why=args.why)
    except ClientError as exc:
        if not _daemon_down(exc):
            raise
        from vlad.config import load_config
        from vlad.release.store import ReleaseStore

        cfg = load_config(args.config)
        entry = ReleaseStore(cfg.store.root, cfg.release.keys_dir).rollback(_who(args), args.why)
        print(f"vlad is not running: rolled the store back to {entry.to_release} (from {entry.from_release}); "
              "it is served at the next start")
        return 0
    if "aborted" in r:
        print(f"canary of {r['aborted']} aborted; serving {r['release']} again")
    else:
        print(f"rolled back to {r['release']} (from {r['rolled_back_from']})")
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    from vlad.client import ClientError

    try:
        rows = _daemon(args, "history")
    except ClientError as exc:
        if not _daemon_down(exc):
            raise
        from dataclasses import asdict

        from vlad.config import load_config
        from vlad.release.store import ReleaseStore

        cfg = load_config(args.config)
        rows = [asdict(e) for e in ReleaseStore(cfg.store.root, cfg.release.keys_dir, create=False).history()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no activations or rollbacks recorded")
    for e in rows:
        print(f"{e['time']}  {e['event']:<9} {e['from_release'] or '-'} -> {e['to_release']}  by {e['who']}: {e['why']}"
              + ("  (forced)" if e.get("forced") else ""))
    return 0


def cmd_shadow(args: argparse.Namespace) -> int:
    if args.shadow_command == "start":
        r = _daemon(args, "shadow_start", max(args.timeout_ms, 120_000), path=str(Path(args.release).resolve()),
                    tolerance=args.tolerance)
        print(f"shadow run of {r['shadow']} started (tolerance {r['tolerance']:g}); its actions are never published")
        return 0
    r = _daemon(args, "shadow_report" if args.shadow_command == "report" else "shadow_stop")
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    d = r["divergence"]
    lat = r["latency_ms"].get("e2e", {})
    print(f"shadow {r['release']} ({r['purpose']}), running {r['running_s']:.0f} s, {d['pairs']} chunks compared")
    print(f"  divergence: max abs {d['max_abs']:.4g}, mean abs {d['mean_abs']:.4g}, per joint max {d['per_joint_max_abs']},"
          f" beyond tolerance {100 * d['fraction_beyond_tolerance']:.2f} %")
    if lat:
        print(f"  latency: sensor -> actions p50 {lat['p50']:.2f} ms, p99 {lat['p99']:.2f} ms")
    print(f"  faults: {r['faults']}")
    return 0


def _add_daemon_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="/etc/vlad/vlad.toml", help="daemon config, for the control endpoint")
    p.add_argument("--endpoint", help="control endpoint (overrides the config)")
    p.add_argument("--timeout-ms", type=int, default=2000)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--curve-key", help="CurveZMQ: this client's secret key file (tcp:// control)")
    p.add_argument("--curve-server-key", help="CurveZMQ: the daemon's public key file (tcp:// control)")


def vladctl_parser() -> argparse.ArgumentParser:
    from vlad.cli.contract import add_contract_commands
    from vlad.cli.release import add_release_commands

    parser = argparse.ArgumentParser(prog="vladctl", description="Operate vlad: contracts, plugins, releases.")
    parser.add_argument("--version", action="version", version=f"vladctl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_contract_commands(sub)
    add_release_commands(sub)
    from vlad.planner.cli import add_plan_commands

    add_plan_commands(sub)

    p = sub.add_parser("status", help="state, release, backend, rates and latency of the running daemon")
    _add_daemon_args(p)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("events", help="state transitions and faults recorded by the running daemon")
    _add_daemon_args(p)
    p.add_argument("--limit", type=int, default=50)
    p.set_defaults(func=cmd_events)

    p = sub.add_parser("deploy", help="verify, stage, warm and hot-swap a release on the running daemon")
    _add_daemon_args(p)
    p.add_argument("release", help="release folder (signed manifest)")
    p.add_argument("--why", required=True, help="reason, recorded in the history")
    p.add_argument("--who", help="operator name (default: $VLAD_OPERATOR, $SUDO_USER, $USER)")
    p.add_argument("--canary", action="store_true", help="watch it against the manifest's canary thresholds; "
                   "crossing one rolls back automatically")
    p.add_argument("--force", action="store_true", help="allow a deliberate downgrade")
    p.set_defaults(func=cmd_deploy)

    p = sub.add_parser("rollback", help="back to the previous release (live, or in the store when vlad is down)")
    _add_daemon_args(p)
    p.add_argument("--why", required=True, help="reason, recorded in the history")
    p.add_argument("--who", help="operator name (default: $VLAD_OPERATOR, $SUDO_USER, $USER)")
    p.set_defaults(func=cmd_rollback)

    p = sub.add_parser("history", help="activations and rollbacks with who and why")
    _add_daemon_args(p)
    p.set_defaults(func=cmd_history)

    p = sub.add_parser("shadow", help="run a candidate beside the serving policy without publishing it")
    shadow = p.add_subparsers(dest="shadow_command", metavar="COMMAND", required=True)
    q = shadow.add_parser("start", help="start a shadow run of RELEASE")
    _add_daemon_args(q)
    q.add_argument("release", help="release folder (signed manifest)")
    q.add_argument("--tolerance", type=float, default=0.05, help="per-value abs error counted as beyond (contract units)")
    for name, text in (("report", "divergence, latency and faults so far"), ("stop", "stop and print the final report")):
        q = shadow.add_parser(name, help=text)
        _add_daemon_args(q)
    p.set_defaults(func=cmd_shadow)

    p = sub.add_parser("resume", help="clear the quarantine of a policy that faulted (operator decision)")
    _add_daemon_args(p)
    p.add_argument("--why", required=True, help="why it is safe to use the policy again (recorded)")
    p.add_argument("--who", default=os.environ.get("SUDO_USER") or os.environ.get("USER") or "operator")
    p.set_defaults(func=cmd_resume)

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
    from vlad.daemon.supervisor import serve
    from vlad.daemon.systemd import setup_logging

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
