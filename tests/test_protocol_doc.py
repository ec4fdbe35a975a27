"""docs/protocol.md cannot drift from the code: its tables of rejection reasons, control
commands and counters are compared with the code (and a live daemon's status), and its
example runs, as written, against a live daemon."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import time
import typing
from pathlib import Path

import pytest

from tests.conftest import ROOT
from vlad_tools.testing import start_daemon

DOC = ROOT / "docs" / "protocol.md"
ROLES = ("observations", "actions", "status", "control", "estop")


def _table(marker: str) -> list[list[str]]:
    """The rows (cells) of the markdown table right after ``<!-- marker: ... -->``."""
    text = DOC.read_text()
    start = text.index(f"<!-- {marker}:")
    rows = []
    for line in text[start:].splitlines()[1:]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if set(cells[0]) <= set("-: "):
            continue
        rows.append(cells)
    return rows[1:]  # without the header row


def _names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _code_reasons() -> tuple[set[str], set[str]]:
    """(reasons of the observation and e-stop sockets, reasons of the control channel),
    as the code spells them: every observation reason is a :class:`vlad.protocol.Rejection`
    (mypy holds every refusal to the type), the control channel adds its own counter keys."""
    from vlad.protocol import Rejection

    vlad = ROOT / "vlad"
    protocol = (vlad / "protocol.py").read_text()
    control_src = (vlad / "daemon" / "control.py").read_text()
    request_path = (
        protocol[protocol.index("def _unpack") : protocol.index("def is_version")]
        + protocol[protocol.index("def check_text") : protocol.index("def decode(")]
        + protocol[protocol.index("def decode_request") : protocol.index("def encode_reply")]
    )
    control = set(re.findall(r'self\.rejected\["(\w+)"\]', control_src))
    control |= set(re.findall(r'return "(\w+)"', control_src[control_src.index("def error_reason") :]))
    control |= {m.lower() for m in re.findall(r"Rejection\.(\w+)", control_src + request_path)}
    observations = {r.value for r in Rejection} - {Rejection.UNKNOWN_COMMAND.value}  # the control channel's own
    return observations, control


def test_every_rejection_is_produced_somewhere():
    """No member of the enum is dead: each is raised or returned by some code of vlad."""
    from vlad.protocol import Rejection

    used = set()
    for path in (ROOT / "vlad").rglob("*.py"):
        used |= {m.lower() for m in re.findall(r"Rejection\.([A-Z_]+)\b", path.read_text())}
    assert used >= {r.value for r in Rejection}, sorted({r.value for r in Rejection} - used)


def test_rejection_reasons_table_matches_the_code():
    documented = {_names(r[0])[0] for r in _table("reasons")}
    observations, control = _code_reasons()
    doc_control = {n[len("control_") :] for n in documented if n.startswith("control_")}
    doc_other = {n for n in documented if not n.startswith("control_")} - {"estop_garbled", "unauthorized_<role>"}
    assert doc_control == control, f"control reasons, code vs docs/protocol.md: {sorted(doc_control ^ control)}"
    assert doc_other == observations, f"reasons, code vs docs/protocol.md: {sorted(doc_other ^ observations)}"


def test_the_status_rejected_keys_are_documented():
    status = (ROOT / "vlad" / "daemon" / "status.py").read_text()
    assert 'rejected[f"unauthorized_{role}"]' in status and 'rejected["estop_garbled"]' in status
    assert '{f"control_{k}": v' in status


def test_control_commands_table_matches_the_registry():
    from vlad.daemon.control import COMMANDS

    rows = {_names(r[0])[0]: r for r in _table("commands")}
    assert set(rows) == set(COMMANDS), sorted(set(rows) ^ set(COMMANDS))
    for name, cmd in COMMANDS.items():
        hints = typing.get_type_hints(cmd.args)
        fields = {f.name: f for f in dataclasses.fields(cmd.args)}
        cell = rows[name][1]
        documented = [n for n in _names(cell) if n in fields or not n.startswith('"')]
        documented = [n for n in documented if re.fullmatch(r"[a-z_]+", n)]
        assert set(documented) == set(fields), (name, documented, list(fields))
        for fname, f in fields.items():
            part = cell[cell.index(f"`{fname}`") :].split("),")[0]
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            assert ("required" in part) == required, (name, fname, part)
            assert hints[fname].__name__ in part, (name, fname, hints[fname], part)
            if not required:
                default = f.default
                shown = {True: "true", False: "false"}.get(default, default) if isinstance(default, bool) else default
                assert str(shown) in part, (name, fname, default, part)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("protocol-doc")
    (tmp / "run").mkdir()
    endpoints = {
        "observations": f"ipc://{tmp}/run/obs",
        "actions": f"ipc://{tmp}/run/actions",
        "status": f"ipc://{tmp}/run/status",
        "control": f"ipc://{tmp}/run/control",
    }
    d = start_daemon(tmp, endpoints=endpoints)
    d.folder = tmp / "run"
    yield d
    d.stop()
    assert "Traceback" not in d.log(), d.log()


def test_counters_table_matches_a_live_status(daemon):
    from vlad.serving.guard import INTERVENTIONS

    documented = set()
    for row in _table("counters"):
        documented |= set(_names(row[0]))
    client = daemon.client()
    try:
        counters = client.status()["counters"]
    finally:
        client.close()
    assert set(counters) == documented, sorted(set(counters) ^ documented)
    assert {f"guard_{k}" for k in INTERVENTIONS} <= documented


def test_the_example_runs_as_written(daemon, tmp_path):
    text = DOC.read_text()
    example = text[text.index("## Example") :]
    code = example[example.index("```python\n") + len("```python\n") :]
    code = code[: code.index("```")]
    assert code.count("ipc:///run/vlad/") == 3
    script = Path(tmp_path / "example.py")
    script.write_text(code.replace("ipc:///run/vlad/", f"ipc://{daemon.folder}/"))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "vlad is ACTIVE" in out.stdout or "vlad is DEGRADED" in out.stdout, out.stdout
    assert "from release:vlad-demo-reacher@1.0.0 execute waypoint" in out.stdout, out.stdout


class _Tap:
    """Keeps the raw frames of every chunk a client receives."""

    def __init__(self) -> None:
        self.frames: list[list[bytes]] = []

    def observation(self, frames: list[bytes], t_ns: int) -> None:
        pass

    def actions(self, frames: list[bytes], t_ns: int) -> None:
        self.frames.append(frames)


def test_live_chunks_carry_exactly_the_documented_keys(daemon):
    """A policy chunk and a hold from the running daemon: header keys as the page's `act`
    table lists them (plus the common keys), `timings_ms` keys among the documented stages."""
    from vlad import protocol
    from vlad_tools.testing import load_golden

    rows = {_names(r[0])[0]: r for r in _table("act")}
    documented = set(rows) | {"v", "kind", "seq", "tensors"}
    stages = set(_names(rows["timings_ms"][2]))
    raw = load_golden()[0]["raw"]
    client = daemon.client("doc-check")
    client.tap = tap = _Tap()
    headers: dict[int, dict] = {}
    want = {90_000: "release", 90_001: "hold:rejected"}  # (a daemon left alone falls back first: wait)
    try:
        for seq, instruction in enumerate([raw.instruction, "reach the red target " * 10], start=90_000):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and seq not in headers:
                client.publish_observation(dict(raw.images), raw.proprio, instruction, seq=seq)
                client.heartbeat()
                time.sleep(0.02)  # a control period
                while client.recv_chunk(timeout_ms=0) is not None:
                    pass
                for frames in tap.frames:
                    h = protocol.decode(frames, expect=(protocol.TOPIC_ACTIONS,)).header
                    if want.get(h["obs_seq"]) == h["source"]:
                        headers[h["obs_seq"]] = h
                tap.frames.clear()
        events = [(e["kind"], e["reason"]) for e in client.control("events", limit=10)]
    finally:
        client.close()
    assert set(headers) == set(want), "\n".join(map(str, events))
    policy, hold = headers[90_000], headers[90_001]
    assert hold["reason"] == "instruction_too_long" and hold["advisory"] is True
    for header in (policy, hold):
        assert set(header) == documented, sorted(set(header) ^ documented)
    assert policy["timings_ms"] and set(policy["timings_ms"]) <= stages, sorted(set(policy["timings_ms"]) - stages)
    assert hold["timings_ms"] == {}


# -- every rejection row of the observation socket, against the live daemon -------------------


def _obs_frames(seq: int, *, header: dict | None = None, tensors: dict | None = None, topic: bytes = b"obs") -> list:
    """A demo observation, with header keys and tensors replaced where given (None: dropped)."""
    import msgpack
    import numpy as np

    from vlad_tools.testing import load_golden

    raw = load_golden()[0]["raw"]
    h = {"v": 1, "kind": "obs", "seq": seq, "t_sensor_ns": time.monotonic_ns(), "instruction": raw.instruction}
    h.update(header or {})
    h = {k: v for k, v in h.items() if v is not None}
    ts = {"image/overhead": raw.images["overhead"], "proprio": np.asarray(raw.proprio, np.float32)}
    ts.update(tensors or {})
    ts = {k: v for k, v in ts.items() if v is not None}
    descs = [{"name": k, "dtype": str(v.dtype), "shape": list(v.shape)} for k, v in ts.items()]
    h["tensors"] = h.get("tensors", descs)
    return [topic, msgpack.packb(h), *(np.ascontiguousarray(v).tobytes() for v in ts.values())]


def _cases():
    """(reason, frames builder (seq -> frames), answered with hold:rejected)."""
    import numpy as np

    far = np.array([3.9, 2.9, 0.0, 0.0], np.float32)
    return [
        ("malformed", lambda s: _obs_frames(s, header={"t_sensor_ns": -1}), True),
        ("malformed", lambda s: _obs_frames(s, header={"exec": [1]}), True),
        ("malformed", lambda s: [b"obs", b"\x93not-a-map"], False),  # no header to answer to
        ("unknown_topic", lambda s: _obs_frames(s, topic=b"obsx"), False),
        ("bad_version", lambda s: _obs_frames(s, header={"v": 2}), True),
        ("bad_dtype", lambda s: _obs_frames(s, tensors={"proprio": np.zeros(4, np.complex64)}), True),
        ("bad_dtype", lambda s: _obs_frames(s, tensors={"image/overhead": np.zeros((64, 64, 3), np.float32)}), True),
        ("bad_shape", lambda s: _obs_frames(s, tensors={"image/overhead": np.zeros((32, 64, 3), np.uint8)}), True),
        ("unknown_tensor", lambda s: _obs_frames(s, tensors={"image/wrist": np.zeros((2, 2, 3), np.uint8)}), True),
        ("missing_tensor", lambda s: _obs_frames(s, tensors={"proprio": None}), True),
        ("nonfinite", lambda s: _obs_frames(s, tensors={"proprio": np.array([0.1, 0.1, 1e39, 0.0])}), True),
        ("future_timestamp", lambda s: _obs_frames(s, header={"t_sensor_ns": time.monotonic_ns() + 10**9}), True),
        ("proprio_out_of_limits", lambda s: _obs_frames(s, tensors={"proprio": far * 3}), True),
        ("implausible_proprio", lambda s: _obs_frames(s, tensors={"proprio": far}), True),
        ("instruction_too_long", lambda s: _obs_frames(s, header={"instruction": "reach " * 20}), True),
    ]


@pytest.mark.parametrize(("reason", "frames", "answered"), _cases(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_observation_rejection_is_counted_and_answered_as_the_table_says(daemon, reason, frames, answered):
    """One message per row: its counter moves, and the sender gets ``hold:rejected`` with that
    reason exactly when the header names an observation (docs/protocol.md, "Hold chunks")."""
    from vlad_tools.testing import load_golden, wait_until

    documented = {_names(r[0])[0] for r in _table("reasons")}
    assert reason in documented
    raw = load_golden()[0]["raw"]
    client = daemon.client("rows")
    try:
        # The trusted state first (a good observation), so implausibility can be judged.
        seq0 = 70_000 + 1000 * len(reason) + int(time.monotonic_ns() % 97) * 10
        sent = []

        def answered_once() -> bool:  # sent until the subscription has propagated (slow joiner)
            sent.append(seq0 + len(sent))
            client.publish_observation(dict(raw.images), raw.proprio, raw.instruction, seq=sent[-1])
            time.sleep(0.02)
            return any(c.obs_seq in sent for c in _drain(client))

        wait_until(answered_once, 10, "the good observation's answer", poll=0)
        before = client.status()["counters"]["rejected"].get(reason, 0)
        seq = sent[-1] + 1
        got = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            client.send_raw(frames(seq))
            time.sleep(0.02)
            got += [c for c in _drain(client) if c.obs_seq == seq]
            if client.status()["counters"]["rejected"].get(reason, 0) > before and (got or not answered):
                break
        assert client.status()["counters"]["rejected"].get(reason, 0) > before, reason
        holds = [c for c in got if c.source == "hold:rejected"]
        if answered:
            assert holds and holds[0].reason == reason and holds[0].advisory, (reason, got)
        else:
            assert not holds, (reason, got)
    finally:
        client.close()


def _drain(client) -> list:
    out = []
    while (chunk := client.recv_chunk(timeout_ms=0)) is not None:
        out.append(chunk)
    return out
