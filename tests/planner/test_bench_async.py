"""scripts/bench_async.py, one episode per instruction and row: the latency sweep (real-time
chunking by inpainting and by guidance, plain asynchronous execution, the waiting rule)
through the real daemon in the MuJoCo simulator at 100 ms of injected latency, beside the
policy in process (the 0 ms reference). Figures are benchmark output, not asserted: this
checks that every row ran and reported what it should. (``--ci`` adds the same rows at 0 ms:
the same daemons and episodes with no delay, half again the run time for no other path.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import ROOT


def test_bench_async_one_episode_per_row_at_100_ms(tmp_path):
    out = tmp_path / "sweep.json"
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_async.py"), "--episodes", "1", "--latency", "100"]
        + ["--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    rows = {(r["latency_ms"], r["rule"]): r for r in result["rows"]}
    expected = {(0, "in process")} | {(100.0, rule) for rule in ("rtc", "guided", "async", "wait")}
    assert set(rows) == expected
    for key, r in rows.items():
        assert r["episodes"] == 2 and 0 <= r["success"] <= 2, key  # one per instruction
        assert r["ticks"] == 100 and r["seams"] > 0, key  # the arm moved on the policy's chunks
        assert r["latency_p50_ms"] > 0, key
        if key[1] != "in process":
            assert r["daemon"]["heartbeat_lost"] == 0, (key, r["daemon"])
    assert rows[(100.0, "rtc")]["latency_p50_ms"] >= 90  # the injected latency is there
    for rule in ("rtc", "guided"):
        assert rows[(100.0, rule)]["daemon"]["guided"] > 0, rule  # and real-time chunking answered it
    cond = result["conditions"]
    assert cond["period_ms"] == 20.0 and cond["episodes_per_instruction"] == 1
