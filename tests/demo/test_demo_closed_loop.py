"""Closed-loop smoke run: the committed demo policy drives the simulated arm in process.

The episodes are seeded and the flow-matching noise is derived from the observation
sequence (:mod:`vlad_tools.episodes` numbers them per seed), so the outcome is deterministic for
the committed artifacts.
"""

from __future__ import annotations

import numpy as np
import pytest

from vlad.plugins import get_backend
from vlad_tools.demo import sim
from vlad_tools.demo.evaluate import evaluate, fixed_seeds, no_motion_link
from vlad_tools.episodes import InProcessLink, contract_infer, run_episode

EPISODES = 6


@pytest.fixture(scope="module")
def policy_link(demo_dir, contract, tokenizer):
    session = get_backend("onnxruntime").load(demo_dir / "policy.onnx", contract, {"intra_op_threads": 1})
    yield InProcessLink.for_contract(contract, contract_infer(contract, tokenizer, session))
    session.close()


@pytest.mark.parametrize("instruction", sim.INSTRUCTIONS)
def test_policy_beats_no_motion(contract, policy_link, instruction):
    with sim.ReacherTask(render=False) as task:
        policy = evaluate(task, policy_link, contract, "policy", instruction, fixed_seeds(EPISODES))
        zero = evaluate(task, no_motion_link(contract), contract, "zero", instruction, fixed_seeds(EPISODES))
    print(policy.line())
    print(zero.line())
    assert policy.successes >= EPISODES // 2, policy.line()
    assert policy.successes > zero.successes
    assert policy.mean_final_distance < zero.mean_final_distance / 2


def test_language_changes_the_goal(contract, policy_link):
    """Same scenes, the other instruction: the policy ends nearer the instructed goal than its
    mirror image (the goal of the other instruction) in nearly every episode."""
    nearer, n = 0, 0
    with sim.ReacherTask(render=False) as task:
        for instruction in sim.INSTRUCTIONS:
            for seed in fixed_seeds(EPISODES):
                run_episode(
                    task,
                    policy_link,
                    seed,
                    instruction,
                    period_ns=20_000_000,
                    chunk_length=contract.action.chunk_length,
                )
                mirrored = -task.goal  # the other instruction's goal for the same target
                nearer += np.linalg.norm(task.fingertip - task.goal) < np.linalg.norm(task.fingertip - mirrored)
                n += 1
    print(f"ended nearer the instructed goal in {nearer}/{n} episodes")
    assert nearer >= n - 2, f"{nearer}/{n}"
