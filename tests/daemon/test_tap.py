"""The recording tap against the real daemon (subprocess, real sockets) and, for its queue's
bounds, in process on a real XPUB (issue 33, section 3.7).

Each recorder is independent: another subscriber leaving or stalling never stops or thins
a recorder's stream; a stalled one costs the daemon a bounded amount of memory, measured
as the daemon's resident set; subscription churn is logged a few times, not per change;
every recorder starts with the event history; only the allow list may subscribe.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgpack
import pytest
import zmq

from tests.conftest import ROOT
from vlad.daemon.tap import LOG_BURST, RECORDER_BYTES, Tap
from vlad_tools.testing import ControllerSim, load_golden, start_daemon, wait_until

VLADCTL = [sys.executable, "-m", "vlad.cli"]


class Recorder:
    """A SUB on the tap that reads everything as it comes, counting messages and seq gaps."""

    def __init__(self, ctx: zmq.Context, endpoint: str, topic: bytes = b"") -> None:
        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, 100_000)
        self.sock.connect(endpoint)
        self.sock.setsockopt(zmq.SUBSCRIBE, topic)
        self.received = 0
        self.gaps = 0
        self.kinds: list[bytes] = []
        self._last = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-recorder", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.sock.poll(20):
                continue
            frames = self.sock.recv_multipart()
            seq = int.from_bytes(frames[2], "little")
            if self._last and seq > self._last + 1:
                self.gaps += seq - self._last - 1
            self._last = max(self._last, seq)
            self.kinds.append(frames[0])
            self.received += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close(0)


def stalled(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    """A subscriber that never reads (its own queue: one message and 4 KiB of socket buffer)."""
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 1)
    sock.setsockopt(zmq.RCVBUF, 4096)
    sock.connect(endpoint)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    return sock


def flood(ctx: zmq.Context, d, client, messages: int, frames: list[bytes]) -> int:
    """``messages`` copies of ``frames`` on the observation socket at about 1000/s (refused
    by the intake, offered to the tap first). Returns how many of them the daemon read, once
    it has read them all or its count of refusals stopped growing for two seconds: on a busy
    machine ZeroMQ drops what the daemon's receive queue cannot hold before the daemon sees
    it. Counted by the intake's refusals, which only the flood causes (the fixture's
    controller keeps sending accepted messages meanwhile)."""
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.setsockopt(zmq.SNDHWM, messages + 100)
    pub.connect(d.endpoints["observations"])
    try:
        start = client.status()["counters"]["input_rejected"]
        # The daemon's subscription reaches this PUB a moment after the connect: probe until
        # one message arrives, then send the flood whole.
        wait_until(
            lambda: pub.send_multipart(frames, copy=False) or client.status()["counters"]["input_rejected"] > start,
            10,
            "the daemon reading the flood's connection",
            poll=0.01,
        )
        start = client.status()["counters"]["input_rejected"]
        for i in range(messages):
            pub.send_multipart(frames, copy=False)
            if i % 10 == 9:
                time.sleep(0.01)  # paces the flood at about 1000 messages/s, a burst the tap forwards whole
        read, since, deadline = -1, time.monotonic(), time.monotonic() + 60
        while time.monotonic() < deadline:
            now = client.status()["counters"]["input_rejected"] - start
            if now >= messages:
                return now
            if now != read:
                read, since = now, time.monotonic()
            elif time.monotonic() - since > 2.0:
                return read
            time.sleep(0.05)
        raise AssertionError(f"the daemon still reading the flood after 60 s ({read} of {messages})")
    finally:
        pub.close(0)


def junk(frame_bytes: int, frames: int) -> list[bytes]:
    """An observation-socket message of ``frames`` frames: topic, header, tensors of ``frame_bytes``."""
    header = msgpack.packb({"v": 1, "kind": "obs", "seq": 1, "t_sensor_ns": 1})
    return [b"obs", header] + [bytes(frame_bytes)] * (frames - 2)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tap")
    d = start_daemon(tmp, extra=["--set", "serve.warmup=3"])
    client = d.client()
    ctl = ControllerSim(client, load_golden()[0]).start()
    ctx = zmq.Context()
    try:
        yield d, client, ctx
    finally:
        ctl.stop()
        client.close()
        d.stop()
        ctx.term()
    assert "Traceback" not in d.log(), d.log()


def unsubscribed(client) -> None:
    """Wait until the sockets an earlier test closed have left the tap."""
    wait_until(lambda: not client.status()["tap"]["subscribed"], 10, "the tap without subscribers", poll=0.02)


def test_another_subscriber_leaving_does_not_stop_a_recording(served):
    """A recorder of everything, and a second subscriber (to ``status`` only) that comes and
    goes: the first one's stream goes on at the controller's rate, whole."""
    d, client, ctx = served
    unsubscribed(client)
    tap = client.status()["tap"]["endpoint"]
    rec = Recorder(ctx, tap)
    try:
        wait_until(lambda: rec.received > 0, 10, "the recorder's first messages")
        other = Recorder(ctx, tap, topic=b"status")
        wait_until(lambda: other.received > 0, 10, "a status for the second subscriber")
        other.close()
        # The controller's observations, heartbeats and chunks come at 150/s: 2 s of them.
        before = rec.received
        wait_until(lambda: rec.received >= before + 300, 6, "300 more messages for the first recorder")
        assert rec.gaps == 0
    finally:
        rec.close()


def test_a_stalled_subscriber_does_not_starve_another(served):
    """A subscriber that never reads, and a flood of 3000 small messages through the tap
    (more than its queue, the socket buffers and libzmq's default 1000 together): the other
    recorder keeps getting every message."""
    d, client, ctx = served
    unsubscribed(client)
    tap = client.status()["tap"]["endpoint"]
    slow = stalled(ctx, tap)
    rec = None
    try:
        wait_until(lambda: client.status()["tap"]["subscribed"], 10, "the stalled subscription", poll=0.02)
        rec = Recorder(ctx, tap)
        wait_until(lambda: rec.received > 0, 10, "the recorder's first messages")
        flood(ctx, d, client, 3000, junk(16, 3))
        before = rec.received
        wait_until(lambda: rec.received >= before + 100, 5, "100 more messages after the flood")
        assert rec.gaps == 0, (rec.gaps, client.status()["tap"])
    finally:
        slow.close(0)
        if rec is not None:
            rec.close()


def test_a_stalled_subscriber_costs_a_bounded_amount_of_memory(served):
    """A subscriber that never reads, then floods of multi-frame messages: 300 of 16 frames
    of 64 KiB (1 MiB, larger than any legal observation of the demo contract: not queued)
    and 1500 of 8 frames of 9 KiB (54 KiB, legal size: its queue holds about 16 MiB of them).
    The daemon's resident set, the stalled subscriber still connected, grows by less than
    RECORDER_BYTES and 16 MiB of slack (allocator, receive buffers)."""
    d, client, ctx = served
    unsubscribed(client)
    slow = stalled(ctx, client.status()["tap"]["endpoint"])
    try:
        wait_until(lambda: client.status()["tap"]["subscribed"], 10, "the stalled subscription", poll=0.02)
        rss0 = rss_mib(d.pid)
        dropped0 = client.status()["tap"]["dropped"]["observations"]
        large = flood(ctx, d, client, 300, junk(64 * 2**10, 16))
        # every oversized message the daemon read was dropped by the tap, none queued
        assert large >= 30 and client.status()["tap"]["dropped"]["observations"] - dropped0 >= large
        assert flood(ctx, d, client, 1500, junk(9 * 2**10, 8)) >= 300  # more than the tap's queue holds
        grown = rss_mib(d.pid) - rss0
        assert grown < RECORDER_BYTES / 2**20 + 16, f"the daemon's RSS grew by {grown:.0f} MiB"
    finally:
        slow.close(0)


def test_subscription_churn_is_logged_a_few_times(served):
    """200 subscribe/unsubscribe toggles, then a subscription that gets its first message
    (so the daemon has seen every toggle before it): a few log lines, not one per toggle."""
    d, client, ctx = served
    lines = d.log().count("tap: ")
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(client.status()["tap"]["endpoint"])
    try:
        for i in range(200):
            (sock.subscribe if i % 2 == 0 else sock.unsubscribe)(b"")
        sock.subscribe(b"")
        assert sock.poll(10_000), "no message after the toggles"
    finally:
        sock.close(0)
    # A minute's window may end during the toggles: its summary line and the next window's burst.
    assert d.log().count("tap: ") - lines <= 2 * LOG_BURST + 1


def _record(d, out: Path, seconds: float = 1.0) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*VLADCTL, "record", "--out", str(out), "--seconds", str(seconds), "--endpoint", d.endpoints["control"]],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def test_every_recorder_starts_with_the_event_history_and_keeps_each_event_once(served, tmp_path):
    """Two recordings one after the other both hold the daemon's start (its transition to
    ACTIVE); a subscriber arriving during a recording that already got the history makes the
    tap send it again, and the recording still holds each event once."""
    from vlad_tools.gates.recording import read_recording

    d, client, ctx = served
    for name in ("first", "second"):
        proc = _record(d, tmp_path / f"{name}.mcap")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        events = read_recording(tmp_path / f"{name}.mcap").events
        assert any(e["kind"] == "transition" and e["state_to"] == "ACTIVE" for _, e in events), (name, events)

    out = tmp_path / "third.mcap"
    unsubscribed(client)
    recording = subprocess.Popen(
        [*VLADCTL, "record", "--out", str(out), "--seconds", "3", "--endpoint", d.endpoints["control"]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        # Its first progress line (after 1 s) counts the history it got.
        assert recording.stderr is not None
        for line in recording.stderr:
            if re.search(r"[1-9]\d* events", line):
                break
        late = Recorder(ctx, client.status()["tap"]["endpoint"])
        wait_until(lambda: b"event" in late.kinds, 10, "the history for the late subscriber")
        late.close()
        stdout, stderr = recording.communicate(timeout=60)
    finally:
        recording.kill()
    assert recording.returncode == 0, stdout + stderr
    rec = read_recording(out)
    times = [t for t, _ in rec.events]
    assert len(times) == len(set(times)) and times, rec.events
    assert int(rec.metadata["vlad.recording.summary"]["events_repeated"]) >= 1


def test_only_the_allow_list_may_subscribe(tmp_path):
    """With ``sockets.tap_subscribers`` naming another user, this user's recorder is refused
    at the handshake: ``vladctl record`` says so in one line, the daemon counts it."""
    d = start_daemon(tmp_path, extra=["--set", "serve.warmup=3", "--set", "sockets.tap_subscribers=['uid:4242']"])
    client = d.client()
    try:
        t0 = time.monotonic()
        proc = _record(d, tmp_path / "refused.mcap")
        assert proc.returncode == 2, proc.stdout + proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert "Traceback" not in proc.stderr and "refused this recorder" in lines[-1], proc.stderr
        assert time.monotonic() - t0 < 10  # said at once, not after waiting for messages
        rejected = client.status()["counters"]["rejected"]
        assert rejected.get("unauthorized_tap", 0) >= 1, rejected
        assert not client.status()["tap"]["subscribed"]
    finally:
        client.close()
        d.stop()
    assert "Traceback" not in d.log(), d.log()


def test_the_queue_is_bounded_in_bytes_for_multi_frame_messages(tmp_path):
    """In process, on a real XPUB: the tap's thread stopped with a recorder subscribed,
    multi-frame observations are queued up to the observation budget, counting every frame,
    and the rest are dropped and counted."""
    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.bind(f"ipc://{tmp_path}/tap")
    tap = Tap(pub, f"ipc://{tmp_path}/tap", largest_observation=2**20)
    tap.start()
    sub = ctx.socket(zmq.SUB)
    sub.connect(f"ipc://{tmp_path}/tap")
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    try:
        wait_until(lambda: tap.subscribed, 10, "the recorder's subscription", poll=0.01)
        tap.stop()  # nothing is sent from now on: what is offered stays queued or is dropped
        message = [b"obs", b"h"] + [bytes(64 * 2**10)] * 15  # 15 tensors of 64 KiB: just under 1 MiB
        size = sum(map(len, message))
        offered = 200
        for i in range(offered):
            tap.observation(message, i)
        queued = tap.queued_bytes()
        assert queued <= tap.budget[0] and queued == (offered - tap.dropped["observations"]) * size
        assert tap.dropped["observations"] == offered - tap.budget[0] // size
        tap.observation([b"obs", b"h", bytes(2**20)], 0)  # larger than any legal observation
        assert tap.dropped["observations"] == offered - tap.budget[0] // size + 1
        st = tap.status()  # the status's typed part: the same figures
        assert st.subscribed and st.queue_bytes == sum(tap.budget) and st.queue_items == tap.max_items
        assert st.dropped == dict(tap.dropped) and st.endpoint == f"ipc://{tmp_path}/tap"
    finally:
        sub.close(0)
        pub.close(0)
        ctx.term()
