"""The Mender update module ``vlad-release`` driven by the real Mender client.

``mender install`` / ``commit`` / ``rollback`` in standalone mode (no server) install
artifacts made by the real ``mender-artifact write module-image`` on a real ``vlad serve``
(one daemon for the module, a simulated controller feeding it throughout). The cases run
in file order on that one daemon, each starting from what the one before left served;
their version codes grow, as vlad refuses downgrades.

Mender 3.4 reads update modules only from /usr/share/mender/modules/v3 and, before its
first install, the current artifact name only from /etc/mender/artifact_info (neither is
configurable). Each ``mender`` call therefore runs in a private mount namespace with
temporary folders bind-mounted over those two: the system's own stay untouched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import KEYS, signed_demo_copy, store_config, wait_release
from vlad_tools.testing import DEMO, PLUGIN_ENV, ControllerSim, load_golden, start_daemon, wait_until
from vlad_tools.testing.releases import REPO

SHIM = REPO / "etc" / "mender" / "vlad-release"
MODULES = Path("/usr/share/mender/modules/v3")
MENDER_ETC = Path("/etc/mender")
DEVICE_TYPE = "vlad-test-robot"
WINDOW_S = 2.0  # the canary window of a release meant to pass: the commit waits it out
# A canary and its reference (the previous release, as a shadow) both infer every cycle:
# on a loaded 2-core test machine a quarter of the cycles miss their deadline, which would
# abort a canary on vlad's 1 % rule. The cases judge the rest of the thresholds.
MISS_RATE = 1.0

pytestmark = pytest.mark.skipif(
    not (shutil.which("mender") and shutil.which("mender-artifact")),
    reason="needs the Mender client and mender-artifact (Debian: apt install mender-client mender-artifact)",
)


class Mender:
    """The ``mender`` command on temporary config, state and module folders."""

    def __init__(self, base: Path, env: dict[str, str]) -> None:
        self.base = base
        self.modules, self.etc, self.data = base / "modules", base / "etc", base / "data"
        for d in (self.modules, self.etc, self.data):
            d.mkdir(parents=True)
        shutil.copy(SHIM, self.modules / "vlad-release")  # the shim as shipped, run by vlad's Python
        (self.etc / "artifact_info").write_text("artifact_name=factory-image\n")
        (self.data / "device_type").write_text(f"device_type={DEVICE_TYPE}\n")
        self.conf = base / "mender.conf"
        self.conf.write_text("{}\n")
        self.env = env
        # root: a private mount namespace; anyone else: a user namespace as well (root there)
        self.prefix = ["unshare", "-m", "--propagation", "private"] + ([] if os.geteuid() == 0 else ["-r"])

    def __call__(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        script = (
            f'mount --bind "$1" {MODULES} && mount --bind "$2" {MENDER_ETC} && shift 2 && exec mender'
            f' --config {self.conf} --data {self.data} --no-syslog "$@"'
        )
        cmd = [*self.prefix, "sh", "-c", script, "sh", str(self.modules), str(self.etc), *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=self.env)

    def usable(self) -> str | None:
        """Why the bind mounts cannot be made here, or None."""
        if not (MODULES.is_dir() and MENDER_ETC.is_dir()):
            return f"{MODULES} or {MENDER_ETC} is missing (the Mender client's package makes both)"
        cmd = [*self.prefix, "sh", "-c", f'mount --bind "$0" {MODULES}', str(self.modules)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        return None if out.returncode == 0 else f"cannot bind-mount in a private mount namespace: {out.stderr.strip()}"

    def artifact(self, release: Path, name: str) -> Path:
        """``mender-artifact write module-image`` with every file of the release folder."""
        out_file = self.base / f"{name}.mender"
        files = [a for f in sorted(release.iterdir()) for a in ("-f", str(f))]
        cmd = ["mender-artifact", "write", "module-image", "-T", "vlad-release", "-t", DEVICE_TYPE, "-n", name]
        out = subprocess.run([*cmd, *files, "-o", str(out_file)], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        return out_file

    def installed(self) -> str:
        out = self("show-artifact")
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout.strip()


@pytest.fixture(scope="module")
def robot(tmp_path_factory):
    from vlad.release.store import ReleaseStore

    tmp = tmp_path_factory.mktemp("mender")
    store_root = tmp / "store"
    store = ReleaseStore(store_root, KEYS)
    store.activate(store.stage(DEMO), who="test", why="initial")
    d = start_daemon(tmp, config=store_config(store_root), env=PLUGIN_ENV)  # PLUGIN_ENV: the faulty backend of (b)
    client = d.client()
    ctl = ControllerSim(client, load_golden()[0]).start()  # a canary is judged on served cycles
    config = tmp / "mender.toml"
    config.write_text(
        f'endpoint = "{d.endpoints["control"]}"\nstaging_dir = "{tmp / "incoming"}"\n'
        f'daemon_config = "{tmp / "vlad.toml"}"\nregistry_plain_http = true\n'  # (e): its store, keys; a lab registry
        "poll_s = 0.2\ncanary_margin_s = 20\n"
    )
    env = {**os.environ, "VLAD_PYTHON": sys.executable, "VLAD_MENDER_CONFIG": str(config)}
    mender = Mender(tmp / "mender", env)
    try:
        if why := mender.usable():
            pytest.skip(f"mender 3.4 standalone: {why}")
        yield mender, client, store, tmp
    finally:
        ctl.stop()
        client.close()
        d.stop()
    assert "Traceback" not in d.log(), d.log()


def events(client, kind: str) -> list[dict]:
    return [e for e in client.control("events", limit=200) if e["kind"] == kind]


def test_install_and_commit_serve_the_release_after_its_canary(robot):
    mender, client, store, tmp = robot
    art = mender.artifact(
        signed_demo_copy(tmp / "v110", "1.1.0", 2, canary_window_s=WINDOW_S, canary_max_deadline_miss_rate=MISS_RATE),
        "vlad-1.1.0",
    )
    out = mender("install", str(art))
    assert out.returncode == 0, out.stdout + out.stderr
    st = client.status()  # a canary now, not yet passed: the commit decides
    assert st["release"] == "vlad-demo-reacher@1.1.0" and st["canary"] is not None, st["canary"]
    t0 = time.monotonic()
    out = mender("commit")
    assert out.returncode == 0, out.stdout + out.stderr
    assert time.monotonic() - t0 >= 0.5 * WINDOW_S  # the commit waited for the verdict
    st = wait_release(client, "vlad-demo-reacher@1.1.0")
    assert st["canary"] is None
    assert any("canary of vlad-demo-reacher@1.1.0 passed" in e["reason"] for e in events(client, "canary"))
    assert not events(client, "canary_abort")
    assert store.active() == "vlad-demo-reacher-1.1.0"
    assert (store.history()[-1].who, store.history()[-1].why) == ("mender", "Mender artifact vlad-1.1.0")
    assert mender.installed() == "vlad-1.1.0"
    assert not list((tmp / "incoming").iterdir())  # Cleanup removed the assembled folder


def test_a_canary_abort_fails_the_commit_and_mender_rolls_back(robot):
    mender, client, store, tmp = robot
    control = tmp / "fault"
    control.write_text("oob")  # the canary's engine produces out-of-bounds actions
    bad = signed_demo_copy(
        tmp / "v120",
        "1.2.0",
        3,
        backend="wrapped",
        options=json.dumps({"control_file": str(control), "intra_op_threads": 1}),
        canary_window_s=60,
        canary_max_deadline_miss_rate=MISS_RATE,
    )
    out = mender("install", str(mender.artifact(bad, "vlad-1.2.0")))
    assert out.returncode == 0, out.stdout + out.stderr
    out = mender("commit")
    log = out.stdout + out.stderr
    assert out.returncode != 0, log
    assert "canary of vlad-demo-reacher@1.2.0 aborted" in log and "vlad serves vlad-demo-reacher@1.1.0 again" in log, (
        log
    )
    # Mender ran the module's ArtifactRollback, which found nothing left to do
    assert "Rolling back Artifact" in log and "vlad already serves vlad-demo-reacher@1.1.0" in log, log
    wait_release(client, "vlad-demo-reacher@1.1.0")
    assert events(client, "canary_abort")
    wait_until(lambda: store.history()[-1].event == "rollback", 10, "the rollback's journal record")
    assert store.active() == "vlad-demo-reacher-1.1.0"
    assert mender.installed() == "vlad-1.1.0"  # Mender too keeps the artifact installed before


def test_a_tampered_release_fails_the_install_with_vlads_reason(robot):
    mender, client, store, tmp = robot
    rel = signed_demo_copy(tmp / "v130", "1.3.0", 4, canary_window_s=WINDOW_S, canary_max_deadline_miss_rate=MISS_RATE)
    data = bytearray((rel / "policy.onnx").read_bytes())
    data[100] ^= 1  # after signing: the manifest's sha256 no longer holds
    (rel / "policy.onnx").write_bytes(bytes(data))
    history = len(store.history())
    out = mender("install", str(mender.artifact(rel, "vlad-1.3.0")))
    log = out.stdout + out.stderr
    assert out.returncode != 0, log
    assert "vlad-release: ArtifactInstall: vlad refused 'deploy'" in log and "policy.onnx" in log, log
    assert "Traceback" not in log, log
    assert client.status()["release"] == "vlad-demo-reacher@1.1.0"
    assert store.active() == "vlad-demo-reacher-1.1.0" and len(store.history()) == history
    assert mender.installed() == "vlad-1.1.0"


def test_mender_rollback_after_install_serves_the_previous_release(robot):
    mender, client, store, tmp = robot
    art = mender.artifact(
        signed_demo_copy(tmp / "v140", "1.4.0", 5, canary_window_s=60, canary_max_deadline_miss_rate=MISS_RATE),
        "vlad-1.4.0",
    )
    out = mender("install", str(art))
    assert out.returncode == 0, out.stdout + out.stderr
    assert client.status()["release"] == "vlad-demo-reacher@1.4.0"
    out = mender("rollback")
    assert out.returncode == 0, out.stdout + out.stderr
    wait_release(client, "vlad-demo-reacher@1.1.0")
    abort = events(client, "canary_abort")[-1]  # the canary was running: the rollback aborts it
    assert "rollback by mender: Mender rolled back artifact vlad-1.4.0" in abort["reason"], abort
    wait_until(lambda: store.history()[-1].event == "rollback", 10, "the rollback's journal record")
    assert store.active() == "vlad-demo-reacher-1.1.0"
    assert mender.installed() == "vlad-1.1.0"
    # A second rollback finds no update in progress (exit 2): vlad is not asked again.
    assert mender("rollback").returncode == 2
    assert client.status()["release"] == "vlad-demo-reacher@1.1.0"


def test_an_artifact_naming_a_registry_reference_pulls_only_what_the_robot_lacks(robot):
    """(e) The artifact carries one line, a reference pinned by digest: the module pulls
    the release from a real registry (verified as it streams; the robot's store already
    holds the weights) and deploys it through the same canary and commit."""
    from vlad.fleet.registry import Registry, push
    from vlad_tools.testing.registry import RegistryProcess, registry_unavailable

    if (why := registry_unavailable()) is not None:
        pytest.skip(why)
    mender, client, store, tmp = robot
    rel = signed_demo_copy(tmp / "v150", "1.5.0", 6, canary_window_s=WINDOW_S, canary_max_deadline_miss_rate=MISS_RATE)
    registry = RegistryProcess(tmp / "registry")
    try:
        t = push(
            rel,
            f"{registry.host}/fleet/reacher:1.5.0",
            keys_dir=KEYS,
            registry=Registry(registry.host, plain_http=True),
        )
        ref = tmp / "ref" / "vlad-release.ref"
        ref.parent.mkdir()
        ref.write_text(f"{registry.host}/fleet/reacher@{t.digest}\n")
        out = mender("install", str(mender.artifact(ref.parent, "vlad-1.5.0")))
        log = out.stdout + out.stderr
        assert out.returncode == 0, log
        assert "pulled 15 files" in log and "0.00 MB moved" not in log, log
        moved = float(log.split(" MB moved")[0].rsplit(": ", 1)[-1])
        assert moved < 0.1 * t.bytes_total / 1e6, log  # the weights came from the store
        out = mender("commit")
        assert out.returncode == 0, out.stdout + out.stderr
    finally:
        registry.close()
    wait_release(client, "vlad-demo-reacher@1.5.0")
    assert store.active() == "vlad-demo-reacher-1.5.0" and mender.installed() == "vlad-1.5.0"
