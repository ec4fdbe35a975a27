"""Closed-loop smoke run: the committed demo policy drives the simulated arm.

The episodes are seeded and the flow-matching noise is derived from the observation
sequence, so the outcome is deterministic for the committed artifacts.
"""

from __future__ import annotations

import onnxruntime as ort
import pytest

from vlad.demo import sim
from vlad.demo.evaluate import contract_policy, evaluate, fixed_seeds

EPISODES = 6


@pytest.fixture(scope="module")
def onnx_infer(demo_dir):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(demo_dir / "policy.onnx"), opts, providers=["CPUExecutionProvider"])
    return lambda inputs: {"actions": sess.run(["actions"], dict(inputs))[0]}


@pytest.mark.parametrize("instruction", sim.INSTRUCTIONS)
def test_policy_beats_no_motion(contract, tokenizer, onnx_infer, instruction):
    with sim.ReacherTask(render=True) as task:
        policy = evaluate(task, lambda: contract_policy(contract, tokenizer, onnx_infer), "policy", instruction,
                          fixed_seeds(EPISODES))
        zero = evaluate(task, lambda: sim.zero_policy(task), "zero", instruction, fixed_seeds(EPISODES))
    print(policy.line())
    print(zero.line())
    assert policy.successes >= EPISODES // 2, policy.line()
    assert policy.successes > zero.successes
    assert policy.mean_final_distance < zero.mean_final_distance / 2


def test_language_changes_the_goal(contract, tokenizer, onnx_infer):
    """Same scene, other instruction: the policy must end near the other goal."""
    seed = fixed_seeds(1)[0]
    with sim.ReacherTask(render=True) as task:
        ends = {}
        for instruction in sim.INSTRUCTIONS:
            sim.run_episode(task, contract_policy(contract, tokenizer, onnx_infer), seed, instruction)
            ends[instruction] = (task.fingertip.copy(), task.goal.copy())
    (tip_a, goal_a), (tip_b, goal_b) = ends.values()
    assert abs(goal_a + goal_b).max() < 1e-9  # mirrored goals
    assert ((tip_a - goal_a) ** 2).sum() < ((tip_a - goal_b) ** 2).sum()
    assert ((tip_b - goal_b) ** 2).sum() < ((tip_b - goal_a) ** 2).sum()
