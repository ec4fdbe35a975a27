"""scripts/bench_remote.py --ci: local vs remote (loopback gRPC / HTTP, emulated Wi-Fi 6 and
5G links) beside the planner. Figures are benchmark output, not asserted: this checks that
every path ran and reported what it should."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT
from tests.kserve.remote_server import require_server


def test_bench_remote_ci_mode():
    require_server()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_remote.py"), "--ci"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ") and not line.startswith("| path")]
    names = [r.split("|")[1].strip() for r in rows]
    assert names[0].startswith("local ONNX Runtime") and "kserve grpc, loopback" in names
    assert "kserve http, loopback" in names
    assert any("WiFi 6" in n for n in names) and any("5G" in n for n in names)
    for r in rows[1:]:
        cells = [c.strip() for c in r.split("|")[1:-1]]
        assert float(cells[1]) > 0 and cells[5] != "-"  # round trip measured, server time reported
    assert "link emulation:" in proc.stdout and "kserve" in proc.stdout
