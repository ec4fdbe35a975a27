"""Recording a running daemon through its tap, and replaying the recording through a candidate.

The real daemon (subprocess, real sockets), a simulated controller at 50 Hz, ``vladctl
record`` as its own process. The tap's bounds are checked in process: a recorder that
never reads costs the daemon nothing but counted drops.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.conftest import ROOT
from vlad_tools.testing import DEMO, PERIOD_S, ControllerSim, load_golden, max_gap, start_daemon, wait_until

VLADCTL = [sys.executable, "-m", "vlad.cli"]


@pytest.fixture()
def served(tmp_path):
    d = start_daemon(tmp_path, extra=["--set", "serve.warmup=3"])
    client = d.client()
    ctl = ControllerSim(client, load_golden()[0]).start()
    try:
        yield d, client, ctl
    finally:
        ctl.stop()
        client.close()
        d.stop()
    assert "Traceback" not in d.log(), d.log()


def test_record_a_live_daemon_and_replay_it_through_a_candidate(served, tmp_path, contract, tokenizer):
    from vlad.plugins import get_backend
    from vlad_tools.gates.recording import read_recording
    from vlad_tools.gates.replay import replay

    d, client, ctl = served
    out = tmp_path / "live.mcap"
    proc = subprocess.run(
        [*VLADCTL, "record", "--out", str(out), "--seconds", "3", "--endpoint", d.endpoints["control"]],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"wrote {out}:" in proc.stdout and "recording vlad-demo-reacher@1.0.0 from ipc://" in proc.stderr
    st = client.status()
    assert st["tap"]["endpoint"] == f"ipc://{tmp_path}/run/tap" and st["tap"]["sent"] > 0
    # The recorder gone, the daemon stops offering anything to the tap.
    wait_until(lambda: not client.status()["tap"]["subscribed"], 10, "the tap unsubscribed", poll=0.05)

    rec = read_recording(out)
    info = rec.metadata["vlad.recording"]
    assert info["tap"] == "daemon" and info["release"] == "vlad-demo-reacher@1.0.0"
    # About 3 s at 50 Hz (the first and last period may fall either side of the limit).
    assert 130 <= len(rec.observations) <= 160 and len(rec.chunk_for()) >= 110
    assert len(rec.states) >= 2 and rec.states[-1][1]["release"] == "vlad-demo-reacher@1.0.0"
    assert any(e["kind"] == "transition" and e["state_to"] == "ACTIVE" for _, e in rec.events)
    assert rec.metadata["vlad.recording.summary"]["daemon_dropped"] == "0"

    # Replayed through the same release it reproduces what the controller received.
    ort = get_backend("onnxruntime").load(DEMO / "policy.onnx", contract, {"intra_op_threads": 1})
    try:
        d2 = replay(rec, ort, contract, tokenizer).to_dict()
    finally:
        ort.close()
    # The first second's chunks may continue one sent before the recording: references only.
    assert d2["chunks_warmup"] >= 40 and d2["chunks_compared"] >= 70
    assert max(d2["vs_recorded_max_abs_per_joint"]) < 1e-4 and d2["intervention_flips_vs_recorded"] == 0
    # And the replay command takes it, as the equivalence gate's recordings do.
    proc = subprocess.run(
        [*VLADCTL, "replay", str(out), "--release", str(DEMO), "--limit", "20"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0 and "replayed 20 observations" in proc.stdout, proc.stdout + proc.stderr


def _record(d, out, *, seconds: float = 2.0, wrap: list[str] | None = None, timeout: float = 60):
    return subprocess.run(
        [*(wrap or []), *VLADCTL, "record", "--out", str(out), "--seconds", str(seconds)]
        + ["--endpoint", d.endpoints["control"]],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def test_record_refuses_an_out_that_is_a_symlink_or_a_fifo(served, tmp_path):
    """``--out`` naming a symbolic link (its target untouched) or a FIFO nobody reads (a
    plain open would wait for ever): exit 2 at once, one line."""
    d, client, ctl = served
    target = tmp_path / "precious"
    target.write_text("keep me")
    (tmp_path / "link.mcap").symlink_to(target)
    os.mkfifo(tmp_path / "fifo.mcap")
    for name, kind in (("link.mcap", "a symbolic link"), ("fifo.mcap", "a FIFO")):
        proc = _record(d, tmp_path / name, timeout=30)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stderr.strip().splitlines()[-1] == f"error: {tmp_path / name}: {kind}; refusing to write to it"
        assert "Traceback" not in proc.stderr
    assert target.read_text() == "keep me"


def test_a_full_disk_ends_the_recording_with_one_line_and_keeps_what_was_written(served, tmp_path):
    """``vladctl record`` onto a 384 KiB tmpfs (mounted in a private user and mount namespace):
    the disk fills within seconds (the demo records about 85 KiB/s, in zstd chunks of about
    130 KiB); one line says so, exit 2, and the file (copied out before the namespace goes) is
    readable, with what was written before."""
    from vlad_tools.gates.recording import read_recording

    if shutil.which("unshare") is None or subprocess.run(["unshare", "-Urm", "true"]).returncode != 0:
        pytest.skip("needs unshare -Urm (user and mount namespaces) to mount a small tmpfs")
    d, client, ctl = served
    disk = tmp_path / "disk"
    disk.mkdir()
    out, kept = disk / "rec.mcap", tmp_path / "kept.mcap"
    script = f'mount -t tmpfs -o size=384k tmpfs {disk} && "$@"; rc=$?; cp {out} {kept}; exit $rc'
    proc = _record(d, out, seconds=60, wrap=["unshare", "-Urm", "sh", "-c", script, "sh"])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {out}: cannot write (No space left on device); recording stopped, the "), last
    assert last.endswith(" messages written before it are kept, readable") and "Traceback" not in proc.stderr
    rec = read_recording(kept)
    assert rec.observations and rec.chunks, rec.metadata
    assert "No space left on device" in rec.metadata["vlad.recording.summary"]["stop_reason"]


def test_a_recorder_that_never_reads_costs_serving_nothing(served, tmp_path):
    """Subscribed and never reading: the controller keeps its cadence while the tap sends
    well past what that recorder's own queue holds (the rest is lost to it alone)."""
    import zmq

    d, client, ctl = served
    wait_until(lambda: ctl.received, 10, "the controller's first chunk")  # its cadence is judged from here
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 1)
    sub.setsockopt(zmq.RCVBUF, 4096)
    sub.connect(client.status()["tap"]["endpoint"])
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    try:
        t0 = time.monotonic()
        tap: dict = {}

        def past_its_queue() -> bool:
            tap.update(client.status()["tap"])
            return bool(tap["subscribed"] and tap["sent"] > 3 * tap["recorder_queue"])

        try:
            wait_until(past_its_queue, 30, poll=0.05)
        except AssertionError:
            raise AssertionError(tap) from None
        chunks = ctl.since(t0)
        seconds = time.monotonic() - t0
        assert len(chunks) >= 0.9 * seconds / PERIOD_S, (len(chunks), seconds)
        assert max_gap(chunks) < 4 * PERIOD_S
    finally:
        sub.close(0)


def test_tap_offers_never_block_and_every_item_is_sent_or_counted(tmp_path):
    """In process, with a real XPUB: 3000 observations offered as fast as possible to a
    recorder that never reads; each offer returns at once and sent + dropped = offered."""
    import zmq

    from vlad.daemon.tap import Tap

    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.bind(f"ipc://{tmp_path}/tap")
    tap = Tap(pub, f"ipc://{tmp_path}/tap", largest_observation=64 * 2**10 + 16)
    tap.start()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 1)
    sub.connect(f"ipc://{tmp_path}/tap")
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    try:
        wait_until(lambda: tap.subscribed, 10, "the recorder's subscription", poll=0.01)
        frame = np.zeros(64 * 2**10, np.uint8).tobytes()
        for i in range(3000):
            tap.observation([b"obs", frame], i)
        wait_until(lambda: tap.sent + tap.dropped["observations"] >= 3000, 10, "every offer sent or counted", poll=0.01)
        assert tap.queued_bytes() == 0 and tap.sent + tap.dropped["observations"] == 3000, tap.status()
    finally:
        tap.stop()
        sub.close(0)
        pub.close(0)
        ctx.term()
