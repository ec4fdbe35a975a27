"""Fixtures of the gate tests: the broken candidates (built once per session) and plans."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gates import candidates

ROOT = candidates.ROOT
DEMO_PLAN = ROOT / "etc" / "vlad" / "demo-gates.toml"
RECORDING = ROOT / "manifests" / "demo" / "demo_recording.mcap"
# Small runs: every gate's machinery with a few episodes and calls (docs/gates.md has the
# default, long run). Enough samples that a stress verdict is not decided by one chunk; a
# fidelity budget that four paired episodes can judge (one flipped seed is 25 points).
SMALL = [
    "--perf-calls",
    "300",
    "--bursts",
    "20",
    "--episodes",
    "4",
    "--max-fidelity-drop",
    "0.5",
    "--max-latency-drop",
    "0.5",
    "--replay-limit",
    "40",
    "--rollout-episodes",
    "1",
]


def gate_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 400) -> subprocess.CompletedProcess:
    """``vladctl gate ARGS``, as its own process (the real CLI path)."""
    return subprocess.run(
        [sys.executable, "-m", "vlad.cli", "gate", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "MUJOCO_GL": "egl", **(env or {})},
        timeout=timeout,
    )


def gate_named(report: dict, name: str) -> dict:
    """The entry of the gate ``name`` in a gate report."""
    return next(g for g in report["gates"] if g["gate"] == name)


def why(report: dict) -> str:
    """Each gate's status and reasons (and a gate error's traceback): what a failed assert shows."""
    lines = []
    for g in report["gates"]:
        lines.append(f"{g['gate']}: {g['status']}: {'; '.join(g['reasons'])}")
        if g["status"] == "error":
            lines.append(g["details"].get("traceback", ""))
    return "\n".join(lines)


def small_plan(overrides: dict | None = None, plan_file: Path = DEMO_PLAN):
    """The demo plan with the small run's numbers (as the CLI options above set them)."""
    from vlad_tools.gates.plan import load_plan

    plan = load_plan(ROOT, plan_file).with_overrides(
        equivalence={"replay_limit": 40, "rollout_episodes": 1},
        performance={"warm_calls": 300, "bursts": 20, "shape_switch_calls": 15},
        closed_loop={"episodes": 3, "max_fidelity_drop": 0.5, "max_latency_drop": 0.5},
    )
    return plan.with_overrides(**(overrides or {}))


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("candidates")


@pytest.fixture(scope="session")
def ignores_instruction(built) -> tuple[Path, Path]:
    """(release, its own gate plan): golden fixtures of the wrapped model, outside the release."""
    golden = built / "no-language-golden.npz"
    release = candidates.ignores_instruction(built / "no-language", golden)
    plan = built / "no-language-gates.toml"
    text = DEMO_PLAN.read_text().replace('"../../manifests/demo/', f'"{ROOT}/manifests/demo/')
    plan.write_text(text.replace(f'golden = "{ROOT}/manifests/demo/golden.npz"', f'golden = "{golden}"'))
    assert str(golden) in plan.read_text()
    return release, plan
