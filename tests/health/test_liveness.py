"""Per-controller liveness (vlad.health.liveness): who is judged, a bounded table no flood can
lock, names owned by their connection, and what the operator's resume forgets."""

from __future__ import annotations

import pytest

from vlad.health.liveness import Beat, Controllers
from vlad.protocol import ProtocolError

PERIOD = 20_000_000
LIMIT = 5 * PERIOD  # monitors.heartbeat_missing_periods at 50 Hz
T0 = 100_000_000_000


def beats(c: Controllers, name: str, t0: int, periods: int, peer: str | None = None, **extra) -> int:
    """Heartbeats every period from ``t0`` for ``periods`` periods; the time of the last one."""
    t = t0
    for k in range(periods + 1):
        t = t0 + k * PERIOD
        c.heartbeat({"t_ns": 5, "client": name, **extra}, t, peer)
    return t


def observe(c: Controllers, name: str, t: int, peer: str | None = None) -> None:
    c.admit(name, t, peer)
    c.observed(name, t)


def refused(fn, *args) -> str:
    with pytest.raises(ProtocolError) as exc:
        fn(*args)
    return exc.value.reason


def test_a_heartbeat_counts_only_when_well_formed():
    c = Controllers(establish_ns=LIMIT)
    for header in (
        {},  # no t_ns
        {"t_ns": "123"},
        {"t_ns": 1.5},
        {"t_ns": True},
        {"t_ns": 0},
        {"t_ns": -5},
        {"t_ns": 2**63},
        {"t_ns": 5, "client": "a\nb"},
        {"t_ns": 5, "client": 7},
        {"t_ns": 5, "client": "x" * 129},
        {"t_ns": 5, "cadence": "sometimes"},
        {"t_ns": 5, "bye": "yes"},
    ):
        assert refused(c.heartbeat, header, T0) == "malformed", header
    assert c.snapshot() == {} and len(c) == 0


def test_a_controller_is_judged_once_it_observed_and_heartbeated_for_the_limit():
    c = Controllers(establish_ns=LIMIT)
    observe(c, "arm", T0)
    last = beats(c, "arm", T0, 4)  # 4 periods: not yet the limit
    assert c.snapshot() == {}
    last = beats(c, "arm", last + PERIOD, 0)  # the 5th period
    assert c.snapshot() == {"arm": Beat(last, "stream", since_ns=T0)}
    beats(c, "openpi/1", T0, 6, cadence="request")  # heartbeats alone: never judged
    assert set(c.snapshot()) == {"arm"}
    c.heartbeat({"t_ns": 6, "client": "arm", "bye": True}, last + 1)
    assert c.snapshot() == {} and c.left_ns == last + 1


def test_each_heartbeat_declares_the_cadence_and_a_change_is_dated():
    c = Controllers(establish_ns=LIMIT)
    observe(c, "arm", T0)
    last = beats(c, "arm", T0, 6, cadence="request")
    assert c.snapshot()["arm"] == Beat(last, "request", since_ns=T0)
    c.heartbeat({"t_ns": 1, "client": "arm"}, last + PERIOD)  # no cadence: streaming again
    assert c.snapshot()["arm"] == Beat(last + PERIOD, "stream", since_ns=last + PERIOD)
    c.heartbeat({"t_ns": 1, "client": "arm", "cadence": "stream"}, last + 2 * PERIOD)
    assert c.snapshot()["arm"].since_ns == last + PERIOD  # unchanged: the same cadence


def test_a_name_used_once_never_holds_the_robot_and_is_forgotten():
    """One heartbeat and one observation (a probe, junk): not judged, so its silence is no
    lost controller; silent past the limit it gives its place to a new name."""
    c = Controllers(limit=2, establish_ns=LIMIT)
    c.heartbeat({"t_ns": 1, "client": "junk"}, T0)
    observe(c, "junk", T0)
    last = beats(c, "arm", T0, 6)
    observe(c, "arm", T0)
    assert set(c.snapshot()) == {"arm"}
    assert refused(c.heartbeat, {"t_ns": 1, "client": "new"}, T0 + LIMIT) == "too_many_controllers"
    beats(c, "new", last + PERIOD, 6)  # junk has been silent past the limit: evicted
    observe(c, "new", last + PERIOD)
    assert set(c.snapshot()) == {"arm", "new"}


def test_a_full_table_refuses_the_observations_of_a_name_it_cannot_watch():
    """Heartbeats refused for lack of room would leave a controller unjudged: its observations
    are refused too, so the policy never serves a controller liveness cannot watch."""
    c = Controllers(limit=3, establish_ns=LIMIT)
    for name in ("a", "b", "c"):
        beats(c, name, T0, 6)
        observe(c, name, T0)
    assert refused(c.heartbeat, {"t_ns": 1, "client": "late"}, T0 + PERIOD) == "too_many_controllers"
    assert refused(c.admit, "late", T0 + PERIOD, None) == "too_many_controllers"
    # judged names are never evicted, however long they have been silent: that would hide a death
    assert refused(c.admit, "late", T0 + 100 * LIMIT, None) == "too_many_controllers"
    assert set(c.snapshot()) == {"a", "b", "c"}


def test_resume_forgets_every_silent_name_heartbeats_only_included():
    c = Controllers(limit=64, establish_ns=LIMIT)
    for k in range(63):  # a flood of names that only heartbeat
        c.heartbeat({"t_ns": 1, "client": f"junk-{k}"}, T0)
    last = beats(c, "arm", T0, 6)
    observe(c, "arm", T0)
    gone = c.forget_silent(last + 2 * PERIOD, LIMIT)
    assert len(gone) == 63 and set(c.snapshot()) == {"arm"} and len(c) == 1
    assert c.forget_silent(last + 2 * LIMIT, LIMIT) == ["arm"]  # the controller itself once silent


def test_a_name_belongs_to_its_connection_while_it_lives():
    """Another connection cannot keep a dead controller alive, make it say goodbye or change
    its cadence; once it has been silent for the limit, a new connection of the same
    principal takes the name over (the controller restarted), another principal never."""
    c = Controllers(establish_ns=LIMIT)
    arm, spoof, stranger = "c1/uid:1000", "c2/uid:1000", "c3/uid:1001"
    last = beats(c, "arm", T0, 6, peer=arm)
    observe(c, "arm", T0, arm)
    for header in ({"t_ns": 1, "client": "arm"}, {"t_ns": 1, "client": "arm", "bye": True}):
        assert refused(c.heartbeat, header, last + 1, spoof) == "name_in_use"
    assert refused(c.heartbeat, {"t_ns": 1, "client": "arm", "cadence": "request"}, last + 1, spoof) == "name_in_use"
    assert refused(c.admit, "arm", last + 1, spoof) == "name_in_use"
    assert c.snapshot() == {"arm": Beat(last, "stream", since_ns=T0)}
    later = last + LIMIT + PERIOD  # the controller died
    assert refused(c.heartbeat, {"t_ns": 1, "client": "arm"}, later, stranger) == "name_in_use"
    c.heartbeat({"t_ns": 1, "client": "arm"}, later, spoof)  # same principal: the restart
    assert c.snapshot()["arm"].last_ns == later
    assert refused(c.heartbeat, {"t_ns": 1, "client": "arm"}, later + 1, arm) == "name_in_use"
