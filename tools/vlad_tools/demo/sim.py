"""Simulated robot + scripted expert for the demo VLA policy (behaviour cloning).

The robot is Gymnasium's ``Reacher-v5``: a 2-joint planar arm, one ``env.step`` is one
20 ms control period (frame_skip 2 x 0.01 s) and an episode is 50 control periods.

* A language instruction selects the goal: ``"reach the red target"`` -> the red target's
  xy, ``"reach the point opposite the red target"`` -> the target mirrored through the arm
  base. The camera image shows only the red target, so a policy needs vision *and* language.
* Actions are absolute joint POSITION targets (rad) for ``[joint0, joint1]``; the robot side
  turns them into torques with a joint PD controller run once per control period
  (the policy never commands torques).
* Policies return *chunks* of future waypoints (``float32[H, 2]``); the episode runner
  (:mod:`vlad_tools.episodes`) executes the first few and asks again (receding horizon).
  :class:`ReacherTask` is the runner's :class:`~vlad_tools.episodes.Task`.

Run ``python -m vlad_tools.demo.sim --episodes 50`` to evaluate the scripted expert and the
no-motion baseline.
"""

from __future__ import annotations

import os

# Headless offscreen rendering: must be decided before mujoco / gymnasium are imported,
# because mujoco binds its GL backend at import time.
os.environ.setdefault("MUJOCO_GL", "egl")

import argparse
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import gymnasium as gym
import mujoco
import numpy as np

from vlad_tools.episodes import Frame, InProcessLink

if TYPE_CHECKING:
    from gymnasium.envs.mujoco.mujoco_env import MujocoEnv

    from vlad.contract import Contract

__all__ = [
    "CONTROL_DT",
    "EPISODE_STEPS",
    "INSTRUCTIONS",
    "JOINT1_LIMIT",
    "KD",
    "KP",
    "RATE_LIMIT",
    "SUCCESS_RADIUS",
    "Observation",
    "ReacherTask",
    "Sample",
    "collect_demonstrations",
    "expert_chunk",
    "expert_link",
    "forward_kinematics",
    "goal_for",
    "inverse_kinematics",
]

INSTRUCTIONS: tuple[str, str] = ("reach the red target", "reach the point opposite the red target")
EPISODE_STEPS = 50  # Reacher-v5 episode length in control periods
CONTROL_DT = 0.02  # seconds per control period (frame_skip 2 x 0.01 s)
SUCCESS_RADIUS = 0.02  # metres, fingertip-to-goal at the final step
RATE_LIMIT = 0.25  # rad per control period per joint, for waypoint chunks
JOINT1_LIMIT = 3.0  # rad, MuJoCo range of joint1 in reacher.xml
CHUNK_HORIZON = 50

# Joint PD gains (ctrl units; the actuators have gear 200, so torque = 200 * ctrl).
# Each joint is dominated by its armature (inertia ~1 kg m^2) with damping 1, so the
# closed loop is ~ I qdd = 200*kp*e - (200*kd + 1)*qd, with the torque held constant over
# the 20 ms period. Swept kp in 2..30, kd in 0.2..1.0: kp=8 / kd=0.3 gives the fastest
# clean step response (small steps: 97% after 3 periods, ~1% overshoot, within 2% after 4
# periods); larger kp overshoots 15-20% or rings, larger kd turns sluggish.
KP = 8.0
KD = 0.3

# Rendering: a fixed top-down camera centred on the arm base. fovy is 45 deg, so at
# distance 0.56 the half-width of the view is 0.56*tan(22.5 deg) ~ 0.23 m, just enough for
# the 0.21 m reach disk and the (enlarged) target anywhere within 0.2 m of the base.
# Image orientation: base at the centre, +x to the right, +y up, ~138 px/m at 64x64.
CAMERA_CONFIG = {
    "distance": 0.56,
    "elevation": -90.0,
    "azimuth": 90.0,
    "lookat": np.array([0.0, 0.0, 0.0]),
    "trackbodyid": -1,
}
# The target sphere is 9 mm in the XML: under a pixel at 64x64. It has contype=0 and
# conaffinity=0 (no collisions) and changing geom_size at runtime does not touch the body
# mass, so enlarging it is a rendering-only change.
TARGET_RENDER_RADIUS = 0.02


@dataclass(frozen=True)
class Observation:
    """What the policy sees at one control step.

    ``image`` is uint8 HxWx3 RGB, or ``None`` when the step was not rendered (rendering
    costs ~5 ms, so loops that don't need pixels skip it). ``proprio`` is float32[4] =
    [q0, q1, qd0, qd1]; q0 is unwrapped (as MuJoCo reports it), q1 is limited to +-3 rad.
    """

    image: np.ndarray | None
    proprio: np.ndarray
    instruction: str


@dataclass(frozen=True)
class Sample:
    """One behaviour-cloning training sample: observation + expert action chunk."""

    image: np.ndarray  # uint8 HxWx3
    proprio: np.ndarray  # float32[4]
    instruction: str
    chunk: np.ndarray  # float32[H, 2] absolute joint position waypoints q_{t+1}..q_{t+H}
    episode: int  # seed of the episode the sample came from
    t: int  # control step within the episode


def _wrap(a: np.ndarray | float) -> np.ndarray | float:
    """Wrap angles to [-pi, pi)."""
    return (np.asarray(a) + np.pi) % (2.0 * np.pi) - np.pi


def goal_for(target_xy: np.ndarray, instruction: str) -> np.ndarray:
    """Goal xy implied by an instruction: the target itself, or its mirror through the base."""
    if instruction == INSTRUCTIONS[0]:
        return np.asarray(target_xy, dtype=np.float64).copy()
    if instruction == INSTRUCTIONS[1]:
        return -np.asarray(target_xy, dtype=np.float64)
    raise ValueError(f"unknown instruction {instruction!r}; expected one of {INSTRUCTIONS}")


# Link lengths of reacher.xml (base->joint1, joint1->fingertip); ReacherTask re-reads them
# from the model and asserts they match, so these constants can't silently drift.
L0 = 0.1
L1 = 0.11


def forward_kinematics(q: np.ndarray, l0: float = L0, l1: float = L1) -> np.ndarray:
    """Fingertip xy (m, in the arm base frame) for joint angles ``q = [q0, q1]``."""
    q0, q1 = float(q[0]), float(q[1])
    return np.array([l0 * np.cos(q0) + l1 * np.cos(q0 + q1), l0 * np.sin(q0) + l1 * np.sin(q0 + q1)])


def inverse_kinematics(goal: np.ndarray, q_current: np.ndarray, l0: float = L0, l1: float = L1) -> np.ndarray:
    """Joint configuration that puts the fingertip on ``goal``, closest to ``q_current``.

    Of the two elbow branches, picks the one with the smaller joint-space move; joint0 is
    unwrapped to the equivalent angle nearest the current (unwrapped) q0, so the arm never
    spins the long way round. Goals outside the reachable annulus (joint1 is limited to
    +-3 rad, so the minimum reach is ~0.018 m; the maximum is l0+l1) are projected onto it
    along the same bearing, which is the closest reachable point.
    """
    goal = np.asarray(goal, dtype=np.float64)
    qc = np.asarray(q_current, dtype=np.float64)
    r = float(np.hypot(goal[0], goal[1]))
    cos_lim = np.cos(JOINT1_LIMIT)
    c1 = (r * r - l0 * l0 - l1 * l1) / (2.0 * l0 * l1)
    c1 = float(np.clip(c1, cos_lim, 1.0))
    # Bearing of the goal; for a goal at the base any bearing is equally good, keep q0's.
    bearing = float(np.arctan2(goal[1], goal[0])) if r > 1e-9 else float(qc[0])
    best, best_cost = None, np.inf
    for sign in (1.0, -1.0):
        q1 = sign * float(np.arccos(c1))
        q0 = bearing - np.arctan2(l1 * np.sin(q1), l0 + l1 * np.cos(q1))
        q0 = qc[0] + float(_wrap(q0 - qc[0]))  # nearest equivalent to the current q0
        cand = np.array([q0, q1])
        cost = float(np.abs(cand - qc).sum())
        if cost < best_cost:
            best, best_cost = cand, cost
    assert best is not None
    return best


def expert_chunk(
    q: np.ndarray,
    goal: np.ndarray,
    horizon: int = CHUNK_HORIZON,
    rate_limit: float = RATE_LIMIT,
    decel: float = 0.06,
) -> np.ndarray:
    """Scripted expert: the next ``horizon`` joint position waypoints toward ``goal``.

    ``q`` is the current joint position [q0, q1] (extra entries such as velocities are
    ignored, so ``proprio`` can be passed directly). The goal configuration comes from
    :func:`inverse_kinematics`; the waypoints follow a straight line in joint space (both
    joints arrive together) whose per-step move is ``min(rate_limit, sqrt(2*decel*remaining))``
    in the infinity norm, i.e. a rate-limited cruise that decelerates near the goal so the
    PD-tracked arm doesn't overshoot. Every waypoint is within ``rate_limit`` of the
    previous one per joint (the first one relative to ``q``), and once reached the chunk
    holds the IK solution. Returns float32[horizon, 2] = q_{t+1}..q_{t+horizon}.
    """
    q = np.asarray(q, dtype=np.float64)[:2]
    q_goal = inverse_kinematics(goal, q)
    out = np.empty((horizon, 2), dtype=np.float64)
    cur = q.copy()
    for i in range(horizon):
        err = q_goal - cur
        remaining = float(np.abs(err).max())
        step = min(rate_limit, float(np.sqrt(2.0 * decel * remaining)))
        if remaining <= step:
            cur = q_goal.copy()
        else:
            cur = cur + err * (step / remaining)
        out[i] = cur
    return out.astype(np.float32)


def expert_link(task: ReacherTask, contract: Contract) -> InProcessLink:
    """The scripted expert toward the task's true goal (privileged: it knows the goal), as a
    link of the episode runner."""

    def infer(frame: Frame, seq: int) -> np.ndarray:
        return expert_chunk(frame.proprio[:2], task.goal, contract.action.chunk_length)

    return InProcessLink.for_contract(contract, infer)


class ReacherTask:
    """The simulated robot: Reacher-v5 + joint PD controller + instruction-defined goal.

    ``reset(seed, instruction)`` is deterministic in ``seed`` (arm start pose and target
    come from the env's seeded RNG). ``step(q_target)`` runs one 20 ms control period.
    With ``render=False`` observations carry ``image=None`` unless a step explicitly asks
    for a frame; :meth:`render` always works.
    """

    def __init__(self, render: bool = True, size: int = 64, kp: float = KP, kd: float = KD):
        self._render_default = render
        self.kp, self.kd = float(kp), float(kd)
        self._env = gym.make(
            "Reacher-v5",
            render_mode="rgb_array",
            width=size,
            height=size,
            default_camera_config=CAMERA_CONFIG,
        )
        self._u = cast("MujocoEnv", self._env.unwrapped)
        model = self._u.model
        gid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, "target")
        model.geom_size[gid, 0] = TARGET_RENDER_RADIUS
        # Link lengths from the model (body offsets), checked against the module constants
        # that the free functions (IK/FK) use.
        b1 = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, "body1")
        ft = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, "fingertip")
        self.l0 = float(np.linalg.norm(model.body_pos[b1]))
        self.l1 = float(np.linalg.norm(model.body_pos[ft]))
        assert np.isclose(self.l0, L0) and np.isclose(self.l1, L1), (self.l0, self.l1)
        self._instruction = INSTRUCTIONS[0]
        self._goal = np.zeros(2)
        self.initial_q = np.zeros(2)
        self.t = 0
        self._was_reset = False

    # -- state -------------------------------------------------------------------------

    def state(self) -> tuple[np.ndarray, np.ndarray]:
        """Current arm joint positions and velocities ``(q[2], qd[2])`` (copies)."""
        d = self._u.data
        return d.qpos[:2].copy(), d.qvel[:2].copy()

    @property
    def instruction(self) -> str:
        """Instruction of the current episode."""
        return self._instruction

    @property
    def target(self) -> np.ndarray:
        """xy of the red target (what the camera shows)."""
        return self._u.data.qpos[2:4].copy()

    @property
    def goal(self) -> np.ndarray:
        """xy the instruction asks the fingertip to reach."""
        return self._goal.copy()

    @property
    def fingertip(self) -> np.ndarray:
        """Fingertip xy, from forward kinematics of the current joint angles.

        (Computed from qpos rather than data.xpos, which MuJoCo leaves one substep stale
        after mj_step.)
        """
        return forward_kinematics(self._u.data.qpos[:2], self.l0, self.l1)

    def distance(self) -> float:
        """Fingertip-to-goal distance in metres."""
        return float(np.linalg.norm(self.fingertip - self._goal))

    def success(self) -> bool:
        """Whether the fingertip is within SUCCESS_RADIUS of the goal right now."""
        return self.distance() < SUCCESS_RADIUS

    # -- control -----------------------------------------------------------------------

    def _obs(self, render: bool | None) -> Observation:
        q, qd = self.state()
        do_render = self._render_default if render is None else render
        return Observation(
            image=self.render() if do_render else None,
            proprio=np.concatenate([q, qd]).astype(np.float32),
            instruction=self._instruction,
        )

    def reset(self, seed: int, instruction: str = INSTRUCTIONS[0], render: bool | None = None) -> Observation:
        """Start an episode: seed the env (arm pose + target) and set the goal."""
        goal_for(np.zeros(2), instruction)  # validate before touching the env
        self._env.reset(seed=int(seed))
        self._instruction = instruction
        self._goal = goal_for(self.target, instruction)
        self.initial_q = self._u.data.qpos[:2].copy()
        self.t = 0
        self._was_reset = True
        return self._obs(render)

    def step(self, q_target: np.ndarray, render: bool | None = None) -> Observation:
        """Run one control period tracking the joint position target ``q_target[2]``.

        The PD torque is computed once and held for the period (the robot-side loop runs
        at the control rate). ``render`` overrides the constructor's default for this step.
        """
        if not self._was_reset:
            raise RuntimeError("call reset() before step()")
        q_target = np.asarray(q_target, dtype=np.float64).reshape(2)
        # Don't ask joint1 for more than its hard limit: the error would never close and
        # the PD would just push against the limit.
        q_target = np.array([q_target[0], np.clip(q_target[1], -JOINT1_LIMIT, JOINT1_LIMIT)])
        q, qd = self.state()
        torque = np.clip(self.kp * (q_target - q) - self.kd * qd, -1.0, 1.0)
        # Step the unwrapped env: the TimeLimit wrapper would otherwise flag truncation at
        # step 50 and the passive checker re-validates every action; neither is needed here.
        self._u.step(torque.astype(np.float32))
        self.t += 1
        return self._obs(render)

    # -- the episode runner's Task (vlad_tools.episodes) ---------------------------------------

    steps = EPISODE_STEPS
    camera = "overhead"  # the demo contract's camera

    def observe(self, render: bool) -> Frame:
        """What the controller sends now: the camera frame (when ``render``), joint state and instruction."""
        q, qd = self.state()
        images = {self.camera: self.render()} if render else {}
        return Frame(images, np.concatenate([q, qd]).astype(np.float32), self._instruction)

    def hold(self) -> np.ndarray:
        """The command that holds the arm where it is: its measured joint positions."""
        return self._u.data.qpos[:2].copy()

    def outcome(self) -> tuple[bool, float]:
        """(success, final fingertip-to-goal distance in metres)."""
        d = self.distance()
        return d < SUCCESS_RADIUS, d

    def render(self) -> np.ndarray:
        """Current camera frame, uint8 HxWx3 RGB."""
        return np.ascontiguousarray(self._env.render())

    def close(self) -> None:
        """Release the env and its GL context."""
        self._env.close()

    def __enter__(self) -> ReacherTask:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- demonstrations --------------------------------------------------------------------


def collect_demonstrations(
    n_episodes: int,
    seed0: int = 0,
    every: int = 1,
    horizon: int = CHUNK_HORIZON,
    exec_steps: int = 4,
    action_noise: float = 0.0,
    instructions: tuple[str, ...] = INSTRUCTIONS,
    size: int = 64,
) -> Iterator[Sample]:
    """Yield behaviour-cloning samples from expert rollouts.

    Episode ``i`` uses seed ``seed0 + i`` and instruction ``instructions[i % len]`` (so both
    instructions see the same distribution of targets). The expert drives the arm with the
    same receding-horizon execution as :func:`run_episode`; every ``every``-th control step
    (t = 0, every, 2*every, ...) yields the rendered frame, proprio, instruction and the
    expert's chunk from that exact state. Only sampled steps are rendered.

    ``action_noise`` (rad, std) perturbs the *executed* waypoints, not the labels, to
    visit off-expert states the cloned policy must recover from (DART-style).
    """
    rng = np.random.default_rng(seed0 + 7_654_321)
    task = ReacherTask(render=False, size=size)
    try:
        for i in range(n_episodes):
            seed = seed0 + i
            instruction = instructions[i % len(instructions)]
            task.reset(seed, instruction)
            goal = task.goal
            chunk = None
            k = 0
            for t in range(EPISODE_STEPS):
                q, qd = task.state()
                if chunk is None or k >= exec_steps:
                    chunk, k = expert_chunk(q, goal, horizon).astype(np.float64), 0
                if t % every == 0:
                    label = expert_chunk(q, goal, horizon)
                    yield Sample(
                        image=task.render(),
                        proprio=np.concatenate([q, qd]).astype(np.float32),
                        instruction=instruction,
                        chunk=label,
                        episode=seed,
                        t=t,
                    )
                a = chunk[k]
                if action_noise > 0.0:
                    a = a + rng.normal(0.0, action_noise, size=2)
                task.step(a, render=False)
                k += 1
    finally:
        task.close()


# -- CLI --------------------------------------------------------------------------------


def _timing(n: int = 200) -> tuple[float, float]:
    """Mean ms per control step without and with rendering."""
    out = []
    for render in (False, True):
        task = ReacherTask(render=render)
        task.reset(0, INSTRUCTIONS[0])
        q = task.initial_q + 0.3
        task.step(q)  # warm up (GL context creation on first render)
        t0 = time.perf_counter()
        for _ in range(n):
            task.step(q)
        out.append((time.perf_counter() - t0) / n * 1e3)
        task.close()
    return out[0], out[1]


def _write_png(path: str, img: np.ndarray) -> None:
    """Minimal dependency-free RGB PNG writer (for eyeballing frames)."""
    import struct
    import zlib

    h, w, _ = img.shape
    raw = b"".join(b"\x00" + img[y].tobytes() for y in range(h))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
    with open(path, "wb") as f:
        f.write(png)


def main(argv: list[str] | None = None) -> int:
    """CLI: evaluate the expert and the no-motion baseline on the episode runner; optionally dump a frame."""
    ap = argparse.ArgumentParser(prog="python -m vlad_tools.demo.sim", description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=50, help="episodes per policy and instruction")
    ap.add_argument("--seed0", type=int, default=0)
    ap.add_argument("--exec-steps", type=int, default=4, help="waypoints executed per chunk")
    ap.add_argument("--png", metavar="PATH", help="write the first frame of seed0 to PATH and exit")
    ap.add_argument("--no-timing", action="store_true", help="skip the per-step timing")
    args = ap.parse_args(argv)

    if args.png:
        with ReacherTask(render=True) as task:
            obs = task.reset(args.seed0, INSTRUCTIONS[0])
            assert obs.image is not None  # the task renders (render=True)
            _write_png(args.png, obs.image)
        print(f"wrote {args.png}")
        return 0

    from vlad.contract import load_contract
    from vlad_tools.episodes import NoMotionLink
    from vlad_tools.evaluation import EpisodeSet, success_line, summarize

    contract = load_contract(Path(__file__).resolve().parents[3] / "manifests" / "demo" / "contract.toml")
    t0 = time.perf_counter()
    print(f"evaluating {args.episodes} episodes per policy x instruction", flush=True)
    episodes = EpisodeSet.grid(range(args.seed0, args.seed0 + args.episodes), INSTRUCTIONS, args.exec_steps)
    with ReacherTask(render=False) as task:
        for name, link in (("expert", expert_link(task, contract)), ("zero", NoMotionLink(contract))):
            logs = episodes.run(task, link, period_ns=link.period_ns, chunk_length=contract.action.chunk_length)
            for instruction, row in summarize(logs, INSTRUCTIONS)["per_instruction"].items():
                print(success_line(name, instruction, row), flush=True)
    print(f"\nevaluation took {time.perf_counter() - t0:.1f}s")
    if not args.no_timing:
        no_r, with_r = _timing()
        print(f"timing: {no_r:.3f} ms/step without rendering, {with_r:.3f} ms/step with 64x64 rendering")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
