"""``vladctl status --watch``: a live view of the daemon in a terminal, plain ANSI, 80 columns.

Redrawn in place every ``--interval`` seconds: cursor home, each line followed by
erase-to-end-of-line, then erase-below, so a shorter frame leaves no leftovers and nothing
scrolls. No curses: it works over a serial console, ssh and tmux alike. When the daemon
does not answer, the last line says so and the view keeps retrying; Ctrl-C restores the
cursor and exits 0.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from vlad.errors import ClientError, DaemonUnreachable

WIDTH = 80
STAGES = ("e2e", "transport", "queue", "preprocess", "engine", "decode", "guard", "publish")
HOME, ERASE_LINE, ERASE_BELOW, HIDE, SHOW = "\x1b[H", "\x1b[K", "\x1b[J", "\x1b[?25l", "\x1b[?25h"


def render(
    st: dict[str, Any] | None, events: list[dict[str, Any]], error: str | None, endpoint: str, now: float
) -> list[str]:
    """The frame's lines (each at most WIDTH characters)."""
    clock = time.strftime("%H:%M:%S", time.localtime(now))
    lines = []
    if st is None:
        lines.append(f"vlad  {endpoint}  {clock}")
    else:
        lines.append(f"vlad {st['version']}  pid {st['pid']}  up {_dur(st['uptime_s'])}  {clock}")
        est = st.get("estop", {})
        estop = f"ENGAGED ({est.get('source') or 'safety system'})" if est.get("engaged") else "released"
        lines.append(f"state    {st['state']} for {_dur(st['state_since_s'])}   e-stop {estop}")
        lines.append(f"release  {st['release']}")
        serving = st.get("serving", "")
        if serving and not serving.startswith("release:"):
            lines.append(f"serving  {serving} (fallback)")
        b = st["backend"]
        lines.append(f"backend  {b['name']} ({b['runtime']}, {b['device']})")
        r = st["rates"]
        lines.append(
            f"rates    {r['observations_hz']:.1f} obs/s   {r['actions_hz']:.1f} actions/s   "
            f"period {st['control_period_ms']:g} ms"
        )
        c = st["counters"]
        lines.append(
            f"counts   published {c.get('published', 0)}  holds {c.get('published_hold', 0)}  "
            f"stale {c.get('stale', 0)}  rejected {sum(c.get('rejected', {}).values())}  "
            f"misses {c.get('deadline_misses', 0)}"
        )
        o = st.get("openpi")
        if o:
            lat_o = o.get("infer_ms", {})
            lines.append(
                f"openpi   {o['clients']} client(s)  replies {o.get('replies', 0)}  "
                f"errors {sum(o['errors'].values())}"
                + (f"  p50 {lat_o['p50']:.1f} ms  p99 {lat_o['p99']:.1f} ms" if lat_o else "")
            )
        for f in st.get("findings", [])[:3]:
            lines.append(f"{f['severity']:<8} {f['message']}")
        lat = st.get("latency_ms", {})
        lines.append("latency  stage           p50 ms     p99 ms      count")
        for stage in STAGES:
            v = lat.get(stage)
            if v:
                lines.append(f"         {stage:<12} {v['p50']:9.3f}  {v['p99']:9.3f}  {v['count']:9d}")
        if not lat:
            lines.append("         (no policy chunk published yet)")
        lines.append("events")
        for e in events[-5:]:
            when = time.strftime("%H:%M:%S", time.localtime(e["time"]))
            what = f"{e['state_from']}->{e['state_to']}" if e["state_from"] != e["state_to"] else e["kind"]
            lines.append(f"  {when} {what}: {e['reason']}")
    if error:
        lines.append(error if st is None else f"{error} (above: last known state)")
    return [_fit(line) for line in lines]


def _fit(line: str) -> str:
    line = line.replace("\n", " ")
    return line if len(line) <= WIDTH else line[: WIDTH - 1] + "…"


def _dur(seconds: float) -> str:
    s = int(seconds)
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    return f"{s // 3600} h {s % 3600 // 60} min"


def watch(args: argparse.Namespace, request: Callable[..., Any], endpoint: str, out: TextIO = sys.stdout) -> int:
    """Refresh until Ctrl-C (exit 0). ``request(args, cmd, timeout_ms, **kw)`` is vladctl's."""
    interval = max(0.1, args.interval)
    timeout_ms = min(args.timeout_ms, max(200, int(interval * 1000)))
    st: dict[str, Any] | None = None
    events: list[dict[str, Any]] = []
    out.write(HIDE + "\x1b[2J")
    try:
        while True:
            error = None
            try:
                st = request(args, "status", timeout_ms)
                events = request(args, "events", timeout_ms, limit=5)
            except DaemonUnreachable:  # show the last known state above this line
                error = f"daemon unreachable at {endpoint}; retrying every {interval:g} s"
            except ClientError as exc:
                error = str(exc)
            frame = render(st, events, error, endpoint, time.time())
            out.write(HOME + "".join(line + ERASE_LINE + "\r\n" for line in frame) + ERASE_BELOW)
            out.flush()
            time.sleep(interval)
    except KeyboardInterrupt:
        return 0
    finally:
        out.write(SHOW + "\r\n")
        out.flush()
