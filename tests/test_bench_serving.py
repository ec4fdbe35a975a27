"""scripts/bench_serving.py --short: every row comes out with finite numbers.

A smoke test of the benchmark, not a benchmark: no timing is asserted (figures from a
shared CI machine mean nothing). One run of the script serves every test here; the
openpi-style rows need ``openpi_client`` and are checked only where it is installed.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "bench_serving.py"
HAVE_OPENPI = importlib.util.find_spec("openpi_client") is not None
HAVE_WEBSOCKETS = importlib.util.find_spec("websockets") is not None
VLAD_SERVERS = ("vlad", "vlad+rt", "vlad+rt+spin")
PAYLOADS = ("demo", "synthetic")
LOADS = ("quiet", "hog+debug")
RATES = ("50 Hz", "lock-step")


@pytest.fixture(scope="module")
def result(slow) -> dict:
    # The real-time variants only with --slow: each is two more daemon starts per payload.
    servers = ["floor", *(VLAD_SERVERS if slow else VLAD_SERVERS[:1])] + (["openpi-style"] if HAVE_OPENPI else [])
    servers += ["ws-floor"] if HAVE_WEBSOCKETS else []
    return _short_run("--servers", *servers)


def _short_run(*args: str) -> dict:
    """``bench_serving.py --short --json`` with ``args``: its result."""
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--short", "--json", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=dict(os.environ),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout)


def _finite(d: dict) -> bool:
    return all(math.isfinite(d[k]) for k in ("p50", "p95", "p99", "max")) and d["n"] > 0


def _rows(result: dict, server: str) -> dict:
    return {(r["payload"], r["load"], r["rate"]): r for r in result["rows"] if r["server"] == server}


@pytest.mark.parametrize("server", ["floor", "ws-floor", *VLAD_SERVERS])
def test_floor_and_vlad_rows(result, server, slow):
    if server not in ("floor", "ws-floor", "vlad") and not slow:
        pytest.skip("slow: run with ./scripts/test --slow")
    if server == "ws-floor" and not HAVE_WEBSOCKETS:
        pytest.skip("websockets is not installed")
    rows = _rows(result, server)
    for key in [(p, lo, ra) for p in PAYLOADS for lo in LOADS for ra in RATES]:
        assert key in rows, f"{server}: no row for {key}"
        r = rows[key]
        for what in ("round_trip_ms", "engine_ms", "overhead_ms"):
            assert _finite(r[what]), f"{server} {key} {what}: {r[what]}"
        if server not in ("floor", "ws-floor"):
            assert r["engine_ms"]["p50"] > 0
            assert math.isfinite(r["above_floor_ms"]["p50"]) and math.isfinite(r["above_floor_ms"]["p99"])
            for stage in ("preprocess", "decode", "guard", "pre+decode+guard"):
                assert _finite(r["stages_ms"][stage]), f"{server} {key} {stage}"


def test_conditions_and_targets(result):
    c = result["conditions"]
    for key in ("cpu", "cpus", "python", "load_avg", "loadavg_after", "payloads", "rt_probe"):
        assert key in c, key
    assert c["packages"]["onnxruntime"] != "not installed"
    assert c["payloads"]["synthetic"]["raw_observation_bytes"] > 2 * 224 * 224 * 3
    assert result["targets"], "no target judged"


def test_stage_costs_hot_and_cold(result):
    """Each stage measured both ways, openpi's client encoding and decoding beside vlad's
    where openpi-client is installed."""
    stages = ["client encode", "intake (decode + checks)", "guard", "action encode", "client decode"]
    if HAVE_OPENPI:
        stages += ["openpi client encode", "openpi client decode"]
    for key in ("hot_stage_costs_us", "cold_stage_costs_us"):
        for payload in PAYLOADS:
            costs = result[key][payload]
            for stage in stages:
                assert 0 < costs[stage]["p50_us"] <= costs[stage]["p99_us"], (key, payload, stage, costs[stage])


def test_openpi_rows(result):
    pytest.importorskip("openpi_client")
    rows = _rows(result, "openpi-style")
    for key in [(p, lo, ra) for p in PAYLOADS for lo in LOADS for ra in RATES]:
        r = rows[key]
        for what in ("round_trip_ms", "engine_ms", "overhead_ms"):
            assert _finite(r[what]), f"openpi-style {key} {what}: {r[what]}"
        assert r["engine_ms"]["p50"] > 0
    vlad = _rows(result, "vlad")
    assert all(math.isfinite(r["vs_openpi"]["p50"]) for r in vlad.values())


def test_interleaved_rows():
    """--interleave: the servers of a condition take turns at 50 Hz; every row still comes out."""
    result = _short_run("--payloads", "demo", "--loads", "quiet", "--servers", "floor", "vlad", "--interleave", "0.1")
    assert result["conditions"]["interleave_s"] == 0.1
    for server in ("floor", "vlad"):
        rows = _rows(result, server)
        assert set(rows) == {("demo", "quiet", rate) for rate in RATES}, server
        assert rows[("demo", "quiet", "50 Hz")]["interleaved_s"] == 0.1
        for r in rows.values():
            assert _finite(r["overhead_ms"]), (server, r["rate"])
