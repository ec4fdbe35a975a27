#!/usr/bin/env python3
"""What a robot installs against what a workstation adds: the wheels of ``vlad`` (the
runtime) and ``vlad-tools`` (tools/), their modules, lines and size, and the import time
of ``vlad serve`` (the CLI and the supervisor with everything it loads at start).

    .venv/bin/python scripts/robot_install.py [--repo PATH]   # PATH: another checkout to compare

Prints one table; builds the wheels without dependencies into a temporary folder (no
network: setuptools from this environment, no build isolation).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVE = "import vlad.cli, vlad.daemon.supervisor; vlad.cli.vlad_parser()"


def wheel(project: Path, out: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(project)],
        check=True,
        capture_output=True,
    )
    return max(out.glob("*.whl"), key=lambda p: p.stat().st_mtime)


def contents(whl: Path) -> tuple[int, int]:
    """(modules, lines of Python) in a wheel."""
    with zipfile.ZipFile(whl) as z:
        py = [n for n in z.namelist() if n.endswith(".py")]
        return len(py), sum(z.read(n).count(b"\n") for n in py)


def import_ms(repo: Path, runs: int = 7) -> tuple[float, int]:
    """Median wall time of importing what `vlad serve` imports in a fresh interpreter, and the module count."""
    times, count = [], 0
    code = f"import sys, time; t = time.perf_counter(); {SERVE}; print(time.perf_counter() - t, len(sys.modules))"
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            cwd=repo,
            env={"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin"},
        )
        t, n = out.stdout.split()
        times.append(float(t) * 1000)
        count = int(n)
    return statistics.median(times), count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, action="append", help="checkout(s) to measure (default: this one)")
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}; wheels built with --no-deps; import: median of 7 fresh interpreters")
    print(f"{'checkout':<28} {'wheel':<12} {'modules':>8} {'lines':>8} {'size kB':>8}   `vlad serve` imports")
    for repo in args.repo or [ROOT]:
        with tempfile.TemporaryDirectory() as tmp:
            projects = [("vlad", repo)] + (
                [("vlad-tools", repo / "tools")] if (repo / "tools" / "pyproject.toml").exists() else []
            )
            ms, n = import_ms(repo)
            for i, (name, project) in enumerate(projects):
                whl = wheel(project, Path(tmp) / name)
                modules, lines = contents(whl)
                tail = f"   {ms:.0f} ms, {n} modules" if i == 0 else ""
                print(
                    f"{str(repo)[-28:]:<28} {name:<12} {modules:>8} {lines:>8} {whl.stat().st_size / 1000:>8.0f}{tail}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
