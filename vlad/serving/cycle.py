"""One cycle: an accepted observation -> the policy's action chunk, or a classified failure.

    stale check -> preprocess -> infer -> decode

The serving thread, a shadow run, the in-process episode link (:mod:`vlad_tools.episodes`) and
the gates call :func:`run_cycle`, so the chunk a policy computes for an observation is the
same, bit for bit, wherever it runs: only what happens to it afterwards (the final guard
and the publisher on the serving thread, a comparison in a shadow run) differs.

Every failure is a :class:`CycleFailure` naming the stage and a reason, which is the
counter key, the hold reason a controller receives and what the health monitors judge:

========================  ============  ==================================================
reason                    stage         meaning
========================  ============  ==================================================
``stale``                 stale check   older than ``timing.max_observation_age_ms`` when
                                        inference would start: never computed
``instruction_too_long``  preprocess    more tokens than the contract allows (its
                                        ``language.truncation = "error"``)
``bad_input``             preprocess    the observation does not fit the contract
``remote_unavailable``    infer         a remote server did not answer in time (a link
                                        fault, not the policy's)
``backend_error``         infer/decode  the engine raised, or answered outside the contract
``internal_error``        any           an exception vlad's own code did not expect
========================  ============  ==================================================

A failure of the observation (``stale``, ``instruction_too_long``, ``bad_input``) is the
controller's to fix; ``backend_error`` is the policy's (the monitors quarantine it);
``internal_error`` is vlad's and is logged with its traceback (rate-limited by the caller).
"""

from __future__ import annotations

import time

import numpy as np

from vlad.errors import ObservationError, RemoteUnavailable, TokenizerError, VladError
from vlad.processing import Guide, RawObservation
from vlad.protocol import HoldKind
from vlad.serving.policy import ServedPolicy
from vlad.serving.tracing import CycleTimes

# The reasons an observation itself is at fault (answered, counted as a rejection).
INPUT_REASONS = ("stale", "instruction_too_long", "bad_input")


class CycleFailure(Exception):
    """A cycle that produced no chunk: ``stage`` and ``reason`` (see the module doc)."""

    def __init__(self, stage: str, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.stage = stage
        self.reason = reason

    @property
    def input_fault(self) -> bool:
        """The observation's fault (the controller's to fix), not the policy's or vlad's."""
        return self.reason in INPUT_REASONS

    @property
    def hold(self) -> HoldKind:
        """The hold that answers the observation instead: advisory for an input fault
        (stale, or refused with ``reason``), binding for a failure of the policy or of vlad."""
        if self.reason == "stale":
            return HoldKind.STALE
        return HoldKind.REJECTED if self.input_fault else HoldKind(self.reason)


def run_cycle(
    policy: ServedPolicy, obs: RawObservation, t: CycleTimes, *, max_age: bool = True, guide: Guide | None = None
) -> np.ndarray:
    """``obs`` -> ``policy``'s action chunk in contract units (the decoder's buffer: copy it
    to keep it past the next cycle); raises :class:`CycleFailure`. ``t`` gets the stage
    stamps; ``max_age=False`` skips the stale check (replaying recorded observations);
    ``guide``: what real-time chunking conditions the chunk on (vlad.serving.rtc)."""
    t.pre_start = time.monotonic_ns()
    if max_age and t.pre_start - obs.sensor_time_ns > policy.max_age_ns:
        raise CycleFailure(
            "stale", "stale", f"observation {obs.sequence} is {(t.pre_start - obs.sensor_time_ns) / 1e6:.1f} ms old"
        )
    try:
        inputs = policy.pre.fill(obs, guide)
    except TokenizerError as exc:
        raise CycleFailure("preprocess", "instruction_too_long", str(exc)) from exc
    except ObservationError as exc:
        raise CycleFailure("preprocess", "bad_input", str(exc)) from exc
    except Exception as exc:
        raise CycleFailure("preprocess", "internal_error", f"{type(exc).__name__}: {exc}") from exc
    t.pre_end = t.infer_start = time.monotonic_ns()
    try:
        outputs = policy.session.infer(inputs, obs.sensor_time_ns + policy.deadline_ns)
    except RemoteUnavailable as exc:
        raise CycleFailure("infer", "remote_unavailable", str(exc)) from exc
    except VladError as exc:
        raise CycleFailure("infer", "backend_error", str(exc)) from exc
    except Exception as exc:  # an engine's own exception type: still the engine that failed
        raise CycleFailure("infer", "backend_error", f"{type(exc).__name__}: {exc}") from exc
    t.infer_end = time.monotonic_ns()
    timing = policy.session.last_timing
    t.h2d_ms, t.d2h_ms, t.network_ms, t.server_ms = timing.h2d_ms, timing.d2h_ms, timing.network_ms, timing.server_ms
    try:
        actions = policy.decoder.decode(outputs)
    except ObservationError as exc:  # the engine answered something else than the contract
        raise CycleFailure("decode", "backend_error", str(exc)) from exc
    except Exception as exc:
        raise CycleFailure("decode", "internal_error", f"{type(exc).__name__}: {exc}") from exc
    t.decode_end = time.monotonic_ns()
    return actions
