"""``vladctl status --watch``: a live view of the daemon in a terminal, plain ANSI, 80 columns.

Redrawn in place every ``--interval`` seconds: cursor home, then each line erased and
rewritten, then the rest of the screen erased, so a shorter frame leaves no leftovers. A
frame never has more lines than the terminal (24 when it is not one): the header and the
state always stay on screen, and what does not fit is cut to a count ("+3 more findings").
No curses: it works over a serial console, ssh and tmux alike. When the daemon does not
answer, the last line says so and the view keeps retrying. Ctrl-C exits 0; SIGTERM and
SIGHUP exit 128+N; every way out shows the cursor again.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from vlad.cli.daemon import endpoint_summary, remote_summary
from vlad.errors import ClientError, DaemonUnreachable
from vlad.health.state import Event
from vlad.snapshot import Percentiles, StatusSnapshot, StatusUnreadable, parse_events, parse_status

WIDTH = 80
HEIGHT = 24  # when the output is not a terminal
# In pipeline order, the end-to-end total last; "transport" first so that its nine letters
# follow the "latency " label rather than another column.
STAGES = ("transport", "queue", "preprocess", "engine", "decode", "guard", "publish", "e2e")
HOME, ERASE_LINE, ERASE_BELOW, HIDE, SHOW = "\x1b[H", "\x1b[K", "\x1b[J", "\x1b[?25l", "\x1b[?25h"
# The least the sections below the top get when there is room: one finding (or its count),
# the latency grid, and the newest event.
LATENCY_LINES = 3


def render(
    st: StatusSnapshot | None,
    events: list[Event],
    error: str | None,
    endpoint: str,
    now: float,
    width: int = WIDTH,
    height: int = HEIGHT,
) -> list[str]:
    """The frame's lines: at most ``height`` of them, each at most ``width`` characters.

    The top lines (header, state, release, fallback, backend, remote link, rates) come
    first and are cut last; then the findings, the latency grid and the newest events
    share what is left, findings first. The error line, when there is one, is the last.
    """
    clock = time.strftime("%H:%M:%S", time.localtime(now))
    foot = [error if st is None else f"{error} (above: last known state)"] if error else []
    if st is None:
        top = [f"vlad  {endpoint}  {clock}"]
        return [_fit(line, width) for line in (top + foot)[: max(1, height)]]
    top = _top(st, clock)
    room = max(0, height - len(foot))
    if len(top) >= room:  # a tiny terminal: the header and the state first, the error kept
        return [_fit(line, width) for line in (top[: max(1, room)] + foot)[: max(1, height)]]
    room -= len(top)
    findings = [f"{f.severity:<8} {f.message}" for f in st.findings]
    latency = _latency(st.latency_ms, width)
    # Findings first (what is wrong now), keeping room for the latency grid and one event.
    shown = _cut(findings, max(1, room - LATENCY_LINES - 2), "findings (vladctl status lists all)")
    room -= len(shown)
    middle = shown
    if room >= len(latency):
        middle += latency
        room -= len(latency)
    if room >= 2 and events:
        recent = [_event(e) for e in events[-(room - 1) :]]
        middle += ["events", *recent]
    return [_fit(line, width) for line in top + middle + foot]


def _top(st: StatusSnapshot, clock: str) -> list[str]:
    """Header, state, release, fallback, backend, remote links, rates, counts, the endpoints."""
    estop = f"ENGAGED ({st.estop.source or 'safety system'})" if st.estop.engaged else "released"
    lines = [
        f"vlad {st.version}  pid {st.pid}  up {_dur(st.uptime_s)}  {clock}",
        f"state    {st.state} for {_dur(st.state_since_s)}   e-stop {estop}",
        f"release  {st.release}",
    ]
    if st.on_fallback:
        quarantined = st.quarantined
        why = f"; quarantined: {', '.join(f'{k} ({v})' for k, v in quarantined.items())}" if quarantined else ""
        lines.append(f"serving  {st.serving} (fallback{why})")
    op = st.operation
    if op:
        lines.append(f"op       {op.kind} {op.target} {_dur(op.elapsed_s)}: {op.step}")
    b = st.backend
    lines.append(f"backend  {b.name} ({b.runtime}, {b.device})")
    links = st.remote_links()
    for pid, s in links[:2]:
        lines.append("remote   " + remote_summary(pid, s, compact=True))
    if len(links) > 2:
        lines.append(f"remote   +{len(links) - 2} more remote links (vladctl status)")
    r = st.rates
    lines.append(
        f"rates    {r.observations_hz:.1f} obs/s   {r.actions_hz:.1f} actions/s   period {st.control_period_ms:g} ms"
    )
    c = st.counters
    lines.append(
        f"counts   published {c.published}  holds {c.published_hold}  "
        f"stale {c.stale}  rejected {sum(c.rejected.values())}  "
        f"misses {c.deadline_misses}"
    )
    o = st.openpi
    if o and o.running:
        lat_o = o.infer_ms
        lines.append(
            f"openpi   {o.clients} client(s)  replies {o.replies}  errors {sum(o.errors.values())}"
            + (f"  p50 {lat_o.p50:.1f} ms  p99 {lat_o.p99:.1f} ms" if lat_o else "")
            + (f"  restarts {o.restarts}" if o.restarts else "")
        )
    elif o:
        lines.append(f"openpi   {endpoint_summary(o, compact=True)}")
    m = st.metrics
    if m and (not m.running or m.restarts):
        lines.append(f"metrics  {endpoint_summary(m, compact=True)}")
    return lines


def _latency(lat: Mapping[str, Percentiles], width: int) -> list[str]:
    """The stages' p50 and p99 as three lines: stage names over their two figures (9 columns
    each; ``preprocess`` shows as ``preproc``)."""
    stages = [s for s in STAGES if s in lat] + [s for s in lat if s not in STAGES]
    if not stages:
        return ["latency  (no policy chunk published yet)"]
    stages = stages[: max(1, (width - 8) // 9)]
    names = {"preprocess": "preproc"}
    lines = [f"{'latency':<8}" + "".join(f"{names.get(s, s)[:9]:>9}" for s in stages)]
    lines.append("  p50 ms" + "".join(f"{_ms(lat[s].p50):>9}" for s in stages))
    lines.append("  p99 ms" + "".join(f"{_ms(lat[s].p99):>9}" for s in stages))
    return lines


def _event(e: Event) -> str:
    when = time.strftime("%H:%M:%S", time.localtime(e.time))
    what = f"{e.state_from}->{e.state_to}" if e.is_transition else e.kind
    return f"  {when} {what}: {e.reason}"


def _cut(lines: list[str], room: int, what: str) -> list[str]:
    """``lines`` in at most ``room`` lines; when they do not all fit, the last says how many more."""
    if len(lines) <= room:
        return lines
    if room <= 0:
        return []
    return lines[: room - 1] + [f"         +{len(lines) - room + 1} more {what}"]


def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 100 else f"{v:.0f}"


def _fit(line: str, width: int = WIDTH) -> str:
    line = line.replace("\n", " ").replace("\r", " ").replace("\t", " ")
    return line if len(line) <= width else line[: width - 1] + "…"


def _dur(seconds: float) -> str:
    s = int(seconds)
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    return f"{s // 3600} h {s % 3600 // 60} min"


def frame_text(frame: list[str], height: int) -> str:
    """The bytes that draw ``frame`` in place. Each line is erased before it is written (an
    erase right after a full-width line would clear its last character), and no newline
    follows the last line of a full screen: it would scroll the header off."""
    text = HOME + "\r\n".join(ERASE_LINE + line for line in frame)
    if len(frame) < height:
        text += "\r\n" + ERASE_BELOW
    return text


class _Signalled(BaseException):  # like KeyboardInterrupt: no `except Exception` swallows it
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_signalled(signum: int, frame: object) -> None:
    raise _Signalled(signum)


def _terminal_size(out: TextIO) -> tuple[int, int]:
    try:
        size = os.get_terminal_size(out.fileno())
        return min(WIDTH, size.columns), size.lines
    except (OSError, ValueError, AttributeError):  # not a terminal (a pipe, a test's buffer)
        return WIDTH, HEIGHT


def watch(args: argparse.Namespace, request: Callable[..., Any], endpoint: str, out: TextIO = sys.stdout) -> int:
    """Refresh until Ctrl-C (exit 0), SIGTERM or SIGHUP (exit 128+N); the cursor is shown
    again on every way out. ``request(args, cmd, timeout_ms, **kw)`` is vladctl's."""
    interval = max(0.1, args.interval)
    timeout_ms = min(args.timeout_ms, max(200, int(interval * 1000)))
    args.endpoint = endpoint  # resolved once: the config is not re-read every refresh
    st: StatusSnapshot | None = None
    events: list[Event] = []
    previous = {sig: signal.signal(sig, _raise_signalled) for sig in (signal.SIGTERM, signal.SIGHUP)}
    code = 0
    try:
        out.write(HIDE + "\x1b[2J")
        while True:
            error = None
            try:
                st = parse_status(request(args, "status", timeout_ms))
                events = parse_events(request(args, "events", timeout_ms, limit=20))
            except DaemonUnreachable:  # show the last known state above this line
                error = f"daemon unreachable at {endpoint}; retrying every {interval:g} s"
            except (ClientError, StatusUnreadable) as exc:  # an error answer, another vlad version's status
                error = str(exc)
            width, height = _terminal_size(out)
            out.write(frame_text(render(st, events, error, endpoint, time.time(), width, height), height))
            out.flush()
            time.sleep(interval)
    except KeyboardInterrupt:
        code = 0
    except _Signalled as exc:
        code = 128 + exc.signum
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        try:
            out.write(SHOW + "\r\n")
            out.flush()
        except OSError:  # the terminal is gone (SIGHUP after a hang-up): nothing to restore
            pass
    return code
