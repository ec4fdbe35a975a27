"""Hostile release folders: a FIFO where a manifest or its signature should be.

``open()`` on a FIFO blocks until a writer appears, so a reader that is not careful hangs
forever (and a daemon answering ``deploy`` or ``rollback`` with it hangs its release
lock). Each operation here must answer promptly with an error and change nothing: the
store's rollback through ``vladctl`` with the daemon down, and the live daemon's
``deploy`` and ``rollback``. "Promptly" is asserted as a subprocess/REQ timeout that a
hang would exceed, not as a speed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, VLAD
from vlad.config import Config, MonitorsConfig, ReleaseConfig, ServeConfig, StoreConfig
from vlad_tools.testing import DEMO, start_daemon

KEYS = ROOT / "etc" / "vlad" / "keys.d"
VLADCTL = VLAD.parent / "vladctl"


def _fifo_in_place_of(path: Path) -> None:
    folder = path.parent
    os.chmod(folder, 0o755)  # the store keeps staged files read-only; the folder is ours in a test
    path.unlink()
    os.mkfifo(path)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A store with the demo release and a second one activated after it (previous = demo)."""
    from tests.helpers import signed_demo_copy
    from vlad.release.store import ReleaseStore

    tmp = tmp_path_factory.mktemp("fifo-store")
    st = ReleaseStore(tmp / "store", KEYS)
    st.activate(st.stage(DEMO), who="test", why="initial")
    v2 = signed_demo_copy(tmp / "v2", "1.1.0", 2)
    st.activate(st.stage(v2), who="test", why="second")
    assert st.previous() == "vlad-demo-reacher-1.0.0"
    return st, tmp


def test_vladctl_rollback_with_a_fifo_signature_answers_with_an_error(store, tmp_path):
    st, _ = store
    # a copy: the module's store stays intact for the live test
    root = tmp_path / "store"
    shutil.copytree(st.root, root, symlinks=True)
    from vlad.release.store import ReleaseStore

    copy = ReleaseStore(root, KEYS)
    _fifo_in_place_of(copy.release_path("vlad-demo-reacher-1.0.0") / "manifest.sig")
    out = _offline_rollback(root, tmp_path)
    assert out.returncode != 0, out.stdout + out.stderr
    text = out.stdout + out.stderr
    assert "FIFO" in text and "Traceback" not in text, text
    assert copy.active() == "vlad-demo-reacher-1.1.0"  # nothing changed


def _offline_rollback(root, tmp_path) -> subprocess.CompletedProcess:
    """``vladctl rollback`` on the store at ``root`` with no daemon listening."""
    env = {**os.environ, "VLAD_KEYS_DIR": str(KEYS)}
    return subprocess.run(
        [
            str(VLADCTL),
            "rollback",
            "--root",
            str(root),
            "--why",
            "test",
            "--endpoint",
            f"ipc://{tmp_path}/nobody-here",
            "--timeout-ms",
            "300",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_vladctl_rollback_with_vlad_down_goes_to_the_store_at_once(store, tmp_path):
    """With vlad down, ``vladctl rollback`` rolls the store back after the short
    ``--timeout-ms`` ping, not after the 2-minute live-rollback timeout (it used to wait
    that long before falling back, which looked like a hang)."""
    st, _ = store
    root = tmp_path / "store"
    shutil.copytree(st.root, root, symlinks=True)
    out = _offline_rollback(root, tmp_path)
    assert out.returncode == 0 and "vlad is not running" in out.stdout, out.stdout + out.stderr


@pytest.fixture(scope="module")
def live(store):
    st, tmp = store
    config = Config(
        release=ReleaseConfig(path=str(st.root / "releases" / "active"), keys_dir=str(KEYS)),
        serve=ServeConfig(warmup=3),
        store=StoreConfig(root=str(st.root)),
        monitors=MonitorsConfig(sensor_stall_periods=1_000_000, heartbeat_missing_periods=1_000_000),
    )
    d = start_daemon(tmp, config=config)
    client = d.client()
    yield d, client, st, tmp
    client.close()
    d.stop()
    assert "Traceback" not in d.log(), d.log()


@pytest.mark.parametrize("name", ["manifest.sig", "manifest.toml"])
def test_deploy_of_a_folder_with_a_fifo_answers_with_an_error(live, name, tmp_path):
    from vlad.client import ClientError

    d, client, st, _ = live
    folder = tmp_path / "candidate"
    shutil.copytree(DEMO, folder)
    _fifo_in_place_of(folder / name)
    t0 = time.monotonic()
    with pytest.raises(ClientError, match="FIFO"):
        client.control("deploy", timeout_ms=60_000, path=str(folder), who="test", why="fifo")
    assert time.monotonic() - t0 < 60
    assert client.control("ping")["pong"] is True
    assert client.status()["release"] == "vlad-demo-reacher@1.1.0"


def test_live_rollback_to_a_release_with_a_fifo_signature_answers_with_an_error(live):
    from vlad.client import ClientError

    d, client, st, _ = live
    _fifo_in_place_of(st.release_path("vlad-demo-reacher-1.0.0") / "manifest.sig")
    out = subprocess.run(
        [str(VLADCTL), "rollback", "--endpoint", d.endpoints["control"], "--why", "fifo"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0 and "FIFO" in out.stdout + out.stderr, out.stdout + out.stderr
    with pytest.raises(ClientError, match="FIFO"):
        client.control("rollback", timeout_ms=60_000, who="test", why="fifo")
    # the release lock was given back: another release operation is answered at once
    with pytest.raises(ClientError, match="FIFO"):
        client.control("rollback", timeout_ms=60_000, who="test", why="again")
    assert client.control("ping")["pong"] is True
    assert client.status()["release"] == "vlad-demo-reacher@1.1.0"
    assert st.active() == "vlad-demo-reacher-1.1.0"
