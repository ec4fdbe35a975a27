"""vlad_tools.testing: the TOML writer round-trips a daemon config; the launcher runs the real daemon;
the wrapper backend injects what it is told around a real engine; the demo's copies and
golden fixtures are what the tests rely on."""

from __future__ import annotations

import dataclasses
import tomllib

import numpy as np
import pytest

from tests.conftest import ROOT
from vlad.config import ChainEntry, Config, FallbackConfig, ReleaseConfig, load_config, parse_config
from vlad.errors import BackendError
from vlad_tools.gates.plan import DEFAULT_BUDGETS
from vlad_tools.gates.wrapped import WrappedBackend
from vlad_tools.testing import (
    DEMO,
    MAX_ABS,
    DaemonFailed,
    DaemonProcess,
    config_toml,
    dumps,
    launch,
    load_golden,
    start_daemon,
    unsigned_copy,
    write_fault_rig,
)
from vlad_tools.testing.plugin import InjectedSensor


def test_a_config_written_as_toml_reads_back_the_same(tmp_path):
    cfg = load_config(ROOT / "etc" / "vlad" / "demo.toml")
    cfg = dataclasses.replace(
        cfg,
        fallback=FallbackConfig(
            chain=(
                ChainEntry(kind="release", path='/a b/"q"', options={"t": 1, "x": [1.5, 2]}),
                ChainEntry(kind="hold"),
            )
        ),
    )
    text = config_toml(cfg)
    assert "_ns" not in text  # derived fields are the loader's
    again = parse_config(tomllib.loads(text), cfg.source)
    assert again == cfg


def test_dumps_reads_back_nested_tables_arrays_and_odd_strings():
    data = {
        "a": 1,
        "b": {"c": [1, 2], "d": {"e": 'x"y\n\u00e9'}},
        "t": [{"k": 1.25}, {"k": float("inf")}],
        "key with space": True,
    }
    assert tomllib.loads(dumps(data)) == data


def test_launch_serves_a_typed_config_and_says_why_when_it_cannot(tmp_path):
    demo = load_config(ROOT / "etc" / "vlad" / "demo.toml")
    with launch(dataclasses.replace(demo, serve=dataclasses.replace(demo.serve, warmup=2))) as daemon:
        assert isinstance(daemon, DaemonProcess)
        assert daemon.notify.first("READY", "1") is not None
        client = daemon.client("launch-test")
        try:
            assert client.status()["state"] in ("ACTIVE", "DEGRADED")
        finally:
            client.close()
        folder = daemon.folder
    assert not folder.exists()  # launch made it, cleanup removed it
    broken = Config(
        release=ReleaseConfig(path=str(tmp_path / "nowhere"), verify=False, backend="onnxruntime", artifact="x.onnx")
    )
    with pytest.raises(DaemonFailed, match="exited with status"):
        launch(broken, folder=tmp_path / "d")


def test_start_daemon_takes_only_set_pairs(tmp_path):
    with pytest.raises(ValueError, match="--set KEY=VALUE pairs"):
        start_daemon(tmp_path, ["serve.warmup=2"])
    with pytest.raises(ValueError, match="--set KEY=VALUE pairs"):
        start_daemon(tmp_path, ["--set", "serve.warmup=2", "--verbose"])


def test_launch_waits_for_ready_on_the_notify_socket_clock(tmp_path):
    """READY=1's arrival and the controller's records share one clock (time.monotonic())."""
    import time

    t0 = time.monotonic()
    with start_daemon(tmp_path, ["--set", "serve.warmup=1"]) as daemon:
        ready = daemon.notify.first("READY", "1")
        assert ready is not None and t0 < ready <= time.monotonic()
        assert 0 < daemon.wait_ready(1) <= ready - t0 + 1


def test_unsigned_copy_changes_what_it_is_asked_and_refuses_a_line_that_is_not_there(tmp_path):
    from vlad.contract import load_contract

    copy = unsigned_copy(tmp_path / "a", version="0.9.0", edits={"e2e_deadline_ms = 20.0": "e2e_deadline_ms = 50.0"})
    contract = load_contract(copy / "contract.toml")
    assert contract.model.version == "0.9.0" and contract.timing.e2e_deadline_ms == 50.0
    assert not (copy / "manifest.toml").exists()  # unsigned
    assert (copy / "policy.onnx").read_bytes() == (DEMO / "policy.onnx").read_bytes()
    with pytest.raises(ValueError, match="not in the demo contract"):
        unsigned_copy(tmp_path / "b", edits={"e2e_deadline_ms = 99.0": "e2e_deadline_ms = 1.0"})


def test_the_golden_fixtures_and_the_one_budget_table():
    cases = load_golden()
    assert len(cases) >= 2 and {"image_overhead", "tokens", "proprio", "noise"} <= set(cases[0]["inputs"])
    assert cases[0]["outputs"]["actions"].ndim == 3 and cases[0]["raw"].instruction
    assert MAX_ABS == {p: b.output_max_abs for p, b in DEFAULT_BUDGETS.items()}
    assert MAX_ABS["fp32"] == 1e-4 and MAX_ABS["fp32"] < MAX_ABS["tf32"] < MAX_ABS["fp16"] < MAX_ABS["bf16"]


@pytest.fixture()
def wrapped(tmp_path):
    """The wrapper around real ONNX Runtime with a control file and a delay file, loaded here."""
    from vlad.contract import load_contract

    contract = load_contract(DEMO / "contract.toml")
    control, delay = tmp_path / "fault", tmp_path / "delay"
    session = WrappedBackend().load(
        DEMO / "policy.onnx",
        contract,
        {"control_file": str(control), "delay_file": str(delay), "intra_op_threads": 1},
    )
    yield session, control, delay, load_golden()[0]
    session.close()


def test_the_wrapper_injects_each_fault_around_the_real_engine(wrapped):
    session, control, _, case = wrapped
    real = session.infer(case["inputs"])["actions"].copy()
    assert np.abs(real - case["outputs"]["actions"]).max() <= MAX_ABS["fp32"]  # the inner engine's outputs
    control.write_text("nan")
    assert np.isnan(session.infer(case["inputs"])["actions"]).all()
    control.write_text("oob")
    assert np.allclose(session.infer(case["inputs"])["actions"], real * 1000.0)
    control.write_text("raise")
    with pytest.raises(BackendError, match="injected engine failure"):
        session.infer(case["inputs"])
    control.write_text("melt")
    with pytest.raises(BackendError, match="one of ok, raise, hang, nan, oob"):
        session.infer(case["inputs"])
    control.write_text("ok")
    assert np.array_equal(session.infer(case["inputs"])["actions"], real)
    assert session.describe().backend == "wrapped" and session.describe().runtime == "onnxruntime"


def test_the_wrapper_delays_by_its_file_and_hangs_while_told(wrapped):
    import threading
    import time

    session, control, delay, case = wrapped
    delay.write_text("60")
    t0 = time.perf_counter()
    session.infer(case["inputs"])
    assert time.perf_counter() - t0 >= 0.06 and session.last_timing.compute_ms >= 60
    delay.write_text("soon")
    with pytest.raises(BackendError, match="does not hold a number of ms"):
        session.infer(case["inputs"])
    delay.write_text("")
    control.write_text("hang")
    done = threading.Event()
    worker = threading.Thread(target=lambda: (session.infer(case["inputs"]), done.set()), daemon=True)
    worker.start()
    assert not done.wait(0.2)  # a wedged engine does not return ...
    control.write_text("ok")
    assert done.wait(10)  # ... until the control file lets it


@pytest.mark.parametrize(
    "options, problem",
    [
        ({"inner": "wrapped"}, "another backend"),
        ({"inner": ""}, "another backend"),
        ({"delay_ms": -1}, "delay_ms"),
        ({"delay_ms": True}, "delay_ms"),
        ({"delay_ms": "70"}, "delay_ms"),
        ({"control_file": 3}, "control_file"),
        ({"delay_file": ""}, "delay_file"),
    ],
)
def test_the_wrapper_refuses_bad_options_in_one_line(options, problem):
    from vlad.contract import load_contract

    with pytest.raises(BackendError, match=problem):
        WrappedBackend().load(DEMO / "policy.onnx", load_contract(DEMO / "contract.toml"), options)


def test_the_injected_sensor_reads_its_file_and_nothing_when_it_is_unreadable(tmp_path, monkeypatch):
    path = tmp_path / "sensors.json"
    monkeypatch.setenv("VLAD_TEST_SENSOR_FILE", str(path))
    sensor = InjectedSensor()
    assert sensor.read() == {}  # no file yet
    path.write_text('{"temperature.cpu": 99}')
    assert sensor.read() == {"temperature.cpu": 99.0}
    for junk in ("[1, 2]", '{"t": "hot"}', "{", '{"t": null}'):
        path.write_text(junk)
        assert sensor.read() == {}, junk


def test_the_fault_rig_is_a_typed_config_that_reads_back(tmp_path):
    rig = write_fault_rig(tmp_path)
    again = parse_config(tomllib.loads(config_toml(rig.config)), "rig")
    assert again == dataclasses.replace(rig.config, source="rig")
    assert again.release.backend == "wrapped" and again.release.options["control_file"] == str(rig.control)
    assert [e.kind for e in again.fallback.chain] == ["release", "hold"]
    assert rig.env == {
        "VLAD_PLUGIN_MODULES": "vlad_tools.gates.wrapped,vlad_tools.testing.plugin",
        "VLAD_TEST_SENSOR_FILE": str(rig.sensors),
    }
