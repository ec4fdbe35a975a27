"""The serving loop in process: latest wins, stale skip, the e-stop gate, fallback swaps and a
replaced thread, on real inproc sockets with a fake engine (no daemon subprocess)."""

from __future__ import annotations

import threading
import time

import numpy as np

from tests.helpers import history_data
from tests.serving.rig import GENEROUS_NS, PROPRIO, FakeSession, Rig
from vlad.contract import parse_contract
from vlad.errors import BackendError, RemoteUnavailable
from vlad.processing import preprocess_proprio
from vlad_tools.testing import wait_until


def test_one_observation_one_chunk(rig):
    rig.send_obs(1)
    msg = rig.recv()
    assert msg is not None
    h = msg.header
    assert (h["obs_seq"], h["source"], h["policy"], h["release"]) == (1, "release", "release:demo@1", "demo@1")
    assert msg.tensors["actions"].shape == (rig.contract.action.chunk_length, rig.contract.action.dim)
    # the serving thread counts a chunk as published just after sending it
    wait_until(lambda: rig.policy.counts.published == 1, what="the published count")
    assert rig.session.calls == 1


def test_a_burst_is_answered_with_the_newest_observation_only(rig):
    """While the engine is busy, observations queue; the next cycle serves the newest one
    and counts the others as superseded instead of working through a backlog."""
    rig.session.gate = threading.Event()
    rig.send_obs(1)
    assert rig.session.entered.wait(5)  # the engine is inside obs 1's inference
    for seq in range(2, 12):
        rig.send_obs(seq)
    # the other thread reads the burst while the engine is busy; release it once all is in
    wait_until(lambda: rig.intake.counts.observations == 11, what="the burst to arrive")
    rig.session.gate.set()
    served = [rig.recv().header["obs_seq"], rig.recv().header["obs_seq"]]
    assert served == [1, 11]
    assert rig.recv(0.2) is None  # nothing for 2..10
    assert rig.intake.counts.superseded == 9
    assert rig.session.calls == 2


def test_latest_wins_per_controller_so_a_fast_stream_never_starves_another_request(rig):
    """Two controllers on one daemon (a native 50 Hz stream and an openpi client's request):
    while an inference runs, the stream's newer observations supersede only its own older
    ones; the request waits in its own place and is served in turn, before the stream's
    newest, since it started waiting first."""
    rig.session.gate = threading.Event()
    rig.send_obs(1, client="stream")
    assert rig.session.entered.wait(5)  # the engine is inside the stream's obs 1
    rig.send_obs(100, client="request")
    for seq in range(2, 6):
        rig.send_obs(seq, client="stream")
    wait_until(lambda: rig.intake.counts.observations == 6, what="all six to arrive")
    rig.session.gate.set()
    served = [(m.header["client"], m.header["obs_seq"]) for m in (rig.recv(), rig.recv(), rig.recv())]
    assert served == [("stream", 1), ("request", 100), ("stream", 5)]
    assert rig.recv(0.2) is None  # nothing for the stream's 2..4
    assert rig.intake.counts.superseded == 3
    assert rig.session.calls == 3


def _wait_read(rig, n: int) -> None:
    """Until the reader has accepted or refused ``n`` observations."""
    counts = rig.intake.counts
    wait_until(lambda: counts.observations + sum(counts.rejected.values()) == n, what=f"{n} observations read")


def _policy_chunks(rig) -> list[dict]:
    """The headers of the policy's chunks sent until none comes for 0.5 s (the advisory holds
    answering refused observations left out)."""
    headers = []
    while (msg := rig.recv(0.5)) is not None:
        if msg.header["source"] == "release":
            headers.append(msg.header)
    return headers


def test_a_flood_of_controller_names_waits_within_the_controller_limit_and_each_is_served_once(rig):
    """Latest wins per controller keeps a place per name: a flood of names (a producer on the
    allow-list sending under 100 names while an inference runs) holds at most the controller
    limit's places, names past it are refused at the intake, and each admitted one is answered
    once, in turn, with its newest observation."""
    from vlad.health.liveness import MAX_CONTROLLERS

    rig.session.gate = threading.Event()
    rig.send_obs(1, client="stream")
    assert rig.session.entered.wait(5)
    for round_ in range(2):
        for n in range(100):
            rig.send_obs(1000 * (round_ + 1) + n, client=f"name-{n}")
    _wait_read(rig, 201)
    with rig.loop._handover:
        waiting = {name: [a.obs.sequence for a in items] for name, items in rig.loop._waiting.items()}
    # "" (the rig's heartbeat) and "stream" hold two of the limit's places
    assert len(waiting) == MAX_CONTROLLERS - 2, len(waiting)
    assert all(seqs == [2000 + int(name[5:])] for name, seqs in waiting.items())  # the newest of each, alone
    rig.session.gate.set()
    answered = _policy_chunks(rig)
    assert answered[0]["client"] == "stream"
    assert [h["client"] for h in answered[1:]] == list(waiting)  # in the order they started waiting
    assert [h["obs_seq"] for h in answered[1:]] == [s[0] for s in waiting.values()]
    assert rig.intake.counts.rejected.get("too_many_controllers", 0) == 2 * (100 - len(waiting))


def test_names_forgotten_during_a_long_inference_never_grow_what_waits_past_the_limit(rig):
    """The intake forgets a name that was never judged and fell silent (its place goes to a new
    one), so during a long inference new names can keep coming: what waits still holds at most
    the controller limit's places; the newcomers past it are superseded, and nothing older is
    lost."""
    from vlad.health.liveness import MAX_CONTROLLERS

    rig.intake.controllers.establish_ns = 1_000_000  # names forgotten after 1 ms of silence
    rig.session.gate = threading.Event()
    rig.send_obs(1, client="stream")
    assert rig.session.entered.wait(5)
    for wave in range(4):
        for n in range(100):
            rig.send_obs(1000 * (wave + 1) + n, client=f"wave{wave}-{n}")
        time.sleep(0.01)  # the wave falls silent: its names may be forgotten for the next
    _wait_read(rig, 1 + 400)
    with rig.loop._handover:
        waiting = list(rig.loop._waiting)
    assert len(waiting) == MAX_CONTROLLERS, len(waiting)  # every place taken, none beyond
    accepted = rig.intake.counts.observations - 1  # the stream's obs 1 is being served
    assert rig.intake.counts.superseded == accepted - len(waiting)
    rig.session.gate.set()
    assert [h["client"] for h in _policy_chunks(rig)] == ["stream", *waiting]


def test_a_stale_observation_is_answered_with_an_advisory_hold_without_inference(rig):
    rig.policy.max_age_ns = 500_000_000
    rig.send_obs(1, t_sensor_ns=time.monotonic_ns() - 5_000_000_000)
    hold = rig.recv()
    assert hold.header["source"] == "hold:stale" and hold.header["obs_seq"] == 1 and hold.header["advisory"] is True
    assert rig.policy.counts.stale == 1
    assert rig.session.calls == 0
    rig.send_obs(2)  # fresh again: served
    assert rig.recv().header["obs_seq"] == 2


def test_the_estop_keeps_the_policy_from_being_asked(rig):
    rig.publisher.set_estop(True)  # what the e-stop thread does
    rig.send_obs(1)
    wait_until(lambda: rig.intake.counts.observations == 1, what="the observation to arrive")
    assert rig.recv(0.2) is None
    assert rig.session.calls == 0


def test_an_estop_during_inference_stops_the_chunk_and_release_restarts_from_the_trusted_state(rig):
    rig.send_obs(1)
    assert rig.recv() is not None
    # the guard records a chunk once it is sent
    wait_until(lambda: rig.guard.last_command is not None, what="the chunk to be recorded")
    rig.session.gate = threading.Event()
    rig.session.entered.clear()
    rig.send_obs(2)
    assert rig.session.entered.wait(5)
    rig.publisher.set_estop(True)  # engaged while obs 2 is being computed
    rig.session.gate.set()
    wait_until(lambda: rig.policy.counts.estop_blocked == 1, what="the blocked chunk")
    assert rig.recv(0.1) is None
    rig.publisher.set_estop(False)
    # the robot may have been moved while stopped: rate limits start from the measurement
    assert rig.guard.last_command is None
    rig.send_obs(3)
    assert rig.recv().header["obs_seq"] == 3


def test_a_fallback_swap_answers_the_newest_observation_at_once(rig):
    rig.send_obs(1)
    assert rig.recv().header["policy"] == "release:demo@1"
    backup = rig.served("fallback1", "backup@1")
    rig.publisher.expect_swap("fallback1", time.monotonic_ns())
    rig.loop.active = backup  # what the supervisor does on a fault ...
    rig.loop.wake()  # ... and the newest observation is served again without waiting
    h = rig.recv().header
    assert (h["obs_seq"], h["source"], h["policy"]) == (1, "fallback1", "fallback1:backup@1")
    assert backup.session.calls == 1 and rig.session.calls == 1
    # recorded just after the send, under the publisher's lock
    wait_until(lambda: [s.to for s in rig.publisher.swap_ms] == ["fallback1"], what="the swap timing")

    rig.loop.active = None  # the hold posture: no model runs
    rig.loop.wake()
    h = rig.recv().header
    assert (h["obs_seq"], h["source"], h["policy"]) == (1, "hold:fallback", "hold")
    assert backup.session.calls == 1
    wait_until(lambda: rig.publisher.counts.holds["fallback"] == 1, what="the hold count")


def test_an_engine_failure_answers_with_the_hold_posture(rig):
    rig.session.error = BackendError("injected")
    rig.send_obs(1)
    h = rig.recv().header
    assert (h["obs_seq"], h["source"]) == (1, "hold:backend_error")
    assert rig.policy.counts.backend_errors == 1 and rig.policy.counts.remote_errors == 0

    rig.session.error = RemoteUnavailable("server gone")  # not the policy's fault: counted apart
    rig.send_obs(2)
    h = rig.recv().header
    assert (h["obs_seq"], h["source"]) == (2, "hold:remote_unavailable")
    assert rig.policy.counts.backend_errors == 1 and rig.policy.counts.remote_errors == 1


def test_a_replaced_thread_never_publishes(rig):
    """A hung engine holds its thread; the successor serves, and the hung call's chunk is
    dropped when it finally returns."""
    rig.session.gate = threading.Event()
    rig.send_obs(1)
    assert rig.session.entered.wait(5)
    assert rig.loop.in_flight is not None and rig.loop.in_flight.policy is rig.policy
    backup = rig.served("fallback1", "backup@1", FakeSession(rig.contract, value=0.1))
    rig.loop.active = backup
    before = list(rig.loop._threads)  # the hung one and the reader
    rig.loop.replace_thread()
    rig.send_obs(2)
    h = rig.recv().header
    assert (h["obs_seq"], h["policy"]) == (2, "fallback1:backup@1")
    rig.session.gate.set()  # the hung inference of obs 1 returns now
    wait_until(lambda: rig.policy.counts.cycles == 1 and rig.loop.generation == 1)
    assert rig.recv(0.3) is None
    assert rig.policy.counts.published == 0
    wait_until(lambda: sum(t.alive for t in before) == 1, what="the hung thread to end once its call returned")
    assert rig.loop.alive  # two threads take turns again: the reader and its successor
    for seq in (3, 4):  # and go on serving, one answer per observation
        rig.send_obs(seq)
        assert rig.recv().header["obs_seq"] == seq


def test_an_observation_that_finds_no_cycle_running_is_served_by_the_thread_that_read_it(rig):
    """One wake-up per observation: the reader serves it itself and the other thread takes
    over the socket (a hand-over to a second thread cost a wake-up on the hot path)."""
    readers, servers = [], []
    accept = rig.intake.accept

    def reading(frames, receive_ns):
        readers.append(threading.current_thread().name)
        return accept(frames, receive_ns)

    rig.intake.accept = reading
    run = rig.session._run

    def serving(inputs):
        servers.append(threading.current_thread().name)
        return run(inputs)

    rig.session._run = serving
    for seq in range(1, 7):
        rig.send_obs(seq)
        assert rig.recv().header["obs_seq"] == seq
        # the next observation is a period later: the cycle has ended meanwhile
        wait_until(lambda: rig.loop._server is None, what="the cycle to end")
    assert servers == readers[-6:]  # each by the thread that read it ...
    assert len(set(servers)) == 2  # ... and the two threads took turns


def test_a_plain_chunk_still_judges_the_report_of_what_the_robot_executes(rig):
    """A fast policy's chunk arrives within its first slot: real-time chunking does not ask
    what the robot executes. An ``exec`` report naming no chunk vlad sent is still counted
    once (``exec_unknown``: the guard judges it for the seams); one naming a chunk it sent is
    not."""
    assert rig.contract.rtc is not None and rig.loop.rtc.delay_periods() == 0
    rig.send_obs(1)
    first = rig.recv().header["seq"]
    wait_until(lambda: rig.policy.counts.published == 1, what="the first chunk recorded")
    rig.send_obs(2, executing=[first, 0])
    assert rig.recv().header["obs_seq"] == 2
    assert rig.publisher.guard.reports_unknown == 0
    rig.send_obs(3, executing=[first + 1000, 0])
    assert rig.recv().header["obs_seq"] == 3
    assert rig.publisher.guard.reports_unknown == 1
    assert rig.policy.counts.guided == 0


class _Turnstile:
    """An engine gate that lets one inference through per :meth:`allow`."""

    def __init__(self) -> None:
        self._tokens = threading.Semaphore(0)
        self._open = False

    def wait(self, timeout: float) -> bool:
        return self._open or self._tokens.acquire(timeout=timeout)

    def allow(self) -> None:
        self._tokens.release()

    def set(self) -> None:  # the rig's teardown: every inference through
        self._open = True
        self._tokens.release()


def test_progress_is_seen_between_cycles_that_follow_each_other(rig):
    """A slow policy with observations arriving during every inference: the serving thread
    goes from one cycle to the next without waiting, and the watchdog's progress stamp moves
    after each cycle all the same (else it would hold back the systemd watchdog ping)."""
    rig.session.gate = gate = _Turnstile()
    rig.send_obs(1)
    assert rig.session.entered.wait(5)
    rig.send_obs(2)  # arrives while obs 1 is computed
    wait_until(lambda: rig.intake.counts.observations == 2, what="obs 2 read")
    rig.session.entered.clear()
    before = time.monotonic_ns()
    gate.allow()  # obs 1's cycle ends; obs 2's starts at once and waits in the engine
    assert rig.recv().header["obs_seq"] == 1
    assert rig.session.entered.wait(5) and rig.loop.in_flight is not None
    assert rig.loop._server is not None  # the serving thread never paused between the two
    assert rig.loop.last_progress_ns > before
    gate.allow()
    assert rig.recv().header["obs_seq"] == 2


def test_heartbeats_are_read_while_an_inference_runs(rig):
    """While one thread serves, the other reads the socket: a controller's heartbeats arrive
    when it sends them, however long the engine takes (liveness on the controller's clock)."""
    rig.session.gate = threading.Event()
    rig.send_obs(1)
    assert rig.session.entered.wait(5)
    read_before, beats = rig.loop.read_ns, rig.intake.counts.heartbeats
    for _ in range(3):
        rig.send_heartbeat()
        time.sleep(0.02)  # one control period between heartbeats
    wait_until(lambda: rig.intake.counts.heartbeats == beats + 3, what="the heartbeats, during the inference")
    assert rig.loop.in_flight is not None  # still inside obs 1's inference
    assert rig.loop.read_ns > read_before
    rig.session.gate.set()
    assert rig.recv().header["obs_seq"] == 1


def test_observations_superseded_during_an_inference_enter_the_history_window(contract, tokenizer):
    """A policy with [history] sees consecutive observations however long it takes: those
    superseded while it computed still enter its window, in order (LeRobot fills its queue
    with every observation of the loop)."""
    frames = 3
    hcontract = parse_contract(history_data(contract, frames), "history", path=contract.path)
    rig = Rig(hcontract, tokenizer)
    try:
        rig.session.gate = threading.Event()
        t0 = time.monotonic_ns() - 100_000_000  # sensor times one period apart, none in the future
        states = {k: np.array([0.3 + 0.01 * k, 0.2, 0.0, 0.0], np.float32) for k in range(1, 6)}
        rig.send_obs(1, t_sensor_ns=t0, proprio=states[1])
        assert rig.session.entered.wait(5)
        for k in range(2, 6):  # one per period while the engine is busy
            rig.send_obs(k, t_sensor_ns=t0 + (k - 1) * 20_000_000, proprio=states[k])
        wait_until(lambda: rig.intake.counts.observations == 5, what="every observation read")
        rig.session.gate.set()
        assert [rig.recv().header["obs_seq"], rig.recv().header["obs_seq"]] == [1, 5]
        window = rig.session.seen[1][hcontract.proprio.input][0]
        expected = np.stack([preprocess_proprio(hcontract, states[k]) for k in (3, 4, 5)])
        np.testing.assert_array_equal(window, expected)
        assert rig.intake.counts.superseded == 3
    finally:
        rig.close()


def test_a_held_reanchor_chunk_gives_way_to_the_observation_that_confirmed_it(rig):
    """An announced re-anchor (an episode reset): its chunk waits for confirmation. When the
    controller's next observation confirms it, that newer observation is answered instead
    (latest wins): the held chunk, computed from an older view, is never sent."""
    rig.intake.trusted.settle_ns = GENEROUS_NS  # only the next observation confirms, never silence
    rig.send_obs(1)
    assert rig.recv().header["obs_seq"] == 1
    reset = PROPRIO + np.array([1.0, 0.0, 0.0, 0.0], np.float32)
    rig.send_obs(2, proprio=reset, reanchor=True)
    wait_until(lambda: rig.loop._held is not None, what="obs 2's chunk held for its announcement")
    assert rig.recv(0.1) is None
    time.sleep(rig.intake.trusted.corroborate_ns / 1e9)
    rig.send_obs(3, proprio=reset)  # the arm is there later on: confirmed
    assert rig.recv().header["obs_seq"] == 3
    assert rig.recv(0.2) is None  # obs 2's chunk was dropped, not sent late
    assert rig.intake.counts.superseded == 1
    assert rig.intake.trusted.reanchors == 1 and rig.session.calls == 3


def test_a_held_reanchor_chunk_waits_for_the_confirming_observation_to_be_handed_over(rig):
    """The reader confirms an announcement while it judges the observation and queues that
    observation a moment later. Nothing looks at the held chunk in between (it sees the
    announcement confirmed and nothing taken): the held chunk is still dropped for the
    confirming observation, not sent."""
    rig.intake.trusted.settle_ns = GENEROUS_NS
    rig.send_obs(1)
    assert rig.recv().header["obs_seq"] == 1
    reset = PROPRIO + np.array([1.0, 0.0, 0.0, 0.0], np.float32)
    rig.send_obs(2, proprio=reset, reanchor=True)
    wait_until(lambda: rig.loop._held is not None, what="obs 2's chunk held for its announcement")
    reported = rig.publisher.guard.reported

    def slow_reported(client, t_sensor_ns, report):  # between judging and handing over
        if rig.intake.trusted.confirmed_id:
            time.sleep(4 * rig.loop.period_ns / 1e9)  # several quarter-period polls' worth
        reported(client, t_sensor_ns, report)

    rig.publisher.guard.reported = slow_reported
    time.sleep(rig.intake.trusted.corroborate_ns / 1e9)
    rig.send_obs(3, proprio=reset)
    assert rig.recv().header["obs_seq"] == 3
    assert rig.recv(0.2) is None
    assert rig.intake.counts.superseded == 1 and rig.session.calls == 3


def test_a_shadow_computes_with_the_guide_the_served_policy_got(rig):
    """Real-time chunking conditions the served chunk on the one the robot executes; a
    shadow (or a canary's reference) is given the same guide, so their divergence compares
    like with like (a plain reference against a guided canary diverged by 0.08 under load)."""
    from vlad.serving.shadow import ShadowRun

    spec = rig.contract.rtc
    assert spec is not None, "the demo contract has [rtc]"
    for _ in range(20):  # recent chunks took 150 ms: the next is computed to continue the executing one
        rig.loop.rtc.published(150_000_000)
    shadow_session = FakeSession(rig.contract)
    run = ShadowRun(rig.served("shadow", "demo@0", shadow_session), "canary-reference", 0.05)
    run.start()
    try:
        rig.send_obs(1)
        assert rig.recv().header["obs_seq"] == 1
        rig.loop.shadow = run
        time.sleep(0.05)  # a period on: the robot executes chunk 1
        rig.send_obs(2)
        assert rig.recv().header["obs_seq"] == 2
        wait_until(lambda: len(shadow_session.seen) == 1, what="the shadow's inference of obs 2")
    finally:
        rig.loop.shadow = None
        run.stop()
    served, shadowed = rig.session.seen[-1], shadow_session.seen[0]
    assert served[spec.weights_input].any(), "obs 2 was served guided"
    for name in (spec.actions_input, spec.weights_input):
        np.testing.assert_array_equal(shadowed[name], served[name])


def test_a_shadow_run_hands_the_status_its_typed_part(rig):
    """``ShadowRun.status()`` is the status's ``shadow`` (a :class:`ShadowStatus` with one
    :class:`vlad.snapshot.Divergence`), and ``vladctl shadow report`` gets its wire map."""
    from vlad import schema
    from vlad.errors import ProblemsError
    from vlad.serving.shadow import ShadowRun
    from vlad.snapshot import Divergence, Percentiles, ShadowStatus, plain

    run = ShadowRun(rig.served("shadow", "demo@0", FakeSession(rig.contract)), "shadow", 0.05)
    rig.publisher.observers.append(run.divergence.reference)
    run.start()
    try:
        rig.loop.shadow = run
        for seq in (1, 2, 3):
            rig.send_obs(seq)
            assert rig.recv().header["obs_seq"] == seq
            wait_until(lambda seq=seq: run.divergence.pairs == seq, what=f"the shadow's pair for obs {seq}")
    finally:
        rig.loop.shadow = None
        rig.publisher.observers.remove(run.divergence.reference)
        run.stop()
    st = run.status()
    assert isinstance(st, ShadowStatus) and isinstance(st.divergence, Divergence)
    assert (st.release, st.purpose, st.divergence.pairs, st.divergence.tolerance) == ("demo@0", "shadow", 3, 0.05)
    assert len(st.divergence.per_joint_max_abs) == rig.contract.action.dim
    assert st.divergence.max_abs == 0.0  # the same fake session on both sides
    assert isinstance(st.latency_ms["e2e"], Percentiles) and st.latency_ms["e2e"].count == 3
    assert st.faults["outputs"] == 3 and st.faults["cycles"] == 3
    report = plain(st)  # the shadow_report answer: the same fields, as a map that parses back
    assert report["divergence"]["pairs"] == 3 and report["latency_ms"]["e2e"]["count"] == 3
    assert schema.parse(ShadowStatus, report, "shadow_report", ProblemsError) == st
