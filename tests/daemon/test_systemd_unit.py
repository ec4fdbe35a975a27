"""The systemd unit: it verifies, and its hardening stays at an exposure of 3.0 or less.

``systemd-analyze security --offline=true`` rates the unit file itself (no running
systemd needed); ``verify`` checks every directive. Both run on the shipped unit with
``ExecStart`` pointed at this checkout's executable (the unit's /opt path does not exist on
a dev machine), alone and with the real-time drop-in (systemd/realtime.conf) installed as
``vlad.service.d/realtime.conf`` beside it.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.conftest import ROOT, VLAD

MAX_EXPOSURE = 3.0

pytestmark = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze not installed (scripts/bootstrap installs the systemd package)",
)


def _unit(tmp_path, dropin: str | None = None):
    unit = (ROOT / "systemd" / "vlad.service").read_text().replace("/opt/vlad/.venv/bin/vlad", str(VLAD))
    path = tmp_path / "vlad.service"
    path.write_text(unit)
    if dropin is not None:
        (tmp_path / "vlad.service.d").mkdir()
        (tmp_path / "vlad.service.d" / "realtime.conf").write_text(dropin)
    return path


def _verify(path):
    out = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60)
    problems = [ln for ln in out.stderr.splitlines() if "vlad.service" in ln or "realtime.conf" in ln]
    assert out.returncode == 0 and not problems, out.stderr


def _exposure(path) -> float:
    out = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--no-pager", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if "--offline" in out.stderr and out.returncode != 0:
        pytest.skip(f"this systemd-analyze has no --offline (systemd >= 250 needed): {out.stderr.strip()[:200]}")
    m = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", out.stdout)
    assert m, out.stdout[-2000:] + out.stderr
    return float(m.group(1))


def test_unit_verifies(tmp_path):
    unit = (ROOT / "systemd" / "vlad.service").read_text()
    assert "Type=notify" in unit and "WatchdogSec=" in unit and "NoNewPrivileges=yes" in unit
    assert "not a safety function" in unit.lower() or "NOT a safety function" in unit
    _verify(_unit(tmp_path))


def test_unit_exposure_at_most_3(tmp_path):
    score = _exposure(_unit(tmp_path))
    assert score <= MAX_EXPOSURE, f"systemd-analyze security: exposure {score} > {MAX_EXPOSURE}"


def test_unit_drops_every_capability(tmp_path):
    lines = (ROOT / "systemd" / "vlad.service").read_text().splitlines()
    assert "CapabilityBoundingSet=" in lines and "AmbientCapabilities=" in lines
    assert "SystemCallFilter=@system-service" in lines and "SystemCallErrorNumber=EPERM" in lines
    assert "RestrictRealtime=yes" in lines and "RestrictNamespaces=yes" in lines


def test_realtime_dropin_verifies_and_stays_hardened(tmp_path):
    dropin = (ROOT / "systemd" / "realtime.conf").read_text()
    assert "LimitRTPRIO=" in dropin and "RestrictRealtime=no" in dropin
    # with the optional lines switched on as well
    enabled = re.sub(r"^#((?:CapabilityBoundingSet|AmbientCapabilities|CPUScheduling\w+)=)", r"\1", dropin, flags=re.M)
    assert "AmbientCapabilities=CAP_SYS_NICE" in enabled.splitlines()
    path = _unit(tmp_path, enabled)
    _verify(path)
    assert _exposure(path) <= MAX_EXPOSURE


def test_limit_nofile_holds_what_the_caps_need():
    """The unit's LimitNOFILE holds the largest need of the daemon and of its endpoint
    processes at the largest caps the config allows (vlad.daemon.endpoints.fd_budget)."""
    from dataclasses import replace

    from vlad.config import CompatConfig, Config, MetricsConfig, OpenPIConfig
    from vlad.daemon.endpoints import fd_budget

    unit = (ROOT / "systemd" / "vlad.service").read_text()
    m = re.search(r"^LimitNOFILE=(\d+)$", unit, re.M)
    assert m, "the unit sets no LimitNOFILE (systemd's default soft limit is 1024)"
    limit = int(m.group(1))
    cfg = Config()
    largest = replace(
        cfg,
        compat=CompatConfig(openpi=OpenPIConfig(enabled=True, max_connections=4096)),
        metrics=MetricsConfig(enabled=True, max_connections=4096),
    )
    assert max(fd_budget(cfg).values()) <= max(fd_budget(largest).values()) <= limit, (fd_budget(largest), limit)
