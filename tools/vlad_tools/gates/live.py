"""Recording a running daemon through its tap (``vladctl record --out FILE``).

The daemon's status names its tap endpoint (:mod:`vlad.daemon.tap`). The recorder asks
for it over the control socket, subscribes, and writes every observation, action chunk,
status snapshot and event it receives into an MCAP file through
:class:`~vlad_tools.gates.recording.McapRecorder`, until ``seconds`` have passed since the first
message, ``max_bytes`` of message data are written, the file cannot be written (a full
disk), or it is interrupted. The file is what :func:`~vlad_tools.gates.recording.read_recording`,
``vladctl replay`` and the equivalence gate read.

The first events to arrive are the daemon's recent history (its last 100 events), sent
again each time a recorder subscribes; an event this recorder already holds (the same
monotonic time) is not written twice, and only those are left out (``events_repeated``
in the summary). A daemon whose allow list (``sockets.tap_subscribers``) does not admit
this user refuses it at the handshake: one line says so at once.

The daemon never waits for the recorder: what it could not queue is dropped and counted on
its side, what this recorder's own queue in the daemon's socket could not hold is lost to
this recorder alone; the recorder sees both as gaps in the tap's sequence numbers and
writes them into the recording's summary (``daemon_dropped``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vlad_tools.gates.recording import McapRecorder
from vlad_tools.gates.results import GateError

Progress = Callable[[str], None]
POLL_MS = 200
# Most items the tap socket buffers for this recorder (the daemon's side has its own bound).
RCVHWM = 10_000


def record_daemon(
    control: str,
    out: str | Path,
    *,
    seconds: float = 60.0,
    max_bytes: int = 100 * 2**20,
    curve: tuple[bytes, bytes, bytes] | None = None,
    timeout_ms: int = 2000,
    progress: Progress | None = None,
    stop: Callable[[], bool] = lambda: False,
) -> dict[str, Any]:
    """Record the daemon answering on ``control`` into ``out``; returns the recorder's
    stats plus ``daemon_dropped`` and ``tap`` (the endpoint). :class:`GateError` when the
    daemon has no tap; :class:`~vlad.errors.DaemonUnreachable` when it does not answer."""
    import zmq

    from vlad.client import apply_curve, control_request

    ctx: zmq.Context = zmq.Context.instance()
    status = control_request(ctx, control, "status", timeout_ms, curve=curve)
    tap = (status.get("tap") or {}).get("endpoint")
    if not tap:
        raise GateError(
            "the daemon has no recording tap: set sockets.tap (it is off, or the control endpoint is tcp://) "
            "and restart vlad"
        )
    meta = {"release": status.get("release", ""), "daemon_pid": status.get("pid", ""), "control": control}
    rec = McapRecorder(out, max_bytes=max_bytes, max_seconds=seconds, tap="daemon", metadata=meta)
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, RCVHWM)
    say = progress or (lambda line: None)
    gaps = last_seq = malformed = repeated = 0
    events: set[int] = set()  # the monotonic times of the events recorded (the history comes again)
    first: float | None = None
    shown = time.monotonic()
    # The daemon's allow list refuses at the handshake: say so instead of waiting for nothing.
    refused = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
    try:
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(refused, zmq.POLLIN)
        apply_curve(sock, tap, curve)
        sock.connect(tap)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        say(f"recording {status.get('release')} from {tap} into {out} (up to {seconds:g} s, {max_bytes} bytes)")
        while not stop() and rec.stop_reason is None:
            now = time.monotonic()
            if first is not None and now - first > seconds:
                break
            if first is None and now - shown > 5 * timeout_ms / 1000:
                raise GateError(f"nothing came from the tap {tap} (is a controller sending observations?)")
            if now - shown >= 1.0 and first is not None:
                shown = now
                st = rec.stats()
                say(
                    f"  {now - first:5.1f} s: {st['observations']} observations, {st['actions']} chunks, "
                    f"{st['states']} states, {st['events']} events, {st['bytes'] / 2**20:.1f} MiB; "
                    f"dropped {st['dropped']} here, {gaps} by the daemon"
                )
            ready = dict(poller.poll(POLL_MS))
            if refused in ready:
                raise GateError(
                    f"the daemon refused this recorder at {tap}: its user is not in sockets.tap_subscribers "
                    "(by default only the daemon's own user and root may record)"
                )
            if sock not in ready:
                continue
            frames = sock.recv_multipart()
            if len(frames) < 4 or len(frames[1]) != 8 or len(frames[2]) != 8:
                malformed += 1
                continue
            kind, t_ns, seq = frames[0], int.from_bytes(frames[1], "little"), int.from_bytes(frames[2], "little")
            if last_seq and seq > last_seq + 1:
                gaps += seq - last_seq - 1
            last_seq = max(last_seq, seq)
            if first is None:
                first = time.monotonic()
                shown = first
            if kind == b"obs":
                rec.observation(frames[3:], t_ns)
            elif kind == b"act":
                rec.actions(frames[3:], t_ns)
            elif kind in (b"status", b"event"):
                try:
                    doc = json.loads(frames[3])
                except (ValueError, RecursionError):
                    malformed += 1
                    continue
                if kind == b"status":
                    rec.state(doc, t_ns)
                elif t_ns in events:  # the history again, for a recorder that attached after this one
                    repeated += 1
                else:
                    events.add(t_ns)
                    rec.event(doc, t_ns)
            else:
                malformed += 1
    finally:
        sock.disable_monitor()
        refused.close(0)
        sock.close(0)
        stats = rec.close(summary={"daemon_dropped": gaps, "malformed": malformed, "events_repeated": repeated})
    return {**stats, "daemon_dropped": gaps, "malformed": malformed, "events_repeated": repeated, "tap": tap}
