"""Replay a sensor recording through a candidate and compare its actions.

Each recorded observation goes through the candidate exactly as the daemon runs it: the
serving thread's cycle (:func:`vlad.serving.cycle.run_cycle`: preprocess with the recorded
sequence number, so the flow-matching noise is the recorded one, the engine, decode) as if
it had just been sensed (no stale check; a remote engine gets the contract's deadline), then the
final guard replayed in the recorded publish order at the recorded guard times (its rate
limit depends on the previous command and the time since, so the replayed guard matches
the recorded one to the timestamps' resolution, not bit for bit). The guarded actions are
compared with what the robot actually received (but for the chunks that continue one the
recording does not hold: docs/gates.md), and the raw actions with a baseline session's on
the same inputs.

    from vlad_tools.gates.recording import read_recording
    from vlad_tools.gates.replay import replay
    result = replay(read_recording("demo.mcap"), candidate_session, contract, tokenizer,
                    baseline=baseline_session)
    result.vs_recorded.max_per_joint(), result.flips_vs_recorded
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vlad.backend import Session
from vlad.contract import Contract
from vlad.processing import RawObservation
from vlad.serving.counters import PolicyId
from vlad.serving.cycle import CycleFailure, run_cycle
from vlad.serving.policy import ServedPolicy
from vlad.serving.tracing import CycleTimes
from vlad_tools.gates.metrics import JointErrors
from vlad_tools.gates.recording import RecordedObservation, Recording
from vlad_tools.gates.results import GateError


def raw_observation(obs: RecordedObservation) -> RawObservation:
    """The processing module's view of a recorded observation (same seq: same noise)."""
    return RawObservation(
        images=obs.images,
        proprio=obs.proprio,
        instruction=obs.instruction,
        sequence=obs.seq,
        sensor_time_ns=obs.t_sensor_ns,
    )


@dataclass
class GuardReplay:
    """Guarded candidate actions vs the recorded ones, and differing guard interventions."""

    errors: JointErrors
    flips: int = 0
    compared: int = 0
    refused: int = 0  # observations this daemon's trusted joint state would refuse
    continued: int = 0  # chunks computed by real-time chunking: not compared (below)
    warmup: int = 0  # chunks while references from before the recording may count: not compared
    examples: list[str] = field(default_factory=list)


def replay_guard(
    contract: Contract,
    recording: Recording,
    actions: Mapping[int, np.ndarray],
    observations: Mapping[int, RecordedObservation],
) -> GuardReplay:
    """Run the final guard over ``actions`` (decoded candidate chunks by observation seq) in
    the recorded publish order, and compare with the published chunks."""
    from vlad.serving.guard import ActionGuard, TrustedState

    trusted = TrustedState(contract)
    guard = ActionGuard(contract, trusted)
    out = GuardReplay(JointErrors(tuple(j.name for j in contract.action.joints)))
    # The trusted joint state and the controllers' reports as the daemon had them when it
    # guarded each chunk: every observation received before then judged, in arrival order.
    arrivals = sorted(observations.values(), key=lambda o: o.t_ns)
    verdicts: dict[int, str | None] = {}
    judged = 0
    chunks = sorted(recording.chunks, key=lambda c: c.seq)
    # A recording that began after the daemon's first chunk (seq 1): until one validity after
    # its first chunk the robot may execute one sent before, which the replayed guard never
    # saw, so those chunks are its references only (sent, not compared).
    validity_ns = int(contract.timing.action_validity_ms * 1e6)
    complete_ns = chunks[0].t_issue_ns + validity_ns if chunks and chunks[0].seq > 1 else 0
    for chunk in chunks:
        while judged < len(arrivals) and arrivals[judged].t_ns <= chunk.t_issue_ns:
            o = arrivals[judged]
            judged += 1
            if o.proprio is not None:
                verdicts[o.seq] = trusted.judge(
                    np.asarray(o.proprio), o.t_sensor_ns, o.reanchor, o.t_ns, o.client or ""
                )
            if verdicts.get(o.seq) is None:
                guard.reported(o.client or "", o.t_sensor_ns, o.executing)
        trusted.settle(chunk.t_issue_ns)
        if chunk.is_hold or chunk.obs_seq not in actions:
            _sent(guard, chunk)  # what the robot may have executed meanwhile
            continue
        if chunk.t_issue_ns < complete_ns:
            _sent(guard, chunk)
            out.warmup += 1
            continue
        if chunk.rtc is not None:
            # Computed to continue the chunk the robot executed then (vlad.serving.rtc), from
            # the guard's view when its inference started, which the recording does not hold:
            # the candidate's plain chunk is no replay of it. Sent, counted, not compared.
            _sent(guard, chunk)
            out.continued += 1
            continue
        obs = observations[chunk.obs_seq]
        if verdicts.get(chunk.obs_seq) is not None:
            # This daemon refuses that joint state and would not answer it; the recorded
            # chunk still moved the recording daemon's reference.
            _sent(guard, chunk)
            out.refused += 1
            continue
        # The seams depend on what the robot executed and on when the guard ran (the slot the
        # chunk arrived in): the recorded report and the recorded issue time.
        client = obs.client or ""
        verdict = guard.check(
            np.array(actions[chunk.obs_seq], np.float32),
            chunk.t_issue_ns,
            chunk.valid_until_ns,
            chunk.t_sensor_ns,
            executing=guard.executing(client, chunk.t_sensor_ns, obs.executing),
            client=client,
            seq=chunk.seq,
        )
        if verdict.actions is None:
            continue
        out.errors.add(chunk.actions, verdict.actions)
        out.compared += 1
        recorded = set(chunk.interventions) - {"expired"}
        replayed = set(verdict.interventions)
        if recorded != replayed:
            out.flips += 1
            if len(out.examples) < 5:
                out.examples.append(
                    f"observation {chunk.obs_seq}: recorded {sorted(recorded)}, replayed {sorted(replayed)}"
                )
    return out


def _sent(guard, chunk) -> None:
    """``chunk`` (recorded) as a chunk the guard sent."""
    guard.record(
        np.asarray(chunk.actions, np.float32),
        chunk.t_sensor_ns,
        chunk.valid_until_ns,
        chunk.t_issue_ns,
        chunk.client,
        chunk.seq,
        chunk.advisory,
    )


@dataclass
class ReplayResult:
    """What a replay found; ``actions`` are the candidate's decoded chunks by observation seq."""

    observations: int
    actions: dict[int, np.ndarray]
    guard: GuardReplay
    vs_baseline: JointErrors | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {
            "observations": self.observations,
            "chunks_compared": self.guard.compared,
            "chunks_continued": self.guard.continued,
            "chunks_warmup": self.guard.warmup,
            "vs_recorded_max_abs_per_joint": self.guard.errors.max_per_joint(),
            "intervention_flips_vs_recorded": self.guard.flips,
            "flip_examples": self.guard.examples,
        }
        if self.vs_baseline is not None:
            d["vs_baseline_max_abs_per_joint"] = self.vs_baseline.max_per_joint()
        return d


def replay(
    recording: Recording,
    candidate: Session,
    contract: Contract,
    tokenizer: Any,
    *,
    baseline: Session | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ReplayResult:
    """Feed every observation of ``recording`` through ``candidate``'s serving cycle; compare
    with the recording and, given one, a ``baseline`` session's chunks for the same
    observations. A cycle that fails raises :class:`GateError` naming the observation, as
    does a recording whose chunks are not of the contract's shape (another release's)."""
    shape = (contract.action.chunk_length, contract.action.dim)
    other = next((c for c in recording.chunks if np.shape(c.actions) != shape), None)
    if other is not None:
        raise GateError(
            f"replay: the recording's chunks are {list(np.shape(other.actions))}, the release's contract "
            f"makes {list(shape)}: record this release (vladctl record --demo RELEASE, docs/gates.md)"
        )
    served = ServedPolicy(PolicyId("candidate", "replay"), contract, candidate, tokenizer)
    base = ServedPolicy(PolicyId("baseline", "replay"), contract, baseline, tokenizer) if baseline else None
    actions: dict[int, np.ndarray] = {}
    observations = {o.seq: o for o in recording.observations}
    vs_baseline = JointErrors(tuple(j.name for j in contract.action.joints)) if base is not None else None
    times = CycleTimes()
    total = len(recording.observations)
    for i, obs in enumerate(recording.observations):
        raw = dataclasses.replace(raw_observation(obs), sensor_time_ns=time.monotonic_ns())
        actions[obs.seq] = _cycle(served, raw, times)
        if base is not None and vs_baseline is not None:
            vs_baseline.add(_cycle(base, raw, times), actions[obs.seq])
        if progress is not None:
            progress(i + 1, total)
    return ReplayResult(total, actions, replay_guard(contract, recording, actions, observations), vs_baseline)


def _cycle(policy: ServedPolicy, raw: RawObservation, times: CycleTimes) -> np.ndarray:
    try:
        return run_cycle(policy, raw, times, max_age=False).copy()  # the decoder reuses its buffer
    except CycleFailure as exc:
        raise GateError(
            f"replay: observation {raw.sequence}: the {policy.id.slot} failed at {exc.stage} ({exc.reason}): {exc}"
        ) from exc
