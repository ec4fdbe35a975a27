"""The typed status (:mod:`vlad.snapshot`): the wire map round-trips, a map of another shape is
one clear error listing every problem, and every reader (plain view, watch frame, Prometheus
text) is total on whatever parses: fuzzed from a status recorded on a real daemon
(``tests/cli/watch_status.json``, re-recorded with ``python -m tests.cli.test_watch``)."""

from __future__ import annotations

import copy
import json
import random
import re
from pathlib import Path
from typing import Any

import msgpack
import pytest

from tests.conftest import ROOT
from vlad.backend import LinkRecovery, RollingLatency, SessionStats
from vlad.cli.daemon import format_status
from vlad.cli.watch import render as render_frame
from vlad.health.state import State, StateMachine
from vlad.serving.guard import INTERVENTIONS
from vlad.snapshot import StatusSnapshot, StatusUnreadable, parse_events, parse_status, split_readings

RECORDED = Path(__file__).parent / "cli" / "watch_status.json"


def recorded() -> dict[str, Any]:
    return json.loads(RECORDED.read_text())


def test_the_wire_map_round_trips_through_json_and_msgpack():
    wire = recorded()
    snap = parse_status(wire)
    assert isinstance(snap, StatusSnapshot)
    assert snap.to_dict() == wire  # same keys, same values: dashboards and scripts read the same map
    packed = msgpack.unpackb(msgpack.packb(snap.to_dict()))  # the status socket's encoding
    assert parse_status(packed) == snap
    assert parse_status(json.loads(json.dumps(snap.to_dict()))) == snap


def test_the_readers_see_typed_values():
    snap = parse_status(recorded())
    assert snap.state in {s.value for s in State}
    assert snap.on_fallback and snap.serving == snap.chain[1]
    assert set(snap.counters.guard()) == set(INTERVENTIONS)
    assert snap.counters.guard()["nonfinite"] == snap.counters.guard_nonfinite >= 1
    assert snap.latency_ms["e2e"].p50 <= snap.latency_ms["e2e"].p99
    assert all(len(h.cumulative) == len(snap.bucket_edges_s) + 1 for h in snap.histograms.values())
    assert snap.remote_links() == []  # local engines only: their stats are empty on the wire
    assert all(not s.remote for s in snap.backend_stats.values())


def test_a_remote_link_round_trips_and_a_local_session_is_empty_on_the_wire():
    link = SessionStats(
        kind="remote",
        state="lost",
        state_for_s=1.5,
        requests=10,
        ok=8,
        errors={"unavailable": 2},
        recovery=LinkRecovery(streak=1, needed=3, relapses=0),
        last_error="unavailable: refused",
        window=10,
        error_rate=0.2,
        round_trip_ms=RollingLatency(p50=2.0, p99=5.0, count=8),
        endpoint="grpc://gpu:8001",
        protocol="grpc",
        model="m",
    )
    assert SessionStats().to_dict() == {}
    wire = recorded()
    pid = wire["chain"][0]
    wire["backend_stats"][pid] = link.to_dict()
    snap = parse_status(wire)
    assert snap.backend_stats[pid] == link and snap.backend_stats[pid].lost
    assert snap.remote_links() == [(pid, link)]
    assert snap.to_dict()["backend_stats"][pid]["kind"] == "remote"  # the key scripts branch on


@pytest.mark.parametrize(
    "change, problems",
    [
        (lambda st: st.pop("counters"), ["counters: missing"]),
        (lambda st: st.update(state="RUNNING"), ["state: unknown value 'RUNNING'"]),
        (lambda st: st["counters"].update(published="7"), ["counters.published: expected an integer"]),
        (lambda st: st["latency_ms"]["e2e"].update(p99=None), ["latency_ms.e2e.p99: expected a number"]),
        (lambda st: st.update(surprise=1), ["surprise: unknown key"]),
        (
            lambda st: (st["rates"].update(actions_hz="fast"), st["estop"].pop("engaged")),
            ["rates.actions_hz: expected a number", "estop.engaged: missing"],
        ),
    ],
    ids=["missing", "literal", "nested-type", "null", "unknown", "several"],
)
def test_a_status_of_another_shape_is_one_line_listing_every_problem(change, problems):
    st = recorded()
    change(st)
    with pytest.raises(StatusUnreadable) as e:
        parse_status(st)
    text = str(e.value)
    assert "\n" not in text and text.startswith("the daemon's status")
    for p in problems:
        assert p in text, text
    assert len(e.value.problems) == len(problems)


def test_not_a_map_at_all():
    for junk in (None, [], "status", 3, b"\x00"):
        with pytest.raises(StatusUnreadable):
            parse_status(junk)
    with pytest.raises(StatusUnreadable):
        parse_events({"events": []})


JUNK: list[Any] = [
    None,
    "",
    "x" * 5000,
    "ACTIVE",
    -1,
    0,
    2**63,
    1e308,
    -1e-308,
    float("nan"),
    float("inf"),
    True,
    [],
    [1, "a", None],
    {},
    {"a": {"b": {"c": 1}}},
    {"\x00": 1},
    {1: "a", "b": 2},  # msgpack maps may have keys of any type
]


def _deep(levels: int) -> Any:
    node: Any = 1
    for _ in range(levels):
        node = {"k": node}
    return node


def _slots(node: Any, out: list) -> list:
    """Every (container, key) in a JSON tree."""
    if isinstance(node, dict):
        for k, v in node.items():
            out.append((node, k))
            _slots(v, out)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.append((node, i))
            _slots(v, out)
    return out


def _same_type(rng: random.Random, value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return rng.choice([0, -1, 2**62, -(2**62)])
    if isinstance(value, float):
        return rng.choice([0.0, -1.0, 1e300, -1e300, 5e-324])
    if isinstance(value, str):
        return rng.choice(["", " ", "é" * 300, "\x1b[2J", "a\nb\tc", "release:"])
    if isinstance(value, dict):
        return {}
    if isinstance(value, list):
        return []
    return value


def mutated(rng: random.Random, base: dict) -> dict:
    st = copy.deepcopy(base)
    for _ in range(rng.randint(1, 3)):
        slots = _slots(st, [])
        parent, key = rng.choice(slots)
        what = rng.random()
        if what < 0.15 and isinstance(parent, dict):
            del parent[key]
        elif what < 0.2 and isinstance(parent, dict):
            parent[f"extra{rng.randint(0, 9)}"] = rng.choice(JUNK)
        elif what < 0.25:
            parent[key] = _deep(rng.randint(30, 60))
        elif what < 0.6:  # a value of the same type, at its extremes: parses, then the readers get it
            parent[key] = _same_type(rng, parent[key])
        else:
            parent[key] = copy.deepcopy(rng.choice(JUNK))
    return st


def read_everywhere(snap: StatusSnapshot) -> None:
    """What every reader does with a snapshot: none may raise on one that parsed."""
    format_status(snap)
    frame = render_frame(snap, [], None, "ipc:///run/vlad/control", 0.0)
    assert len(frame) <= 24 and all(len(line) <= 80 for line in frame)
    json.dumps(snap.to_dict(), indent=2, sort_keys=True)  # vladctl status --json
    try:
        from vlad.compat.metrics import render as render_metrics
    except ImportError:  # prometheus_client is the metrics extra
        return
    render_metrics(snap)


def test_fuzzed_statuses_are_read_or_refused_never_a_crash():
    """Hostile or broken maps (another version, a bug, a forged publisher on the status
    socket): each parses into a snapshot every reader shows, or is one StatusUnreadable."""
    rng = random.Random(24)
    base = recorded()
    read, refused = 0, 0
    for _ in range(400):
        st = mutated(rng, base)
        try:
            snap = parse_status(st)
        except StatusUnreadable as exc:
            assert "\n" not in str(exc)
            refused += 1
            continue
        read_everywhere(snap)
        read += 1
    assert read > 50 and refused > 100, (read, refused)  # both paths were taken


def test_events_round_trip_as_the_control_socket_sends_them():
    sm = StateMachine()
    sm.transition(State.ACTIVE, "warm")
    sm.record("fault", "temperature.cpu.0 at 97.0 °C", monitor="thermal", value=97.0)
    sm.record("operator", "", who="ana")  # an empty reason is a reason
    sm.transition(State.FALLBACK, "thermal fault")
    events = sm.recent(10)
    wire = msgpack.unpackb(msgpack.packb([e.to_dict() for e in events]))
    assert parse_events(wire) == events
    assert [e.is_transition for e in parse_events(wire)] == [True, False, False, True]


@pytest.mark.parametrize(
    "bad, problem",
    [
        ([{"time": 1.0}], "[0].monotonic_ns: missing"),
        ([{**StateMachine().record("fault", "y").to_dict(), "state_to": "LOST"}], "[0].state_to: unknown value"),
        ([{**StateMachine().record("fault", "y").to_dict(), "kind": "party"}], "[0].kind: unknown value"),
        ([1], "[0]: expected a table"),
    ],
)
def test_an_events_answer_of_another_shape_is_one_line(bad, problem):
    with pytest.raises(StatusUnreadable, match=problem.replace("[", r"\[").replace("]", r"\]")):
        parse_events(bad)


def test_split_readings_is_the_one_place_that_reads_sensor_names():
    temps, memory = split_readings(
        {
            "temperature.cpu.0": 61.0,
            "temperature.gpu.0": float("nan"),  # a sensor that failed: no figure
            "memory.rss_bytes": 1e8,
            "memory.board.available_bytes": 2e9,
            "load.1m": 0.5,
            "temperature": 3.0,  # no sensor name: not a temperature
        }
    )
    assert temps == {"cpu.0": 61.0}
    assert memory == {"rss": 1e8, "board.available": 2e9}


def test_every_event_kind_is_documented():
    """docs/operations.md's VLAD_EVENT row lists exactly the kinds an event may have."""
    from typing import get_args

    from vlad.health.state import EventKind

    row = next(
        line for line in (ROOT / "docs" / "operations.md").read_text().splitlines() if line.startswith("| `VLAD_EVENT`")
    )
    documented = set(re.findall(r"`([a-z_]+)`", row.split("|")[3]))
    assert documented == set(get_args(EventKind))


@pytest.mark.parametrize("args", [["status"], ["status", "--json"], ["events"]], ids=" ".join)
def test_vladctl_facing_another_shape_says_so_in_one_line(tmp_path, args):
    """A real control socket (another vlad version's daemon, as far as vladctl can tell)
    answering a status and events of another shape: exit 2, one line naming the problems."""
    import subprocess
    import sys
    import threading

    import zmq

    from vlad import protocol

    endpoint = f"ipc://{tmp_path}/control"
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind(endpoint)
    answered = threading.Event()

    def answer_once() -> None:
        if router.poll(20_000):
            peer, empty, request = router.recv_multipart()
            cmd, _ = protocol.decode_request(request)
            result = {**recorded(), "state": "RUNNING"} if cmd == "status" else [{"time": "yesterday"}]
            router.send_multipart([peer, empty, protocol.encode_reply(True, result)])
            answered.set()

    thread = threading.Thread(target=answer_once, daemon=True)
    thread.start()
    try:
        vladctl = Path(sys.executable).parent / "vladctl"
        proc = subprocess.run([str(vladctl), *args, "--endpoint", endpoint], capture_output=True, text=True, timeout=30)
    finally:
        thread.join(5)
        router.close(0)
        ctx.term()
    assert answered.is_set()
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    (line,) = proc.stderr.splitlines()
    what = "status" if args[0] == "status" else "events"
    assert line.startswith(f"error: the daemon's {what} does not parse (") and "version?" in line, line
    assert ("state: unknown value 'RUNNING'" if what == "status" else "[0].time: expected a number") in line
