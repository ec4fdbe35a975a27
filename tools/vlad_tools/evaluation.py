"""The one evaluation layer: episode sets on the one runner, their summaries, fidelity pairing.

An :class:`EpisodeSet` is the seeds × instructions an evaluation runs, in order, with the
chunk execution rule (``exec_steps``); :meth:`EpisodeSet.run` plays it through a
:class:`~vlad_tools.episodes.Link` on :func:`~vlad_tools.episodes.run_episode`. Its logs give
:func:`summarize` (success per instruction with Wilson intervals, seams, holds, and the
daemon's safety counters over the run) and, the same set run in process and through vlad,
:func:`fidelity` (episode by episode, :func:`compare`: the first tick that differed and why).
The closed-loop gate, the demo (native client, openpi client, in process), the demo
release's evaluation and the LeRobot importer's demo all evaluate through this module.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from vlad.protocol import HOLD_PREFIX
from vlad.snapshot import StatusSnapshot
from vlad_tools.episodes import EpisodeLog, Link, Task, run_episode

__all__ = [
    "EpisodeSet",
    "compare",
    "fidelity",
    "percentiles",
    "success_line",
    "summarize",
    "wilson_interval",
]


@dataclass(frozen=True)
class EpisodeSet:
    """Seeded episodes, ``(seed, instruction)`` in the order they run, and the chunk execution
    rule (``exec_steps``: periods to follow one chunk before the next)."""

    episodes: tuple[tuple[int, str], ...]
    exec_steps: int = 4

    @classmethod
    def grid(cls, seeds: Iterable[int], instructions: Iterable[str], exec_steps: int = 4) -> EpisodeSet:
        """Every seed with every instruction, instruction by instruction (the gate's set)."""
        seeds = tuple(seeds)
        return cls(tuple((s, i) for i in instructions for s in seeds), exec_steps)

    @classmethod
    def alternating(cls, first_seed: int, n: int, instructions: Iterable[str], exec_steps: int = 4) -> EpisodeSet:
        """``n`` episodes on seeds ``first_seed``.., the instructions in turn (the demo's set)."""
        instructions = tuple(instructions)
        return cls(tuple((first_seed + k, instructions[k % len(instructions)]) for k in range(n)), exec_steps)

    @property
    def instructions(self) -> tuple[str, ...]:
        """The set's instructions in the order they first run."""
        return tuple(dict.fromkeys(i for _, i in self.episodes))

    def play(
        self, task: Task, link: Link, *, period_ns: int, chunk_length: int, label: str = "", follow: bool = False
    ) -> Iterator[EpisodeLog]:
        """Each episode's log as it ends (``follow``: a streaming controller executing the
        newest chunk, :func:`~vlad_tools.episodes.run_episode`)."""
        for seed, instruction in self.episodes:
            yield run_episode(
                task,
                link,
                seed,
                instruction,
                period_ns=period_ns,
                exec_steps=self.exec_steps,
                chunk_length=chunk_length,
                label=label,
                follow=follow,
            )

    def run(
        self,
        task: Task,
        link: Link,
        *,
        period_ns: int,
        chunk_length: int,
        label: str = "",
        follow: bool = False,
        progress: Callable[[str], None] | None = None,
    ) -> list[EpisodeLog]:
        """Every episode's log; ``progress`` hears of every tenth episode of an instruction and its last."""
        total = Counter(i for _, i in self.episodes)
        done: Counter[str] = Counter()
        ok: Counter[str] = Counter()
        logs = []
        for log in self.play(task, link, period_ns=period_ns, chunk_length=chunk_length, label=label, follow=follow):
            logs.append(log)
            done[log.instruction] += 1
            ok[log.instruction] += log.success
            k, n = done[log.instruction], total[log.instruction]
            if progress is not None and (k % 10 == 0 or k == n):
                progress(f"{label}: {log.instruction!r} episode {k}/{n}, {ok[log.instruction]} successes")
        return logs


# -- summaries ------------------------------------------------------------------------------


def summarize(
    logs: list[EpisodeLog],
    instructions: tuple[str, ...],
    before: StatusSnapshot | None = None,
    after: StatusSnapshot | None = None,
    rate_limit: float | None = None,
) -> dict[str, Any]:
    """Success per instruction (with Wilson intervals), every episode, the seams (with
    ``rate_limit``: how many stepped beyond it) and, given the daemon's status before and
    after the run, its safety events (counter differences)."""
    per: dict[str, Any] = {}
    for instruction in instructions:
        mine = [e for e in logs if e.instruction == instruction]
        ok = sum(e.success for e in mine)
        lo, hi = wilson_interval(ok, len(mine))
        per[instruction] = {
            "episodes": len(mine),
            "successes": ok,
            "rate": ok / len(mine) if mine else 0.0,
            "wilson95": [lo, hi],
            "mean_final_distance_m": sum(e.final_distance for e in mine) / max(1, len(mine)),
        }
    holds: Counter[str] = Counter()
    for e in logs:
        holds.update(e.holds_adopted)
    seams = [x for e in logs for x in e.seam_steps()]
    out: dict[str, Any] = {
        "per_instruction": per,
        "episodes": [e.to_dict() for e in logs],
        "seams": {
            "count": len(seams),
            "max_rad": max(seams, default=0.0),
            "p99_rad": percentiles(seams)["p99"] if seams else 0.0,
            "over_rate_limit": None if rate_limit is None else sum(x > rate_limit + 1e-4 for x in seams),
        },
        "held_periods": sum(e.held for e in logs),
        "first_plan_ms": percentiles(e.first_plan_ms for e in logs),  # each episode starts once it came
        "ticks": sum(len(e.commands) for e in logs),
        "late_answers": sum(len(e.late) for e in logs),
        "holds_adopted": dict(holds),
    }
    if before is not None and after is not None:
        c0, c1 = before.counters, after.counters
        published = c1.published - c0.published
        misses = c1.deadline_misses - c0.deadline_misses
        interventions = c1.interventions - c0.interventions
        entered = after.transition_counts.get("FALLBACK", 0) - before.transition_counts.get("FALLBACK", 0)
        out["safety"] = {
            "published": published,
            "deadline_misses": misses,
            "deadline_miss_rate": misses / published if published else 0.0,
            "bound_clamps": c1.guard_bounds - c0.guard_bounds,
            "out_of_bounds": c1.guard_out_of_bounds - c0.guard_out_of_bounds,
            "rate_clamps": c1.guard_rate - c0.guard_rate,
            "seam_clamps": c1.guard_seam - c0.guard_seam,
            "guided": c1.guided - c0.guided,
            "interventions": interventions,
            "intervention_rate": interventions / published if published else 0.0,
            "hold_chunks": c1.published_hold - c0.published_hold,
            # Times the daemon entered FALLBACK during the run (at least 1 when it ends there).
            "fallbacks": max(entered, int(after.on_fallback)),
            "held_periods": out["held_periods"],
            "final_state": after.state,
        }
        out["latency_ms"] = percentiles(x for e in logs for x in e.latencies_ms)
    return out


def success_line(name: str, instruction: str, row: dict[str, Any]) -> str:
    """One row of :func:`summarize`'s ``per_instruction`` as a line of a table."""
    return (
        f"{name:>8} | {instruction:<40} | {row['successes']:>3}/{row['episodes']:<3} "
        f"({100 * row['rate']:5.1f} %) | mean final distance {1000 * row['mean_final_distance_m']:6.1f} mm"
    )


def percentiles(values: Iterable[float | None]) -> dict[str, float]:
    """count, p50, p95, p99, max and mean of a sample (NaN entries are ignored)."""
    a = np.asarray([v for v in values if v is not None], dtype=np.float64)
    a = a[np.isfinite(a)]
    if a.size == 0:
        return {"count": 0, "p50": math.nan, "p95": math.nan, "p99": math.nan, "max": math.nan, "mean": math.nan}
    p50, p95, p99 = np.percentile(a, (50, 95, 99))
    return {
        "count": int(a.size),
        "p50": round(float(p50), 4),
        "p95": round(float(p95), 4),
        "p99": round(float(p99), 4),
        "max": round(float(a.max()), 4),
        "mean": round(float(a.mean()), 4),
    }


def wilson_interval(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (95 % for the default ``z``).

    Unlike the normal approximation it stays within [0, 1] and is sensible for 0 or n
    successes and small n, which is what a handful of robot episodes gives.
    """
    if n <= 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return (lo, hi)


# -- pairing ----------------------------------------------------------------------------------


def compare(reference: EpisodeLog, other: EpisodeLog, atol: float = 1e-6) -> dict[str, Any]:
    """How ``other`` (through vlad) differs from ``reference`` (in process) on the same seed:
    the first tick whose command differs and what ``other`` did there."""
    first = None
    for tick, (a, b) in enumerate(zip(reference.commands, other.commands, strict=False)):
        if not np.allclose(a, b, atol=atol, rtol=0):
            first = tick
            break
    why = None
    if first is not None:
        src = other.sources[first]
        if first in other.late:
            why = "late answer"
        elif src.startswith(HOLD_PREFIX):
            why = src
        elif src == "held":
            why = "nothing valid (held)"
        elif other.interventions:
            why = "guard: " + ",".join(sorted(other.interventions))
        else:
            why = f"different chunk ({src})"
    return {
        "seed": reference.seed,
        "instruction": reference.instruction,
        "reference": reference.success,
        "other": other.success,
        "flipped": reference.success != other.success,
        "first_divergence": first,
        "why": why,
    }


def fidelity(reference: list[EpisodeLog], served: list[EpisodeLog], instructions: tuple[str, ...]) -> dict[str, Any]:
    """The same seeds in process (``reference``) and through vlad (``served``), paired
    episode by episode (:func:`compare`), per instruction and over the set."""
    ref = {(e.instruction, e.seed): e for e in reference}
    pairs = [compare(ref[(e.instruction, e.seed)], e) for e in served if (e.instruction, e.seed) in ref]
    per = {}
    for instruction in instructions:
        mine = [p for p in pairs if p["instruction"] == instruction]
        n = max(1, len(mine))
        a = sum(p["reference"] for p in mine) / n
        b = sum(p["other"] for p in mine) / n
        per[instruction] = {
            "episodes": len(mine),
            "in_process": a,
            "through_vlad": b,
            "drop": round(a - b, 6),
            "lost": sum(p["reference"] and not p["other"] for p in mine),
            "gained": sum(p["other"] and not p["reference"] for p in mine),
        }
    why = Counter(p["why"] for p in pairs if p["first_divergence"] is not None)
    return {
        "per_instruction": per,
        "identical_episodes": sum(p["first_divergence"] is None for p in pairs),
        "episodes": len(pairs),
        "divergence_causes": dict(why),
        "flipped": [p for p in pairs if p["flipped"]],
    }
