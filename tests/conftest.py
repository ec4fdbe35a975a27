"""Shared fixtures: the demo release and its golden fixtures."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "manifests" / "demo"
GOLDEN = ROOT / "manifests" / "demo" / "golden.npz"


@pytest.fixture(scope="session")
def demo_dir() -> Path:
    return DEMO


@pytest.fixture(scope="session")
def contract():
    from vlad.contract import load_contract

    return load_contract(DEMO / "contract.toml")


@pytest.fixture(scope="session")
def tokenizer(contract):
    from vlad.processing import Tokenizer

    return Tokenizer.from_contract(contract)


def load_golden() -> list[dict]:
    """The golden fixtures: raw observation -> model inputs -> model outputs -> actions."""
    from vlad.processing import RawObservation

    z = np.load(GOLDEN, allow_pickle=False)
    count = len({k.split("/")[0] for k in z.files})
    cases = []
    for i in range(count):
        p = f"{i}/"
        cases.append(
            {
                "raw": RawObservation(
                    images={"overhead": z[p + "raw/image/overhead"]},
                    proprio=z[p + "raw/proprio"],
                    instruction=str(z[p + "raw/instruction"]),
                    sequence=int(z[p + "raw/sequence"]),
                ),
                "inputs": {k[len(p + "inputs/") :]: z[k] for k in z.files if k.startswith(p + "inputs/")},
                "outputs": {k[len(p + "outputs/") :]: z[k] for k in z.files if k.startswith(p + "outputs/")},
                "actions": z[p + "actions"],
            }
        )
    return cases


@pytest.fixture(scope="session")
def golden() -> list[dict]:
    return load_golden()
