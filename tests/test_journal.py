"""The daemon's journald fields, read back as journald would store them.

systemd is not PID 1 here, so there is no journald: a datagram socket bound by the test
stands in for ``/run/systemd/journal/socket`` and the test parses the native journal
protocol (``KEY=VALUE`` lines; ``KEY``, a 64-bit length and raw bytes for values with a
newline; a memfd passed along for records too large for one datagram), keeping only the
field names journald accepts. Two ways in, one parser:

* ``libsystemd``: the daemon runs in a user and mount namespace (``unshare``) where the
  test's socket is mounted over ``/run/systemd/journal/socket``, so systemd-python sends
  through libsystemd exactly as on a robot (skipped where user namespaces are off);
* ``VLAD_JOURNAL_SOCKET``: vlad's own sender of the same protocol (:mod:`vlad.logs`).

The daemon runs the fault rig (vlad_tools.testing.write_fault_rig): it starts, serves, its release
turns out non-finite (quarantine, swap, FALLBACK), and it stops. The filters asserted are
the ``journalctl`` lines docs/operations.md gives technicians.
"""

from __future__ import annotations

import array
import os
import re
import shutil
import socket
import struct
import subprocess
import threading
from pathlib import Path

import pytest

from tests.conftest import ROOT
from vlad_tools.testing import ControllerSim, load_golden, start_daemon, wait_until, write_fault_rig

pytest.importorskip("systemd.journal", reason="systemd-python is not installed (scripts/bootstrap builds it)")

# journald keeps a field only if its name is this (journal_field_valid); names starting
# with "_" are its own trusted fields and are dropped when a client sends them.
FIELD_NAME = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
STATES = {"STARTING", "ACTIVE", "DEGRADED", "FALLBACK", "ESTOPPED", "STOPPING"}
OPERATIONS = ROOT / "docs" / "operations.md"


def parse_entry(data: bytes) -> dict[str, str]:
    """One native-protocol datagram -> its fields, as journald would store them."""
    fields: dict[str, str] = {}
    i = 0
    while i < len(data):
        end = data.index(b"\n", i)
        line = data[i:end]
        if b"=" in line:
            key, value = line.split(b"=", 1)
            i = end + 1
        else:  # binary-safe: KEY \n <u64 LE length> <bytes> \n
            key = line
            (size,) = struct.unpack_from("<Q", data, end + 1)
            start = end + 1 + 8
            value = data[start : start + size]
            assert data[start + size : start + size + 1] == b"\n", "binary-safe field not closed by a newline"
            i = start + size + 1
        name = key.decode()
        if FIELD_NAME.fullmatch(name):
            fields[name] = value.decode("utf-8", "replace")
    return fields


class JournalCapture:
    """A datagram socket standing in for journald's native socket."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.sock.settimeout(0.1)
        self.entries: list[dict[str, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        fds = array.array("i")
        while not self._stop.is_set():
            try:
                data, ancillary, _, _ = self.sock.recvmsg(1 << 20, socket.CMSG_SPACE(fds.itemsize))
            except TimeoutError:
                continue
            except OSError:
                return
            for level, kind, payload in ancillary:  # a record too large for a datagram: a memfd
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fd = array.array("i", payload[: fds.itemsize])[0]
                    with os.fdopen(fd, "rb") as f:
                        data = f.read()
            self.entries.append(parse_entry(data))

    def match(self, *filters: str) -> list[dict[str, str]]:
        """Entries matching journalctl-style ``FIELD=VALUE`` filters (the same field twice:
        either value; different fields: all of them)."""
        wanted: dict[str, set[str]] = {}
        for f in filters:
            key, value = f.split("=", 1)
            wanted.setdefault(key, set()).add(value)
        return [e for e in list(self.entries) if all(e.get(k) in vs for k, vs in wanted.items())]

    def wait(self, *filters: str, timeout: float = 20.0) -> dict[str, str]:
        try:
            wait_until(lambda: self.match(*filters), timeout, poll=0.05)
        except AssertionError:
            raise AssertionError(
                f"no journal entry with {filters}; got {[e.get('MESSAGE') for e in self.entries]}"
            ) from None
        return self.match(*filters)[0]

    def close(self) -> None:
        self._stop.set()
        self.sock.close()


def libsystemd_prefix(capture: Path) -> list[str] | None:
    """``unshare`` into a namespace where ``capture`` is /run/systemd/journal/socket, or
    None where unprivileged user namespaces are not allowed."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    mount = (
        "mount -t tmpfs tmpfs /run && mkdir -p /run/systemd/journal && touch /run/systemd/journal/socket"
        f' && mount --bind "{capture}" /run/systemd/journal/socket && exec "$@"'
    )
    prefix = [unshare, "--user", "--map-root-user", "--mount", "sh", "-c", mount, "sh"]
    probe = subprocess.run([*prefix, "true"], capture_output=True)
    return prefix if probe.returncode == 0 else None


@pytest.mark.parametrize("transport", ["libsystemd", "VLAD_JOURNAL_SOCKET"])
def test_journal_fields_operators_filter_on(tmp_path, transport):
    capture = JournalCapture(tmp_path / "journal.sock")
    rig = write_fault_rig(tmp_path)
    env = dict(rig.env)
    prefix = None
    if transport == "libsystemd":
        prefix = libsystemd_prefix(capture.path)
        if prefix is None:
            capture.close()
            pytest.skip("unprivileged user namespaces are not available (unshare --user --mount)")
    else:
        env["VLAD_JOURNAL_SOCKET"] = str(capture.path)
    d = start_daemon(
        tmp_path,
        ["--set", 'logging.journald="on"', "--set", "serve.warmup=2"],
        env=env,
        config=rig.config,
        prefix=prefix,
    )
    client = d.client()
    sim = ControllerSim(client, load_golden()[0]).start()
    try:
        release = "vlad-demo-reacher@1.0.0"
        active = capture.wait("VLAD_EVENT=transition", "VLAD_STATE=ACTIVE")
        assert active["VLAD_RELEASE"] == release and active["VLAD_REASON"], active
        rig.control.write_text("nan")  # the release answers NaN: quarantined, the previous release serves
        capture.wait("VLAD_EVENT=transition", "VLAD_STATE=FALLBACK")
        capture.wait("VLAD_EVENT=swap")
        quarantine = capture.wait("VLAD_EVENT=quarantine")
        assert quarantine["VLAD_POLICY"] == f"release:{release}", quarantine
    finally:
        sim.stop()
        client.close()
        code = d.terminate()
        capture_log = d.log()
        d.stop()
    assert code == 0, capture_log
    stopping = capture.wait("VLAD_EVENT=transition", "VLAD_STATE=STOPPING", timeout=5)
    assert stopping["PRIORITY"] == "6"
    capture.close()
    entries = capture.entries
    assert entries and "Traceback" not in capture_log

    # Every entry: the message, a syslog priority, the identifier, vlad's context, where in
    # the code, which logger and thread.
    for e in entries:
        assert e["MESSAGE"] and e["SYSLOG_IDENTIFIER"] == "vlad", e
        assert e["PRIORITY"] in {"2", "3", "4", "5", "6", "7"}, e
        assert e["VLAD_STATE"] in STATES and e["VLAD_RELEASE"], e
        assert e["CODE_FILE"].endswith(".py") and e["CODE_LINE"].isdigit() and e["CODE_FUNC"], e
        assert e["LOGGER"].startswith("vlad") and e["THREAD_NAME"], e
    # A warning is PRIORITY 4 (the quarantine is logged as one, or a fault finding).
    assert {e["PRIORITY"] for e in entries} >= {"6"}
    assert any(e["PRIORITY"] in {"3", "4"} for e in entries), [(e["PRIORITY"], e["MESSAGE"]) for e in entries]

    # The journalctl lines of docs/operations.md find what they promise in this run.
    doc = OPERATIONS.read_text()
    for line, expect in (
        ("journalctl -u vlad VLAD_EVENT=transition VLAD_STATE=FALLBACK -o verbose --since today", "FALLBACK"),
        ('journalctl -u vlad VLAD_EVENT=swap -o verbose --since "1 hour ago"', None),
        ('journalctl -u vlad VLAD_EVENT=fault VLAD_EVENT=quarantine --since "1 hour ago"', None),
        ("journalctl -u vlad VLAD_RELEASE=vlad-demo-reacher@1.0.0", None),
    ):
        assert line in doc, f"docs/operations.md no longer has: {line}"
        found = capture.match(*re.findall(r"\b(VLAD_[A-Z_]+=\S+)", line))
        assert found, line
        if expect:
            assert all(e["VLAD_STATE"] == expect for e in found)
    seen = {k for e in entries for k in e}
    for field in ("VLAD_STATE", "VLAD_RELEASE", "VLAD_EVENT", "VLAD_REASON", "VLAD_POLICY"):
        assert field in doc and field in seen, field


def test_the_parser_reads_both_forms(tmp_path):
    """The binary-safe form (a value with a newline) and a field journald drops."""
    from vlad.logs import journal_sender

    assert parse_entry(b"MESSAGE=hi\nlower=x\n_PID=1\nKEY\n" + struct.pack("<Q", 3) + b"a\nb\n") == {
        "MESSAGE": "hi",
        "KEY": "a\nb",
    }
    # vlad's sender writes what the parser reads, newline or not.
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(str(tmp_path / "j.sock"))
        journal_sender(str(tmp_path / "j.sock"))("two\nlines", PRIORITY="3", CODE_LINE=7, lower="dropped")
        assert parse_entry(s.recv(65536)) == {"MESSAGE": "two\nlines", "PRIORITY": "3", "CODE_LINE": "7"}


def test_the_parser_reads_what_libsystemd_writes(tmp_path):
    """A multi-line message through libsystemd itself goes binary-safe; the parser reads it."""
    import sys

    capture = JournalCapture(tmp_path / "journal.sock")
    try:
        prefix = libsystemd_prefix(capture.path)
        if prefix is None:
            pytest.skip("unprivileged user namespaces are not available (unshare --user --mount)")
        code = "from systemd import journal; journal.send('two\\nlines', PRIORITY='3', VLAD_STATE='ACTIVE')"
        subprocess.run([*prefix, sys.executable, "-c", code], check=True, timeout=30)
        entry = capture.wait("VLAD_STATE=ACTIVE", timeout=5)
        assert entry["MESSAGE"] == "two\nlines" and entry["PRIORITY"] == "3", entry
    finally:
        capture.close()
