"""Fuzz targets and input generators, shared by tests/testing/test_fuzz.py (hypothesis, bounded for
CI) and scripts/fuzz.py (long runs with a time budget).

Each target takes one input and either returns or raises :class:`FuzzFailure` (an
invariant broke) or any other exception (a crash: the code under test let something
other than its documented error escape). The documented errors are swallowed here:

* ``protocol``: :func:`vlad.protocol.decode` on obs/hb/estop/act frames -> only
  :class:`~vlad.protocol.ProtocolError`, with a reason from :data:`PROTOCOL_REASONS`;
* ``control``: :func:`vlad.daemon.control.parse_request` -> only ``ProtocolError`` /
  ``BadArguments``;
* ``estop``: the e-stop thread's message reader never raises, and only a well-formed
  ``estop`` message whose ``engaged`` is exactly ``False`` releases;
* ``intake``: :meth:`vlad.serving.intake.Intake.accept` never raises; every message is
  either an accepted observation, a heartbeat, or exactly one counted rejection with a
  known reason; an accepted observation is finite and has the contract's shapes;
* ``manifest``: :func:`vlad.release.manifest.parse_document` + ``parse_manifest`` on TOML
  bytes -> only :class:`~vlad.release.manifest.ManifestError`.
"""

from __future__ import annotations

import dataclasses
import functools
import random
import struct
import time
from typing import Any

import msgpack
import numpy as np

from vlad.protocol import HoldKind
from vlad_tools.testing.releases import DEMO

PROTOCOL_REASONS = {"malformed", "unknown_topic", "bad_version", "bad_dtype", "bad_shape", "too_large"}
INTAKE_REASONS = PROTOCOL_REASONS | {
    "future_timestamp",
    "unknown_tensor",
    "missing_tensor",
    "nonfinite",
    "proprio_out_of_limits",
    "implausible_proprio",
}


class FuzzFailure(AssertionError):
    """An invariant of a target broke (as opposed to an exception escaping)."""


# ---- the targets ---------------------------------------------------------------------------


def target_protocol(frames: list[bytes]) -> None:
    from vlad import protocol

    for expect in (protocol.TOPICS, (protocol.TOPIC_OBS, protocol.TOPIC_HEARTBEAT), (protocol.TOPIC_ESTOP,)):
        try:
            msg = protocol.decode(frames, expect=expect)
        except protocol.ProtocolError as exc:
            if exc.reason not in PROTOCOL_REASONS:
                raise FuzzFailure(f"unknown reason {exc.reason!r}") from None
            continue
        if msg.topic not in expect or not protocol.is_version(msg.header["v"]):
            raise FuzzFailure(f"accepted a message outside {expect}: {msg.header!r:.200}")
        for arr in msg.tensors.values():
            if arr.dtype.name not in protocol.WIRE_DTYPES or arr.ndim < 1:
                raise FuzzFailure(f"accepted tensor {arr.dtype} {arr.shape}")


def target_control(frame: bytes) -> None:
    from vlad import protocol
    from vlad.daemon import control

    try:
        cmd, args = control.parse_request(frame)
    except (protocol.ProtocolError, control.BadArguments) as exc:
        control.error_reason(exc)
        str(exc)
        return
    if cmd.name not in control.COMMANDS or not isinstance(args, cmd.args):
        raise FuzzFailure(f"parsed into {cmd.name} {args!r:.200}")
    for value in vars(args).values() if hasattr(args, "__dict__") else ():
        if isinstance(value, str) and "\x00" in value:
            raise FuzzFailure(f"NUL byte accepted in {cmd.name} arguments")


@functools.cache
def _estop():
    from vlad.config import SafetyConfig
    from vlad.daemon.safety import EStop

    return EStop(SafetyConfig(), None, None, 20_000_000, lambda *_: None)


def target_estop(frames: list[bytes]) -> None:
    from vlad import protocol

    e = _estop()
    e._bridge_engaged = True
    e._message(frames)
    if e._bridge_engaged is False:
        msg = protocol.decode(frames, expect=(protocol.TOPIC_ESTOP,))  # must be well-formed
        if msg.header.get("engaged") is not False:
            raise FuzzFailure(f"released by {msg.header!r:.200}")
    elif e._bridge_engaged is not True:
        raise FuzzFailure(f"engaged state {e._bridge_engaged!r}")


@functools.cache
def _contract():
    from vlad.contract import load_contract

    return load_contract(DEMO / "contract.toml")


def make_intake():
    from vlad.serving.counters import IntakeCounts
    from vlad.serving.guard import TrustedState
    from vlad.serving.intake import Intake

    contract = _contract()
    return Intake(contract, IntakeCounts(), TrustedState(contract), 50_000_000)


@functools.cache
def shared_intake():
    return make_intake()


def target_intake(frames: list[bytes]) -> None:
    intake = shared_intake()
    c = intake.counts
    before = (c.messages, c.observations, c.heartbeats, c.input_rejected, sum(c.rejected.values()))
    obs = intake.accept(frames, time.monotonic_ns())  # must not raise, whatever the frames
    after = (c.messages, c.observations, c.heartbeats, c.input_rejected, sum(c.rejected.values()))
    delta = tuple(a - b for a, b in zip(after, before, strict=True))
    if obs is not None:
        if delta != (1, 1, 0, 0, 0):
            raise FuzzFailure(f"accepted, but counters moved {delta}")
        contract = _contract()
        for cam in contract.cameras:
            if obs.images[cam.name].dtype != np.dtype(cam.raw.dtype):
                raise FuzzFailure("accepted an image of the wrong dtype")
        if obs.proprio is None or obs.proprio.shape != (contract.proprio.dim,) or not np.isfinite(obs.proprio).all():
            raise FuzzFailure(f"accepted proprio {obs.proprio!r}")
    elif delta == (1, 0, 1, 0, 0):
        pass  # a heartbeat
    elif delta != (1, 0, 0, 1, 1):
        raise FuzzFailure(f"neither accepted nor counted once: counters moved {delta}")
    unknown = set(c.rejected) - INTAKE_REASONS
    if unknown:
        raise FuzzFailure(f"rejection reasons outside the documented list: {unknown}")


@functools.cache
def intake_pair():
    """The demo intake, and one whose Layout never matches: every message takes the full checks."""
    from vlad import protocol

    fast, full = make_intake(), make_intake()
    full._layout = protocol.Layout([("never", "uint8", [1])])
    return fast, full


def target_layout(frames: list[bytes]) -> None:
    """The Layout fast path (protocol.decode with a layout; Intake) gives the verdict the
    full checks give: the same error reason, or the same header, tensors and observation."""
    from vlad import protocol

    fast, full = intake_pair()
    verdicts: list[object] = []  # (topic, header, tensors) or the error reason
    for layout in (fast._layout, None):
        try:
            msg = protocol.decode(frames, expect=(protocol.TOPIC_OBS, protocol.TOPIC_HEARTBEAT), layout=layout)
            # the header as bytes: a NaN in it never equals itself as a dict value
            header = msgpack.packb(msg.header, use_bin_type=True)
            verdicts.append(
                (msg.topic, header, [(k, a.dtype.str, a.shape, a.tobytes()) for k, a in msg.tensors.items()])
            )
        except protocol.ProtocolError as exc:
            verdicts.append(exc.reason)
    if verdicts[0] != verdicts[1]:
        raise FuzzFailure(f"layout fast path says {verdicts[0]!r:.200}, the full checks {verdicts[1]!r:.200}")
    now = time.monotonic_ns()
    got = [intake.accept(frames, now) for intake in (fast, full)]
    if (got[0] is None) != (got[1] is None) or dict(fast.counts.rejected) != dict(full.counts.rejected):
        raise FuzzFailure(f"intake verdicts differ: {dict(fast.counts.rejected)} vs {dict(full.counts.rejected)}")


def gen_layout_frames(rng: random.Random) -> list[bytes]:
    """A valid observation whose tensor descriptions or frames are subtly off."""
    frames = list(valid_obs_frames())
    head = msgpack.unpackb(frames[1])
    head["t_sensor_ns"] = time.monotonic_ns()
    descs = head["tensors"]
    k = rng.randrange(len(descs))
    d = descs[k]
    choice = rng.randrange(9)
    if choice == 0:
        d["shape"] = [float(n) for n in d["shape"]]
    elif choice == 1:
        d["shape"] = [True if n == 1 else n for n in d["shape"]] + [True]
    elif choice == 2:
        descs.reverse()
        frames[2:] = frames[:1:-1]
    elif choice == 3:
        d[rng.choice(["extra", "name2"])] = 1
    elif choice == 4:
        d["dtype"] = rng.choice(["float64", "uint16", "float32", "uint8", ">f4", "int8"])
    elif choice == 5:
        frames.append(bytes(rng.randrange(4)))
    elif choice == 6:
        frames[2 + k] = frames[2 + k][: rng.randrange(len(frames[2 + k]) + 1)]
    elif choice == 7:
        d["shape"] = [n + rng.choice([-1, 1]) for n in d["shape"]]
    else:
        d["name"] = rng.choice(["proprio", "image/overhead", "image/wrist", ""])
    frames[1] = msgpack.packb(head, use_bin_type=True)
    return frames


def valid_chunk_frames() -> tuple[bytes, ...]:
    """An action chunk as the daemon publishes it (every header field present)."""
    from vlad import protocol

    chunk = protocol.ActionChunk(
        seq=3, obs_seq=7, t_sensor_ns=10**15, t_issue_ns=10**15 + 4_000_000, valid_until_ns=10**15 + 10**9,
        period_ns=20_000_000, release="vlad-demo-reacher-1.0.0", state="ACTIVE", source="release",
        interventions=("rate",), timings_ms={"engine": 3.25, "guard": 0.1}, actions=np.zeros((50, 2), np.float32),
        client="fuzz", rtc=(2, 1), policy="release:vlad-demo-reacher-1.0.0",
    )  # fmt: skip
    return tuple(bytes(f) for f in protocol.encode(protocol.TOPIC_ACTIONS, chunk.header(), {"actions": chunk.actions}))


_CHUNK_VALUES: list[Any] = [
    None, True, False, 0, 1, -1, 2**63 - 1, 2**63, 2**64 - 1, 1.0, float("nan"), float("inf"), "", "x" * 65,
    "x" * 129, "x" * 257, "a\x00b", "\n", HoldKind.REJECTED.source, HoldKind.ESTOP.source, "stale", "malformed", [], [1], [1, 2],
    [2**63, 0], [1, True], [1.0, 2], {}, {"a": 1}, {"a": float("nan")}, {"a": "b"}, {"a": 10**18}, ["rate"],
    ["x" * 65], [1], b"bytes",
]  # fmt: skip


def gen_chunk_frames(rng: random.Random) -> list[bytes]:
    """A daemon's chunk with header fields dropped or replaced, or its actions off."""
    frames = list(valid_chunk_frames())
    head = msgpack.unpackb(frames[1])
    if rng.random() < 0.3:  # a hold, alone: its reason decides
        head["source"] = rng.choice([HoldKind.REJECTED.source, HoldKind.STALE.source, "release", "fallback1"])
        head["reason"] = rng.choice(["", "stale", "malformed", "bad_shape", "nonsense"])
        frames[1] = msgpack.packb(head, use_bin_type=True)
        return frames
    for _ in range(rng.randint(1, 3)):
        key = rng.choice([k for k in head if k not in ("v", "kind", "tensors")] or ["seq"])
        if rng.random() < 0.25:
            head.pop(key, None)
        else:
            head[key] = rng.choice(_CHUNK_VALUES) if rng.random() < 0.8 else random_value(rng)
    if rng.random() < 0.1:
        head["tensors"] = [{"name": "actions", "dtype": rng.choice(["float64", "uint8"]), "shape": [50, 2]}]
        frames[2] = bytes(50 * 2 * (8 if head["tensors"][0]["dtype"] == "float64" else 1))
    elif rng.random() < 0.1:
        head["tensors"] = [{"name": "actions", "dtype": "float32", "shape": [100]}]
    frames[1] = msgpack.packb(head, use_bin_type=True)
    return frames


def target_chunk(frames: list[bytes]) -> None:
    """decode_chunk raises only ProtocolError, and its one-pass check for a daemon's chunk
    (protocol._plain_chunk) accepts only what the field-by-field checks accept, as the same chunk."""
    from vlad import protocol

    try:
        msg = protocol.decode(frames, expect=(protocol.TOPIC_ACTIONS,))
    except protocol.ProtocolError:
        return
    plain = protocol._plain_chunk(msg.header, msg.tensors.get("actions"), 5)
    try:
        checked = protocol._checked_chunk(msg, 5)
    except protocol.ProtocolError as exc:
        if exc.reason != "malformed":
            raise FuzzFailure(f"a chunk refused as {exc.reason!r}, not malformed") from None
        if plain is not None:
            header = f"{msg.header!r:.300}"
            raise FuzzFailure(f"the one-pass check accepted what the full checks refuse ({exc}): {header}") from None
        return
    fields = [f.name for f in dataclasses.fields(checked) if f.name != "actions"]
    if plain is not None and (
        [getattr(plain, f) for f in fields] != [getattr(checked, f) for f in fields]
        or plain.actions is not checked.actions
    ):
        raise FuzzFailure(f"the one-pass check made another chunk of {msg.header!r:.300}")


def target_manifest(raw: bytes) -> None:
    from vlad.release.manifest import ManifestError, parse_document, parse_manifest

    try:
        doc = parse_document(raw, "<fuzz>")
        parse_manifest(doc, "<fuzz>")
    except ManifestError as exc:
        str(exc)


# ---- seeds and generators --------------------------------------------------------------------


@functools.cache
def valid_obs_frames() -> tuple[bytes, ...]:
    from vlad import protocol

    contract = _contract()
    cam = contract.cameras[0].raw
    img = np.zeros((cam.height, cam.width, 3), np.dtype(cam.dtype))
    q = np.zeros(contract.proprio.dim, np.float32)
    frames = protocol.encode(
        protocol.TOPIC_OBS,
        {"seq": 1, "t_sensor_ns": time.monotonic_ns(), "instruction": "reach the red target", "client": "fuzz"},
        {f"image/{contract.cameras[0].name}": img, "proprio": q},
    )
    return tuple(bytes(f) for f in frames)


def seeds_frames() -> list[list[bytes]]:
    from vlad import protocol

    obs = list(valid_obs_frames())
    hb = [bytes(f) for f in protocol.encode(protocol.TOPIC_HEARTBEAT, {"seq": 2, "t_ns": 5, "client": "x"})]
    es = [bytes(f) for f in protocol.encode(protocol.TOPIC_ESTOP, {"seq": 3, "engaged": False, "source": "plc"})]
    es2 = [bytes(f) for f in protocol.encode(protocol.TOPIC_ESTOP, {"seq": 4, "engaged": True})]
    act = [
        bytes(f) for f in protocol.encode(protocol.TOPIC_ACTIONS, {"seq": 1}, {"actions": np.zeros((8, 2), np.float32)})
    ]
    return [obs, hb, es, es2, act]


def seeds_control() -> list[bytes]:
    from vlad import protocol

    return [
        protocol.encode_request("ping"),
        protocol.encode_request("events", limit=5),
        protocol.encode_request("deploy", path="/tmp/x", why="w", canary=True),
        protocol.encode_request("shadow_start", path="/a", tolerance=0.1),
        protocol.encode_request("resume", who="me", why="because"),
    ]


def seeds_manifest() -> list[bytes]:
    return [(DEMO / "manifest.toml").read_bytes(), (DEMO / "contract.toml").read_bytes()]


KEYS = [
    "v",
    "kind",
    "seq",
    "tensors",
    "name",
    "dtype",
    "shape",
    "t_sensor_ns",
    "instruction",
    "client",
    "engaged",
    "source",
    "cmd",
    "args",
    "path",
    "why",
    "who",
    "limit",
    "tolerance",
    "canary",
    "force",
    "t_ns",
]
_STRINGS = [
    "obs",
    "hb",
    "estop",
    "act",
    "status",
    "float32",
    "uint8",
    "float64",
    "bool",
    "object",
    "proprio",
    "image/overhead",
    "ping",
    "deploy",
    "status",
    "",
    "\x00",
    "a" * 300,
    "../../etc",
    "\u202e",
]
_INTS = [0, 1, -1, 2, 3, 4, 8, 64, 255, 2**31 - 1, 2**31, 2**32, 2**63 - 1, 2**64 - 1, -(2**63)]


def random_value(rng: random.Random, depth: int = 0) -> Any:
    r = rng.random()
    if depth > 3 or r < 0.5:
        return rng.choice(
            [
                lambda: rng.choice(_INTS),
                lambda: rng.randint(-1000, 1000),
                lambda: rng.choice(_STRINGS),
                lambda: rng.random() * rng.choice([1, 1e300, -1e-300]),
                lambda: float(rng.choice(["nan", "inf", "-inf"])),
                lambda: rng.choice([True, False, None]),
                lambda: rng.randbytes(rng.randint(0, 16)),
            ]
        )()
    if r < 0.75:
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 5))]
    return {
        rng.choice(KEYS) if rng.random() < 0.8 else random_value(rng, 4): random_value(rng, depth + 1)
        for _ in range(rng.randint(0, 6))
    }


def random_header(rng: random.Random, topic: str) -> dict:
    """A header that is mostly right: each field kept, dropped or replaced at random."""
    h: dict[str, Any] = {"v": 1, "kind": topic, "seq": rng.randint(0, 2**20)}
    if topic == "obs":
        h.update(
            t_sensor_ns=time.monotonic_ns() - rng.randint(0, 10**9),
            instruction="reach the red target",
            tensors=[
                {"name": "image/overhead", "dtype": "uint8", "shape": [64, 64, 3]},
                {"name": "proprio", "dtype": "float32", "shape": [4]},
            ],
        )
    elif topic == "estop":
        h.update(engaged=rng.choice([False, True]), source="plc")
    for key in list(h):
        r = rng.random()
        if r < 0.08:
            del h[key]
        elif r < 0.16:
            h[key] = random_value(rng)
    if rng.random() < 0.2:
        h[rng.choice(KEYS)] = random_value(rng)
    return h


def mutate(rng: random.Random, data: bytes, max_len: int = 1 << 16) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        pos = rng.randrange(len(b) + 1)
        if op == 0 and b:  # flip a bit
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1 and b:  # replace a byte with an interesting one
            b[rng.randrange(len(b))] = rng.choice([0, 0xFF, 0x7F, 0x80, 0xC0, 0xC1, 0xDC, 0xDD, 0xDE, 0xDF, 0x90, 0x9F])
        elif op == 2:  # insert random bytes
            b[pos:pos] = rng.randbytes(rng.randint(1, 8))
        elif op == 3 and b:  # delete a range
            del b[pos : pos + rng.randint(1, 16)]
        elif op == 4 and b:  # duplicate a range
            j = rng.randrange(len(b))
            b[pos:pos] = b[j : j + rng.randint(1, 32)]
        elif op == 5 and len(b) >= 4:  # overwrite with an interesting integer
            i = rng.randrange(len(b) - 3)
            b[i : i + 4] = struct.pack("<I", rng.choice([0, 1, 0x7FFFFFFF, 0xFFFFFFFF, 0x80000000]))
        elif op == 6 and b:  # truncate
            del b[rng.randrange(len(b)) :]
    return bytes(b[:max_len])


def gen_frames(rng: random.Random) -> list[bytes]:
    """One multipart message: random bytes, random msgpack, a random-ish header with
    tensors, or a mutation of a valid message."""
    r = rng.random()
    if r < 0.1:
        return [rng.randbytes(rng.randint(0, 64)) for _ in range(rng.randint(0, 5))]
    if r < 0.3:
        raw_topic = rng.choice([b"obs", b"hb", b"estop", b"act", b"zzz"])
        return [raw_topic, msgpack.packb(random_value(rng), use_bin_type=rng.random() < 0.5)] + [
            rng.randbytes(rng.randint(0, 32)) for _ in range(rng.randint(0, 3))
        ]
    if r < 0.6:
        topic = rng.choice(["obs", "obs", "hb", "estop"])
        h = random_header(rng, topic)
        frames = [
            topic.encode() if rng.random() < 0.95 else rng.choice([b"obs", b"hb", b""]),
            msgpack.packb(h, use_bin_type=True),
        ]
        if topic == "obs":
            img = rng.choice([64 * 64 * 3, 64 * 64 * 3 - 1, 32 * 32 * 3, 0])
            q = np.array([rng.choice([0.0, 0.1, -0.1, 3.9, np.nan, np.inf, 1e30]) for _ in range(4)], np.float32)
            frames += [bytes(img) if img < 20000 else rng.randbytes(16) + bytes(img - 16), q.tobytes()]
            tens = h.get("tensors")
            if rng.random() < 0.1 and isinstance(tens, list) and tens and len(frames) == 2 + len(tens):  # one left out
                k = rng.randrange(len(h["tensors"]))
                del h["tensors"][k]
                frames[1] = msgpack.packb(h, use_bin_type=True)
                del frames[2 + k]
            elif rng.random() < 0.1:  # a tensor frame too few or too many
                del frames[2 + rng.randint(0, 1)]
            elif rng.random() < 0.05:
                frames.append(b"")
        return frames
    seed = rng.choice(seeds_frames())
    frames = list(seed)
    i = rng.randrange(len(frames))
    frames[i] = mutate(rng, frames[i], max_len=1 << 15)
    if rng.random() < 0.1:
        frames.append(rng.randbytes(rng.randint(0, 8)))
    return frames


def gen_control(rng: random.Random) -> bytes:
    r = rng.random()
    if r < 0.15:
        return rng.randbytes(rng.randint(0, 64))
    if r < 0.45:
        return msgpack.packb(random_value(rng), use_bin_type=rng.random() < 0.5)
    if r < 0.75:
        from vlad.daemon import control

        args = {rng.choice(KEYS): random_value(rng) for _ in range(rng.randint(0, 4))}
        req: dict[Any, Any] = {"v": 1, "cmd": rng.choice([*control.COMMANDS, "nope", "\x00"]), "args": args}
        if rng.random() < 0.1:
            req[rng.choice(KEYS)] = random_value(rng)
        if rng.random() < 0.1:
            req["v"] = random_value(rng)
        return msgpack.packb(req, use_bin_type=True)
    return mutate(rng, rng.choice(seeds_control()))


_TOML_VALUES = ["1", "-1", "true", '""', "[]", "{}", "1e400", "0x10", "inf", '"a"', "1979-05-27", '"\\u0000"']
_TOML_SNIPPETS = [
    "[release]\n",
    "[[artifacts]]\n",
    'path = "../x"\n',
    "size = -1\n",
    "version_code = 99999999999999999999\n",
    'sha256 = "zz"\n',
    "expires = 1979-05-27T07:32:00Z\n",
    "x = [[[[[[[[1]]]]]]]]\n",
    "a.b.c = {d = 1}\n",
    'format = "vlad.manifest/1"\n',
    "[canary]\n",
    "window_s = nan\n",
    "[lineage]\n",
    "= 1\n",
    "t = 1979-05-27T07:32:00+25:00\n",
    "d = 0000-00-00\n",
    '"\\ud800" = 1\n',
    "k = 1_000_\n",
]


def gen_manifest(rng: random.Random) -> bytes:
    r = rng.random()
    if r < 0.1:
        return rng.randbytes(rng.randint(0, 256))
    seed = rng.choice(seeds_manifest())
    if r < 0.4:  # line-level edits of a real manifest
        lines = seed.decode().splitlines(keepends=True)
        for _ in range(rng.randint(1, 4)):
            op = rng.randrange(4)
            i = rng.randrange(len(lines) + 1)
            if op == 0 and lines:
                del lines[min(i, len(lines) - 1)]
            elif op == 1:
                lines.insert(i, rng.choice(_TOML_SNIPPETS))
            elif op == 2 and lines:
                j = rng.randrange(len(lines))
                lines.insert(i, lines[j])
            elif op == 3 and lines:
                k = min(i, len(lines) - 1)
                key = lines[k].split("=", 1)[0]
                if "=" in lines[k]:
                    lines[k] = key + "= " + rng.choice(_TOML_VALUES) + "\n"
        return "".join(lines).encode()
    return mutate(rng, seed, max_len=1 << 17)


TARGETS = {
    "protocol": (target_protocol, gen_frames),
    "estop": (target_estop, gen_frames),
    "intake": (target_intake, gen_frames),
    "layout": (target_layout, gen_layout_frames),
    "chunk": (target_chunk, gen_chunk_frames),
    "control": (target_control, gen_control),
    "manifest": (target_manifest, gen_manifest),
}
