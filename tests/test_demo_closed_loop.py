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
        policy = evaluate(
            task, lambda: contract_policy(contract, tokenizer, onnx_infer), "policy", instruction, fixed_seeds(EPISODES)
        )
        zero = evaluate(task, lambda: sim.zero_policy(task), "zero", instruction, fixed_seeds(EPISODES))
    print(policy.line())
    print(zero.line())
    assert policy.successes >= EPISODES // 2, policy.line()
    assert policy.successes > zero.successes
    assert policy.mean_final_distance < zero.mean_final_distance / 2


def test_language_changes_the_goal(contract, tokenizer, onnx_infer):
    """Same scenes, the other instruction: the policy ends nearer the instructed goal than its
    mirror image (the goal of the other instruction) in nearly every episode."""
    import numpy as np

    nearer, n = 0, 0
    with sim.ReacherTask(render=True) as task:
        for instruction in sim.INSTRUCTIONS:
            for seed in fixed_seeds(EPISODES):
                sim.run_episode(task, contract_policy(contract, tokenizer, onnx_infer), seed, instruction)
                mirrored = -task.goal  # the other instruction's goal for the same target
                nearer += np.linalg.norm(task.fingertip - task.goal) < np.linalg.norm(task.fingertip - mirrored)
                n += 1
    print(f"ended nearer the instructed goal in {nearer}/{n} episodes")
    assert nearer >= n - 2, f"{nearer}/{n}"
