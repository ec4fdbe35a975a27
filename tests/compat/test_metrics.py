"""Prometheus metrics from a real daemon subprocess, scraped over real HTTP and parsed with
prometheus_client's own parser."""

from __future__ import annotations

import urllib.request

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from vlad_tools.testing import (  # noqa: E402
    ControllerSim,
    free_port,
    load_golden,  # noqa: E402
    start_daemon,
    wait_until,
)


def scrape(url: str) -> dict[str, dict]:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    out: dict[str, dict] = {}
    for fam in text_string_to_metric_families(text):
        out[fam.name] = {"type": fam.type, "samples": fam.samples}
    return out


def value(fams: dict, family: str, sample: str | None = None, **labels: str) -> float:
    for s in fams[family]["samples"]:
        if (sample is None or s.name == sample) and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise KeyError((family, sample, labels))


FAMILIES = {
    "vlad_up": "gauge",
    "vlad_state": "gauge",
    "vlad_release_info": "gauge",
    "vlad_estop_engaged": "gauge",
    "vlad_latency_seconds": "histogram",
    "vlad_published": "counter",
    "vlad_observations": "counter",
    "vlad_holds": "counter",
    "vlad_rejections": "counter",
    "vlad_deadline_misses": "counter",
    "vlad_interventions": "counter",
    "vlad_state_transitions": "counter",
    "vlad_events": "counter",
    "vlad_memory_bytes": "gauge",
    "vlad_temperature_celsius": "gauge",
    "vlad_latency_window_seconds": "gauge",
    "vlad_policy_cycles": "counter",
    "vlad_fallback_active": "gauge",
}
STAGES = ("e2e", "engine", "transport", "preprocess", "decode", "guard", "publish")


def _has(fams: dict, family: str, sample: str | None = None, **labels: str) -> bool:
    try:
        value(fams, family, sample, **labels)
    except KeyError:
        return False
    return True


def _count(fams: dict, stage: str) -> float:
    """Chunks timed so far at ``stage`` (0 before the first)."""
    if not _has(fams, "vlad_latency_seconds", "vlad_latency_seconds_count", stage=stage):
        return 0
    return value(fams, "vlad_latency_seconds", "vlad_latency_seconds_count", stage=stage)


def test_metrics_endpoint_families_and_counts_move(tmp_path):
    port = free_port()
    d = start_daemon(
        tmp_path,
        [
            "--set",
            "metrics.enabled=true",
            "--set",
            f"metrics.listen='127.0.0.1:{port}'",
            "--set",
            "serve.warmup=2",
            "--set",
            "serve.status_hz=10",
        ],
    )
    url = f"http://127.0.0.1:{port}/metrics"
    client = d.client()
    sim = ControllerSim(client, load_golden()[0]).start()
    scrapes: list[dict] = []

    def scraped(pred) -> bool:
        scrapes.append(scrape(url))
        return pred(scrapes[-1])

    try:
        # serving: every stage has timed a chunk
        wait_until(
            lambda: scraped(lambda f: all(_count(f, s) > 0 for s in STAGES)),
            20,
            "a chunk timed at every stage",
            poll=0.1,
        )
        first = scrapes[-1]
        client.send_raw([b"obs", b"\xc1garbage"])  # one malformed message: a rejection by reason
        wait_until(
            lambda: scraped(
                lambda f: (
                    _has(f, "vlad_rejections", reason="malformed")
                    and _has(f, "vlad_memory_bytes", kind="rss")
                    and value(f, "vlad_published") > value(first, "vlad_published")
                    and all(_count(f, s) > _count(first, s) for s in STAGES)
                )
            ),
            20,
            "the counters to move past the first scrape",
            poll=0.1,
        )
        second = scrapes[-1]
    finally:
        sim.stop()
        client.close()
        d.stop()
    for fam, kind in FAMILIES.items():
        assert fam in second, f"{fam} missing; have {sorted(second)}"
        assert second[fam]["type"] == kind, (fam, second[fam]["type"])
    # Exactly one state is current (DEGRADED possible on a loaded machine: deadline warnings).
    assert sum(s.value for s in second["vlad_state"]["samples"]) == 1
    assert max(value(second, "vlad_state", state=s) for s in ("ACTIVE", "DEGRADED")) == 1
    assert value(second, "vlad_state_transitions", to="ACTIVE") >= 1
    assert value(second, "vlad_release_info", release="vlad-demo-reacher@1.0.0") == 1
    assert value(second, "vlad_memory_bytes", kind="rss") > 1e6
    # Counters move between scrapes; the histogram counts every published chunk's e2e.
    assert value(second, "vlad_published") > value(first, "vlad_published") > 0
    assert value(second, "vlad_rejections", reason="malformed") >= 1
    for stage in STAGES:
        n1, n2 = _count(first, stage), _count(second, stage)
        assert n2 > n1 > 0, stage
        inf = value(second, "vlad_latency_seconds", "vlad_latency_seconds_bucket", stage=stage, le="+Inf")
        assert inf == n2
    # Every metric the example Grafana dashboard queries exists (openpi's only when enabled).
    import json
    import re

    from tests.conftest import ROOT

    dash = json.loads((ROOT / "docs" / "grafana" / "vlad.json").read_text())
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p["targets"])
    names = {re.sub(r"_(bucket|total|info)$", "", n) for n in re.findall(r"\bvlad_\w+", exprs)}
    present = {re.sub(r"_(info)$", "", n) for n in second}
    missing = {n for n in names if n not in present and not n.startswith("vlad_openpi_")}
    assert not missing, missing
    e2e_sum = value(second, "vlad_latency_seconds", "vlad_latency_seconds_sum", stage="e2e")
    assert 0 < e2e_sum / value(second, "vlad_latency_seconds", "vlad_latency_seconds_count", stage="e2e") < 0.1


def test_metrics_refuses_a_remote_address_unless_asked():
    from vlad.config import ConfigError, parse_config

    with pytest.raises(ConfigError, match="beyond loopback"):
        parse_config({"metrics": {"enabled": True, "listen": "0.0.0.0:9464"}})
    assert parse_config({"metrics": {"listen": "0.0.0.0:9464", "allow_remote": True}}).metrics.allow_remote
    assert parse_config({"metrics": {"listen": "unix:/run/vlad/metrics.sock"}}).metrics.enabled is False


def test_metrics_read_the_typed_status_and_count_one_they_cannot_read(tmp_path):
    """The endpoint in process, fed over a real PUB socket: a status of another shape is
    counted as unreadable and shown as nothing but ``vlad_up 0``; the recorded status of a
    real daemon in its worst state (tests/cli/watch_status.json) then renders every family from
    typed fields: guard kinds, memory and temperature readings, fallback, openpi."""
    import asyncio
    import json
    import os
    from pathlib import Path

    import zmq
    import zmq.asyncio

    from vlad import protocol
    from vlad.compat.endpoint import Spec
    from vlad.compat.metrics import MetricsEndpoint
    from vlad.config import parse_listen
    from vlad.daemon.sockets import listen_sockets
    from vlad.serving.guard import INTERVENTIONS

    recorded = json.loads((Path(__file__).parents[1] / "cli" / "watch_status.json").read_text())
    bad = {**recorded, "state": "RUNNING"}
    status_ep = f"ipc://{tmp_path}/status"
    listen = f"127.0.0.1:{free_port()}"
    socks = listen_sockets(parse_listen(listen), "metrics.listen", 4)  # the daemon's; the endpoint gets copies
    spec = Spec(
        kind="metrics",
        config={"listen": listen, "max_connections": 4, "max_connections_per_peer": 4, "idle_timeout_s": 5.0},
        sockets={"status": status_ep},
        limits={},
        status_hz=10.0,
        listen_fds=[os.dup(s.fileno()) for s in socks],
    )

    async def until(pred, what: str) -> None:
        deadline = asyncio.get_running_loop().time() + 10
        while not pred():
            assert asyncio.get_running_loop().time() < deadline, what
            await asyncio.sleep(0.02)

    async def run() -> tuple[bytes, bytes, dict]:
        ctx = zmq.asyncio.Context()
        pub = ctx.socket(zmq.PUB)
        pub.bind(status_ep)
        ep = MetricsEndpoint(spec)
        await ep.start()
        try:

            async def publish(st: dict) -> None:  # again and again: the SUB may join late
                await pub.send_multipart(protocol.encode(protocol.TOPIC_STATUS, {"seq": 1, "status": st}))

            while not ep.counts["unreadable"]:
                await publish(bad)
                await asyncio.sleep(0.02)
            unreadable_page = ep.page()
            assert ep.status is None
            task = asyncio.ensure_future(until(lambda: ep.status is not None, "the good status"))
            while not task.done():
                await publish(recorded)
                await asyncio.sleep(0.02)
            await task
            return unreadable_page, ep.page(), dict(ep.counts)
        finally:
            await ep.close()
            pub.close(0)
            ctx.term()

    try:
        unreadable_page, page, counts = asyncio.run(run())
    finally:
        for sock in socks:
            sock.close()
    assert b"vlad_up 0" in unreadable_page and b"vlad_state" not in unreadable_page
    assert counts["unreadable"] >= 1 and counts["renders"] == 1
    fams = {f.name: f for f in text_string_to_metric_families(page.decode())}
    kinds = {s.labels["kind"]: s.value for s in fams["vlad_guard_interventions"].samples}
    assert set(kinds) == set(INTERVENTIONS) and kinds["nonfinite"] == recorded["counters"]["guard_nonfinite"] >= 1
    memory = {s.labels["kind"] for s in fams["vlad_memory_bytes"].samples}
    assert memory == {"rss", "available", "board.available"}
    assert {s.labels["sensor"]: s.value for s in fams["vlad_temperature_celsius"].samples} == {
        "cpu.0": 97.0,
        "gpu.0": 85.0,
    }
    assert fams["vlad_fallback_active"].samples[0].value == 1
    assert fams["vlad_openpi_clients"].samples[0].value == 1
    assert {s.labels["state"] for s in fams["vlad_state"].samples if s.value == 1} == {"ESTOPPED"}
