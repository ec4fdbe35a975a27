"""``vladctl`` commands for the running daemon: status, events, resume, deploy, rollback,
history, shadow. Each sends one control request (the registry in
:mod:`vlad.daemon.control` says which, with which arguments); ``rollback`` and ``history``
work on the release store when the daemon is not running.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vlad.cli.common import add_daemon_args, add_operator_args, operator, request, store
from vlad.errors import DaemonUnreachable

if TYPE_CHECKING:  # imported where used: vladctl's other commands start without numpy
    from vlad.backend import SessionStats
    from vlad.snapshot import EndpointStatus, StatusSnapshot


def cmd_status(args: argparse.Namespace) -> int:
    """Show what the daemon is doing: state, release, backend, rates, latency."""
    if getattr(args, "watch", False):
        from vlad.cli.common import load_config_or_defaults
        from vlad.cli.watch import watch

        return watch(args, request, args.endpoint or load_config_or_defaults(args.config).sockets.control)
    from vlad.snapshot import parse_status

    st = parse_status(request(args, "status"))
    if args.json:
        print(json.dumps(st.to_dict(), indent=2, sort_keys=True))
        return 0
    print(format_status(st))
    return 0


def format_status(st: StatusSnapshot) -> str:
    b = st.backend
    c = st.counters
    lines = [
        f"state        {st.state} (for {st.state_since_s:.0f} s)   uptime {st.uptime_s:.0f} s   pid {st.pid}",
        f"release      {st.release}",
        f"backend      {b.name} ({b.runtime}, {b.device}, {b.precision}"
        + (f", providers {', '.join(b.providers)}" if b.providers else "")
        + ")",
        f"rates        {st.rates.observations_hz:.1f} observations/s, {st.rates.actions_hz:.1f} actions/s"
        f" (control period {st.control_period_ms:g} ms)",
        f"counters     published {c.published}, stale {c.stale}, superseded {c.superseded},"
        f" deadline misses {c.deadline_misses}, interventions {c.interventions},"
        f" holds {c.published_hold},"
        f" rejected {sum(c.rejected.values())}",
    ]
    ev = st.evidence
    if ev.status == "forced":
        lines.append(f"evidence     FORCED ({ev.gate_evidence}) by {ev.who} at {ev.time}: {ev.why}")
    elif ev.status == "unverified":
        lines.append(
            f"evidence     UNVERIFIED: no passing gate evidence, no recorded override; "
            f"{ev.published_unverified or 0} chunks published so ({'; '.join(ev.problems[:2])})"
        )
    op = st.operation
    if op:
        lines.append(f"operation    {op.kind} {op.target} for {op.elapsed_s:.0f} s: {op.step}")
    if st.on_fallback:
        lines.append(f"serving      {st.serving} (fallback chain: {' > '.join(st.chain)})")
    if st.quarantined:
        lines.append(
            f"quarantined  {', '.join(f'{k} ({v})' for k, v in st.quarantined.items())}"
            " -- `vladctl resume --why ...` after fixing"
        )
    if st.estop.engaged:
        lines.append(f"e-stop       ENGAGED ({st.estop.source or 'safety system'}): no motion is published")
    for f in st.findings:
        lines.append(f"{f.severity:<12} {f.message}")
    if st.canary:
        cn = st.canary
        lines.append(f"canary       {cn.release} for {cn.elapsed_s:.0f}/{cn.window_s:.0f} s (previous {cn.previous})")
    if st.shadow:
        sh = st.shadow
        lines.append(
            f"shadow       {sh.release} ({sh.purpose}): {sh.divergence.pairs} chunks compared,"
            f" mean abs divergence {sh.divergence.mean_abs:.4g}"
        )
    for pid, s in st.remote_links():
        lines.append(f"remote       {remote_summary(pid, s)}")
        if s.last_error:
            lines.append(f"             last error: {s.last_error}")
    if st.temperatures_c:
        lines.append("temperature  " + ", ".join(f"{k} {v:.0f} °C" for k, v in sorted(st.temperatures_c.items())[:6]))
    for name, e in (("openpi", st.openpi), ("metrics", st.metrics)):
        if e is not None:
            lines.append(f"{name:<12} {endpoint_summary(e)}")
    hb = st.heartbeat_age_s
    lines.append(f"heartbeat    {'none received' if hb is None else f'{hb:.2f} s ago'}")
    lines.append(f"memory       RSS {st.memory.host_rss_bytes / 2**20:.0f} MiB")
    if st.latency_ms:
        lines.append("latency ms   stage         p50      p95      p99      max    count")
        for stage, v in st.latency_ms.items():
            lines.append(f"             {stage:<10} {v.p50:8.3f} {v.p95:8.3f} {v.p99:8.3f} {v.max:8.3f} {v.count:8d}")
    return "\n".join(lines)


def remote_summary(pid: str, s: SessionStats, compact: bool = False) -> str:
    """One remote link in one line: its state first, then errors, latency and the endpoint.

    ``compact`` (the watch view's 71 columns) names the policy by its chain slot and puts
    the endpoint last, where a cut loses the least."""
    state_text = (s.state.upper() if s.lost else s.state) + f" for {s.state_for_s:.0f} s"
    rtt = s.round_trip_ms
    errors = ", ".join(f"{k} {v}" for k, v in sorted(s.errors.items()))
    endpoint = s.endpoint or "?"
    if compact:
        parts = [f"{pid.split(':', 1)[0]} {state_text}", f"err {s.error_rate:.0%}"]
        if rtt:
            parts.append(f"rtt {rtt.p50:.1f}/{rtt.p99:.1f} ms")
        parts += [f"reconn {s.reconnects}", endpoint]
        return "  ".join(parts)
    where = f"{endpoint} ({s.protocol or '?'}, model {s.model or '?'})"
    figures = [
        f"{name} p50 {v.p50:.2f} ms p99 {v.p99:.2f} ms"
        for name, v in (("round trip", rtt), ("network", s.network_ms), ("server", s.server_ms))
        if v
    ]
    return (
        f"{pid} -> {where}: {state_text}; "
        + (", ".join(figures) + "; " if figures else "")
        + f"{s.error_rate:.1%} of the last {s.window} requests failed"
        + (f" ({errors})" if errors else "")
        + f"; reconnects {s.reconnects}"
    )


def endpoint_summary(e: EndpointStatus, compact: bool = False) -> str:
    """One endpoint process in one line: serving or not, then how often the daemon had to
    start it again and why it last did (``compact``: the watch view's figures only)."""
    from vlad.snapshot import OpenpiStatus

    if e.running:
        head = f"serving on {e.listen} (pid {e.pid})" if not compact else "serving"
        if isinstance(e, OpenpiStatus):
            head += f", {e.clients} client(s)" if not compact else f"  {e.clients} client(s)"
    else:
        head = f"NOT SERVING: being started again (connections to {e.listen} wait)" if not compact else "DOWN"
    trouble = [
        f"{label} {n}"
        for label, n in (("restarts", e.restarts), ("failed starts", e.failed_starts), ("unresponsive", e.unresponsive))
        if n
    ]
    if compact:
        return "  ".join([head, *trouble])
    if trouble:
        head += "; " + ", ".join(trouble)
    if e.last_failure:
        head += f"; last: {e.last_failure}"
    return head


def cmd_events(args: argparse.Namespace) -> int:
    import time as _time

    from vlad.snapshot import parse_events

    events = parse_events(request(args, "events", limit=args.limit))
    if args.json:
        print(json.dumps([e.to_dict() for e in events], indent=2))
        return 0
    for e in events:
        when = _time.strftime("%Y-%m-%d %H:%M:%S", _time.localtime(e.time))
        arrow = f"{e.state_from} -> {e.state_to}" if e.is_transition else e.state_to
        print(f"{when}  {e.kind:<10} {arrow:<22} {e.reason}")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    r = request(args, "resume", who=operator(args.who), why=args.why)
    print(f"quarantine cleared; state {r['state']} (the release serves again after a healthy window)")
    return 0


def with_progress(args: argparse.Namespace, call: Callable[[], Any]) -> Any:
    """Run a long release request while showing the daemon's progress: its status names
    the operation in flight and its current step; each new step is printed (on stderr)
    with the seconds elapsed. The status is asked on its own socket, once a second."""
    import sys
    import threading

    from vlad.snapshot import parse_status

    done = threading.Event()

    def watch() -> None:
        shown = None
        while not done.wait(1.0):
            try:
                op = parse_status(request(args, "status")).operation
            except Exception:  # the progress line is a courtesy: the request itself reports errors
                continue
            if op and op.step != shown:
                shown = op.step
                print(f"[{op.elapsed_s:6.1f} s] {op.kind}: {shown}", file=sys.stderr, flush=True)

    watcher = threading.Thread(target=watch, name="vladctl-progress", daemon=True)
    watcher.start()
    try:
        return call()
    finally:
        done.set()
        watcher.join(2.0)


def cmd_deploy(args: argparse.Namespace) -> int:
    """(pull ->) verify -> stage -> warm -> hot-swap on the running daemon (or refuse with the reason)."""
    from vlad.cli.fleet import release_folder

    with release_folder(args) as folder:
        r = with_progress(
            args,
            lambda: request(
                args,
                "deploy",
                max(args.timeout_ms, 120_000),
                path=str(folder.resolve()),
                who=operator(args.who),
                why=args.why,
                canary=args.canary,
                force=args.force,
            ),
        )
    extra = " as a canary (auto-rollback armed)" if r["canary"] else ""
    ev = r.get("evidence") or {}
    if ev.get("status") == "forced":
        extra += f"; gate evidence {ev['gate_evidence']}, forced (recorded)"
    print(f"deployed {r['release']}{extra}; previous {r['previous']}")
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    """One command back to the previous release: live on the daemon, else in the store."""
    try:
        # Is vlad there? Asked with the short --timeout-ms: with vlad down the store rollback
        # starts at once (it waited for the 2-minute rollback timeout before). A running
        # daemon that is slow to roll back is never bypassed: that timeout is an error.
        request(args, "ping")
    except DaemonUnreachable:
        entry = store(args).rollback(operator(args.who), args.why, force=args.force)
        print(
            f"vlad is not running: rolled the store back to {entry.to_release} (from {entry.from_release})"
            f"{entry.flags()}; it is served at the next start"
        )
        return 0
    r = request(args, "rollback", max(args.timeout_ms, 120_000), who=operator(args.who), why=args.why, force=args.force)
    if "aborted" in r:
        print(f"canary of {r['aborted']} aborted; serving {r['release']} again")
    else:
        print(f"rolled back to {r['release']} (from {r['rolled_back_from']})")
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    try:
        rows = request(args, "history")
    except DaemonUnreachable:
        from dataclasses import asdict

        rows = [asdict(e) for e in store(args).history()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no activations or rollbacks recorded")
    from vlad.cli.release import history_line
    from vlad.release.store import HistoryEntry

    for e in rows:
        print(history_line(HistoryEntry.from_record(e)))
    return 0


def cmd_shadow(args: argparse.Namespace) -> int:
    if args.shadow_command == "start":
        r = request(
            args,
            "shadow_start",
            max(args.timeout_ms, 120_000),
            path=str(Path(args.release).resolve()),
            tolerance=args.tolerance,
        )
        print(f"shadow run of {r['shadow']} started (tolerance {r['tolerance']:g}); its actions are never published")
        return 0
    r = request(args, "shadow_report" if args.shadow_command == "report" else "shadow_stop")
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    d = r["divergence"]
    lat = r["latency_ms"].get("e2e", {})
    print(f"shadow {r['release']} ({r['purpose']}), running {r['running_s']:.0f} s, {d['pairs']} chunks compared")
    print(
        f"  divergence: max abs {d['max_abs']:.4g}, mean abs {d['mean_abs']:.4g}, per joint max {d['per_joint_max_abs']},"
        f" beyond tolerance {100 * d['fraction_beyond_tolerance']:.2f} %"
    )
    if lat:
        print(f"  latency: sensor -> actions p50 {lat['p50']:.2f} ms, p99 {lat['p99']:.2f} ms")
    print(f"  faults: {r['faults']}")
    return 0


def add_daemon_commands(sub: Any) -> None:
    """Add the running-daemon commands to ``vladctl``'s subparsers."""
    from vlad.cli.fleet import add_registry_args
    from vlad.daemon.control import COMMANDS

    p = sub.add_parser("status", help=COMMANDS["status"].help)
    add_daemon_args(p)
    p.add_argument("--watch", action="store_true", help="live view, refreshed in place (Ctrl-C exits)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes with --watch")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("events", help=COMMANDS["events"].help)
    add_daemon_args(p)
    p.add_argument("--limit", type=int, default=50)
    p.set_defaults(func=cmd_events)

    p = sub.add_parser("deploy", help=COMMANDS["deploy"].help)
    add_daemon_args(p)
    p.add_argument("release", help="release folder (signed manifest), or an OCI reference host/repo@sha256:...")
    add_operator_args(
        p,
        force="allow missing or failed gate evidence or a deliberate downgrade (recorded with --why); "
        "never an integrity failure",
    )
    p.add_argument("--root", help="release store whose incoming/ and blobs/ a pull uses (default: the config's)")
    p.add_argument("--keys", help="trusted keys a pull verifies against (default: $VLAD_KEYS_DIR or the config's)")
    add_registry_args(p)
    p.add_argument(
        "--canary",
        action="store_true",
        help="watch it against the manifest's canary thresholds; crossing one rolls back automatically",
    )
    p.set_defaults(func=cmd_deploy)

    p = sub.add_parser("rollback", help="back to the previous release (live, or in the store when vlad is down)")
    add_daemon_args(p)
    p.add_argument("--root", help="release store (default: the config's store.root), when vlad is down")
    add_operator_args(p, force="return to a release without passing gate evidence or marked bad (recorded with --why)")
    p.set_defaults(func=cmd_rollback)

    p = sub.add_parser("history", help="activations and rollbacks with who and why")
    add_daemon_args(p)
    p.add_argument("--root", help="release store (default: the config's store.root), when vlad is down")
    p.set_defaults(func=cmd_history)

    p = sub.add_parser("shadow", help="run a candidate beside the serving policy without publishing it")
    shadow = p.add_subparsers(dest="shadow_command", metavar="COMMAND", required=True)
    q = shadow.add_parser("start", help=COMMANDS["shadow_start"].help)
    add_daemon_args(q)
    q.add_argument("release", help="release folder (signed manifest)")
    q.add_argument(
        "--tolerance", type=float, default=0.05, help="per-value abs error counted as beyond (contract units)"
    )
    for name in ("report", "stop"):
        q = shadow.add_parser(name, help=COMMANDS[f"shadow_{name}"].help)
        add_daemon_args(q)
    p.set_defaults(func=cmd_shadow)

    p = sub.add_parser("resume", help=COMMANDS["resume"].help)
    add_daemon_args(p)
    add_operator_args(p, why="why it is safe to use the policy again (recorded)")
    p.set_defaults(func=cmd_resume)
