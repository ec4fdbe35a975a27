"""Shared fixtures: the demo release and its golden fixtures (:mod:`vlad_tools.testing`)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")

import pytest

from vlad_tools.testing.golden import GOLDEN, GoldenCase, load_golden
from vlad_tools.testing.releases import DEMO, REPO

# A background job of a non-interactive shell (`./.ci/run &`) starts with SIGINT ignored, and
# every process the tests start would inherit that: the Ctrl-C tests (demo, watch) need it
# delivered. A handler (not SIG_IGN) here makes the children start with the default again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

__all__ = ["DEMO", "GOLDEN", "ROOT", "VLAD", "load_golden"]

ROOT = REPO
VLAD = Path(sys.executable).parent / "vlad"  # the daemon's console script in this environment


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--slow",
        action="store_true",
        help="also run the tests marked slow (full-length soaks, AOTInductor compiles, long gate runs)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` are opt-in: the default run (CI) skips them with a reason that
    says how to run them; ``--slow`` runs everything."""
    if config.getoption("slow"):
        return
    skip = pytest.mark.skip(reason="slow: run with ./scripts/test --slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def slow(request: pytest.FixtureRequest) -> bool:
    """True under ``--slow``: a test with a short and a long version runs the long one."""
    return bool(request.config.getoption("slow"))


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


@pytest.fixture(scope="session")
def golden() -> list[GoldenCase]:
    return load_golden()
