"""The built-in monitors on typed health views: thresholds, rates over a sliding window, and
(with the health policy) the hysteresis that keeps a flapping fault from flapping the robot."""

from __future__ import annotations

from vlad.config import MonitorsConfig
from vlad.health import monitors as m
from vlad.health.base import HealthView, InFlight
from vlad.health.liveness import Beat
from vlad.health.policy import HealthPolicy
from vlad.health.state import StateMachine
from vlad.serving.counters import (
    HOLD,
    IntakeCounts,
    PolicyCounts,
    PolicyId,
    PublishCounts,
)

PERIOD = 20_000_000  # the demo contract's 50 Hz
T0 = 100_000_000_000
A = PolicyId("release", "a@1")
B = PolicyId("fallback1", "b@1")


def view(**over) -> HealthView:
    base = {
        "now_ns": T0,
        "period_ns": PERIOD,
        "deadline_ns": 20_000_000,
        "thresholds": MonitorsConfig(),
        "intake": IntakeCounts(),
        "intake_window": IntakeCounts(),
        "publish": PublishCounts(),
        "publish_window": PublishCounts(),
        "policies": {A: PolicyCounts()},
        "policies_window": {A: PolicyCounts()},
        "serving": A,
        "release": A,
        "latency": {},
        "last_observation_ns": 0,
        "last_heartbeat_ns": 0,
        "in_flight": None,
        "hang_timeout_ns": 1_000_000_000,
        "readings": {},
    }
    base.update(over)
    return HealthView(**base)


def codes(findings) -> list[tuple[str, str]]:
    return [(f.code, f.severity) for f in findings]


# -- fixed thresholds ------------------------------------------------------------------------


def test_thermal_thresholds_are_inclusive_and_separate_for_the_gpu():
    t = MonitorsConfig()
    mon = m.ThermalMonitor()
    assert mon.check(view(readings={"temperature.cpu.0": t.cpu_temp_warn_c - 0.1})) == []
    assert codes(mon.check(view(readings={"temperature.cpu.0": t.cpu_temp_warn_c}))) == [("temperature_warm", "warn")]
    assert codes(mon.check(view(readings={"temperature.cpu.0": t.cpu_temp_fault_c}))) == [("temperature_high", "fault")]
    # 86 °C is warm for a CPU but hot for the GPU (83/90 by default)
    gpu = mon.check(view(readings={"temperature.gpu.0": t.gpu_temp_fault_c}))
    assert codes(gpu) == [("temperature_high", "fault")] and gpu[0].scope == "system"
    assert mon.check(view(readings={"memory.rss_bytes": 1e12})) == []  # not a temperature


def test_thermal_thresholds_come_from_the_config():
    cool = MonitorsConfig(cpu_temp_warn_c=50.0, cpu_temp_fault_c=60.0)
    assert codes(m.ThermalMonitor().check(view(thresholds=cool, readings={"temperature.cpu.0": 61.0}))) == [
        ("temperature_high", "fault")
    ]


def test_memory_uses_the_tightest_available_reading():
    t = MonitorsConfig()
    low = (t.min_available_memory_mb - 1) * 2**20
    plenty = 10 * t.min_available_memory_mb * 2**20
    mon = m.MemoryMonitor()
    assert mon.check(view(readings={"memory.available_bytes": plenty})) == []
    found = mon.check(view(readings={"memory.available_bytes": plenty, "memory.cgroup.available_bytes": low}))
    assert codes(found) == [("memory_pressure", "fault")]
    assert codes(mon.check(view(readings={"memory.rss_bytes": (t.max_rss_mb + 1) * 2**20}))) == [("rss_high", "warn")]


def test_heartbeat_is_judged_only_after_the_first_one():
    mon = m.HeartbeatMonitor()
    limit = MonitorsConfig().heartbeat_missing_periods * PERIOD
    assert mon.check(view(controllers={})) == []  # a controller that never sent one
    assert mon.check(view(controllers={"arm": Beat(T0 - limit, "stream")})) == []  # exactly at the limit: still there
    found = mon.check(view(controllers={"arm": Beat(T0 - limit - 1, "stream")}))
    assert codes(found) == [("heartbeat_lost", "fault")] and found[0].scope == "controller"
    assert found[0].subject == "arm" and "'arm'" in found[0].message


def test_one_live_controller_never_hides_another_ones_death():
    """An openpi client heartbeating (by the endpoint) while the native controller's loop died:
    the native controller is still gone."""
    limit = MonitorsConfig().heartbeat_missing_periods * PERIOD
    beats = {"openpi/1": Beat(T0, "request"), "arm": Beat(T0 - limit - 1, "stream")}
    found = m.HeartbeatMonitor().check(view(controllers=beats))
    assert [(f.code, f.subject) for f in found] == [("heartbeat_lost", "arm")]


def test_silence_is_a_stall_unless_every_live_controller_asks_on_request():
    stall = MonitorsConfig().sensor_stall_periods * PERIOD
    quiet = T0 - stall - 1
    mon = m.SensorStreamMonitor()
    assert codes(mon.check(view(last_observation_ns=quiet))) == [("sensor_stall", "fault")]  # nobody said
    on_request = {"openpi/1": Beat(T0, "request")}
    assert mon.check(view(last_observation_ns=quiet, controllers=on_request)) == []
    both = {**on_request, "arm": Beat(T0, "stream")}
    assert codes(mon.check(view(last_observation_ns=quiet, controllers=both))) == [("sensor_stall", "fault")]
    # a streaming controller that died does not count: the request-driven one alone is live
    gone = {**on_request, "arm": Beat(T0 - 10 * stall, "stream")}
    assert mon.check(view(last_observation_ns=quiet, controllers=gone)) == []
    # every controller said goodbye after its last observation: it left, nothing stalled
    assert mon.check(view(last_observation_ns=quiet, controllers_left_ns=quiet + 1)) == []
    # a goodbye before the last observation does not excuse a stream that stopped since
    assert codes(mon.check(view(last_observation_ns=quiet, controllers_left_ns=quiet - 1))) == [
        ("sensor_stall", "fault")
    ]


def test_a_controller_that_streams_again_owes_observations_from_when_it_said_so():
    """Between tasks a controller asked by request (no observation for long); its first
    heartbeat declaring ``stream`` again starts the stall clock, not its last observation."""
    stall = MonitorsConfig().sensor_stall_periods * PERIOD
    long_ago = T0 - 50 * stall
    mon = m.SensorStreamMonitor()
    just_switched = {"arm": Beat(T0, "stream", since_ns=T0 - PERIOD)}
    assert mon.check(view(last_observation_ns=long_ago, controllers=just_switched)) == []
    silent_since = {"arm": Beat(T0, "stream", since_ns=T0 - stall - 1)}
    assert codes(mon.check(view(last_observation_ns=long_ago, controllers=silent_since))) == [("sensor_stall", "fault")]
    # another controller streaming all along still sees the camera stop
    both = {**just_switched, "cam": Beat(T0, "stream", since_ns=long_ago)}
    assert codes(mon.check(view(last_observation_ns=long_ago, controllers=both))) == [("sensor_stall", "fault")]


def test_policy_faults_are_blamed_on_the_policy_that_produced_them():
    mon = m.PolicyOutputMonitor()
    window = {A: PolicyCounts(), B: PolicyCounts(backend_errors=2)}
    found = mon.check(view(policies_window=window, serving=A))
    assert codes(found) == [("backend_exception", "fault")] and found[0].policy == B and found[0].scope == "policy"
    # a remote outage is a system fault, and only of the policy serving now
    window = {A: PolicyCounts(remote_errors=1), B: PolicyCounts(remote_errors=3)}
    found = mon.check(view(policies_window=window, serving=A))
    assert [(f.code, f.scope, f.policy) for f in found] == [("remote_unavailable", "system", A)]


def test_a_hang_is_judged_against_the_hang_timeout():
    mon = m.PolicyOutputMonitor()
    assert mon.check(view(in_flight=InFlight(A, T0 - 999_000_000))) == []
    found = mon.check(view(in_flight=InFlight(A, T0 - 1_001_000_000)))
    assert codes(found) == [("backend_hang", "fault")] and found[0].policy == A


def _deadline_ticks(mon, publish, ticks, chunks_per_tick, miss_every, now):
    """Monitor ticks at 20 Hz while chunks go out at 50 Hz: 2 or 3 chunks per tick."""
    found = []
    for k in range(ticks):
        now += 50_000_000
        n = chunks_per_tick[k % len(chunks_per_tick)]
        publish.policy_chunks += n
        publish.chunks += n
        if miss_every and k % miss_every == 0:
            publish.deadline_misses += 1
        found = mon.check(view(now_ns=now, publish=publish.snapshot()))
    return found, now


def test_deadline_misses_are_a_rate_over_the_window_not_one_tick():
    """At 50 Hz control and a 20 Hz monitor one tick sees 2-3 chunks: the rate is judged over
    input_window_s (a per-tick rate over >= 5 chunks never fired at the demo's rates)."""
    mon = m.DeadlineMonitor()
    publish = PublishCounts()
    assert mon.check(view(now_ns=T0, publish=publish.snapshot())) == []  # baseline
    found, now = _deadline_ticks(mon, publish, 1, [3], 1, T0)
    assert found == []  # 1 of 3: too few cycles to call it a rate
    found, now = _deadline_ticks(mon, publish, 20, [2, 3], 4, now)  # ~1 miss in 10 chunks
    assert codes(found) == [("deadline_misses", "warn")] and found[0].value > 0.05
    found, now = _deadline_ticks(mon, publish, 8, [2, 3], 0, now)
    assert codes(found) == [("deadline_misses", "warn")]  # still inside the 1 s window
    found, now = _deadline_ticks(mon, publish, 20, [2, 3], 0, now)
    assert found == []  # the misses slid out of the window


def test_a_miss_rate_at_the_threshold_is_not_a_warning():
    mon = m.DeadlineMonitor()
    publish = PublishCounts()
    mon.check(view(now_ns=T0, publish=publish.snapshot()))
    found, _ = _deadline_ticks(mon, publish, 20, [5], 20, T0)  # 1 miss in 100 chunks: 1 %
    assert found == []


def test_p99_needs_enough_samples():
    mon = m.DeadlineMonitor()
    assert mon.check(view(latency={"e2e": {"count": 49, "p99": 50.0}})) == []  # p99 of < 50 samples is noise
    assert codes(mon.check(view(latency={"e2e": {"count": 50, "p99": 20.5}}))) == [("p99_over_budget", "warn")]


def test_every_builtin_monitor_is_offered_by_the_hook():
    offered = m.vlad_monitors(config={})
    assert sorted(type(x).__name__ for x in offered) == sorted(cls.__name__ for cls in m.BUILTIN)
    assert len({x.name for x in offered}) == len(offered)


# -- input, judged as a rate over a sliding window ------------------------------------------


class Stream:
    """An observation stream as the sensors monitor sees it: cumulative counters, one
    monitor tick at a time (the counters are what the hot path writes)."""

    def __init__(self, thresholds: MonitorsConfig | None = None) -> None:
        self.t = thresholds or MonitorsConfig()
        self.now = T0
        self.intake = IntakeCounts()
        self.policy = PolicyCounts()
        self.mon = m.SensorStreamMonitor()
        self.last_obs = 0
        # The monitor judges what happened since the oldest tick in its window; the daemon
        # ticks from the start, so the first tick is the baseline.
        assert self.tick(ms=0) == []

    def tick(self, ms: float = 50, good: int = 0, stale: int = 0, rejected: dict[str, int] | None = None):
        self.now += int(ms * 1e6)
        self.intake.observations += good + stale  # a stale observation passed intake ...
        self.policy.stale += stale  # ... and was skipped when inference would start
        for reason, n in (rejected or {}).items():
            self.intake.rejected[reason] += n
            self.intake.input_rejected += n
        if good or stale:
            self.last_obs = self.now
        v = view(
            now_ns=self.now,
            thresholds=self.t,
            intake=self.intake.snapshot(),
            policies={A: self.policy.snapshot()},
            last_observation_ns=self.last_obs,
        )
        return self.mon.check(v)


def test_one_stale_observation_is_counted_not_an_outage():
    s = Stream()
    for _ in range(10):
        assert s.tick(good=2) == []
    assert s.tick(stale=1) == []


def test_sustained_stale_input_is_a_fault_until_good_input_outweighs_it():
    s = Stream()
    found = []
    for _ in range(5):
        found = s.tick(stale=4)  # 20 stale observations, nothing else
    assert codes(found) == [("stale_observations", "fault")] and found[0].scope == "input"
    assert found[0].value == 1.0 and found[0].threshold == s.t.stale_fraction_fault
    # good input again: a rate, so the fault holds while stale ones are still the majority
    # of the window (20 of 20 + 2k), and clears when they no longer are (k = 10: 50 %)
    for k in range(1, 10):
        assert codes(s.tick(good=2)) == [("stale_observations", "fault")], k
    assert s.tick(good=2) == []


def test_too_few_observations_are_not_judged():
    s = Stream()
    assert s.tick(stale=s.t.min_input_events - 1) == []  # every one stale, but too few to judge
    assert codes(s.tick(stale=1)) == [("stale_observations", "fault")]


def test_the_fraction_and_the_window_come_from_the_config():
    lenient = Stream(MonitorsConfig(stale_fraction_fault=0.9))
    for _ in range(5):
        assert lenient.tick(stale=8, good=2) == []  # 80 % stale: under 90 %
    # the same input judged over the default 1 s window and over 100 ms (two 50 ms ticks)
    default, short = Stream(), Stream(MonitorsConfig(input_window_s=0.1))
    for stream in (default, short):
        for _ in range(3):
            stream.tick(stale=5)
    assert codes(default.tick(good=10)) == [("stale_observations", "fault")]  # 15 of 25
    assert short.tick(good=10) == []  # 5 of 15: the first stale ticks left the short window


def test_out_of_contract_input_warns_with_the_top_reasons():
    s = Stream()
    found = s.tick(good=2, rejected={"bad_shape": 5, "nonfinite": 1})
    assert codes(found) == [("input_out_of_contract", "warn")]
    assert "bad_shape 5" in found[0].message and "nonfinite 1" in found[0].message


def test_a_stalled_stream_is_a_fault():
    s = Stream()
    s.tick(good=1)
    limit_ms = s.t.sensor_stall_periods * PERIOD / 1e6
    assert s.tick(ms=limit_ms) == []  # exactly the limit
    assert codes(s.tick(ms=1)) == [("sensor_stall", "fault")]


# -- with the health policy: hysteresis -----------------------------------------------------


def test_a_stale_burst_holds_while_it_lasts_and_no_longer():
    """Input faults say nothing about the policies: the hold ends at the first tick the
    finding is gone (the stale fraction is already a rate over its window: its own inertia),
    while a system fault's way back needs the healthy window."""
    s = Stream()
    window_ns = 2_000_000_000
    policy = HealthPolicy([A, B, HOLD], healthy_window_ns=window_ns, events=StateMachine())
    for _ in range(5):
        decision = policy.update(s.tick(stale=4), s.now)
    assert decision.target == 2  # input fault: the hold posture
    last_fault = s.now
    while True:
        findings = s.tick(good=2)
        if findings:
            last_fault = s.now
        if policy.update(findings, s.now).target == 0:
            break
        assert s.now - T0 < 10_000_000_000, "never returned to the release"
    # the finding cleared after 10 good ticks (see above); the release serves at the next
    assert last_fault == T0 + 14 * 50_000_000
    assert s.now - last_fault == 50_000_000


def test_messages_waiting_behind_a_long_inference_are_not_a_lost_controller():
    """A starved intake thread leaves heartbeats unread for a while: ages are judged up to
    when it last read its socket, never as a lost controller."""
    limit = MonitorsConfig().heartbeat_missing_periods * PERIOD
    beats = {"arm": Beat(T0 - limit - 1, "stream")}
    reading_stopped = T0 - limit + 5_000_000  # the inference started just after the last heartbeat
    assert m.HeartbeatMonitor().check(view(controllers=beats, socket_read_ns=reading_stopped)) == []
    assert [f.code for f in m.HeartbeatMonitor().check(view(controllers=beats, socket_read_ns=T0))] == [
        "heartbeat_lost"
    ]
    stall = MonitorsConfig().sensor_stall_periods * PERIOD
    quiet = T0 - stall - 1
    assert m.SensorStreamMonitor().check(view(last_observation_ns=quiet, socket_read_ns=quiet + 1)) == []


# -- artifacts -------------------------------------------------------------------------------


def _artifacts_view(tmp_path, now_ns, digest, interval_s=5.0):
    return view(
        now_ns=now_ns,
        thresholds=MonitorsConfig(artifact_check_interval_s=interval_s),
        release_dir=tmp_path,
        artifacts={"policy.onnx": digest},
    )


def test_artifacts_are_rehashed_a_block_per_tick(tmp_path):
    import hashlib
    import os

    path = tmp_path / "policy.onnx"
    data = os.urandom(2 * m.ARTIFACT_BYTES_PER_TICK + 1000)
    path.write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    mon = m.ArtifactMonitor()
    for tick in range(3):  # 3 ticks to read it: no tick hashes more than its budget
        assert mon.check(_artifacts_view(tmp_path, T0 + tick * PERIOD, digest)) == []
        assert mon._job is None if tick == 2 else mon._job is not None
    # The next pass starts with the next interval; changed meanwhile (same identity here:
    # the first look recorded it after the change), the pass finds it.
    mon._identity.clear()
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    t = T0 + 5_000_000_000
    found = [codes(mon.check(_artifacts_view(tmp_path, t + i * PERIOD, digest))) for i in range(3)]
    assert found == [[], [], [("artifact_modified", "fault")]]


def test_an_artifact_whose_identity_changed_is_hashed_at_once(tmp_path):
    import hashlib
    import os

    path = tmp_path / "policy.onnx"
    data = os.urandom(3 * m.ARTIFACT_BYTES_PER_TICK)
    path.write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    mon = m.ArtifactMonitor()
    assert mon.check(_artifacts_view(tmp_path, T0, digest, interval_s=0.05)) == []
    path.write_bytes(b"tampered")
    t = T0 + 50_000_000
    assert codes(mon.check(_artifacts_view(tmp_path, t, digest, interval_s=0.05))) == [("artifact_modified", "fault")]
    path.write_bytes(data)  # restored: the finding goes with the next look
    assert mon.check(_artifacts_view(tmp_path, t + 50_000_000, digest, interval_s=0.05)) == []
    path.unlink()  # gone: changed
    assert mon.check(_artifacts_view(tmp_path, t + 100_000_000, digest, interval_s=0.05)) != []


def test_artifacts_of_another_release_are_looked_at_from_scratch(tmp_path):
    import hashlib
    import os

    old, new = tmp_path / "old", tmp_path / "new"
    digests = {}
    for folder in (old, new):
        folder.mkdir()
        data = os.urandom(2 * m.ARTIFACT_BYTES_PER_TICK)
        (folder / "policy.onnx").write_bytes(data)
        digests[folder] = hashlib.sha256(data).hexdigest()
    mon = m.ArtifactMonitor()
    assert mon.check(_artifacts_view(old, T0, digests[old])) == []  # half of old/policy.onnx hashed
    for i in range(1, 4):  # a deploy: the old file's pass is not judged against the new digest
        assert mon.check(_artifacts_view(new, T0 + i * PERIOD, digests[new])) == []


def test_a_sensor_is_read_at_most_every_interval_and_its_readings_reused_in_between():
    """The 20 Hz health tick takes a slow sensor's last readings until its interval passed
    (a hwmon scan per tick is interpreter time the serving thread competes with)."""
    from vlad.health.base import Sensor
    from vlad.health.sensors import PsutilSensor

    class Counting(Sensor):
        name = "counting"
        interval_s = 0.5

        def __init__(self) -> None:
            self.reads = 0

        def read(self) -> dict[str, float]:
            self.reads += 1
            return {"temperature.cpu.die": 40.0 + self.reads}

    s = Counting()
    seen = [s.sample(t)["temperature.cpu.die"] for t in (100.0, 100.2, 100.49, 100.5, 100.9, 101.0)]
    assert seen == [41.0, 41.0, 41.0, 42.0, 42.0, 43.0] and s.reads == 3
    every_tick = Counting()
    every_tick.interval_s = 0.0
    assert [every_tick.sample(100.0), every_tick.sample(100.0)] == [
        {"temperature.cpu.die": 41.0},
        {"temperature.cpu.die": 42.0},
    ]
    assert PsutilSensor.interval_s > 0  # the real ones are slow
