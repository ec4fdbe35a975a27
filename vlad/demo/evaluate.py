"""Closed-loop evaluation of a contract-driven policy in the simulated Reacher.

The policy adapter goes through exactly the serving path's processing functions
(:func:`vlad.processing.preprocess` and :func:`vlad.processing.decode_actions`), with any
``infer(inputs) -> outputs`` callable as the engine: a PyTorch module, an ONNX Runtime
session or a backend plugin.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from vlad.contract import Contract
from vlad.processing import RawObservation, Tokenizer, decode_actions, preprocess

Infer = Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]


def contract_policy(contract: Contract, tokenizer: Tokenizer, infer: Infer):
    """A simulator policy ``obs -> action chunk`` that runs ``infer`` through the contract."""
    camera = contract.cameras[0].name
    sequence = itertools.count()

    def policy(obs) -> np.ndarray:
        raw = RawObservation(
            images={camera: obs.image}, proprio=obs.proprio, instruction=obs.instruction, sequence=next(sequence)
        )
        return decode_actions(contract, infer(preprocess(contract, tokenizer, raw)))

    return policy


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
    task,
    make_policy: Callable[[], Callable],
    name: str,
    instruction: str,
    seeds,
    exec_steps: int = 4,
    progress: Callable[[str], None] | None = None,
) -> SuccessRate:
    """Run one seeded episode per seed; a fresh policy per episode (new noise sequence)."""
    from vlad.demo.sim import run_episode

    successes, dists = 0, []
    seeds = list(seeds)
    for i, seed in enumerate(seeds):
        result = run_episode(task, make_policy(), seed, instruction, exec_steps=exec_steps)
        successes += bool(result.success)
        dists.append(result.final_distance)
        if progress and (i + 1) % 10 == 0:
            progress(f"  {name}: {instruction!r} {i + 1}/{len(seeds)} episodes, {successes} successes")
    return SuccessRate(name, instruction, len(seeds), successes, float(np.mean(dists)))


def fixed_seeds(n: int, base: int = 10_000) -> range:
    """Evaluation seeds, disjoint from the training seeds (which start at 0)."""
    return range(base, base + n)


__all__ = ["contract_policy", "evaluate", "fixed_seeds", "SuccessRate", "itertools"]
