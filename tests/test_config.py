"""The daemon configuration: every problem is one clear line, units are converted at load,
and the shipped configs load."""

from __future__ import annotations

from pathlib import Path

import pytest

from vlad.config import Config, ConfigError, load_config, parse_config

ROOT = Path(__file__).resolve().parent.parent


def problems(data: dict) -> list[str]:
    with pytest.raises(ConfigError) as err:
        parse_config(data, "robot.toml")
    for line in err.value.problems:
        assert "\n" not in line and "Traceback" not in line
    return err.value.problems


@pytest.mark.parametrize(
    "data, expected",
    [
        # unknown keys, with the near miss or the known ones
        ({"serve": {"warmupp": 3}}, "serve.warmupp: unknown key (did you mean 'warmup'?)"),
        ({"monitor": {}}, "monitor: unknown key"),
        ({"fallback": {"chain": [{"kind": "hold", "pth": "x"}]}}, "fallback.chain[0].pth: unknown key"),
        # wrong types: refused, never coerced
        ({"monitors": {"cpu_temp_warn_c": "hot"}}, "monitors.cpu_temp_warn_c: expected a number, got a string"),
        ({"monitors": {"heartbeat_missing_periods": 2.7}}, "monitors.heartbeat_missing_periods: expected an integer"),
        ({"monitors": {"heartbeat_missing_periods": True}}, "monitors.heartbeat_missing_periods: expected an integer"),
        ({"monitors": {"enabled": "thermal"}}, "monitors.enabled: expected an array"),
        ({"release": {"verify": "yes"}}, "release.verify: expected true or false, got a string"),
        # out of bounds, closed value sets
        ({"serve": {"status_hz": 0.5}}, "serve.status_hz: must be >= 1.0, got 0.5"),
        ({"monitors": {"stale_fraction_fault": 1.5}}, "monitors.stale_fraction_fault: must be <= 1.0"),
        ({"monitors": {"min_input_events": 0}}, "monitors.min_input_events: must be >= 1, got 0"),
        ({"safety": {"estop_output": "loud"}}, "safety.estop_output: unknown value 'loud' (known: hold, silence)"),
        ({"fallback": {"chain": [{"kind": "relase"}]}}, "fallback.chain[0].kind: unknown value 'relase'"),
        # relations between keys
        ({"monitors": {"cpu_temp_warn_c": 99.0}}, "monitors.cpu_temp_warn_c: 99.0 is above cpu_temp_fault_c 95.0"),
        (
            {"fallback": {"chain": [{"kind": "release"}]}},
            "fallback.chain[0].path: a release entry needs the release folder",
        ),
        (
            {"fallback": {"chain": [{"kind": "hold"}, {"kind": "release", "path": "b"}]}},
            "fallback.chain: entries after a hold entry can never be reached",
        ),
    ],
)
def test_one_clear_line_per_problem(data, expected):
    found = problems(data)
    assert len(found) == 1, found
    assert found[0].startswith(expected), found


def test_every_problem_is_reported_at_once():
    found = problems({"serve": {"status_hz": 0.5, "warmupp": 1}, "monitors": {"cpu_temp_warn_c": "hot"}})
    assert len(found) == 3
    with pytest.raises(ConfigError, match=r"^robot\.toml: 3 problems: "):
        parse_config({"serve": {"status_hz": 0.5, "warmupp": 1}, "monitors": {"cpu_temp_warn_c": "hot"}}, "robot.toml")


def test_units_are_converted_once_at_load():
    cfg = parse_config(
        {
            "serve": {"hang_timeout_s": 0.25, "max_clock_skew_ms": 2.5},
            "fallback": {"healthy_window_s": 3.0},
            "safety": {"bridge_timeout_ms": 100.0},
        }
    )
    assert cfg.serve.hang_timeout_ns == 250_000_000 and cfg.serve.max_clock_skew_ns == 2_500_000
    assert cfg.fallback.healthy_window_ns == 3_000_000_000
    assert cfg.safety.bridge_timeout_ns == 100_000_000


def test_derived_values_cannot_be_set_from_the_file():
    assert problems({"serve": {"hang_timeout_ns": 5}})[0].startswith("serve.hang_timeout_ns: unknown key")


def test_typed_sections():
    cfg = parse_config(
        {
            "monitors": {"heartbeat_missing_periods": 3, "enabled": ["thermal"]},
            "fallback": {"chain": [{"kind": "release", "path": "/r/b"}, {"kind": "hold"}]},
        }
    )
    assert cfg.monitors.heartbeat_missing_periods == 3 and cfg.monitors.enabled == ("thermal",)
    assert [e.kind for e in cfg.fallback.chain] == ["release", "hold"] and cfg.fallback.chain[0].path == "/r/b"
    assert parse_config({}) == parse_config({}, "<config>")
    assert isinstance(parse_config({}), Config)


def test_overrides_are_toml_typed_and_checked_like_the_file(tmp_path):
    path = tmp_path / "vlad.toml"
    path.write_text('[serve]\nwarmup = 3\n[fallback]\nchain = [{ kind = "release", path = "fallback" }]\n')
    cfg = load_config(path, ["serve.warmup=5", "monitors.cpu_temp_warn_c=70"])
    assert cfg.serve.warmup == 5 and cfg.monitors.cpu_temp_warn_c == 70.0
    assert cfg.fallback.chain[0].path == str(tmp_path / "fallback")  # relative to the file
    with pytest.raises(ConfigError, match=r"serve\.warmup: expected an integer, got a string"):
        load_config(path, ["serve.warmup=five"])
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        load_config(path, ["serve.warmup"])


def test_a_missing_file_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"nope\.toml: config file does not exist$"):
        load_config(tmp_path / "nope.toml")


def test_a_broken_toml_file_is_one_line(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text("[serve\nwarmup = 3\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert len(err.value.problems) == 1 and "\n" not in str(err.value)


@pytest.mark.parametrize("name", ["vlad.toml", "demo.toml"])
def test_the_shipped_configs_load(name):
    load_config(ROOT / "etc" / "vlad" / name)
