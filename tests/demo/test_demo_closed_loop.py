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
from vlad_tools.episodes import InProcessLink, NoMotionLink, contract_infer, run_episode
from vlad_tools.evaluation import EpisodeSet, success_line, summarize

EPISODES = 6
SEEDS = range(10_000, 10_000 + EPISODES)  # disjoint from the training seeds (0..)


@pytest.fixture(scope="module")
def policy_link(demo_dir, contract, tokenizer):
    session = get_backend("onnxruntime").load(demo_dir / "policy.onnx", contract, {"intra_op_threads": 1})
    yield InProcessLink.for_contract(contract, contract_infer(contract, tokenizer, session))
    session.close()


@pytest.mark.parametrize("instruction", sim.INSTRUCTIONS)
def test_policy_beats_no_motion(contract, policy_link, instruction):
    episodes = EpisodeSet.grid(SEEDS, (instruction,))
    rows = {}
    with sim.ReacherTask(render=False) as task:
        for name, link in (("policy", policy_link), ("zero", NoMotionLink(contract))):
            logs = episodes.run(task, link, period_ns=link.period_ns, chunk_length=contract.action.chunk_length)
            rows[name] = summarize(logs, (instruction,))["per_instruction"][instruction]
            print(success_line(name, instruction, rows[name]))
    policy, zero = rows["policy"], rows["zero"]
    assert policy["successes"] >= EPISODES // 2, policy
    assert policy["successes"] > zero["successes"]
    assert policy["mean_final_distance_m"] < zero["mean_final_distance_m"] / 2


def test_language_changes_the_goal(contract, policy_link):
    """Same scenes, the other instruction: the policy ends nearer the instructed goal than its
    mirror image (the goal of the other instruction) in nearly every episode."""
    nearer, n = 0, 0
    with sim.ReacherTask(render=False) as task:
        for instruction in sim.INSTRUCTIONS:
            for seed in SEEDS:
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
