"""MCAP recordings: the recorder's API and limits, the file it writes to and a failed write,
reading back, and replay of the fixture."""

from __future__ import annotations

import dataclasses
import os
import threading

import numpy as np
import pytest

from tests.gates.conftest import RECORDING
from vlad import protocol
from vlad.files import FileRefused
from vlad_tools.gates.recording import (
    TOPIC_ACT,
    TOPIC_OBS,
    TOPIC_STATE,
    McapRecorder,
    RecordingError,
    iter_messages,
    pack_frames,
    read_recording,
    unpack_frames,
)
from vlad_tools.gates.results import GateError


def _obs(seq: int) -> list[bytes]:
    img = np.full((64, 64, 3), seq % 256, np.uint8)
    return protocol.encode(
        protocol.TOPIC_OBS,
        {"seq": seq, "t_sensor_ns": 1000 + seq, "instruction": "reach"},
        {"image/overhead": img, "proprio": np.arange(4, dtype=np.float32)},
    )


def _act(seq: int, obs_seq: int) -> list[bytes]:
    return protocol.encode(
        protocol.TOPIC_ACTIONS,
        {
            "seq": seq,
            "obs_seq": obs_seq,
            "t_sensor_ns": 1000 + obs_seq,
            "t_issue_ns": 2000 + obs_seq,
            "valid_until_ns": 9000,
            "period_ns": 20_000_000,
            "release": "r",
            "state": "ACTIVE",
            "source": "release",
            "interventions": ["rate"],
            "timings_ms": {"infer": 1.5},
        },
        {"actions": np.full((8, 2), obs_seq, np.float32)},
    )


def test_frames_round_trip_and_corruption_is_one_clear_error():
    frames = [b"obs", b"\x81\xa1v\x01", b"", bytes(range(256))]
    assert unpack_frames(pack_frames(frames)) == frames
    with pytest.raises(GateError, match="corrupt vlad.frames/1"):
        unpack_frames(pack_frames(frames)[:-3])


def test_recorder_round_trip_with_memoryviews_from_several_threads(tmp_path):
    path = tmp_path / "r.mcap"
    rec = McapRecorder(path, metadata={"release": "test-release"})

    def producer(base: int) -> None:
        for i in range(base, base + 25):
            assert rec.observation([memoryview(f) for f in _obs(i)], 10_000 + i)
            assert rec.actions(_act(i, i), 20_000 + i)

    threads = [threading.Thread(target=producer, args=(k * 100,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rec.state({"state": "ACTIVE", "counters": {"published": 100}}, 30_000)
    rec.event({"kind": "transition", "reason": "test"}, 30_001)
    stats = rec.close()
    assert stats == {
        "observations": 100,
        "actions": 100,
        "states": 1,
        "events": 1,
        "dropped": 0,
        "bytes": stats["bytes"],
        "stop_reason": None,
    }
    back = read_recording(path)
    assert back.metadata["vlad.recording"]["release"] == "test-release"
    assert back.metadata["vlad.recording.summary"]["observations"] == "100"
    assert sorted(o.seq for o in back.observations) == sorted(k * 100 + i for k in range(4) for i in range(25))
    o = next(o for o in back.observations if o.seq == 301)
    assert o.images["overhead"].shape == (64, 64, 3) and int(o.images["overhead"][0, 0, 0]) == 301 % 256
    assert o.instruction == "reach" and o.t_ns == 10_301 and list(o.proprio) == [0, 1, 2, 3]
    c = back.chunk_for()[301]
    assert c.interventions == ("rate",) and float(c.actions[0, 0]) == 301.0
    assert back.states[0][1]["counters"]["published"] == 100
    assert back.events[0][1] == {"kind": "transition", "reason": "test"}
    topics = {t for t, _, _ in iter_messages(path)}
    assert topics == {
        "/vlad/observations",
        "/vlad/actions",
        "/vlad/state",
        "/vlad/events",
        "/vlad/observations/info",
        "/vlad/actions/info",
    }


def test_size_and_time_limits_stop_the_recording_and_count_drops(tmp_path):
    one = sum(len(f) for f in _obs(0))
    rec = McapRecorder(tmp_path / "size.mcap", max_bytes=int(2.5 * one))
    results = [rec.observation(_obs(i), 100 + i) for i in range(5)]
    stats = rec.close()
    assert results == [True, True, False, False, False]
    assert stats["observations"] == 2 and stats["dropped"] == 3 and stats["stop_reason"].startswith("size limit")
    assert len(read_recording(tmp_path / "size.mcap").observations) == 2

    rec = McapRecorder(tmp_path / "time.mcap", max_seconds=1.0)
    t0 = 10**12  # the limit counts from the first message's own stamp: no clock in this test
    assert rec.observation(_obs(0), t0) and rec.observation(_obs(1), t0 + 900_000_000)
    assert not rec.observation(_obs(2), t0 + 1_100_000_000)
    assert rec.close()["stop_reason"].startswith("time limit")
    assert rec.close()["observations"] == 2  # idempotent


def test_not_a_recording_is_refused_with_what_to_do(tmp_path):
    bad = tmp_path / "x.mcap"
    bad.write_bytes(b"not mcap at all")
    with pytest.raises(GateError, match="not a readable MCAP file"):
        read_recording(bad)
    with pytest.raises(GateError, match="no such recording"):
        read_recording(tmp_path / "missing.mcap")


def test_shipped_fixture_is_small_and_replays_exactly_through_the_demo(contract, tokenizer, demo_dir):
    from vlad.plugins import get_backend
    from vlad_tools.gates.replay import replay

    assert RECORDING.stat().st_size < 1_000_000
    rec = read_recording(RECORDING)
    assert rec.metadata["vlad.recording"]["release"] == "vlad-demo-reacher-1.0.0"
    assert len(rec.observations) >= 200 and len(rec.chunk_for()) >= 190  # 4 episodes of 50 ticks
    assert {o.instruction for o in rec.observations} == {
        "reach the red target",
        "reach the point opposite the red target",
    }
    ort = get_backend("onnxruntime").load(demo_dir / "policy.onnx", contract, {"intra_op_threads": 1})
    try:
        d = replay(rec, ort, contract, tokenizer, baseline=ort).to_dict()
    finally:
        ort.close()
    # The serving engine reproduces what the robot received, guard included: to the
    # resolution of the guard's recorded timing (its rate limit scales with elapsed time).
    assert max(d["vs_recorded_max_abs_per_joint"]) < 1e-4 and d["intervention_flips_vs_recorded"] == 0
    assert d["vs_baseline_max_abs_per_joint"] == [0.0, 0.0]


def test_a_recording_of_another_contract_is_refused_in_one_line(contract, tokenizer, demo_dir):
    """Chunks of another shape (a recording of an older release): named, not a numpy error."""
    from vlad.plugins import get_backend
    from vlad_tools.gates.replay import replay

    rec = read_recording(RECORDING)
    rec.chunks[-1] = dataclasses.replace(rec.chunks[-1], actions=rec.chunks[-1].actions[:8])
    ort = get_backend("onnxruntime").load(demo_dir / "policy.onnx", contract, {"intra_op_threads": 1})
    try:
        with pytest.raises(GateError, match=r"chunks are \[8, 2\].*makes \[50, 2\]: record this release"):
            replay(rec, ort, contract, tokenizer)
    finally:
        ort.close()


# ---- hostile files: bounded, validated, one line each --------------------------------------


def _mcap(path, records) -> None:
    """An MCAP file of raw ``records`` (mcap.records objects), as a forger would write it."""
    from mcap.data_stream import RecordBuilder
    from mcap.records import DataEnd, Footer, Header

    b = RecordBuilder()
    b.write(b"\x89MCAP0\r\n")
    for r in [Header(profile="", library="forged"), *records, DataEnd(0), Footer(0, 0, 0)]:
        r.write(b)
    b.write(b"\x89MCAP0\r\n")
    path.write_bytes(b.end())


def _channel_records(*topics: str) -> list:
    from mcap.records import Channel, Metadata, Schema

    out = [Metadata(name="vlad.recording", metadata={"format": "vlad.recording/1", "clock_offset_ns": "0"})]
    out.append(Schema(id=1, name="s", encoding="", data=b""))
    out += [Channel(id=i + 1, topic=t, message_encoding="x", schema_id=1, metadata={}) for i, t in enumerate(topics)]
    return out


def _message(channel: int, data: bytes, t: int = 1):
    from mcap.records import Message

    return Message(channel_id=channel, sequence=t, log_time=t, publish_time=t, data=data)


def test_a_zstd_bomb_is_refused_before_it_is_inflated(tmp_path):
    """A chunk of a few KB declaring gigabytes decompressed: refused from its header, in a
    process whose peak memory stays far below what inflating it would take."""
    import dataclasses
    import subprocess
    import sys

    import zstandard
    from mcap.records import Chunk

    zeros = bytes(1 << 20)
    c = zstandard.ZstdCompressor(level=1, write_content_size=False).compressobj()
    data = b"".join(c.compress(zeros) for _ in range(2 * 1024)) + c.flush()  # 2 GiB of zeros, 64 KB

    def chunk(declared: int):
        return Chunk(
            compression="zstd",
            data=data,
            message_end_time=1,
            message_start_time=0,
            uncompressed_crc=0,
            uncompressed_size=declared,
        )

    bomb = tmp_path / "bomb.mcap"
    _mcap(bomb, [chunk(2 * 2**30)])
    assert bomb.stat().st_size < 200_000
    # The child's own high-water mark (VmHWM of its address space): getrusage's ru_maxrss
    # would carry the parent's from before the exec, and a test process that ran the gates
    # holds far more than the limit.
    code = (
        "import re, sys\n"
        "from vlad_tools.gates.recording import read_recording, RecordingError\n"
        "try:\n    read_recording(sys.argv[1])\nexcept RecordingError as e:\n    print(e)\n"
        "print(re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read()).group(1))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(bomb)], capture_output=True, text=True, timeout=120)
    message, peak_kib = out.stdout.splitlines()
    assert "declares 2147483648 bytes decompressed" in message and "refusing to decompress" in message
    assert int(peak_kib) < 400 * 1024, f"peak RSS {int(peak_kib) / 1024:.0f} MiB"

    # A chunk that lies low about its size is cut at the limit, not inflated to the end.
    _mcap(bomb, [chunk(1000)])
    with pytest.raises(RecordingError, match="decompresses to 1001 bytes, its header says 1000"):
        read_recording(bomb, max_chunk_bytes=1000)
    # One unknown record filling each chunk (a reader skips those): honest, well-formed chunks.
    honest = zstandard.ZstdCompressor().compress(b"\x80" + (2**20 - 9).to_bytes(8, "little") + bytes(2**20 - 9))
    _mcap(bomb, [dataclasses.replace(chunk(2**20), data=honest)] * 3)
    with pytest.raises(RecordingError, match="more than 3000000 bytes decompressed"):
        read_recording(bomb, max_bytes=3_000_000)


def _forged_obs(header: dict) -> bytes:
    return pack_frames(protocol.encode(protocol.TOPIC_OBS, header, {"image/overhead": np.zeros((4, 4, 3), np.uint8)}))


def _forged_act(drop: str = "", **changes) -> bytes:
    frames = _act(1, 1)
    h = protocol.decode(frames).header
    h = {k: v for k, v in h.items() if k not in ("v", "kind", "tensors") and k != drop} | changes
    return pack_frames(protocol.encode(protocol.TOPIC_ACTIONS, h, {"actions": np.zeros((8, 2), np.float32)}))


@pytest.mark.parametrize(
    "case,expect",
    [
        ("act-no-obs_seq", "obs_seq: missing"),
        ("act-string-obs_seq", "obs_seq: expected an integer"),
        ("act-float64-actions", "actions: expected a 2-D float32 tensor"),
        ("act-timing-string", "timings_ms.infer: expected a finite number"),
        ("act-rtc-string", "rtc: expected [chunk seq, delay periods]"),
        ("act-rtc-negative", "rtc: expected [chunk seq, delay periods]"),
        ("state-deep-json", "JSON nested deeper than 64 levels"),
        ("state-not-object", "not a JSON object"),
        ("frames-truncated", "corrupt vlad.frames/1"),
        ("unknown-channel", "which no channel record declares"),
        ("lz4", "compression 'lz4' is not supported"),
    ],
)
def test_malformed_records_are_one_line_errors(tmp_path, case, expect):
    from mcap.records import Chunk

    records = _channel_records(TOPIC_OBS, TOPIC_ACT, TOPIC_STATE)
    data = {
        "act-no-obs_seq": (2, _forged_act(drop="obs_seq")),
        "act-string-obs_seq": (2, _forged_act(obs_seq="1")),
        "act-timing-string": (2, _forged_act(timings_ms={"infer": "fast"})),
        "act-rtc-string": (2, _forged_act(rtc="soon")),
        "act-rtc-negative": (2, _forged_act(rtc=[3, -1])),
        "state-deep-json": (3, b"[" * 5000 + b"]" * 5000),
        "state-not-object": (3, b"[1, 2]"),
        "frames-truncated": (2, _forged_act()[:-5]),
        "unknown-channel": (9, b""),
    }
    if case == "act-float64-actions":
        h = {k: v for k, v in protocol.decode(_act(1, 1)).header.items() if k not in ("v", "kind", "tensors")}
        data[case] = (2, pack_frames(protocol.encode(protocol.TOPIC_ACTIONS, h, {"actions": np.zeros((8, 2))})))
    if case == "lz4":
        records.append(Chunk("lz4", b"0123456789", 1, 0, 0, 10))
    else:
        records.append(_message(*data[case]))
    path = tmp_path / f"{case}.mcap"
    _mcap(path, records)
    with pytest.raises(RecordingError) as exc:
        read_recording(path)
    assert expect in str(exc.value) and "\n" not in str(exc.value)


def test_observations_the_daemon_would_refuse_are_counted_not_fatal(tmp_path):
    """A live tap records what arrived, junk included: an observation without t_sensor_ns,
    with a string seq or not decodable at all is skipped and counted, like the daemon's."""
    records = _channel_records(TOPIC_OBS)
    good = _forged_obs({"seq": 3, "t_sensor_ns": 5, "instruction": "reach"})
    for i, frame in enumerate(
        [
            _forged_obs({"seq": 1, "instruction": "reach"}),
            _forged_obs({"seq": 2, "t_sensor_ns": "soon"}),
            pack_frames([b"obs", b"\xc1"]),
            good,
        ]
    ):
        records.append(_message(1, frame, t=i + 1))
    path = tmp_path / "junk.mcap"
    _mcap(path, records)
    rec = read_recording(path)
    assert [o.seq for o in rec.observations] == [3] and rec.refused == 3
    assert "t_sensor_ns: missing" in rec.refusals[0] and "t_sensor_ns: expected" in rec.refusals[1]


def test_replay_command_on_a_hostile_file_is_one_line(tmp_path, capsys):
    from tests.gates import candidates
    from vlad.cli import vladctl_main as main

    records = _channel_records(TOPIC_OBS, TOPIC_ACT, TOPIC_STATE) + [_message(2, _forged_act(drop="obs_seq"))]
    path = tmp_path / "bad.mcap"
    _mcap(path, records)
    assert main(["replay", str(path), "--release", str(candidates.DEMO)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "obs_seq: missing" in err


def test_the_recorder_refuses_a_symlink_or_a_fifo_with_one_line(tmp_path):
    target = tmp_path / "precious"
    target.write_text("keep me")
    (tmp_path / "link.mcap").symlink_to(target)
    os.mkfifo(tmp_path / "fifo.mcap")  # no reader: a plain open() would wait for one for ever
    for name, kind in (("link.mcap", "a symbolic link"), ("fifo.mcap", "a FIFO")):
        with pytest.raises(FileRefused, match=f"^{tmp_path / name}: {kind}; refusing to write to it$"):
            McapRecorder(tmp_path / name)
    assert target.read_text() == "keep me"


WRITE_UNTIL_IT_FAILS = """
import os, sys, time
from vlad_tools.gates.recording import McapRecorder
from vlad_tools.gates.results import GateError

rec = McapRecorder(sys.argv[1])
for i in range(200):  # 12.5 MiB of incompressible frames: more than the file may hold
    rec.observation([b"obs", b"header", os.urandom(64 * 1024)], 10**12 + i * 20_000_000)
    time.sleep(0.002)  # paces the offers so that the writer's queue takes them all
deadline = time.monotonic() + 30
while rec.stop_reason is None and time.monotonic() < deadline:
    time.sleep(0.01)  # the writer thread hits the limit on its own time
try:
    rec.close()
except GateError as exc:
    print(exc)
    sys.exit(2)
"""


def test_a_failed_write_ends_the_recording_with_one_line_and_keeps_what_was_written(tmp_path):
    """A real write failure (the file-size limit: EFBIG, as a full disk gives ENOSPC) in a
    recorder process: one line, and the file cut back to its last complete record and
    finished there, readable, with the chunk written before."""
    import resource
    import signal
    import subprocess
    import sys

    from tests.conftest import ROOT

    out = tmp_path / "limited.mcap"

    def limit_file_size() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (3 * 2**20 // 2, resource.RLIM_INFINITY))

    proc = subprocess.run(
        [sys.executable, "-c", WRITE_UNTIL_IT_FAILS, str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        preexec_fn=limit_file_size,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    line = proc.stdout.strip()
    assert "\n" not in line and line.startswith(f"{out}: cannot write (File too large); recording stopped, the ")
    assert line.endswith("messages written before it are kept, readable"), line
    observations = [m for m in iter_messages(out) if m[0] == "/vlad/observations"]
    assert 1 <= len(observations) < 200
    summary = read_recording(out).metadata["vlad.recording.summary"]
    assert summary["written"] == str(len(observations)) and "File too large" in summary["stop_reason"]
