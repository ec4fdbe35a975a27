"""``vladctl status --watch`` in a real terminal: a tmux pane, against a real daemon."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from vlad.testing import start_daemon

TMUX = shutil.which("tmux")
pytestmark = pytest.mark.skipif(TMUX is None, reason="tmux is not installed (scripts/bootstrap installs it as root)")


def tmux(*args: str, check: bool = True) -> str:
    return subprocess.run([TMUX, *args], capture_output=True, text=True, check=check).stdout


def screen(session: str) -> list[str]:
    return tmux("capture-pane", "-p", "-t", session).splitlines()


def wait_screen(session: str, pred, timeout: float = 20.0) -> list[str]:
    deadline = time.monotonic() + timeout
    lines: list[str] = []
    while time.monotonic() < deadline:
        lines = screen(session)
        if pred("\n".join(lines)):
            return lines
        time.sleep(0.2)
    raise AssertionError("screen never matched:\n" + "\n".join(lines))


def test_status_watch_in_tmux(tmp_path):
    d = start_daemon(tmp_path, ["--set", "serve.warmup=2"])
    session = f"vlad-watch-{tmp_path.name}"[:60]
    vladctl = Path(sys.executable).parent / "vladctl"
    status_file = tmp_path / "exit"
    cmd = (
        f"cd {ROOT} && PYTHONPATH={ROOT} {vladctl} status --watch --interval 0.3 "
        f"--endpoint {d.endpoints['control']}; echo $? > {status_file}; sleep 60"
    )
    # A 100-column pane: a line over 80 columns would show, not wrap.
    tmux("new-session", "-d", "-s", session, "-x", "100", "-y", "40", cmd)
    client = d.client()
    try:
        for _ in range(30):  # some traffic, so latency rows appear
            client.publish_observation(
                {"overhead": __import__("numpy").zeros((64, 64, 3), "uint8")},
                proprio=[0, 0, 0, 0],
                instruction="reach the red target",
            )
            client.heartbeat()
            time.sleep(0.02)
        lines = wait_screen(session, lambda s: "e2e" in s and "state " in s)
        text = "\n".join(lines)
        assert "release  vlad-demo-reacher@1.0.0" in text
        assert "backend  onnxruntime" in text
        assert "e-stop released" in text
        events = lines[lines.index("events") + 1 :]
        assert events and re.match(r"  \d\d:\d\d:\d\d \S+: ", events[0]), events  # the last events
        assert all(len(line) <= 80 for line in lines), max(lines, key=len)
        # Refreshed in place: the frame never scrolls (one header line on the screen).
        time.sleep(1.0)
        assert sum(line.startswith("vlad ") for line in screen(session)) == 1
        # Daemon gone: one line says so, and the view keeps retrying.
        d.terminate()
        wait_screen(session, lambda s: "daemon unreachable" in s)
        # Ctrl-C: clean exit, code 0.
        tmux("send-keys", "-t", session, "C-c")
        deadline = time.monotonic() + 10
        # The shell creates the file before it writes the code: wait for the code.
        while not (status_file.exists() and status_file.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert status_file.read_text().strip() == "0"
        assert "Traceback" not in "\n".join(screen(session))
    finally:
        client.close()
        tmux("kill-session", "-t", session, check=False)
        d.stop()
