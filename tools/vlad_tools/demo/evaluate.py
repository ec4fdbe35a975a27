"""In-process closed-loop evaluation in the simulated Reacher, on the one episode runner.

A trained release (its serving session through :func:`vlad_tools.episodes.contract_infer`), the
scripted expert and the no-motion baseline run as :class:`~vlad_tools.episodes.InProcessLink`\\ s,
with the same chunk execution rule, seeds and noise as the demo and the closed-loop gate
use through the daemon (:mod:`vlad_tools.episodes`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from vlad.contract import Contract
from vlad_tools.demo import sim
from vlad_tools.episodes import Frame, InProcessLink, Link, NoMotionLink, run_episode


def expert_link(task: sim.ReacherTask, contract: Contract) -> InProcessLink:
    """The scripted expert toward the task's true goal (privileged: it knows the goal)."""

    def infer(frame: Frame, seq: int) -> np.ndarray:
        return sim.expert_chunk(frame.proprio[:2], task.goal, contract.action.chunk_length)

    return InProcessLink.for_contract(contract, infer)


def no_motion_link(contract: Contract) -> NoMotionLink:
    """Hold the pose the episode started in."""
    t, a = contract.timing, contract.action
    return NoMotionLink(
        int(t.control_period_ms * 1e6),
        int(t.action_validity_ms * 1e6),
        chunk_length=a.chunk_length,
        action_dim=a.dim,
    )


@dataclass(frozen=True)
class SuccessRate:
    name: str
    instruction: str
    episodes: int
    successes: int
    mean_final_distance: float

    @property
    def rate(self) -> float:
        return self.successes / self.episodes if self.episodes else 0.0

    def line(self) -> str:
        return (
            f"{self.name:>8} | {self.instruction:<40} | {self.successes:>3}/{self.episodes:<3} "
            f"({100 * self.rate:5.1f} %) | mean final distance {1000 * self.mean_final_distance:6.1f} mm"
        )


def evaluate(
    task: sim.ReacherTask,
    link: Link,
    contract: Contract,
    name: str,
    instruction: str,
    seeds: Iterable[int],
    exec_steps: int = 4,
    progress: Callable[[str], None] | None = None,
) -> SuccessRate:
    """One seeded episode per seed through ``link``."""
    successes, dists = 0, []
    seeds = list(seeds)
    for i, seed in enumerate(seeds):
        log = run_episode(
            task,
            link,
            seed,
            instruction,
            period_ns=int(contract.timing.control_period_ms * 1e6),
            exec_steps=exec_steps,
            chunk_length=contract.action.chunk_length,
        )
        successes += log.success
        dists.append(log.final_distance)
        if progress and (i + 1) % 10 == 0:
            progress(f"  {name}: {instruction!r} {i + 1}/{len(seeds)} episodes, {successes} successes")
    return SuccessRate(name, instruction, len(seeds), successes, float(np.mean(dists)))


def fixed_seeds(n: int, base: int = 10_000) -> range:
    """Evaluation seeds, disjoint from the training seeds (which start at 0)."""
    return range(base, base + n)


__all__ = ["SuccessRate", "evaluate", "expert_link", "fixed_seeds", "no_motion_link"]
