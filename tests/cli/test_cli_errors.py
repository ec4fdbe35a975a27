"""Command-line error paths every ``vlad`` / ``vladctl`` command shares (vlad/cli/common.py)."""

from __future__ import annotations

import subprocess
import sys

# A command whose output is larger than a pipe's buffer, run through the real `run`.
BIG = """
import argparse, sys
from vlad.cli.common import run
p = argparse.ArgumentParser()
p.set_defaults(func=lambda args: print("x" * 100 + "\\n") or print("y" * 1_000_000))
sys.exit(run(p, []))
"""


def test_a_reader_that_stops_early_ends_the_command_quietly():
    """`vladctl events | head -1`: no BrokenPipeError traceback, SIGPIPE's exit status."""
    proc = subprocess.Popen([sys.executable, "-c", BIG], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"x")
    proc.stdout.close()  # what `head -1` does after its line
    assert proc.wait(30) == 141
    assert proc.stderr.read() == b""
