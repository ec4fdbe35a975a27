"""The rehearsal (vlad.serving.rehearsal): when it runs, that it never reaches serving, and
that what vlad serves is the same, bit for bit, with or without it."""

from __future__ import annotations

import numpy as np
import pytest

from tests.serving.rig import INSTRUCTION, PROPRIO, Rig
from vlad import protocol
from vlad.config import GuardConfig
from vlad.serving.rehearsal import WARM_AFTER_PUBLISH_NS, Rehearsal
from vlad_tools.testing import Ticker, wait_until

PERIOD = 20_000_000
LEAD = 2_000_000
T0 = 10**15  # a made-up monotonic clock, far from the rig's real one


def _frames(seq: int, t_sensor: int, proprio: np.ndarray = PROPRIO) -> list[bytes]:
    header = {"seq": seq, "t_sensor_ns": t_sensor, "instruction": INSTRUCTION, "client": "arm"}
    image = np.full((64, 64, 3), seq % 256, np.uint8)
    return protocol.encode(protocol.TOPIC_OBS, header, {"image/overhead": image, "proprio": proprio})


def _steady(r: Rehearsal, start: int, n: int = 3, client: str = "arm") -> int:
    """``n`` observations one period apart from ``start``; the last one's receive time."""
    for k in range(n):
        rx = start + k * PERIOD
        r.accepted(_frames(k + 1, rx - 1_000_000), rx, client)
    return rx


@pytest.fixture()
def rehearsal(rig):
    rig.publisher.last_publish_ns = 0
    return Rehearsal(rig.intake, rig.publisher, LEAD, GuardConfig())


def _never() -> bool:
    return False


def test_it_is_due_only_for_a_controller_at_a_steady_rate(rehearsal):
    r = rehearsal
    r.accepted(_frames(1, T0), T0, "arm")
    assert r.due_ns() is None
    r.accepted(_frames(2, T0 + PERIOD), T0 + PERIOD, "arm")
    assert r.due_ns() is None  # one interval says nothing about the next
    r.accepted(_frames(3, T0 + 2 * PERIOD), T0 + 2 * PERIOD, "arm")
    assert r.due_ns() == T0 + 3 * PERIOD - LEAD
    r.accepted(_frames(4, T0 + 2 * PERIOD + 6_000_000), T0 + 2 * PERIOD + 6_000_000, "arm")
    assert r.due_ns() is None  # out of step
    # observations back to back (lock-step) never cool down: nothing to rehearse
    for k in range(4):
        rx = T0 + 10 * PERIOD + k * 3_000_000
        r.accepted(_frames(10 + k, rx), rx, "arm")
    assert r.due_ns() is None


def test_it_waits_while_another_controller_is_there(rehearsal):
    """Two controllers' observations come at times it cannot foresee: one arriving during a
    rehearsal would wait, and could meet the other's and be superseded."""
    from vlad.serving.rehearsal import OTHER_CONTROLLER_NS

    r = rehearsal
    rx = _steady(r, T0)
    assert r.due_ns() is not None
    rx += PERIOD // 2
    r.accepted(_frames(99, rx - 1_000_000), rx, "openpi")  # another controller asks
    rx = _steady(r, rx + PERIOD // 2, 4)
    assert r.due_ns() is None
    rx = _steady(r, rx + OTHER_CONTROLLER_NS, 3)  # alone again for a while
    assert r.due_ns() == rx + PERIOD - LEAD


def test_the_reader_wakes_for_it(rehearsal):
    rx = _steady(rehearsal, T0)
    due = rx + PERIOD - LEAD
    assert rehearsal.poll_ms(due - 12_000_000, 5) == 5  # not before its usual timeout
    assert rehearsal.poll_ms(due - 3_200_000, 5) == 3
    assert rehearsal.poll_ms(due + 1_000_000, 5) == 0


def test_it_runs_once_per_interval_and_never_during_a_cycle_right_after_a_chunk_or_too_late(rig, rehearsal):
    r, policy = rehearsal, rig.policy
    rx = _steady(r, T0)
    due = r.due_ns()
    r.maybe_run(due - 2_000_000, policy, _never)
    assert r.runs == 0 and r.due_ns() == due  # not yet
    r.maybe_run(due, None, _never)  # a cycle runs
    assert r.runs == 0 and r.due_ns() is None  # and this interval is over
    rx = _steady(r, rx + PERIOD, 1)
    due = r.due_ns()
    rig.publisher.last_publish_ns = due - WARM_AFTER_PUBLISH_NS // 2
    r.maybe_run(due, policy, _never)
    assert r.runs == 0 and r.due_ns() is None  # a chunk just went out: warm anyway
    rig.publisher.last_publish_ns = 0
    rx = _steady(r, rx + PERIOD, 1)
    r.maybe_run(rx + PERIOD - 100_000, policy, _never)
    assert r.runs == 0  # the observation is about to come
    rx = _steady(r, rx + PERIOD, 1)
    r.maybe_run(r.due_ns(), policy, _never)  # builds the scratch preprocessor for this policy
    assert r.runs == 0 and r.due_ns() is None
    for k in range(3):
        rx = _steady(r, rx + PERIOD, 1)
        due = r.due_ns()
        r.maybe_run(due, policy, _never)
        r.maybe_run(due + 100_000, policy, _never)  # once per interval
        assert r.runs == k + 1 and r.due_ns() is None
    assert (r.interrupted, r.errors) == (0, 0)


def test_it_stops_when_a_message_waits(rig, rehearsal):
    rx = _steady(rehearsal, T0)
    rehearsal.maybe_run(rx + PERIOD - LEAD, rig.policy, _never)  # builds the scratch preprocessor
    rx = _steady(rehearsal, rx + PERIOD, 1)
    rehearsal.maybe_run(rx + PERIOD - LEAD, rig.policy, lambda: True)
    assert (rehearsal.runs, rehearsal.interrupted) == (0, 1)


def test_a_bug_in_it_is_counted_and_never_raised(rig, rehearsal):
    def broken(*args, **kwargs):
        raise RuntimeError("injected")

    rehearsal._intake.accept = broken
    rx = _steady(rehearsal, T0)
    rehearsal.maybe_run(rx + PERIOD - LEAD, rig.policy, _never)  # builds the scratch preprocessor
    rx = _steady(rehearsal, rx + PERIOD, 1)
    rehearsal.maybe_run(rx + PERIOD - LEAD, rig.policy, _never)
    assert (rehearsal.runs, rehearsal.errors) == (0, 1)


def _serve(rig: Rig, n: int) -> list[tuple]:
    """``n`` observations at the contract's rate, the arm moving a little each period and
    reporting the chunk it executes; what came back."""
    ticker = Ticker(PERIOD / 1e9)
    out: list[tuple] = []
    executing = None
    for seq in range(1, n + 1):
        proprio = PROPRIO.copy()
        proprio[0] += 0.01 * seq
        rig.send_obs(seq, proprio=proprio, executing=executing)
        msg = rig.recv()
        assert msg is not None
        h = msg.header
        out.append((h["obs_seq"], h["source"], tuple(h["interventions"]), msg.tensors["actions"].tobytes()))
        executing = [h["seq"], 0]
        ticker.wait()
    return out


def _history(rig: Rig) -> list[tuple]:
    """The chunks the guard remembers as sent (its seam references)."""
    g = rig.guard
    return [(k, s.client, s.actions.tobytes(), s.advisory) for k, s in g.sent.items()] + [sorted(g._newest.items())]


def test_what_is_served_is_the_same_with_and_without_it(contract, tokenizer):
    n = 25
    plain = Rig(contract, tokenizer)
    rehearsed = Rig(contract, tokenizer, rehearse_lead_ns=5_000_000)
    try:
        a = _serve(plain, n)
        b = _serve(rehearsed, n)
        wait_until(lambda: rehearsed.policy.counts.published == n, what="the last publish")
        wait_until(lambda: plain.policy.counts.published == n, what="the last publish")
        r = rehearsed.loop.rehearsal
        assert r is not None and r.runs >= 5, (r.runs, r.interrupted)  # it did run in between
        assert r.errors == 0
        assert a == b  # the same chunks, bit for bit, with the same interventions
        for x, y in zip(plain.session.seen, rehearsed.session.seen, strict=True):  # the same model inputs
            assert x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
        # and the same state behind them
        for field in ("messages", "observations", "input_rejected", "superseded", "reanchors"):
            assert getattr(plain.intake.counts, field) == getattr(rehearsed.intake.counts, field), field
        assert np.array_equal(plain.trusted.positions, rehearsed.trusted.positions)
        assert plain.guard.counts == rehearsed.guard.counts
        assert plain.guard.reports_unknown == rehearsed.guard.reports_unknown == 0
        assert _history(plain) == _history(rehearsed)
    finally:
        plain.close()
        rehearsed.close()


def test_it_starts_early_enough_to_end_before_the_observation(rig, rehearsal):
    r = rehearsal
    rx = _steady(r, T0)
    r.maybe_run(r.due_ns(), rig.policy, _never)  # builds the scratch preprocessor
    rx = _steady(r, rx + PERIOD, 1)
    r.maybe_run(r.due_ns(), rig.policy, _never)
    assert r.runs == 1 and 0 < r._takes_ns <= PERIOD // 4
    rx = _steady(r, rx + PERIOD, 1)
    assert r.due_ns() == rx + PERIOD - LEAD - r._takes_ns


def test_preprocessing_that_moves_bytes_is_not_rehearsed_again(rig, rehearsal, monkeypatch):
    import vlad.serving.rehearsal as module

    r = rehearsal
    rx = _steady(r, T0)
    r.maybe_run(r.due_ns(), rig.policy, _never)  # builds the scratch preprocessor
    assert r._pre is not None
    monkeypatch.setattr(module, "PREPROCESS_LIMIT_NS", -1)  # every fill is "too long"
    for k in range(module.SLOW_FILLS):
        assert r._pre is not None, k  # one slow fill may be the machine
        rx = _steady(r, rx + PERIOD, 1)
        r.maybe_run(r.due_ns(), rig.policy, _never)
    assert r._pre is None and r.runs == module.SLOW_FILLS
    rx = _steady(r, rx + PERIOD, 1)
    r.maybe_run(r.due_ns(), rig.policy, _never)  # the rest still runs
    assert r.runs == 1 + module.SLOW_FILLS and r.errors == 0


def test_one_fast_fill_keeps_the_preprocessing_rehearsed(rig, rehearsal, monkeypatch):
    import vlad.serving.rehearsal as module

    r = rehearsal
    rx = _steady(r, T0)
    r.maybe_run(r.due_ns(), rig.policy, _never)
    monkeypatch.setattr(module, "PREPROCESS_LIMIT_NS", 10**12)
    rx = _steady(r, rx + PERIOD, 1)
    r.maybe_run(r.due_ns(), rig.policy, _never)  # one fast fill
    monkeypatch.setattr(module, "PREPROCESS_LIMIT_NS", -1)
    for _ in range(module.SLOW_FILLS + 1):
        rx = _steady(r, rx + PERIOD, 1)
        r.maybe_run(r.due_ns(), rig.policy, _never)
    assert r._pre is not None
