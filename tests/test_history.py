"""Observation history (``[history]``): the contract declares it, the one Preprocessor holds
the window, and every staleness and rejection rule applies to the whole window.

The window is checked against a plain list model of the rules in docs/contract.md,
including under random (hypothesis) sequences of fresh, stale, backwards, foreign-client,
repeated and malformed observations.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import history_data
from vlad.contract import diff_contracts, parse_contract
from vlad.errors import ContractError, ObservationError
from vlad.processing import Preprocessor, RawObservation, preprocess, preprocess_image, preprocess_proprio

FRAMES = 3
MS = 1_000_000


@pytest.fixture(scope="module")
def hcontract(contract):
    data = history_data(contract, FRAMES)
    lang = data["language"]
    c = parse_contract(data, "history", path=contract.path)  # the tokenizer resolves beside the demo's
    assert c.frames == FRAMES and lang["file"] == c.language.file
    return c


def obs(k: int, t_ms: float, client: str | None = "a", seq: int | None = None) -> RawObservation:
    rng = np.random.default_rng(k)
    return RawObservation(
        images={"overhead": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)},
        proprio=rng.normal(size=4).astype(np.float32),
        instruction="reach the red target",
        sequence=k if seq is None else seq,
        sensor_time_ns=int(t_ms * MS),
        client=client,
    )


def frame_of(c, o: RawObservation) -> tuple[np.ndarray, np.ndarray]:
    return preprocess_image(c.cameras[0], o.images["overhead"]), preprocess_proprio(c, o.proprio)


def window_of(c, pre: Preprocessor) -> tuple[np.ndarray, np.ndarray]:
    return pre.inputs[c.cameras[0].input][0].copy(), pre.inputs[c.proprio.input][0].copy()


def expected_window(c, frames: list[RawObservation]) -> tuple[np.ndarray, np.ndarray]:
    pairs = [frame_of(c, o) for o in frames]
    return np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])


def assert_window(c, pre: Preprocessor, frames: list[RawObservation]) -> None:
    img, prop = window_of(c, pre)
    want_img, want_prop = expected_window(c, frames)
    np.testing.assert_array_equal(img, want_img)
    np.testing.assert_array_equal(prop, want_prop)


# -- the contract ------------------------------------------------------------------------------


def test_history_needs_the_time_axis(contract):
    data = history_data(contract, FRAMES)
    for t in data["inputs"]:
        if t["name"] == contract.proprio.input:
            t["layout"], t["shape"] = "ND", [1, 4]
    with pytest.raises(ContractError) as e:
        parse_contract(data)
    assert "proprio.dim and history.frames 3: expected [N, 3, 4]" in str(e.value)


def test_history_camera_layout_and_shape(contract):
    data = history_data(contract, FRAMES)
    for t in data["inputs"]:
        if t["name"] == contract.cameras[0].input:
            t["layout"], t["shape"] = "NCHW", [1, 3, 64, 64]
    with pytest.raises(ContractError) as e:
        parse_contract(data)
    text = str(e.value)
    assert "'NCHW' but cameras[0].model" in text and "needs 'NTCHW'" in text
    assert "expected [N, 3, 3, 64, 64]" in text


@pytest.mark.parametrize("frames", [0, 65])
def test_history_frames_bounded(contract, frames):
    with pytest.raises(ContractError, match=r"history.frames: must be in \[1, 64\]"):
        parse_contract(history_data(contract, frames))


def test_no_history_keeps_the_canonical_bytes(contract, hcontract, demo_dir):
    """A contract without [history] hashes as before the section existed: the signed demo
    manifest pins that sha256."""
    import tomllib

    assert "history" not in contract.to_dict() and hcontract.to_dict()["history"] == {"frames": FRAMES}
    manifest = tomllib.loads((demo_dir / "manifest.toml").read_text())
    assert contract.sha256 == manifest["contract"]["sha256"]


def test_history_change_is_breaking(contract, hcontract):
    diffs = {d.path: d for d in diff_contracts(contract, hcontract)}
    assert diffs["history"].breaking and diffs["history"].category == "structure"
    other = parse_contract(history_data(contract, 2), path=contract.path)
    d = {d.path: d for d in diff_contracts(hcontract, other)}
    assert d["history.frames"].breaking and d["history.frames"].category == "shape"


# -- the window ----------------------------------------------------------------------------------


def test_single_observation_is_a_restarted_window(hcontract, tokenizer):
    o = obs(1, 1000)
    pre = Preprocessor(hcontract, tokenizer)
    pre.fill(o)
    assert_window(hcontract, pre, [o] * FRAMES)
    ref = preprocess(hcontract, tokenizer, o)
    for name, value in pre.inputs.items():
        np.testing.assert_array_equal(value, ref[name], err_msg=name)


def test_window_slides_oldest_first(hcontract, tokenizer):
    pre = Preprocessor(hcontract, tokenizer)
    seen = [obs(k, 1000 + 20 * k) for k in range(6)]
    for i, o in enumerate(seen):
        pre.fill(o)
        frames = seen[max(0, i - FRAMES + 1) : i + 1]
        frames = [frames[0]] * (FRAMES - len(frames)) + frames  # a restart repeats the first
        assert_window(hcontract, pre, frames)
    assert pre.restarts == 1


def test_gap_longer_than_the_observation_age_restarts(hcontract, tokenizer):
    age = hcontract.timing.max_observation_age_ms
    pre = Preprocessor(hcontract, tokenizer)
    a, b = obs(1, 1000), obs(2, 1000 + age)  # exactly the age: still one window
    c = obs(3, 1000 + 2 * age + 0.001)  # just over it after b
    for o in (a, b):
        pre.fill(o)
    assert_window(hcontract, pre, [a, a, b])
    pre.fill(c)
    assert_window(hcontract, pre, [c, c, c])
    assert pre.restarts == 2


def test_time_backwards_and_another_client_restart(hcontract, tokenizer):
    pre = Preprocessor(hcontract, tokenizer)
    a, b = obs(1, 1000), obs(2, 1020)
    back = obs(3, 1010)
    pre.fill(a)
    pre.fill(b)
    pre.fill(back)
    assert_window(hcontract, pre, [back] * FRAMES)
    other = obs(4, 1030, client="b")
    pre.fill(other)
    assert_window(hcontract, pre, [other] * FRAMES)


def test_reset_restarts_at_the_next_frame(hcontract, tokenizer):
    pre = Preprocessor(hcontract, tokenizer)
    pre.fill(obs(1, 1000))
    pre.fill(obs(2, 1020))
    pre.reset()
    o = obs(3, 1040)
    pre.fill(o)
    assert_window(hcontract, pre, [o] * FRAMES)


def test_the_same_observation_twice_does_not_move_the_window(hcontract, tokenizer):
    pre = Preprocessor(hcontract, tokenizer)
    a, b = obs(1, 1000), obs(2, 1020)
    pre.fill(a)
    pre.fill(b)
    pre.fill(b)  # a swap re-serves the newest observation
    assert_window(hcontract, pre, [a, a, b])


@pytest.mark.parametrize(
    "bad",
    [
        lambda o: RawObservation(
            {**o.images}, np.full(4, np.nan, np.float32), o.instruction, o.sequence, o.sensor_time_ns
        ),
        lambda o: RawObservation({}, o.proprio, o.instruction, o.sequence, o.sensor_time_ns),
        lambda o: RawObservation(
            {"overhead": np.zeros((32, 32, 3), np.uint8)}, o.proprio, o.instruction, o.sequence, o.sensor_time_ns
        ),
        lambda o: RawObservation(o.images, o.proprio[:2], o.instruction, o.sequence, o.sensor_time_ns),
    ],
    ids=["nan-proprio", "no-camera", "wrong-size", "short-proprio"],
)
def test_a_rejected_observation_never_enters_the_window(hcontract, tokenizer, bad):
    pre = Preprocessor(hcontract, tokenizer)
    a, b = obs(1, 1000), obs(2, 1020)
    pre.fill(a)
    pre.fill(b)
    before = window_of(hcontract, pre)
    with pytest.raises(ObservationError):
        pre.fill(bad(obs(3, 1040)))
    after = window_of(hcontract, pre)
    np.testing.assert_array_equal(before[0], after[0])
    np.testing.assert_array_equal(before[1], after[1])
    c = obs(4, 1060)
    pre.fill(c)
    assert_window(hcontract, pre, [a, b, c])


def test_without_history_nothing_changes(contract, tokenizer):
    """frames = 1: the window machinery stays out of the way (no staging, no restarts)."""
    pre = Preprocessor(contract, tokenizer)
    o = obs(1, 1000)
    pre.fill(o)
    assert pre.frames == 1 and not pre._staged
    assert pre.inputs[contract.cameras[0].input].shape == (1, 3, 64, 64)


# -- adversarial: random sequences against a plain model of the rules -----------------------------

EVENTS = st.lists(
    st.tuples(
        st.sampled_from(["next", "gap", "back", "client", "repeat", "bad", "reset"]),
        st.floats(min_value=0.0, max_value=200.0),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(EVENTS)
def test_window_follows_the_rules_on_random_sequences(hcontract, tokenizer, events):
    age = hcontract.timing.max_observation_age_ms
    pre = Preprocessor(hcontract, tokenizer)
    model: list[RawObservation] = []  # the window, per docs/contract.md
    t, client, k, last = 1000.0, "a", 0, None
    for kind, dt in events:
        k += 1
        if kind == "reset":
            pre.reset()
            model = []
            continue
        if kind == "repeat" and last is not None:
            o = last
        else:
            step = {"next": min(dt, age), "gap": age + 1 + dt, "back": -1 - dt}.get(kind, min(dt, age))
            t += step
            client = {"client": "b" if client == "a" else "a"}.get(kind, client)
            o = obs(k, t, client)
        if kind == "bad":
            with pytest.raises(ObservationError):
                pre.fill(RawObservation({}, o.proprio, o.instruction, o.sequence, o.sensor_time_ns, o.client))
            continue
        pre.fill(o)
        if model and o is model[-1] and kind == "repeat":
            pass
        elif (
            not model
            or o.client != model[-1].client
            or o.sensor_time_ns < model[-1].sensor_time_ns
            or o.sensor_time_ns - model[-1].sensor_time_ns > age * MS
        ):
            model = [o] * FRAMES
        else:
            model = [*model[1:], o]
        last = o
        assert_window(hcontract, pre, model)
