"""Fault injection against the real daemon process, one scenario per fault.

Each test starts ``vlad serve`` with the primary policy on the ``wrapped`` backend
(tools/vlad_tools/gates/wrapped.py: faults injected around real ONNX Runtime), a fallback chain of
[a previous release (real ONNX Runtime), hold], and a simulated controller that publishes
observations and heartbeats at the control rate and records every chunk it receives.
Each asserts the state transition, the event log, and what the controller got: a fresh
command throughout, never a non-finite or out-of-bounds action.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import MAX_GAP_S, wait_chunks, wait_state
from vlad.protocol import ActionChunk
from vlad_tools.testing import (
    ControllerSim,
    load_golden,
    max_gap,
    start_daemon,
    write_fault_rig,
)


@pytest.fixture()
def rig(tmp_path):
    """A daemon with the faulty primary, a previous release and hold; plus a controller."""
    f = write_fault_rig(tmp_path)
    control, sensors, estop, primary = f.control, f.sensors, f.estop, f.primary
    d = start_daemon(tmp_path, config=f.config, env=f.env)
    client = d.client()
    ctl = ControllerSim(client, load_golden()[0]).start()
    rig = Rig(d, client, ctl, control, sensors, estop, primary)
    try:  # a set-up that times out on a loaded machine must not leave the daemon running
        rig.wait_state("ACTIVE", serving_prefix="release")
        rig.wait_chunks(source="release")
        yield rig
    finally:
        ctl.stop()
        client.close()
        d.stop()
    assert "Traceback" not in d.log(), d.log()


@dataclass
class Rig:
    daemon: object
    client: object
    ctl: ControllerSim
    control: Path
    sensors: Path
    estop: Path
    primary: Path

    def status(self) -> dict:
        return self.client.status()

    def wait_state(self, state: str, serving_prefix: str | None = None, timeout: float = 10.0) -> dict:
        return wait_state(self.client, state, serving_prefix, timeout)

    def wait_chunks(self, source: str, n: int = 10, timeout: float = 10.0) -> list[ActionChunk]:
        return wait_chunks(self.ctl, source, n, timeout)

    def events(self) -> list[dict]:
        return self.client.control("events", limit=200)

    def assert_event(self, kind: str, text: str) -> None:
        evs = self.events()
        assert any(e["kind"] == kind and text in e["reason"] for e in evs), [(e["kind"], e["reason"]) for e in evs]

    def assert_safe(self, chunks: list[ActionChunk], contract) -> None:
        lower = np.array([j.lower for j in contract.action.joints])
        upper = np.array([j.upper for j in contract.action.joints])
        for c in chunks:
            assert np.isfinite(c.actions).all(), c
            assert (c.actions >= lower - 1e-6).all() and (c.actions <= upper + 1e-6).all(), c

    def run_fault(
        self, contract, inject, expect_state: str, expect_serving: str, event: tuple[str, str], settle: int = 10
    ) -> list[ActionChunk]:
        """Inject, wait for the transition and then for ``settle`` chunks from what serves
        after it, and check what the controller saw meanwhile (through the switch-over)."""
        t0 = time.monotonic()
        inject()
        self.wait_state(expect_state, expect_serving)
        self.wait_chunks(expect_serving, n=settle)
        seen = self.ctl.since(t0)
        self.assert_event(*event)
        self.assert_safe(seen, contract)
        gap = max_gap(seen)
        assert gap <= MAX_GAP_S, f"{gap * 1000:.1f} ms without a chunk; sources {[c.source for c in seen][:40]}"
        return seen


def test_backend_raises(rig, contract):
    seen = rig.run_fault(
        contract, lambda: rig.control.write_text("raise"), "FALLBACK", "fallback1", ("quarantine", "backend exception")
    )
    assert any(c.source == "hold:backend_error" for c in seen)
    rig.wait_chunks("fallback1")
    st = rig.status()
    assert "release:vlad-demo-reacher@1.0.0" in st["quarantined"]
    # quarantined: even with the engine healthy again, no automatic return
    rig.control.write_text("ok")
    time.sleep(1.5)  # past the healthy window (1 s): that nothing happens meanwhile is the behaviour
    assert rig.status()["serving"].startswith("fallback1")
    # an operator brings it back
    rig.client.control("resume", who="test", why="engine fixed")
    rig.wait_state("ACTIVE", "release", timeout=5)
    rig.assert_event("operator", "resume by test")


def test_backend_hangs_past_deadline(rig, contract):
    seen = rig.run_fault(
        contract, lambda: rig.control.write_text("hang"), "FALLBACK", "fallback1", ("quarantine", "inference running")
    )
    assert any(c.source == "hold:bridge" for c in seen)
    rig.wait_chunks("fallback1")
    rig.control.write_text("ok")  # unwedge the thread so the test can end cleanly


def test_nan_output(rig, contract):
    seen = rig.run_fault(
        contract, lambda: rig.control.write_text("nan"), "FALLBACK", "fallback1", ("quarantine", "nonfinite output")
    )
    assert any("nonfinite" in c.interventions or c.source.startswith("hold") for c in seen)
    rig.wait_chunks("fallback1")
    rig.control.write_text("ok")
    time.sleep(1.5)  # past the healthy window (1 s): still no automatic return to a NaN policy
    assert rig.status()["serving"].startswith("fallback1")


def test_out_of_bounds_output(rig, contract):
    seen = rig.run_fault(
        contract, lambda: rig.control.write_text("oob"), "FALLBACK", "fallback1", ("quarantine", "out of bounds")
    )
    assert any("bounds" in c.interventions for c in seen)  # clamped, counted, never published raw
    rig.wait_chunks("fallback1")


def test_temperature_over_threshold_then_cooled(rig, contract):
    rig.run_fault(
        contract,
        lambda: rig.sensors.write_text(json.dumps({"temperature.board.injected": 99.0})),
        "FALLBACK",
        "fallback1",
        ("fault", "temperature.board.injected at 99.0"),
    )
    rig.wait_chunks("fallback1")
    rig.sensors.write_text("{}")
    rig.wait_state("ACTIVE", "release", timeout=5)  # not quarantined: back after the healthy window
    rig.assert_event("cleared", "temperature_high cleared")


def test_memory_pressure_then_relieved(rig, contract):
    rig.run_fault(
        contract,
        lambda: rig.sensors.write_text(json.dumps({"memory.injected.available_bytes": 1e6})),
        "FALLBACK",
        "fallback1",
        ("fault", "host memory available"),
    )
    rig.sensors.write_text("{}")
    rig.wait_state("ACTIVE", "release", timeout=5)


def test_heartbeat_lost_then_restored(rig, contract):
    def lose():
        rig.ctl.send_heartbeat = False

    seen = rig.run_fault(
        contract, lose, "FALLBACK", "hold", ("fault", "no heartbeat from controller 'test-controller'")
    )
    assert seen[-1].source.startswith("hold")
    rig.ctl.send_heartbeat = True
    rig.wait_state("ACTIVE", "release", timeout=5)
    rig.wait_chunks("release")


def test_sensor_stream_stalls(rig, contract):
    def stall():
        rig.ctl.send_obs = False

    seen = rig.run_fault(contract, stall, "FALLBACK", "hold", ("fault", "no observation for"), settle=25)
    holds = [c for c in seen if c.source == "hold:fallback"]
    assert len(holds) >= 20  # the hold posture keeps coming every period without input
    rig.ctl.send_obs = True
    rig.wait_state("ACTIVE", "release", timeout=5)


def test_stale_observations(rig, contract):
    def go_stale():
        rig.ctl.stale = True

    rig.run_fault(contract, go_stale, "FALLBACK", "hold", ("fault", "stale"))
    assert rig.status()["counters"]["stale"] > 0
    rig.ctl.stale = False
    rig.wait_state("ACTIVE", "release", timeout=5)


def test_input_shape_out_of_range(rig, contract):
    def bad():
        rig.ctl.bad_shape = True

    # Refused observations are counted; with no valid one left the sensor stream stalls
    # and the hold posture serves (junk beside valid observations would only warn).
    rig.run_fault(contract, bad, "FALLBACK", "hold", ("fault", "no observation"))
    assert rig.status()["counters"]["rejected"]["bad_shape"] > 0
    rig.ctl.bad_shape = False
    rig.wait_state("ACTIVE", "release", timeout=5)


def test_artifact_modified_while_serving(rig, contract):
    def tamper():
        path = rig.primary / "policy.onnx"
        data = bytearray(path.read_bytes())
        data[-1] ^= 0xFF
        path.write_bytes(bytes(data))

    rig.run_fault(contract, tamper, "FALLBACK", "fallback1", ("quarantine", "changed on disk"))


def test_estop_engaged_then_released(rig, contract):
    t0 = time.monotonic()
    before = rig.status()["counters"].get("published_release", 0)
    rig.estop.write_text("engaged")
    rig.wait_state("ESTOPPED")
    rig.wait_chunks("hold:estop", n=25)  # half a second of e-stop holds: no chunk from the policy among them
    st = rig.status()
    assert st["estop"]["engaged"]
    during = [c for c in rig.ctl.since(t0 + 0.1)]
    assert during and all(c.source == "hold:estop" for c in during[2:])  # no motion from the policy
    assert max_gap(during) <= MAX_GAP_S
    rig.assert_safe(during, contract)
    assert st["counters"].get("published_release", 0) <= before + 2  # the policy is not even asked
    rig.assert_event("transition", "e-stop engaged")
    rig.estop.write_text("0")  # the safety system releases it; vlad never does
    rig.wait_state("ACTIVE", "release")
    rig.assert_event("transition", "e-stop released by the safety system")
    rig.wait_chunks("release")
