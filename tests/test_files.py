"""vlad.files.load_toml_or_raise: every way a TOML file can fail is one line in the caller's own error."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vlad.errors import ProblemsError
from vlad.files import load_toml_or_raise


def _load(path: Path) -> dict:
    return load_toml_or_raise(path, lambda problem: ProblemsError(str(path), [problem]), "no such thing")


def test_load_toml_or_raise(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text('a = 1\n[b]\nc = "d"\n')
    assert _load(good) == {"a": 1, "b": {"c": "d"}}

    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)  # would block a plain open() for ever
    bad = tmp_path / "bad.toml"
    bad.write_text("a = \n")
    deep = tmp_path / "deep.toml"
    deep.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    cases = [
        (tmp_path / "absent.toml", "no such thing"),
        (fifo, "not a regular file (a FIFO)"),
        (tmp_path, "not a regular file (a folder)"),
        (bad, "not valid TOML"),
        (deep, "nested deeper than"),
    ]
    for path, why in cases:
        with pytest.raises(ProblemsError) as info:
            _load(path)
        # one problem, without the path the error already carries as its source
        assert len(info.value.problems) == 1 and why in info.value.problems[0], (path, info.value.problems)
        assert not info.value.problems[0].startswith(str(path)), info.value.problems
