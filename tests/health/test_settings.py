"""Monitors declare their own config table (``Monitor.Settings``); the config parser reads
``[monitors.<name>]`` with it, asking the loaded plugins' monitors, and the daemon hands the
parsed table to the monitor. Every bad table is one line at start, with the file's other
problems; a real daemon applies a good one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from vlad.backend import SessionStats
from vlad.config import Config, ConfigError, MonitorsConfig, ReleaseConfig, ServeConfig, parse_config
from vlad.schema import bounded
from vlad_kserve.monitor import RemoteLinkMonitor, RemoteLinkSettings
from vlad_tools.testing import DEMO, QUIET_MONITORS, config_toml, start_daemon, wait_until

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "vlad_example"
VLAD = Path(sys.executable).parent / "vlad"


@dataclass(frozen=True)
class GripSettings:
    mode: Literal["soft", "hard"] = "soft"
    limit_n: float = field(default=20.0, metadata=bounded(0.0, 200.0))


# What the loaded plugins would offer: name -> the monitor's Settings (None: takes none).
OFFERED: dict[str, type | None] = {"thermal": None, "grip": GripSettings, "remote": RemoteLinkSettings}


def problems(data: dict, offered: dict[str, type | None] | None = OFFERED) -> list[str]:
    with pytest.raises(ConfigError) as err:
        parse_config(data, "robot.toml", offered)
    for line in err.value.problems:
        assert "\n" not in line
    return err.value.problems


def test_each_monitor_table_is_parsed_into_its_dataclass():
    cfg = parse_config(
        {"monitors": {"cpu_temp_warn_c": 70.0, "grip": {"mode": "hard"}, "enabled": ["grip", "thermal"]}},
        "robot.toml",
        OFFERED,
    )
    assert cfg.monitors.cpu_temp_warn_c == 70.0 and cfg.monitors.enabled == ("grip", "thermal")
    # a table given is parsed; a monitor with settings and no table gets its defaults
    assert cfg.monitors.settings == {"grip": GripSettings(mode="hard"), "remote": RemoteLinkSettings()}


@pytest.mark.parametrize(
    ("monitors", "expected"),
    [
        ({"grip": {"mod": "hard"}}, "monitors.grip.mod: unknown key (did you mean 'mode'?)"),
        ({"grip": {"mode": "firm"}}, "monitors.grip.mode: unknown value 'firm' (known: soft, hard)"),
        ({"grip": {"limit_n": "high"}}, "monitors.grip.limit_n: expected a number, got a string"),
        ({"grip": {"limit_n": float("nan")}}, "monitors.grip.limit_n: must be finite"),
        ({"remote": {"slow_fraction": 0}}, "monitors.remote.slow_fraction: must be >= 0.01, got 0"),
        ({"remote": {"min_samples": 2.5}}, "monitors.remote.min_samples: expected an integer, got a float"),
        ({"gripp": {"mode": "hard"}}, "monitors.gripp: 'gripp' is not a monitor offered by the loaded plugins"),
        ({"thermal": {"x": 1}}, "monitors.thermal: 'thermal' takes no settings"),
        ({"enabled": ["thermal", "thermall"]}, "monitors.enabled[1]: no monitor named 'thermall' (did you mean"),
        ({"x" * 5000: {}}, "monitors.xxxxx"),
    ],
)
def test_a_bad_monitor_table_is_one_line(monitors, expected):
    (found,) = problems({"monitors": monitors})
    assert found.startswith(expected), found
    assert len(found) < 300, found


def test_monitor_tables_are_reported_with_the_rest_of_the_file():
    found = problems({"serve": {"warmupp": 1}, "monitors": {"cpu_temp_warn_c": "hot", "grip": {"mode": 1}}})
    assert len(found) == 3, found
    assert found[-1] == "monitors.grip.mode: expected a string, got an integer"


def test_without_the_monitors_the_tables_are_kept_for_the_daemon():
    """vladctl reads the config for its sockets with no plugin loaded: it must not refuse a
    table it cannot check; the daemon checks it at start."""
    cfg = parse_config({"monitors": {"grip": {"mod": "x"}, "heartbeat_missing_periods": 3}})
    assert cfg.monitors.settings == {"grip": {"mod": "x"}} and cfg.monitors.heartbeat_missing_periods == 3
    # a flat key that is not a table is still a flat key: unknown ones are refused
    assert problems({"monitors": {"grip": 3}}, None) == [
        "monitors.grip: unknown key (known: " + ", ".join(f for f in asdict(MonitorsConfig()) if f != "settings") + ")"
    ]


def test_a_config_built_in_code_round_trips_through_toml():
    cfg = Config(monitors=MonitorsConfig(max_rss_mb=100.0, settings={"grip": GripSettings(limit_n=5.0)}))
    text = config_toml(cfg)
    assert tomllib.loads(text)["monitors"]["grip"] == {"mode": "soft", "limit_n": 5.0}
    again = parse_config(tomllib.loads(text), "<text>", OFFERED)
    assert again.monitors.settings["grip"] == GripSettings(limit_n=5.0) and again.monitors.max_rss_mb == 100.0
    assert again.monitors.settings["grip"].limit_n == 5.0


def test_the_loaded_plugins_declare_their_tables():
    from vlad.plugins import monitor_settings

    offered = monitor_settings()
    assert offered["remote"] is RemoteLinkSettings  # the kserve plugin's monitor
    assert offered["thermal"] is None and offered["heartbeat"] is None  # built-ins: the shared [monitors] keys


def test_the_remote_monitor_judges_by_its_settings():
    from types import SimpleNamespace

    stats = {"r": SessionStats(kind="remote", state="connected", window=50, error_rate=0.1)}
    view = SimpleNamespace(deadline_ns=20_000_000, backend_stats=stats)
    assert [f.code for f in RemoteLinkMonitor().check(view)] == ["remote_errors"]
    assert RemoteLinkMonitor(RemoteLinkSettings(error_rate_warn=0.2)).check(view) == []
    assert RemoteLinkMonitor(RemoteLinkSettings(min_samples=100)).check(view) == []


# ---------------------------------------------------------------------------------------
# A real daemon: refused at start, or applied
# ---------------------------------------------------------------------------------------

EXAMPLE_ENV = {"PYTHONPATH": str(EXAMPLE), "VLAD_PLUGIN_MODULES": "vlad_example.backend,vlad_example.door"}


def test_vlad_serve_refuses_a_bad_table_at_start_in_one_line(tmp_path):
    out = subprocess.run(
        [
            str(VLAD),
            "serve",
            "--config",
            str(ROOT / "etc" / "vlad" / "demo.toml"),
            "--set",
            "monitors.door.severty=fault",
            "--set",
            "monitors.remote.min_samples=0",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, **EXAMPLE_ENV},
        timeout=60,
    )
    assert out.returncode == 2, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "monitors.door.severty: unknown key (did you mean 'severity'?)" in lines[0], lines
    assert "monitors.remote.min_samples: must be >= 1, got 0" in lines[0], lines


def test_a_daemon_applies_the_table(tmp_path):
    """The door example with ``[monitors.door] severity = "fault"``: an open door is a system
    fault, so the daemon serves below the release (FALLBACK), not DEGRADED."""
    door = tmp_path / "door"
    door.write_text("open")
    config = Config(
        release=ReleaseConfig(
            path=str(DEMO), verify=False, backend="example-onnx", artifact="policy.onnx", options={"threads": 1}
        ),
        serve=ServeConfig(warmup=1),
    )
    env = {**EXAMPLE_ENV, "VLAD_EXAMPLE_DOOR_FILE": str(door)}
    d = start_daemon(tmp_path, [*QUIET_MONITORS, "--set", 'monitors.door.severity="fault"'], env=env, config=config)
    client = d.client()
    try:
        seen: list[dict] = []

        def door_finding() -> bool:
            seen[:] = [f for f in client.status()["findings"] if f["monitor"] == "door"]
            return bool(seen)

        wait_until(door_finding, timeout=15, what="the door finding", poll=0.05)
        assert [f["severity"] for f in seen] == ["fault"], json.dumps(seen)
        wait_until(lambda: client.status()["state"] == "FALLBACK", timeout=15, what="FALLBACK", poll=0.05)
    finally:
        client.close()
        d.stop()
    assert "Traceback" not in d.log(), d.log()
