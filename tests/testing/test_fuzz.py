"""Property-based fuzzing of everything that parses untrusted bytes (issue 9).

Targets and their invariants are in tools/vlad_tools/testing/fuzz.py (shared with scripts/fuzz.py,
which runs the same targets for minutes). Here each target gets hypothesis-generated
input of three kinds: raw bytes, random msgpack structures, and mutations of valid
messages (hypothesis drives the mutators through ``st.randoms``). Bounded for CI:
``max_examples`` per test, no per-example deadline (a loaded 2-core machine would make
one flaky); the whole file runs in well under a minute.
"""

from __future__ import annotations

import logging

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vlad_tools.testing import fuzz as ft

FUZZ = settings(
    max_examples=400,
    deadline=None,
    derandomize=False,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FUZZ_SLOW = settings(FUZZ, max_examples=500)


@pytest.fixture(autouse=True, scope="module")
def _quiet():
    # the code under test logs its first rejections loudly; thousands of them are noise here
    names = ("vlad.intake", "vlad.safety", "vlad.guard")
    levels = [logging.getLogger(n).level for n in names]
    for n in names:
        logging.getLogger(n).setLevel(logging.CRITICAL)
    yield
    for n, lvl in zip(names, levels, strict=True):
        logging.getLogger(n).setLevel(lvl)


# msgpack-able values, nested a few levels (what a hostile peer can put in a header)
leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.binary(max_size=40),
)
structures = st.recursive(
    leaves,
    lambda kids: st.one_of(st.lists(kids, max_size=6), st.dictionaries(st.text(max_size=12), kids, max_size=6)),
    max_leaves=30,
)
topics = st.sampled_from([b"obs", b"hb", b"estop", b"act", b"status", b"", b"obs\x00"])
frames_bytes = st.lists(st.binary(max_size=200), min_size=0, max_size=6)
frames_msgpack = st.builds(
    lambda t, h, rest: [t, msgpack.packb(h, use_bin_type=True), *rest],
    topics,
    structures,
    st.lists(st.binary(max_size=64), max_size=4),
)
frames_headers = st.builds(
    lambda t, extra, rest: [
        t.encode(),
        msgpack.packb({"v": 1, "kind": t, "seq": 1, **extra}, use_bin_type=True),
        *rest,
    ],
    st.sampled_from(["obs", "hb", "estop"]),
    st.dictionaries(st.sampled_from(ft.KEYS), structures, max_size=5),
    st.lists(st.binary(max_size=64), max_size=3),
)
frames_mutated = st.randoms(use_true_random=False).map(ft.gen_frames)
any_frames = st.one_of(frames_bytes, frames_msgpack, frames_headers, frames_mutated)


@FUZZ
@given(any_frames)
def test_protocol_decode_raises_only_protocol_errors(frames):
    ft.target_protocol(frames)


@FUZZ
@given(any_frames)
def test_estop_reader_never_raises_and_only_a_clean_false_releases(frames):
    ft.target_estop(frames)


@FUZZ
@given(any_frames)
def test_intake_never_raises_and_counts_every_rejection_once(frames):
    ft.target_intake(frames)


@FUZZ
@given(st.randoms(use_true_random=False))
def test_intake_on_valid_looking_observations(rng):
    # mostly-right obs headers with wrong shapes, NaN/huge proprio, missing tensors
    frames = [
        b"obs",
        msgpack.packb(ft.random_header(rng, "obs"), use_bin_type=True),
        bytes(64 * 64 * 3),
        rng.choice([bytes(16), bytes(8), b"\x00\x00\xc0\x7f" * 4]),
    ]
    ft.target_intake(frames)


@FUZZ
@given(st.one_of(any_frames, st.randoms(use_true_random=False).map(ft.gen_layout_frames)))
def test_layout_fast_path_agrees_with_the_full_checks(frames):
    ft.target_layout(frames)


def test_the_layout_fast_path_is_taken_for_a_conforming_controller():
    """Not vacuous: vlad.client's observation matches the intake's Layout exactly."""
    from vlad import protocol

    fast, _ = ft.intake_pair()
    msg = protocol.decode(list(ft.valid_obs_frames()), layout=fast._layout)
    assert msg.layout is fast._layout
    for _ in range(200):
        ft.target_layout(ft.gen_layout_frames(__import__("random").Random(_)))


@FUZZ
@given(st.one_of(any_frames, st.randoms(use_true_random=False).map(ft.gen_chunk_frames)))
def test_the_one_pass_chunk_check_agrees_with_the_field_by_field_checks(frames):
    ft.target_chunk(frames)


def test_a_daemons_chunk_takes_the_one_pass_check_and_every_field_off_the_full_checks():
    """Not vacuous: the daemon's chunk passes the one-pass check, and the generator's
    chunks reach all three verdicts (the one pass, the full checks only, refused)."""
    import random

    from vlad import protocol

    msg = protocol.decode(list(ft.valid_chunk_frames()), expect=(protocol.TOPIC_ACTIONS,))
    assert protocol._plain_chunk(msg.header, msg.tensors["actions"], 0) == protocol.decode_chunk(msg, 0)
    verdicts = {"plain": 0, "checked": 0, "refused": 0}
    for seed in range(400):
        frames = ft.gen_chunk_frames(random.Random(seed))
        ft.target_chunk(frames)
        try:
            m = protocol.decode(frames, expect=(protocol.TOPIC_ACTIONS,))
            plain = protocol._plain_chunk(m.header, m.tensors.get("actions"), 0)
            protocol.decode_chunk(m, 0)
            verdicts["plain" if plain is not None else "checked"] += 1
        except protocol.ProtocolError:
            verdicts["refused"] += 1
    assert all(n > 10 for n in verdicts.values()), verdicts


control_requests = st.one_of(
    st.binary(max_size=200),
    structures.map(lambda s: msgpack.packb(s, use_bin_type=True)),
    st.builds(
        lambda cmd, args: msgpack.packb({"v": 1, "cmd": cmd, "args": args}, use_bin_type=True),
        st.one_of(
            st.sampled_from(sorted(__import__("vlad.daemon.control", fromlist=["COMMANDS"]).COMMANDS)),
            st.text(max_size=20),
        ),
        st.one_of(st.dictionaries(st.sampled_from(ft.KEYS), structures, max_size=5), structures),
    ),
    st.randoms(use_true_random=False).map(ft.gen_control),
)


@FUZZ
@given(control_requests)
def test_control_requests_raise_only_documented_errors(frame):
    ft.target_control(frame)


toml_text = st.one_of(
    st.binary(max_size=300),
    st.text(alphabet=st.sampled_from(list("[]{}=\".,'\n #abc0123456789-_:TZ+")), max_size=300).map(str.encode),
    st.randoms(use_true_random=False).map(ft.gen_manifest),
)


@FUZZ_SLOW
@given(toml_text)
def test_manifest_parser_raises_only_manifest_errors(raw):
    ft.target_manifest(raw)


def test_seeds_pass_every_target():
    """The valid seeds themselves go through (the generators mutate something real)."""
    intake = ft.make_intake()
    assert intake.accept(list(ft.valid_obs_frames()), __import__("time").monotonic_ns()) is not None
    for frames in ft.seeds_frames():
        ft.target_protocol(frames)
        ft.target_estop(frames)
    for frame in ft.seeds_control():
        ft.target_control(frame)
    from vlad.release.manifest import parse_document, parse_manifest

    parse_manifest(parse_document(ft.seeds_manifest()[0], "demo"), "demo")
