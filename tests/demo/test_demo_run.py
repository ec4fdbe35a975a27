"""``./scripts/demo`` (``python -m vlad_tools.demo.run``) leaves nothing behind and errors in one line.

The demo runs as a real subprocess with its own sockets (a config under ``tmp_path``) and
``TMPDIR`` pointed at a folder of the test's, so any temporary folder it leaves is seen:

* ``--remote``: Ctrl-C or SIGTERM once the daemon serves from the real KServe v2 server, and
  a run to its end: the temporary release copy is gone, no server or daemon is left running;
* ``--openpi --port``: the endpoint listens on that port; a busy port is one line, before
  anything starts.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from tests.conftest import ROOT
from tests.kserve.remote_server import server_unavailable
from vlad.config import Config, ReleaseConfig, ServeConfig, SocketsConfig
from vlad_tools.testing import DEMO, DEMO_KEYS, busy_port, config_toml, free_port, wait_until


def demo_config(tmp_path: Path, release: Path = DEMO) -> Path:
    """etc/vlad/demo.toml with absolute paths and this test's own sockets."""
    run = tmp_path / "run"
    run.mkdir()
    config = tmp_path / "demo.toml"
    cfg = Config(
        release=ReleaseConfig(path=str(release), keys_dir=str(DEMO_KEYS)),
        sockets=SocketsConfig(
            observations=f"ipc://{run}/obs",
            actions=f"ipc://{run}/actions",
            status=f"ipc://{run}/status",
            control=f"ipc://{run}/control",
        ),
        serve=ServeConfig(warmup=2),
    )
    config.write_text(config_toml(cfg))
    return config


class Demo:
    """``python -m vlad_tools.demo.run ...`` with its output collected line by line."""

    def __init__(self, tmp_path: Path, *args: str, release: Path = DEMO) -> None:
        self.tmpdir = tmp_path / "tmpdir"
        self.tmpdir.mkdir()
        env = {**os.environ, "TMPDIR": str(self.tmpdir), "MUJOCO_GL": "egl", "PYTHONUNBUFFERED": "1"}
        config = demo_config(tmp_path, release)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vlad_tools.demo.run", "--config", str(config), "--no-daemon-log", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.out), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for r in self._readers:
            r.start()

    @staticmethod
    def _read(stream, into: list[str]) -> None:
        for line in stream:
            into.append(line.rstrip("\n"))

    def wait_line(self, text: str, timeout: float = 90.0) -> None:
        with contextlib.suppress(AssertionError):  # the message below says what came instead
            wait_until(
                lambda: any(text in line for line in self.out) or self.proc.poll() is not None, timeout, poll=0.02
            )
        if any(text in line for line in self.out):
            return
        raise AssertionError(f"no {text!r} from the demo; stdout {self.out[-10:]}, stderr {self.err[-10:]}")

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def finish(self, timeout: float = 60.0) -> int:
        code = self.proc.wait(timeout)
        for r in self._readers:
            r.join(5)
        return code

    def kill(self) -> None:
        for p in [*self.descendants(), psutil.Process(self.proc.pid)] if self.proc.poll() is None else []:
            p.kill()


needs_server = pytest.mark.skipif(bool(server_unavailable()), reason=str(server_unavailable()))


def left_behind(tmpdir: Path) -> list[Path]:
    """What the demo left in its TMPDIR. ONNX Runtime itself keeps one 51-byte ``.ses`` file
    there (a fixed name, rewritten by every process that uses it, not one per run)."""
    return [p for p in tmpdir.iterdir() if p.name != ".ses"]


def gone(procs: list[psutil.Process], timeout: float = 10.0) -> list[psutil.Process]:
    """The processes still running after ``timeout``."""
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    return alive


@needs_server
@pytest.mark.parametrize(
    ("sig", "when"),
    # Ctrl-C while serving: test_openpi_demo_serves_on_the_port_given.
    [(signal.SIGTERM, "serving"), (signal.SIGINT, "server starting")],
    ids=["SIGTERM-serving", "SIGINT-server-starting"],
)
def test_remote_demo_interrupted_leaves_nothing_behind(tmp_path, sig, when):
    demo = Demo(tmp_path, "--remote", "--episodes", "1")
    try:
        if when == "serving":
            demo.wait_line("demo: vlad is ACTIVE")
        else:  # the v2 server runs but is not ready yet: its process is not handed back yet
            wait_for_server(demo)
        started = demo.descendants()
        assert any("vlad_kserve.server" in cmdline(p) for p in started), started
        assert left_behind(demo.tmpdir), "the remote demo's release copy should exist while it runs"
        demo.proc.send_signal(sig)
        code = demo.finish()
        assert code == (130 if sig == signal.SIGINT else 128 + sig), (demo.out, demo.err)
        assert not gone(started), "a server or daemon outlived the demo"
        assert left_behind(demo.tmpdir) == []
        assert len(demo.err) == 1 and demo.err[0].startswith("demo: "), demo.err
    finally:
        demo.kill()


def cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:  # gone meanwhile
        return ""


def wait_for_server(demo: Demo, timeout: float = 60.0) -> None:
    with contextlib.suppress(AssertionError):  # the message below says what came instead
        wait_until(lambda: any("vlad_kserve.server" in cmdline(p) for p in demo.descendants()), timeout, poll=0.02)
        return
    raise AssertionError(f"the v2 server never started; stderr {demo.err[-5:]}")


@needs_server
def test_remote_demo_run_to_the_end_leaves_nothing_behind(tmp_path):
    demo = Demo(tmp_path, "--remote", "--episodes", "1")
    try:
        demo.wait_line("demo: vlad is ACTIVE")
        started = demo.descendants()
        assert demo.finish(timeout=180) == 0, (demo.out[-10:], demo.err[-10:])
        assert any("through vlad 1/1" in line or "through vlad 0/1" in line for line in demo.out), demo.out[-10:]
        assert not gone(started)
        assert left_behind(demo.tmpdir) == []
    finally:
        demo.kill()


@needs_server
def test_remote_demo_whose_server_fails_says_why_in_one_line(tmp_path):
    """The v2 server cannot load the model: one line with its log's last line (the log's
    folder is removed like the rest), no server left."""
    import shutil

    release = tmp_path / "release"
    shutil.copytree(DEMO, release)
    (release / "policy.onnx").write_bytes(b"not an onnx model")
    demo = Demo(tmp_path, "--remote", "--episodes", "1", release=release)
    try:
        assert demo.finish() == 1
        assert len(demo.err) == 1, demo.err
        assert demo.err[0].startswith("demo: the v2 server exited with status "), demo.err
        assert "server.log" not in demo.err[0] and len(demo.err[0]) > len("demo: the v2 server exited with status 1: ")
        assert left_behind(demo.tmpdir) == []
    finally:
        demo.kill()


def test_openpi_demo_refuses_a_busy_port_in_one_line(tmp_path):
    with busy_port() as port:
        demo = Demo(tmp_path, "--openpi", "--port", str(port))
        code = demo.finish()
    assert code == 1
    assert demo.err == [
        f"demo: port {port} on 127.0.0.1 is not free (Address already in use); pass --port with a free one"
    ]
    assert not any("starting vlad" in line for line in demo.out)  # refused before anything started


def test_openpi_demo_serves_on_the_port_given(tmp_path):
    pytest.importorskip("openpi_client.websocket_client_policy")
    port = free_port()
    demo = Demo(tmp_path, "--openpi", "--port", str(port), "--episodes", "3")
    try:
        demo.wait_line(f"on ws://127.0.0.1:{port}")
        # Ctrl-C in the second episode: not while the simulator imports its renderer, whose
        # GLFW probe (a `python -c` child of pyGLFW's) prints its own EOFError when cut off.
        demo.wait_line("episode   1 ")
        started = demo.descendants()
        demo.proc.send_signal(signal.SIGINT)
        assert demo.finish() == 130, (demo.out, demo.err)
        assert not gone(started)
        assert demo.err == ["demo: interrupted; vlad is stopped and nothing is left behind"], demo.err
    finally:
        demo.kill()


@pytest.mark.parametrize("port", ["70000", "http"])
def test_bad_port_is_refused_by_the_parser(tmp_path, port):
    out = subprocess.run(
        [sys.executable, "-m", "vlad_tools.demo.run", "--openpi", "--port", port],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.returncode == 2
    assert "--port: " in out.stderr and "is not a port number" in out.stderr and "Traceback" not in out.stderr
