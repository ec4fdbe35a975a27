"""MCAP recordings: the recorder's API and limits, reading back, and replay of the fixture."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tests.gates.conftest import RECORDING
from vlad import protocol
from vlad.gates.recording import (
    McapRecorder,
    iter_messages,
    pack_frames,
    read_recording,
    unpack_frames,
)
from vlad.gates.results import GateError


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
    stats = rec.close()
    assert stats == {
        "observations": 100,
        "actions": 100,
        "states": 1,
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
    topics = {t for t, _, _ in iter_messages(path)}
    assert topics == {
        "/vlad/observations",
        "/vlad/actions",
        "/vlad/state",
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
    with pytest.raises(GateError, match="unreadable recording"):
        read_recording(bad)
    with pytest.raises(GateError, match="no such recording"):
        read_recording(tmp_path / "missing.mcap")


def test_shipped_fixture_is_small_and_replays_exactly_through_the_demo(contract, tokenizer, demo_dir):
    from vlad.gates.replay import replay
    from vlad.plugins import get_backend

    assert RECORDING.stat().st_size < 1_000_000
    rec = read_recording(RECORDING)
    assert rec.metadata["vlad.recording"]["release"] == "vlad-demo-reacher-1.0.0"
    assert len(rec.observations) == 200 and len(rec.chunk_for()) >= 190
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
