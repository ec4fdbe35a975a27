"""Shared fixtures: the demo release and its golden fixtures (:mod:`vlad_tools.testing`)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import warnings
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


# Test files that start no daemon and judge nothing by the clock: exports, imports, fuzzers,
# source scans, pure logic. ./scripts/test runs them (--share cpu) in a second pytest at the
# lowest CPU priority beside the others (--share timed), so they take the CPU the daemon tests
# leave idle instead of adding their minutes after them, and never delay a daemon under test.
# tests/test_shares.py keeps this list honest.
CPU_SHARE = (
    "backends",
    "contract",
    "importers",
    "pi0",
    "demo/test_demo_closed_loop.py",
    "demo/test_demo_sim.py",
    "gates/test_cli.py",
    "gates/test_conditions.py",
    "gates/test_evidence.py",
    "gates/test_metrics.py",
    "gates/test_offline_gates.py",
    "gates/test_plan.py",
    "gates/test_sim_tasks.py",
    "health/test_monitors.py",
    "health/test_policy.py",
    "planner/test_cli.py",
    "planner/test_model.py",
    "planner/test_reproduce.py",
    "release/test_export.py",
    "release/test_external_data.py",
    "release/test_manifest.py",
    "release/test_store.py",
    "serving/test_guard.py",
    "serving/test_rtc.py",
    "testing/test_fuzz.py",
    "test_chunk_executor.py",
    "test_docs_tables.py",
    "test_file_hash.py",
    "test_files.py",
    "test_history.py",
    "test_layers.py",
    "test_layout_doc.py",
    "test_processing.py",
    "test_protocol.py",
    "test_robot_install.py",
    "test_schema.py",
    "test_snapshot.py",
    "test_shares.py",
    "test_tomlwrite.py",
)
# Test files that start daemons but judge nothing by the clock: what happened, never how soon
# (a status, a deploy's outcome, a rendered screen, what a demo leaves behind, that a
# benchmark's rows are there and finite), each wait bounded by a timeout far above its normal
# time, and no controller streaming to a daemon whose health verdicts the test reads.
# ./scripts/test runs them (--share functional) in a third pytest beside the others at the
# lowest CPU priority, like the CPU share: the timed share's daemons take the CPU first, and
# these wait on their own daemons instead of adding their minutes after the timed share's.
FUNCTIONAL_SHARE = (
    "cli/test_watch.py",
    "demo/test_demo_run.py",
    "fleet/test_registry.py",
    "gates/test_recording.py",
    "kserve/test_kserve_bench.py",
    "release/test_release_fifo.py",
    "test_journal.py",
    "test_bench_serving.py",
    "test_plugin_example.py",
    "test_protocol_doc.py",
    "testing/test_testing.py",
)
SHARES = {"cpu": CPU_SHARE, "functional": FUNCTIONAL_SHARE}
TESTS = Path(__file__).parent


def _listed(rel: str, entries: tuple[str, ...]) -> bool:
    return any(rel == entry or rel.startswith(entry + "/") for entry in entries)


def in_cpu_share(path: Path) -> bool:
    return _listed(path.relative_to(TESTS).as_posix(), CPU_SHARE)


def share_of(path: Path) -> str:
    """The share a test file runs in: "cpu", "functional" or "timed" (every file not listed)."""
    rel = path.relative_to(TESTS).as_posix()
    return next((name for name, entries in SHARES.items() if _listed(rel, entries)), "timed")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--slow",
        action="store_true",
        help="also run the tests marked slow (full-length soaks, AOTInductor compiles, long gate runs)",
    )
    parser.addoption(
        "--share",
        choices=("all", "cpu", "functional", "timed"),
        default="all",
        help="cpu, functional: only the files of tests/conftest.py's CPU_SHARE, FUNCTIONAL_SHARE; timed: all "
        "the others (./scripts/test runs the three side by side)",
    )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """``--share``: a file of another share is not even imported."""
    share = config.getoption("share")
    if share == "all" or not collection_path.is_relative_to(TESTS) or collection_path == TESTS:
        return None
    if collection_path.is_dir():
        if share == "timed":
            return True if share_of(collection_path) != "timed" else None
        # cpu, functional: descend only into folders that hold part of the share
        rel = collection_path.relative_to(TESTS).as_posix()
        entries = SHARES[share]
        return None if _listed(rel, entries) or any(e.startswith(rel + "/") for e in entries) else True
    if collection_path.suffix != ".py":
        return None
    return True if share_of(collection_path) != share else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` are opt-in: the default run (CI) skips them with a reason that
    says how to run them; ``--slow`` runs everything."""
    if config.getoption("slow"):
        return
    skip = pytest.mark.skip(reason="slow: run with ./scripts/test --slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _no_child_outlives_the_session():
    """A test that fails before it stops its daemon must not leave ``vlad serve`` (or any
    process it started) running after pytest: at the end of the session each child still
    running is named in a warning, terminated, and killed after 5 s."""
    yield
    import psutil

    running = []
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if p.status() == psutil.STATUS_ZOMBIE:
                continue  # it has ended; its parent reaps it
            if any("from multiprocessing." in arg for arg in p.cmdline()):
                # multiprocessing's resource tracker (or forkserver): Python's own helper, which
                # ignores SIGTERM and ends when this process does
                continue
            # a warning: the summary shows it also when every test passed (stderr is captured)
            warnings.warn(
                f"{p.pid} still running at the end of the session: {' '.join(p.cmdline())[:200]}", stacklevel=1
            )
            p.terminate()
            running.append(p)
    _, alive = psutil.wait_procs(running, timeout=5)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()


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
