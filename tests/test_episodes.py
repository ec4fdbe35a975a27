"""The one episode runner: in process and through the real daemon, only the transport differs.

Same seeds, same observation sequence numbers and so the same noise: an episode through vlad
is the in-process one, tick for tick, unless serving changed something, and what changed
is named (a late answer, a hold, a guard intervention)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from vlad.plugins import get_backend
from vlad_tools.demo import sim
from vlad_tools.episodes import DaemonLink, InProcessLink, contract_infer, run_episode, seq_base
from vlad_tools.evaluation import compare
from vlad_tools.testing import start_daemon

os.environ.setdefault("MUJOCO_GL", "egl")
PERIOD = 20_000_000
CHUNK = sim.CHUNK_HORIZON  # the demo contract's chunk_length
SEEDS = (43000, 43001)  # x both instructions: four episodes through the daemon


@pytest.fixture(scope="module")
def in_process(demo_dir, contract, tokenizer):
    session = get_backend("onnxruntime").load(demo_dir / "policy.onnx", contract, {"intra_op_threads": 1})
    yield InProcessLink.for_contract(contract, contract_infer(contract, tokenizer, session))
    session.close()


def test_in_process_episodes_are_deterministic_and_number_their_observations(in_process):
    seqs = []
    infer = in_process.infer
    in_process.infer = lambda frame, seq: seqs.append(seq) or infer(frame, seq)
    try:
        with sim.ReacherTask(render=False) as task:
            a = run_episode(task, in_process, SEEDS[0], sim.INSTRUCTIONS[0], period_ns=PERIOD, chunk_length=CHUNK)
            b = run_episode(task, in_process, SEEDS[0], sim.INSTRUCTIONS[0], period_ns=PERIOD, chunk_length=CHUNK)
    finally:
        in_process.infer = infer
    assert a.commands == b.commands and a.trajectory == b.trajectory
    assert compare(a, b)["first_divergence"] is None
    base = seq_base(SEEDS[0], sim.EPISODE_STEPS)
    assert seqs[: len(seqs) // 2] == [base + t for t in range(0, sim.EPISODE_STEPS, 4)]
    assert a.requests == 13 and a.answered_in_time == 13 and not a.late and a.held == 0


def test_through_the_daemon_an_episode_differs_from_in_process_only_where_serving_changed_it(tmp_path, in_process):
    """The demo release served by ``vlad serve``: every request is answered in its tick, the
    first observation of each episode is announced (no refused reset), and an episode with no
    guard intervention and no late answer is the in-process one, tick for tick."""
    plan = [(seed, instruction) for seed in SEEDS for instruction in sim.INSTRUCTIONS]
    with sim.ReacherTask(render=False) as task:
        refs = [
            run_episode(task, in_process, seed, instruction, period_ns=PERIOD, chunk_length=CHUNK)
            for seed, instruction in plan
        ]
    daemon = start_daemon(tmp_path)
    try:
        client = daemon.client("episodes")
        link = DaemonLink(client)
        with sim.ReacherTask(render=False) as task:  # back to back: a controller that pauses gets holds
            run_episode(
                task, link, 1, sim.INSTRUCTIONS[0], period_ns=PERIOD, chunk_length=CHUNK
            )  # warm caches, not compared
            got = [
                run_episode(task, link, seed, instruction, period_ns=PERIOD, chunk_length=CHUNK)
                for seed, instruction in plan
            ]
        pairs = [(r, g, compare(r, g)) for r, g in zip(refs, got, strict=True)]
        status = client.status()
        events = [(e["kind"], e["reason"]) for e in client.control("events", limit=20)]
        client.close()
    finally:
        daemon.stop()
    assert status["counters"]["rejected"].get("implausible_proprio", 0) == 0  # resets were announced
    assert status["counters"]["reanchors_announced"] >= len(pairs) - 1
    for ref, got, cmp in pairs:
        assert got.requests >= ref.requests, (cmp, got.holds_received, events)
        # Holds only where an answer was late: advisory ones, while nothing valid was left.
        assert set(got.holds_adopted) <= {"hold:bridge", "hold:stale"}, (cmp, got.holds_adopted, events)
        assert not got.holds_adopted or got.late, (cmp, got.holds_adopted)
        if cmp["first_divergence"] is None:
            continue
        # Whatever differs is explained, and it is what vlad is there to do or a late answer.
        assert cmp["why"] is not None and (cmp["why"].startswith("guard") or cmp["why"] == "late answer"), cmp
    # On a quiet enough machine most answers are in time (a loaded CI runner may be late now and then).
    answered = sum(g.answered_in_time for _, g, _ in pairs) / sum(g.requests for _, g, _ in pairs)
    assert answered > 0.8, answered
    identical = [cmp for _, g, cmp in pairs if not g.interventions and not g.late]
    for cmp in identical:
        assert cmp["first_divergence"] is None, cmp
    # The latencies the runner saw are real ones, one per answer.
    lat = np.concatenate([np.asarray(g.latencies_ms) for _, g, _ in pairs])
    assert (lat > 0).all() and len(lat) >= sum(g.answered_in_time for _, g, _ in pairs)
