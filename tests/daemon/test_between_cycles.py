"""When the status build and the health tick run: a moment the serving thread needs no GIL
(vlad.daemon.health.between_cycles), judged from the loop's plain attributes."""

from __future__ import annotations

from types import SimpleNamespace

import anyio

from vlad.daemon.health import ENGINE_WINDOW_NS, LOOK_NS, _next_look, between_cycles
from vlad.serving.loop import Inference, ServingLoop
from vlad.serving.tracing import CycleTimes, LatencyStats

MS = 1_000_000
PERIOD = 20 * MS
SETTLE = 2 * MS


def fake_loop(last_publish: int, engine_ms: float = 5.0) -> SimpleNamespace:
    stats = LatencyStats(10)
    stats.add("engine", engine_ms)
    loop = SimpleNamespace(
        publisher=SimpleNamespace(last_publish_ns=last_publish, stats=stats),
        in_flight=None,
        _times=CycleTimes(),
        intake=SimpleNamespace(last_seen_ns=last_publish),
    )
    loop.engine_left_ns = lambda now: ServingLoop.engine_left_ns(loop, now)  # type: ignore[arg-type]
    return loop


def in_engine(loop: SimpleNamespace, received: int, engine_start: int) -> None:
    loop.in_flight = Inference(SimpleNamespace(), received)  # type: ignore[arg-type]
    loop._times.reset(received, received)
    loop._times.infer_start = engine_start


def test_idle_gap_after_a_chunk_at_the_controller_rate() -> None:
    now = 1000 * MS
    loop = fake_loop(last_publish=now - 5 * MS)
    assert _next_look(loop, now, PERIOD, SETTLE) is None  # idle, next observation ~15 ms away
    loop.publisher.last_publish_ns = now - MS
    assert _next_look(loop, now, PERIOD, SETTLE) == now + MS  # just after the settle
    loop.publisher.last_publish_ns = now - 12 * MS
    assert _next_look(loop, now, PERIOD, SETTLE) == now + 10 * MS  # just after the next chunk


def test_at_the_controller_rate_a_cycle_is_waited_out_not_entered() -> None:
    now = 1000 * MS
    loop = fake_loop(last_publish=now - 15 * MS)  # the previous chunk left a gap: a rate-driven controller
    in_engine(loop, received=now - MS, engine_start=now - MS // 2)  # 4.5 ms of engine left
    wake = _next_look(loop, now, PERIOD, SETTLE)
    assert wake == now + 4 * MS + MS // 2 + SETTLE  # after this cycle's chunk, not inside it


def test_lock_step_uses_the_engine_call() -> None:
    now = 1000 * MS
    loop = fake_loop(last_publish=now - 2 * MS)
    in_engine(loop, received=now - MS - MS // 2, engine_start=now - MS)  # came 0.5 ms after the chunk
    assert _next_look(loop, now, PERIOD, SETTLE) is None  # 4 ms of engine left >= the window
    loop._times.infer_start = now - 5 * MS + ENGINE_WINDOW_NS // 2  # too little left
    assert _next_look(loop, now, PERIOD, SETTLE) == now + LOOK_NS
    loop._times.infer_start = 0  # preprocessing: the engine call starts soon
    assert _next_look(loop, now, PERIOD, SETTLE) == now + LOOK_NS
    loop._times.infer_start, loop._times.infer_end = now - 4 * MS, now - MS  # decoding, guarding
    assert _next_look(loop, now, PERIOD, SETTLE) == now + LOOK_NS


def test_lock_step_with_engine_calls_too_short_to_start_in_goes_at_once() -> None:
    now = 1000 * MS
    loop = fake_loop(last_publish=now - MS, engine_ms=0.2)
    in_engine(loop, received=now - MS // 2, engine_start=0)  # preprocessing
    assert _next_look(loop, now, PERIOD, SETTLE) is None


def test_never_waits_past_a_period() -> None:
    async def main() -> float:
        loop = fake_loop(last_publish=0)
        t0 = anyio.current_time()
        now = int(t0 * 1e9)
        loop.intake.last_seen_ns = 1 << 62  # a controller is there
        in_engine(loop, received=now, engine_start=0)  # a cycle that never reaches its engine
        loop.publisher.last_publish_ns = now
        await between_cycles(loop, PERIOD)  # type: ignore[arg-type]
        return anyio.current_time() - t0

    assert anyio.run(main) < 0.2
