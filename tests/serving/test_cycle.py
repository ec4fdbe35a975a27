"""Every cycle failure is a counted, visible fault: an exception injected into each stage of
a serving cycle (intake, tokenization, preprocessing, engine, decode, guard, publish) gets
the controller an answer for that observation (a hold saying why), a counter, a
rate-limited log line, and the serving thread goes on answering the next observation."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from vlad.errors import BackendError, ObservationError, RemoteUnavailable
from vlad.processing import RawObservation
from vlad.serving.cycle import CycleFailure, run_cycle
from vlad.serving.tracing import CycleTimes
from vlad_tools.testing import wait_until

LONG = "reach the red target " * 10  # more tokens than the demo contract's max_tokens (8)


def _boom(exc: Exception):
    def raise_(*args, **kwargs):
        raise exc

    return raise_


def _intake(rig, monkeypatch):
    monkeypatch.setattr(rig.trusted, "judge_values", _boom(RuntimeError("a bug in a check")))


def _tokenizer_in_cycle(rig, monkeypatch):
    monkeypatch.setattr(rig.intake, "tokenizer", None)  # not refused at intake: the cycle classifies it


def _preprocess(rig, monkeypatch):
    monkeypatch.setattr(rig.policy.pre, "fill", _boom(ValueError("a bug in preprocessing")))


def _engine_raises(rig, monkeypatch):
    rig.session.error = RuntimeError("the engine's own exception type")


def _engine_fails(rig, monkeypatch):
    rig.session.error = BackendError("CUDA error: an illegal memory access")


def _remote(rig, monkeypatch):
    rig.session.error = RemoteUnavailable("the server did not answer within the deadline")


def _decode_contract(rig, monkeypatch):
    monkeypatch.setattr(rig.policy.decoder, "decode", _boom(ObservationError("output 'actions': wrong shape")))


def _decode_bug(rig, monkeypatch):
    monkeypatch.setattr(rig.policy.decoder, "decode", _boom(ZeroDivisionError("a bug in decoding")))


def _guard(rig, monkeypatch):
    monkeypatch.setattr(rig.guard, "check", _boom(FloatingPointError("a bug in the guard")))


def _publish_once(rig, monkeypatch):
    send = rig.publisher._send
    calls = []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise OSError("the action socket failed once")
        return send(*args, **kwargs)

    monkeypatch.setattr(rig.publisher, "_send", flaky)


# (stage, inject, instruction, hold source, reason, advisory, counter)
CASES = [
    ("intake", _intake, None, "hold:rejected", "internal_error", True, ("intake", "internal_error")),
    (
        "tokenize at intake",
        None,
        LONG,
        "hold:rejected",
        "instruction_too_long",
        True,
        ("intake", "instruction_too_long"),
    ),
    (
        "tokenize",
        _tokenizer_in_cycle,
        LONG,
        "hold:rejected",
        "instruction_too_long",
        True,
        ("intake", "instruction_too_long"),
    ),
    ("preprocess", _preprocess, None, "hold:internal_error", "internal_error", False, ("policy", "cycle_errors")),
    ("engine raises", _engine_raises, None, "hold:backend_error", "backend_error", False, ("policy", "backend_errors")),
    ("engine fails", _engine_fails, None, "hold:backend_error", "backend_error", False, ("policy", "backend_errors")),
    ("remote", _remote, None, "hold:remote_unavailable", "remote_unavailable", False, ("policy", "remote_errors")),
    (
        "decode contract",
        _decode_contract,
        None,
        "hold:backend_error",
        "backend_error",
        False,
        ("policy", "backend_errors"),
    ),
    ("decode bug", _decode_bug, None, "hold:internal_error", "internal_error", False, ("policy", "cycle_errors")),
    ("guard", _guard, None, "hold:internal_error", "internal_error", False, ("policy", "cycle_errors")),
    ("publish", _publish_once, None, "hold:internal_error", "internal_error", False, ("policy", "cycle_errors")),
]


def _count(rig, where, key):
    if where == "intake":
        return rig.intake.counts.rejected[key]
    return getattr(rig.policy.counts, key)


@pytest.mark.parametrize(
    ("stage", "inject", "instruction", "source", "reason", "advisory", "counter"), CASES, ids=[c[0] for c in CASES]
)
def test_an_exception_in_any_stage_is_answered_counted_and_serving_goes_on(
    rig, monkeypatch, stage, inject, instruction, source, reason, advisory, counter
):
    rig.send_obs(1)
    assert rig.recv().header["source"] == "release"
    with monkeypatch.context() as m:
        if inject is not None:
            inject(rig, m)
        rig.send_obs(2, **({"instruction": instruction} if instruction else {}))
        hold = rig.recv()
        assert hold is not None, f"{stage}: no answer"
        h = hold.header
        assert (h["source"], h["reason"], h["advisory"], h["obs_seq"]) == (source, reason, advisory, 2), h
        # The hold posture is the trusted joint state.
        assert np.allclose(hold.tensors["actions"], rig.trusted.positions, atol=1e-6)
        assert _count(rig, *counter) == 1, (stage, counter)
        rig.session.error = None
    rig.send_obs(3)  # fixed: the next observation is served by the policy again
    msg = rig.recv()
    assert msg.header["source"] == "release" and msg.header["obs_seq"] == 3
    assert rig.loop.cycle_errors == 0  # nothing escaped to the thread's last-resort handler


def test_repeated_failures_are_logged_sparsely(rig, caplog):
    rig.session.error = BackendError("the engine fails every time")
    with caplog.at_level(logging.ERROR, logger="vlad.serving"):
        for seq in range(1, 41):
            rig.send_obs(seq)
            assert rig.recv().header["source"] == "hold:backend_error"
    assert rig.policy.counts.backend_errors == 40
    assert len([r for r in caplog.records if "backend_error" in r.getMessage()]) == 10


def test_an_over_long_instruction_flood_is_refused_quietly_and_good_observations_are_served(rig, caplog):
    with caplog.at_level(logging.WARNING):
        for seq in range(1, 201):
            rig.send_obs(seq, instruction=LONG)
        wait_until(lambda: rig.intake.counts.rejected["instruction_too_long"] == 200, what="200 refusals")
    assert rig.session.calls == 0
    assert len(caplog.records) <= 11  # the first ten, sampled after
    assert not [r for r in caplog.records if r.exc_info]  # a refusal, not a traceback
    while rig.recv(0.2) is not None:  # the refusals' answers (at most one per wake-up)
        pass
    rig.send_obs(300)
    assert rig.recv().header["source"] == "release"


def test_the_cycle_names_its_stage(rig):
    """run_cycle itself: the failure's stage and reason, as every caller sees them."""
    t = CycleTimes()
    obs = RawObservation({"overhead": np.zeros((64, 64, 3), np.uint8)}, np.zeros(4, np.float32), LONG, 1, 1)
    with pytest.raises(CycleFailure) as failure:
        run_cycle(rig.policy, obs, t, max_age=False)
    assert (failure.value.stage, failure.value.reason, failure.value.input_fault) == (
        "preprocess",
        "instruction_too_long",
        True,
    )
    with pytest.raises(CycleFailure) as failure:
        run_cycle(rig.policy, obs, t)  # sensor time 1 ns: decades old
    assert (failure.value.stage, failure.value.reason) == ("stale", "stale")
