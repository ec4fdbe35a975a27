"""The shared measurement conditions the benchmark scripts print with their figures."""

from __future__ import annotations

import json
import os

from vlad_tools.testing.conditions import conditions


def test_conditions_name_the_machine_load_and_versions() -> None:
    c = conditions("numpy", "no-such-distribution-xyz")
    assert c["cpus"] == os.cpu_count() and len(c["load_avg"]) == 3 and c["date"].endswith("UTC")
    assert c["packages"]["vlad"] and c["packages"]["numpy"][0].isdigit()
    assert c["packages"]["no-such-distribution-xyz"] == "not installed"
    json.dumps(c)  # printable as the scripts print it
