"""docs/layout.md's table names every module that exists, and nothing that does not.

A module added, moved or removed without its line in the table fails here, so the table
cannot drift from the tree."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def layout_rows() -> dict[str, str]:
    """``path -> what`` for every row of the table in docs/layout.md."""
    text = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    section = text.split("# Layout\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"^\| `([^`]+)` \| (.*) \|$", line)
        if m:
            assert m.group(1) not in rows, f"docs/layout.md names {m.group(1)} twice"
            rows[m.group(1)] = m.group(2).strip()
    return rows


def modules() -> set[str]:
    """Every Python module of vlad, vlad-tools and the built-in plugins' packages."""
    found = {p for p in (ROOT / "vlad").rglob("*.py")} | {p for p in (ROOT / "tools" / "vlad_tools").rglob("*.py")}
    found |= {p for p in (ROOT / "plugins").glob("*/*/*.py") if p.parent.name == p.parent.parent.name}
    return {str(p.relative_to(ROOT)) for p in found if "__pycache__" not in p.parts}


def named(rows: dict[str, str], module: str) -> bool:
    # a package's __init__ may be described by the package's own row ("vlad/serving/")
    return module in rows or (module.endswith("/__init__.py") and module[: -len("__init__.py")] in rows)


def test_every_module_is_in_the_layout_table():
    rows = layout_rows()
    assert len(rows) > 50, "docs/layout.md's table not found"
    missing = sorted(m for m in modules() if not named(rows, m))
    assert not missing, "add to docs/layout.md's table: " + ", ".join(missing)


def test_the_layout_table_names_nothing_that_is_gone():
    stale = sorted(p for p in layout_rows() if not (ROOT / p).exists())
    assert not stale, "docs/layout.md's table names paths that do not exist: " + ", ".join(stale)


def test_every_row_says_what_it_holds():
    for path, what in layout_rows().items():
        assert len(what.split()) >= 2, f"docs/layout.md row {path!r} needs a line on what it holds"


def test_the_readme_still_starts_with_the_two_setup_commands():
    head = (ROOT / "README.md").read_text(encoding="utf-8").split("\n---\n", 1)[0]
    assert "./scripts/demo" in head and "./scripts/test" in head
