"""scripts/bench_async.py --ci: waiting in the tick vs async chunk execution through the real daemon in
the MuJoCo simulator, real and slowed backend. Figures are benchmark output, not
asserted: this checks that every configuration ran and reported what it should."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import ROOT


def test_bench_async_ci_mode(tmp_path):
    out = tmp_path / "async.json"
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_async.py"), "--ci", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    rows = {(r["backend"], r["mode"]): r for r in result["rows"]}
    assert set(rows) == {("real", "wait"), ("real", "async"), ("slow 70 ms", "wait"), ("slow 70 ms", "async")}
    for r in rows.values():
        assert r["episodes"] == 1 and 0 <= r["success"] <= 1
        assert r["control_hz"] > 0 and r["latency_p50_ms"] > 0  # the daemon answered and the arm moved
        assert r["predicted_hz_measured_latency"] > 0 and r["predicted_hz_roofline"] > 0
    assert rows[("slow 70 ms", "async")]["threshold"] is not None
    cond = result["conditions"]
    assert cond["period_ms"] == 20.0 and cond["chunk"] == 8 and cond["peaks"]["matmul_gflops"]["numpy"] > 0
