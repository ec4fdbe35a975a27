"""One cycle: an accepted observation -> the policy's action chunk, or a classified failure.

    stale check -> preprocess -> infer -> decode

The serving thread, a shadow run, the in-process episode link (:mod:`vlad_tools.episodes`) and
the gates call :func:`run_cycle`, so the chunk a policy computes for an observation is the
same, bit for bit, wherever it runs: only what happens to it afterwards (the final guard
and the publisher on the serving thread, a comparison in a shadow run) differs.

Every failure is a :class:`CycleFailure` naming the stage and the hold that answers the
observation (:class:`~vlad.protocol.HoldKind`), with the :class:`~vlad.protocol.Rejection`
when the observation itself is at fault; its ``reason`` is the counter key, the hold reason a
controller receives and what the health monitors judge:

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
from collections.abc import Callable

import numpy as np

from vlad.errors import ObservationError, RemoteUnavailable, TokenizerError, VladError
from vlad.processing import Guide, RawObservation
from vlad.protocol import HoldKind, Rejection
from vlad.serving.counters import PolicyCounts
from vlad.serving.policy import ServedPolicy
from vlad.serving.tracing import CycleTimes


class CycleFailure(Exception):
    """A cycle that produced no chunk: the ``stage``, the ``hold`` that answers the observation
    instead, and the ``rejection`` when the observation itself is at fault (see the module doc)."""

    def __init__(self, stage: str, hold: HoldKind, detail: str, rejection: Rejection | None = None) -> None:
        super().__init__(detail)
        self.stage = stage
        self.hold = hold
        self.rejection = rejection

    @property
    def reason(self) -> Rejection | HoldKind:
        """The counter key and the hold's reason: the rejection, else the hold's kind."""
        return self.rejection or self.hold

    @property
    def input_fault(self) -> bool:
        """The observation's fault (the controller's to fix), not the policy's or vlad's: its
        hold is advisory (stale, or refused with the rejection), any other is binding."""
        return self.hold in (HoldKind.STALE, HoldKind.REJECTED)

    def count(self, counts: PolicyCounts) -> None:
        """Count the failure on the policy that had the observation; a refused observation is
        the intake's to count (as a rejection), not the policy's."""
        if self.hold is HoldKind.STALE:
            counts.stale += 1
        elif self.hold is HoldKind.REMOTE_UNAVAILABLE:
            counts.remote_errors += 1
        elif self.hold is HoldKind.BACKEND_ERROR:
            counts.backend_errors += 1
        elif self.hold is HoldKind.INTERNAL_ERROR:
            counts.cycle_errors += 1


def run_cycle(
    policy: ServedPolicy,
    obs: RawObservation,
    t: CycleTimes,
    *,
    max_age: bool = True,
    guide: Guide | None = None,
    before_engine: Callable[[], None] | None = None,
) -> np.ndarray:
    """``obs`` -> ``policy``'s action chunk in contract units (the decoder's buffer: copy it
    to keep it past the next cycle); raises :class:`CycleFailure`. ``t`` gets the stage
    stamps; ``max_age=False`` skips the stale check (replaying recorded observations);
    ``guide``: what real-time chunking conditions the chunk on (vlad.serving.rtc);
    ``before_engine``: called once the inputs are ready, just before the engine call."""
    t.pre_start = time.monotonic_ns()
    if max_age and t.pre_start - obs.sensor_time_ns > policy.max_age_ns:
        raise CycleFailure(
            "stale",
            HoldKind.STALE,
            f"observation {obs.sequence} is {(t.pre_start - obs.sensor_time_ns) / 1e6:.1f} ms old",
        )
    try:
        inputs = policy.pre.fill(obs, guide)
    except TokenizerError as exc:
        raise CycleFailure("preprocess", HoldKind.REJECTED, str(exc), Rejection.INSTRUCTION_TOO_LONG) from exc
    except ObservationError as exc:
        raise CycleFailure("preprocess", HoldKind.REJECTED, str(exc), Rejection.BAD_INPUT) from exc
    except Exception as exc:
        raise CycleFailure("preprocess", HoldKind.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}") from exc
    if before_engine is not None:
        before_engine()
    t.pre_end = t.infer_start = time.monotonic_ns()
    try:
        outputs = policy.session.infer(inputs, obs.sensor_time_ns + policy.deadline_ns)
    except RemoteUnavailable as exc:
        raise CycleFailure("infer", HoldKind.REMOTE_UNAVAILABLE, str(exc)) from exc
    except VladError as exc:
        raise CycleFailure("infer", HoldKind.BACKEND_ERROR, str(exc)) from exc
    except Exception as exc:  # an engine's own exception type: still the engine that failed
        raise CycleFailure("infer", HoldKind.BACKEND_ERROR, f"{type(exc).__name__}: {exc}") from exc
    t.infer_end = time.monotonic_ns()
    timing = policy.session.last_timing
    t.h2d_ms, t.d2h_ms, t.network_ms, t.server_ms = timing.h2d_ms, timing.d2h_ms, timing.network_ms, timing.server_ms
    try:
        actions = policy.decoder.decode(outputs)
    except ObservationError as exc:  # the engine answered something else than the contract
        raise CycleFailure("decode", HoldKind.BACKEND_ERROR, str(exc)) from exc
    except Exception as exc:
        raise CycleFailure("decode", HoldKind.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}") from exc
    t.decode_end = time.monotonic_ns()
    return actions
