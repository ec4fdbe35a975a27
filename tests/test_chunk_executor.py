"""vlad.client.ChunkExecutor: asynchronous chunk execution, on an injected clock."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from vlad.client import ActionChunk, ChunkExecutor

MS = 1_000_000
P = 20 * MS  # control period


def chunk(
    t_sensor_ms: float, values, *, seq: int = 1, validity_ms: float = 160, source: str = "release"
) -> ActionChunk:
    actions = np.asarray(values, dtype=np.float32).reshape(-1, 1)
    t = int(t_sensor_ms * MS)
    return ActionChunk(
        seq=seq,
        obs_seq=seq,
        t_sensor_ns=t,
        t_issue_ns=t,
        valid_until_ns=t + int(validity_ms * MS),
        period_ns=P,
        release="r",
        state="ACTIVE",
        source=source,
        interventions=(),
        timings_ms={},
        actions=actions,
        t_receive_ns=t,
        advisory=source in ("hold:bridge", "hold:stale", "hold:rejected"),
    )


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def test_switches_at_the_index_for_now_and_drops_the_past():
    clock = Clock()
    ex = ChunkExecutor(overlap=0, clock=clock)
    clock.now = 45 * MS  # 2 periods + 5 ms after the sensor time
    assert ex.offer(chunk(0, range(8)))
    assert ex.step()[0] == 2 and ex.stats.dropped_waypoints == 2
    clock.now = 60 * MS
    assert ex.step()[0] == 3
    assert ex.remaining() == 4


def test_never_executes_past_valid_until_or_the_chunk_end():
    clock = Clock()
    ex = ChunkExecutor(overlap=0, clock=clock)
    ex.offer(chunk(0, range(8), validity_ms=70), now_ns=0)
    assert ex.step(60 * MS)[0] == 3
    assert ex.remaining(60 * MS) == 0  # waypoint 4 would start at 80 ms, after validity
    assert ex.step(71 * MS) is None and ex.stats.idle_steps == 1
    ex2 = ChunkExecutor(overlap=0)
    ex2.offer(chunk(0, range(4), validity_ms=500), now_ns=0)
    assert ex2.step(77 * MS)[0] == 3 and ex2.step(78 * MS) is None  # 78 ms: within the tolerance of 80
    assert not ChunkExecutor().offer(chunk(0, range(8)), now_ns=161 * MS)  # stale when offered


def test_refuses_older_observations_and_chunks_wholly_in_the_past():
    ex = ChunkExecutor(overlap=0)
    assert ex.offer(chunk(40, [1] * 8, seq=2), now_ns=45 * MS)
    assert not ex.offer(chunk(20, [9] * 8, seq=1), now_ns=46 * MS)
    assert ex.stats.rejected_older == 1
    ex2 = ChunkExecutor(overlap=0)
    assert not ex2.offer(chunk(0, [1, 2], validity_ms=500), now_ns=50 * MS)
    assert ex2.stats.rejected_exhausted == 1


@pytest.mark.parametrize("blend,first,second", [("linear", 1 / 3, 2 / 3), ("none", 1.0, 1.0)])
def test_blends_over_the_overlap_window(blend, first, second):
    ex = ChunkExecutor(overlap=2, blend=blend)
    ex.offer(chunk(0, [0.0] * 8), now_ns=0)
    ex.offer(chunk(40, [1.0] * 8, seq=2), now_ns=45 * MS)
    assert ex.step(45 * MS)[0] == pytest.approx(first)
    assert ex.step(65 * MS)[0] == pytest.approx(second)
    assert ex.step(85 * MS)[0] == pytest.approx(1.0)


def test_exponential_schedule_is_front_loaded_and_ends_at_one():
    lin, exp = ChunkExecutor(overlap=3), ChunkExecutor(overlap=3, blend="exponential", blend_rate=3.0)
    ws = [exp.weight(j) for j in range(4)]
    assert ws[0] > lin.weight(0) and ws == sorted(ws) and ws[3] == 1.0
    with pytest.raises(ValueError, match="blend must be one of"):
        ChunkExecutor(blend="cubic")


def test_blending_stops_when_the_old_chunk_expires():
    ex = ChunkExecutor(overlap=4)
    ex.offer(chunk(0, [0.0] * 8, validity_ms=50), now_ns=0)
    ex.offer(chunk(40, [1.0] * 8, seq=2), now_ns=41 * MS)
    assert ex.step(41 * MS)[0] == pytest.approx(0.2)
    assert ex.step(61 * MS)[0] == 1.0  # the old chunk's validity (50 ms) is over


def test_requests_at_the_threshold_once_until_answered():
    ex = ChunkExecutor(request_threshold=3, overlap=0, request_timeout_ns=200 * MS)
    assert ex.should_request(0)  # nothing to execute yet
    ex.request_sent(1, now_ns=0)
    assert not ex.should_request(1 * MS)
    ex.offer(chunk(0, range(8), seq=1), now_ns=3 * MS)
    assert ex.remaining(3 * MS) == 7 and not ex.should_request(3 * MS)
    assert not ex.should_request(60 * MS)  # index 3: 4 left
    assert ex.should_request(80 * MS)  # index 4: 3 left
    ex.request_sent(2, now_ns=80 * MS)
    assert not ex.should_request(100 * MS)
    assert ex.should_request(281 * MS)  # unanswered past the timeout: ask again


@pytest.mark.parametrize("advisory", ["hold:bridge", "hold:stale", "hold:rejected"])
def test_advisory_holds_do_not_interrupt_a_valid_chunk_but_other_holds_do(advisory):
    ex = ChunkExecutor(overlap=2)
    ex.offer(chunk(0, [5.0] * 8), now_ns=0)
    ex.request_sent(7, now_ns=60 * MS)
    assert not ex.offer(chunk(55, [0.0] * 8, seq=7, source=advisory), now_ns=61 * MS)
    assert ex.stats.ignored_advisory == 1 and not ex.should_request(62 * MS)  # an advisory hold answers nothing
    assert ex.offer(chunk(60, [0.0] * 8, seq=7, source="hold:estop"), now_ns=62 * MS)
    assert ex.step(62 * MS)[0] == 0.0  # no blending into a hold
    ex2 = ChunkExecutor()
    assert ex2.offer(chunk(0, [0.0] * 8, source=advisory), now_ns=MS)  # nothing else to run


def test_ticks_in_step_with_the_frames_neither_repeat_nor_skip_under_jitter():
    ex = ChunkExecutor(overlap=0)
    ex.offer(chunk(0, range(8)), now_ns=0)
    ticks = [k * P + jitter for k, jitter in enumerate([0, -300_000, 200_000, -50_000, 0, -900_000, 400_000, -1])]
    assert [int(ex.step(t)[0]) for t in ticks] == list(range(8))
    strict = ChunkExecutor(overlap=0, tolerance=0.0)
    strict.offer(chunk(0, range(8)), now_ns=0)
    assert int(strict.step(P - 300_000)[0]) == 0  # without tolerance: waypoint 0 again


def test_chunks_addressed_to_another_controller_are_not_executed():
    """Two controllers on one action stream: each executes its own chunks and those for
    every controller (docs/protocol.md, "Which chunk to execute")."""
    ex = ChunkExecutor(client="arm", overlap=0, blend="none")
    mine = dataclasses.replace(chunk(0, range(8), seq=1), client="arm")
    theirs = dataclasses.replace(chunk(20, range(8), seq=2), client="other")
    everyone = dataclasses.replace(chunk(40, range(8), seq=3), client=None)
    assert ex.offer(mine, 0) and not ex.offer(theirs, 20 * MS) and ex.stats.foreign == 1
    assert ex.current is mine
    assert ex.offer(everyone, 40 * MS) and ex.current is everyone
