"""The figures in README.md and docs/benchmarks.md that come from the demo release's signed
evidence are what scripts/docs_tables.py writes from it: regenerating them changes nothing."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def test_generated_blocks_match_the_evidence():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "docs_tables.py"), "--check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_generated_block_is_filled():
    for doc in (ROOT / "README.md", ROOT / "docs" / "benchmarks.md"):
        text = doc.read_text(encoding="utf-8")
        assert "<!-- generated: closed-loop" in text, doc
        for block in text.split("<!-- generated: ")[1:]:
            body = block.split("-->", 1)[1].split("<!-- end generated -->", 1)[0]
            assert "|" in body, f"{doc.name}: an empty generated block; run scripts/docs_tables.py"
