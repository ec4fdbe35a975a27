"""Tests for the demo simulated robot (vlad_tools.demo.sim): task, scripted expert, baselines."""

from __future__ import annotations

import os

# Headless rendering; must be set before mujoco/gymnasium are imported.
os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np
import pytest

pytest.importorskip("gymnasium")
pytest.importorskip("mujoco")

from vlad_tools.demo import sim  # noqa: E402
from vlad_tools.demo.sim import (  # noqa: E402
    INSTRUCTIONS,
    RATE_LIMIT,
    SUCCESS_RADIUS,
    ReacherTask,
    collect_demonstrations,
    expert_chunk,
    expert_link,
    forward_kinematics,
    inverse_kinematics,
)
from vlad_tools.episodes import NoMotionLink, run_episode  # noqa: E402

PERIOD = 20_000_000
CHUNK = sim.CHUNK_HORIZON  # the demo contract's chunk_length


@pytest.fixture(scope="module")
def task():
    t = ReacherTask(render=True)
    yield t
    t.close()


def _strongly_red(img: np.ndarray) -> np.ndarray:
    im = img.astype(np.int32)
    r, g, b = im[..., 0], im[..., 1], im[..., 2]
    return (r > 80) & (r - g > 50) & (r - b > 50)


def test_reset_is_deterministic_by_seed(task):
    a = task.reset(7, INSTRUCTIONS[0])
    goal_a, q_a = task.goal, task.state()[0]
    b = task.reset(7, INSTRUCTIONS[0])
    np.testing.assert_array_equal(a.proprio, b.proprio)
    np.testing.assert_array_equal(a.image, b.image)
    np.testing.assert_array_equal(goal_a, task.goal)
    np.testing.assert_array_equal(q_a, task.state()[0])
    task.reset(8, INSTRUCTIONS[0])
    assert not np.allclose(goal_a, task.goal)


def test_goal_per_instruction_is_target_or_its_mirror(task):
    task.reset(3, INSTRUCTIONS[0])
    target = task.target
    np.testing.assert_allclose(task.goal, target)
    obs = task.reset(3, INSTRUCTIONS[1])
    np.testing.assert_allclose(task.target, target)  # same scene, only the goal changes
    np.testing.assert_allclose(task.goal, -target)
    assert obs.instruction == INSTRUCTIONS[1]
    with pytest.raises(ValueError):
        task.reset(3, "dance")


def test_observation_shapes_and_dtypes(task):
    obs = task.reset(0, INSTRUCTIONS[0])
    assert obs.image.shape == (64, 64, 3) and obs.image.dtype == np.uint8
    assert obs.proprio.shape == (4,) and obs.proprio.dtype == np.float32
    obs = task.step(task.initial_q)
    assert obs.image.shape == (64, 64, 3)
    assert task.step(task.initial_q, render=False).image is None


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_red_target_is_visible_where_expected(task, seed):
    obs = task.reset(seed, INSTRUCTIONS[0])
    red = _strongly_red(obs.image)
    assert red.sum() >= 3
    # Top-down camera centred on the base: +x to the right, +y up, ~0.23 m half-width.
    ys, xs = np.nonzero(red)
    tx, ty = task.target
    assert abs(xs.mean() - (31.5 + tx / 0.232 * 32)) < 3
    assert abs(ys.mean() - (31.5 - ty / 0.232 * 32)) < 3


def test_fingertip_matches_mujoco_body_position(task):
    import mujoco

    task.reset(5, INSTRUCTIONS[0])
    for _ in range(5):
        task.step(task.initial_q + np.array([0.4, -0.6]), render=False)
    u = task._env.unwrapped
    mujoco.mj_forward(u.model, u.data)
    np.testing.assert_allclose(task.fingertip, u.data.body("fingertip").xpos[:2], atol=1e-9)


def test_ik_reaches_goal_and_respects_joint_limit():
    rng = np.random.default_rng(0)
    for _ in range(200):
        # Same goal distribution as Reacher-v5 (and its mirror): the disk of radius 0.2.
        goal = rng.uniform(-0.2, 0.2, size=2)
        if np.linalg.norm(goal) >= 0.2:
            continue
        q_cur = rng.uniform(-4, 4, size=2)
        q = inverse_kinematics(goal, q_cur)
        assert abs(q[1]) <= sim.JOINT1_LIMIT + 1e-9
        assert abs(q[0] - q_cur[0]) <= np.pi + 1e-9  # nearest equivalent of joint0
        if np.linalg.norm(goal) > 0.02:
            np.testing.assert_allclose(forward_kinematics(q), goal, atol=1e-9)
        else:  # inside the unreachable core: still within the success radius
            assert np.linalg.norm(forward_kinematics(q) - goal) < SUCCESS_RADIUS
    # Beyond the reach (0.21 m) or inside the core: the closest point on the same bearing.
    np.testing.assert_allclose(forward_kinematics(inverse_kinematics([0.0, 0.3], [0, 0])), [0, 0.21], atol=1e-9)
    tip = forward_kinematics(inverse_kinematics([0.005, 0.0], [0, 0]))
    assert 0.017 < np.linalg.norm(tip) < 0.019 and tip[0] > 0.017


def test_expert_chunk_respects_rate_limit_and_ends_at_ik():
    rng = np.random.default_rng(1)
    for _ in range(100):
        q = rng.uniform(-3, 3, size=2)
        goal = rng.uniform(-0.2, 0.2, size=2)
        chunk = expert_chunk(q, goal, horizon=8)
        assert chunk.shape == (8, 2) and chunk.dtype == np.float32
        steps = np.diff(np.vstack([q, chunk.astype(np.float64)]), axis=0)
        assert np.all(np.abs(steps) <= RATE_LIMIT + 1e-6)
        # Rolling the plan forward long enough lands exactly on the IK solution.
        long = expert_chunk(q, goal, horizon=60)
        np.testing.assert_allclose(long[-1], inverse_kinematics(goal, q), atol=1e-6)
        np.testing.assert_allclose(chunk, long[:8], atol=1e-6)
    # Already at the goal: the chunk holds still.
    q = np.array([0.3, -0.7])
    held = expert_chunk(q, forward_kinematics(q))
    np.testing.assert_allclose(held, np.tile(q, (len(held), 1)), atol=1e-6)


def test_expert_succeeds_and_zero_baseline_does_not(contract):
    task = ReacherTask(render=False)
    try:
        expert, zero = expert_link(task, contract), NoMotionLink(contract)
        for instruction in INSTRUCTIONS:
            ok = [
                run_episode(task, expert, s, instruction, period_ns=PERIOD, chunk_length=CHUNK).success
                for s in range(5)
            ]
            assert sum(ok) >= 4, (instruction, ok)
            z = [run_episode(task, zero, s, instruction, period_ns=PERIOD, chunk_length=CHUNK) for s in range(5)]
            assert sum(r.success for r in z) <= 1, (instruction, z)
            assert all(len(r.commands) == sim.EPISODE_STEPS for r in z)
            # The zero baseline really holds the start pose.
            np.testing.assert_allclose(task.state()[0], z[-1].trajectory[0], atol=1e-3)
    finally:
        task.close()


def test_the_runner_renders_only_the_observations_it_sends(contract):
    task = ReacherTask(render=False)
    rendered = []
    observe = task.observe

    def counting(render: bool):
        rendered.append(render)
        return observe(render)

    task.observe = counting  # type: ignore[method-assign]
    try:
        log = run_episode(
            task, expert_link(task, contract), 0, INSTRUCTIONS[0], period_ns=PERIOD, chunk_length=CHUNK, exec_steps=4
        )
    finally:
        task.close()
    assert len(log.commands) == 50
    assert len(rendered) == 13 and all(rendered) and log.requests == 13  # ceil(50 / 4) requests, each with a frame


def test_collect_demonstrations_samples():
    samples = list(collect_demonstrations(2, seed0=0, every=10))
    assert len(samples) == 10  # 2 episodes x t in {0, 10, 20, 30, 40}
    assert {s.instruction for s in samples} == set(INSTRUCTIONS)
    for s in samples:
        assert s.image.shape == (64, 64, 3) and s.image.dtype == np.uint8
        assert s.proprio.shape == (4,) and s.proprio.dtype == np.float32
        assert s.chunk.shape == (sim.CHUNK_HORIZON, 2) and s.chunk.dtype == np.float32
        steps = np.diff(np.vstack([s.proprio[:2], s.chunk]), axis=0)
        assert np.all(np.abs(steps) <= RATE_LIMIT + 1e-5)
    assert [s.t for s in samples[:5]] == [0, 10, 20, 30, 40]
