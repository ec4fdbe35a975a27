"""vlad.testing: the TOML writer round-trips a daemon config; the launcher runs the real daemon."""

from __future__ import annotations

import dataclasses
import tomllib

import pytest

from tests.daemon_harness import ROOT
from vlad.config import ChainEntry, Config, FallbackConfig, ReleaseConfig, load_config, parse_config
from vlad.testing import DaemonProcess, config_toml, dumps, launch
from vlad.testing.daemon import DaemonFailed


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
