"""Live release changes on the real daemon: deploy, rollback, shadow, canary, refusals.

The daemon serves from a release store in tmp (``/var/lib/vlad`` layout) holding the
signed demo release; new releases are copies of it re-signed with the demo key. A
simulated controller runs at 50 Hz throughout and records every chunk.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import pytest

from tests.conftest import VLAD
from tests.helpers import KEYS, signed_demo_copy, store_config, wait_chunks, wait_release
from vlad.snapshot import parse_status
from vlad_tools.testing import (
    DEMO,
    PERIOD_S,
    PLUGIN_ENV,
    ControllerSim,
    explain_gap,
    load_golden,
    max_gap,
    start_daemon,
    wait_until,
)

# A deploy, a rollback or a canary loads a release (verification, ONNX Runtime session,
# warm-up) inside the daemon while it serves; on the 2-core test machine, with the rest
# of the suite beside it, that delays the daemon's stream by up to ~3 periods (fresh-clone
# runs: 63 ms, and 65 ms through a canary's abort). The bound is on the gaps between the
# chunks as the daemon *issued* them: the test's own controller thread shares this process
# with the test's polling, and read the same stream up to 35 ms later still. Every chunk
# is valid for 8 periods, so the controller never lacks a valid command; this bound still
# fails a stream that stops.
LOAD_GAP_S = 4 * PERIOD_S
VLADCTL = VLAD.parent / "vladctl"


@pytest.fixture()
def live(tmp_path):
    from vlad.release.store import ReleaseStore

    store_root = tmp_path / "store"
    store = ReleaseStore(store_root, KEYS)
    store.activate(store.stage(DEMO), who="test", why="initial")
    control = tmp_path / "fault"
    # The plugin: a canary below is served by the fault-injecting wrapper backend.
    d = start_daemon(tmp_path, config=store_config(store_root), env=PLUGIN_ENV)
    client = d.client()
    ctl = ControllerSim(client, load_golden()[0]).start()
    try:
        yield d, client, ctl, store, tmp_path, control
    finally:
        ctl.stop()
        client.close()
        d.stop()
    assert "Traceback" not in d.log(), d.log()


def test_deploy_while_serving_keeps_the_stream(live):
    d, client, ctl, store, tmp, _ = live
    wait_release(client, "vlad-demo-reacher@1.0.0")
    v2 = signed_demo_copy(tmp / "v2", "1.1.0", 2)
    t0 = time.monotonic()
    import threading

    result = {}
    deploying = threading.Thread(
        target=lambda: result.update(
            client.control("deploy", timeout_ms=120_000, path=str(v2), who="tech", why="new grasp")
        )
    )
    deploying.start()
    while deploying.is_alive():  # the control socket keeps answering during the deploy
        assert client.control("ping", timeout_ms=1000)["pong"]
        time.sleep(0.02)  # a ping per control period, not a busy loop beside the deploy
    deploying.join()
    r = result
    assert r["release"] == "vlad-demo-reacher@1.1.0" and r["previous"] == "vlad-demo-reacher@1.0.0"
    wait_release(client, "vlad-demo-reacher@1.1.0")
    wait_chunks(ctl, n=10)  # and the new release streaming after the swap
    seen = ctl.since(t0)
    assert max_gap(seen, by="issue") <= LOAD_GAP_S, explain_gap(seen, by="issue")
    assert store.active() == "vlad-demo-reacher-1.1.0" and store.previous() == "vlad-demo-reacher-1.0.0"
    # rollback over the control socket: the exact previous release serves again
    out = subprocess.run(
        [str(VLADCTL), "rollback", "--endpoint", d.endpoints["control"], "--why", "overshoots", "--who", "tech"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    wait_release(client, "vlad-demo-reacher@1.0.0")
    assert store.active() == "vlad-demo-reacher-1.0.0"
    hist = subprocess.run(
        [str(VLADCTL), "history", "--endpoint", d.endpoints["control"]], capture_output=True, text=True, timeout=30
    )
    assert "rollback" in hist.stdout and "by tech: overshoots" in hist.stdout, hist.stdout
    seen = ctl.since(t0)
    assert max_gap(seen, by="issue") <= LOAD_GAP_S, explain_gap(seen, by="issue")


def test_deploy_refuses_tampered_and_downgraded_releases(live):
    from vlad.client import ClientError

    d, client, ctl, store, tmp, _ = live
    bad = signed_demo_copy(tmp / "tampered", "1.2.0", 3)
    data = bytearray((bad / "policy.onnx").read_bytes())
    data[100] ^= 1
    (bad / "policy.onnx").write_bytes(bytes(data))
    with pytest.raises(ClientError, match="policy.onnx"):
        client.control("deploy", timeout_ms=120_000, path=str(bad), who="x", why="y")
    old = signed_demo_copy(tmp / "old", "0.5.0", 0)
    with pytest.raises(ClientError, match="not newer than releases already activated"):
        client.control("deploy", timeout_ms=120_000, path=str(old), who="x", why="y")
    st = client.status()
    assert st["release"] == "vlad-demo-reacher@1.0.0" and st["state"] in ("ACTIVE", "DEGRADED")
    assert store.active() == "vlad-demo-reacher-1.0.0"


def test_deploy_enforces_gate_evidence_unless_forced_with_a_reason(live):
    from vlad.client import ClientError

    d, client, ctl, store, tmp, _ = live
    rel = signed_demo_copy(
        tmp / "unproven", "1.3.0", 4, required_gates=("contract", "equivalence", "performance", "closed_loop")
    )
    with pytest.raises(ClientError, match=r"lacks passing gate evidence \(gate contract: no evidence") as exc:
        client.control("deploy", timeout_ms=120_000, path=str(rel), who="tech", why="try")
    assert "--force --why" in str(exc.value) and "\n" not in str(exc.value)
    assert store.active() == "vlad-demo-reacher-1.0.0"
    r = client.control(
        "deploy", timeout_ms=120_000, path=str(rel), who="tech", why="field trial, gates pending", force=True
    )
    assert r["release"] == "vlad-demo-reacher@1.3.0" and r["evidence"]["status"] == "forced"
    assert store.active() == "vlad-demo-reacher-1.3.0"
    entry = store.history()[-1]
    assert (entry.forced, entry.evidence, entry.who, entry.why) == (
        True,
        "missing",
        "tech",
        "field trial, gates pending",
    )
    events = client.control("events", limit=50)
    forced = [e for e in events if "deploy of vlad-demo-reacher-1.3.0 forced by tech (evidence missing" in e["reason"]]
    assert forced and "field trial, gates pending" in forced[-1]["reason"]
    assert forced[-1]["details"]["overrides"][0].startswith("evidence missing: gate contract")
    ev = client.status()["evidence"]
    assert (ev["status"], ev["gate_evidence"], ev["who"], ev["why"]) == (
        "forced",
        "missing",
        "tech",
        "field trial, gates pending",
    )

    # Failed evidence is forceable too; the message says what to do.
    failed = signed_demo_copy(tmp / "failed", "1.4.0", 5, closed_loop_passes=False)
    with pytest.raises(ClientError, match=r"failed its gates \(gate closed_loop \(report eval.json\): failed\)"):
        client.control("deploy", timeout_ms=120_000, path=str(failed), who="tech", why="try")
    r = client.control("deploy", timeout_ms=120_000, path=str(failed), who="tech", why="A/B on the bench", force=True)
    assert r["evidence"]["status"] == "forced" and r["evidence"]["gate_evidence"] == "failed"
    assert store.active() == "vlad-demo-reacher-1.4.0"
    out = subprocess.run(
        [str(VLADCTL), "history", "--endpoint", d.endpoints["control"]], capture_output=True, text=True, timeout=30
    )
    assert "[forced: evidence failed]" in out.stdout and "overrode evidence failed" in out.stdout, out.stdout


def test_deploy_of_a_copy_of_a_staged_release_judges_the_folder_offered(live):
    """A copy of a release the store already holds, its model moved out of the folder (bytes
    unchanged) and linked back in: the staged copy is intact, the folder offered is not.
    The deploy, forced or not, refuses it with what `vladctl verify` says of that folder;
    the store and the stream stay as they were."""
    from vlad.client import ClientError

    d, client, ctl, store, tmp, _ = live
    v2 = signed_demo_copy(tmp / "v2", "1.1.0", 2)
    store.stage(v2)
    offered = tmp / "offered"
    shutil.copytree(v2, offered)
    shutil.move(offered / "policy.onnx", tmp / "outside.onnx")
    (offered / "policy.onnx").symlink_to(tmp / "outside.onnx")
    verify = subprocess.run(
        [str(VLADCTL), "verify", str(offered), "--keys", str(KEYS)], capture_output=True, text=True, timeout=60
    )
    assert verify.returncode == 2 and "policy.onnx: a symbolic link" in verify.stderr, verify.stderr
    refusal = verify.stderr.strip().splitlines()[-1].removeprefix("error: ")
    for force in (False, True):
        with pytest.raises(ClientError) as exc:
            client.control("deploy", timeout_ms=120_000, path=str(offered), who="tech", why="bench", force=force)
        assert refusal in str(exc.value)
    assert store.active() == "vlad-demo-reacher-1.0.0" and [e.to_release for e in store.history()] == [
        "vlad-demo-reacher-1.0.0"
    ]
    wait_release(client, "vlad-demo-reacher@1.0.0")


def test_shadow_never_publishes(live):
    d, client, ctl, store, tmp, _ = live
    v2 = signed_demo_copy(tmp / "v2", "1.1.0", 2)
    client.control("shadow_start", timeout_ms=120_000, path=str(v2), tolerance=0.05)
    t0 = time.monotonic()

    def shadowed() -> bool:
        report = client.control("shadow_report")
        e2e = report.get("latency_ms", {}).get("e2e") or {}
        return report.get("divergence", {}).get("pairs", 0) >= 25 and e2e.get("count", 0) >= 10

    wait_until(shadowed, 15, "25 shadow pairs", poll=0.05)
    seen = ctl.since(t0)
    # Only the served release answers. A chunk late by 1.5 periods on the loaded test
    # machine (the candidate was just loaded beside it) is bridged with a hold: allowed,
    # but the release must keep answering.
    assert seen and all(c.source in ("release", "hold:bridge") for c in seen), {c.source for c in seen}
    assert sum(c.source == "release" for c in seen) >= 0.9 * len(seen), [c.source for c in seen]
    report = client.control("shadow_report")
    assert report["divergence"]["pairs"] >= 10
    shadow = parse_status(client.status()).shadow  # the status carries the same report, typed
    assert shadow is not None and shadow.release == "vlad-demo-reacher@1.1.0" and shadow.divergence.pairs >= 10
    # same weights, same noise rule: the shadow agrees with the served policy
    assert report["divergence"]["max_abs"] < 1e-5
    assert report["latency_ms"]["e2e"]["count"] >= 10
    final = client.control("shadow_stop")
    assert final["release"] == "vlad-demo-reacher@1.1.0"
    assert client.status()["shadow"] is None


def test_canary_auto_abort_rolls_back(live):
    d, client, ctl, store, tmp, control = live
    control.write_text("oob")  # the canary's engine produces out-of-bounds actions
    bad = signed_demo_copy(
        tmp / "canary",
        "1.1.0",
        2,
        backend="wrapped",
        options=json.dumps({"control_file": str(control), "intra_op_threads": 1}),
    )
    t0 = time.monotonic()
    r = client.control("deploy", timeout_ms=120_000, path=str(bad), who="tech", why="try", canary=True)
    assert r["canary"] is True
    canary = parse_status(client.status()).canary  # typed; None once it already aborted
    assert canary is None or canary.previous == "vlad-demo-reacher@1.0.0"
    st = wait_release(client, "vlad-demo-reacher@1.0.0")
    assert st["canary"] is None
    events = client.control("events", limit=100)
    abort = [e for e in events if e["kind"] == "canary_abort"]
    assert abort and "interventions" in abort[-1]["reason"], [(e["kind"], e["reason"]) for e in events]
    # The swap comes first; the store follows. Its pointer moves (the commit point) before
    # the journal's "done" record is written, so wait for the record, not the pointer.
    wait_until(lambda: store.history()[-1].event == "rollback", 10, "the rollback's journal record")
    assert "canary aborted" in store.history()[-1].why
    assert store.active() == "vlad-demo-reacher-1.0.0"
    wait_chunks(ctl, n=10)  # and the release streaming after the rollback
    seen = ctl.since(t0)
    assert max_gap(seen, by="issue") <= LOAD_GAP_S, explain_gap(seen, by="issue")


def test_an_operator_rollback_of_a_canary_is_recorded_whatever_the_length_of_its_reason(live):
    """The canary abort's reason ("canary aborted: rollback by WHO: WHY") is longer than one
    operator text may be when WHY is near the limit: the store still rolls back, its journal
    holding the reason cut to one line (the event holds all of it)."""
    d, client, ctl, store, tmp, _ = live
    v2 = signed_demo_copy(tmp / "v2", "1.1.0", 2)
    client.control("deploy", timeout_ms=120_000, path=str(v2), who="tech", why="canary", canary=True)
    why = "arm overshoots at the shelf; " + "w" * 990  # 1018 characters: the daemon takes it
    r = client.control("rollback", timeout_ms=120_000, who="tech", why=why)
    assert r["aborted"] == "vlad-demo-reacher@1.1.0", r
    wait_until(lambda: store.history()[-1].event == "rollback", 10, "the rollback's journal record")
    entry = store.history()[-1]
    assert store.active() == "vlad-demo-reacher-1.0.0" and entry.to_release == "vlad-demo-reacher-1.0.0"
    assert entry.why.startswith("canary aborted: rollback by tech: arm overshoots") and len(entry.why) == 1024
    abort = [e for e in client.control("events", limit=50) if e["kind"] == "canary_abort"]
    assert abort and abort[-1]["reason"].endswith(why)


def test_boot_on_a_release_without_evidence_serves_flagged_unverified(tmp_path):
    """A daemon started on a release that has no passing evidence and no recorded override
    (here: the store's active release was switched by an older vlad, whose journal kept no
    evidence) serves it, and says so: an error at start, an event, the status flag with the
    chunks published so, and `vladctl status`."""
    from vlad.release.store import ReleaseStore

    unproven = signed_demo_copy(tmp_path / "unproven", "1.3.0", 4, required_gates=("contract", "closed_loop"))
    store_root = tmp_path / "store"
    store = ReleaseStore(store_root, KEYS)
    store.activate(store.stage(unproven), who="old-vlad", why="installed before the gates", force=True)
    records = [json.loads(line) for line in store.history_path.read_text().splitlines()]
    for r in records:  # what an older vlad wrote: no evidence fields
        for key in ("evidence", "evidence_problems", "overrides"):
            r.pop(key)
    store.history_path.write_text("".join(json.dumps(r) + "\n" for r in records))
    d = start_daemon(tmp_path, config=store_config(store_root))
    client = d.client()
    ctl = ControllerSim(client, load_golden()[0]).start()
    try:
        wait_until(lambda: client.status()["evidence"]["published_unverified"] >= 10, 10, "10 unverified chunks")
        ev = client.status()["evidence"]
        assert ev["status"] == "unverified" and ev["gate_evidence"] == "missing", ev
        assert ev["published_unverified"] >= 10
        assert ev["problems"] == ["gate contract: no evidence in the manifest"]
        events = client.control("events", limit=50)
        assert any(e["kind"] == "release_unverified" for e in events)
        out = subprocess.run(
            [str(VLADCTL), "status", "--endpoint", d.endpoints["control"]], capture_output=True, text=True, timeout=30
        )
        assert "evidence     UNVERIFIED: no passing gate evidence, no recorded override" in out.stdout
        assert "serves WITHOUT passing gate evidence" in d.log()
    finally:
        ctl.stop()
        client.close()
        d.stop()


def test_a_daemon_on_an_old_journal_publishes_a_readable_status(tmp_path):
    """A journal written before the store refused such text records the forced activation of
    the active release with terminal escapes, a newline and 100 KB in its reason. The daemon
    serves it and publishes a status every reader can decode (the metrics endpoint reads
    the same broadcast: a status over the 64 KiB header bound was `vlad_up 0`), the reason
    escaped and cut to one line; `vladctl status` prints no control character."""
    from vlad.release.store import ReleaseStore

    unproven = signed_demo_copy(tmp_path / "unproven", "1.3.0", 4, required_gates=("contract", "closed_loop"))
    store_root = tmp_path / "store"
    store = ReleaseStore(store_root, KEYS)
    store.activate(store.stage(unproven), who="tech", why="placeholder", force=True)
    hostile = "\x1b[2J\x1b[32mfine\n2030-01-01T00:00:00Z  activate a -> b  by boss: ok [forced]" + "y" * 100_000
    records = [json.loads(line) for line in store.history_path.read_text().splitlines()]
    store.history_path.write_text("".join(json.dumps({**r, "why": hostile}) + "\n" for r in records))
    d = start_daemon(tmp_path, config=store_config(store_root))
    client = d.client()
    try:
        st = client.recv_status(timeout_ms=5000)
        assert st is not None and st["evidence"]["status"] == "forced", st and st["evidence"]
        why = st["evidence"]["why"]
        assert why.startswith("\\x1b[2J\\x1b[32mfine\\x0a2030") and len(why) == 1024 and why.isprintable()
        out = subprocess.run(
            [str(VLADCTL), "status", "--endpoint", d.endpoints["control"]], capture_output=True, text=True, timeout=30
        )
        assert out.returncode == 0 and all(line.isprintable() for line in out.stdout.splitlines()), out.stdout
        assert "evidence     FORCED (missing) by tech" in out.stdout
    finally:
        client.close()
        d.stop()
