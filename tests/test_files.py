"""vlad.files: every way a TOML file can fail is one line in the caller's own error
(load_toml_or_raise); a file to write that is not a regular file is refused (create_regular)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vlad.errors import ProblemsError
from vlad.files import FileRefused, create_regular, load_toml_or_raise


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


def test_create_regular_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    """A symbolic link is not followed (its target is untouched), a FIFO nobody reads and
    one somebody reads are refused at once, a folder too; each is one line naming it."""
    target = tmp_path / "precious"
    target.write_text("keep me")
    link = tmp_path / "link"
    link.symlink_to(target)
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # would block a plain open() for writing for ever
    read_fifo = tmp_path / "read_fifo"
    os.mkfifo(read_fifo)
    reader = os.open(read_fifo, os.O_RDONLY | os.O_NONBLOCK)  # someone reads: opening it for writing succeeds
    try:
        for path, why in [
            (link, "a symbolic link; refusing to write to it"),
            (dangling, "a symbolic link; refusing to write to it"),
            (fifo, "a FIFO; refusing to write to it"),
            (read_fifo, "a FIFO; refusing to write to it"),
            (tmp_path, "a folder; refusing to write to it"),
            (tmp_path / "absent" / "file", "cannot create (No such file or directory)"),
        ]:
            with pytest.raises(FileRefused) as info:
                create_regular(path)
            assert str(info.value) == f"{path}: {why}", info.value
    finally:
        os.close(reader)
    assert target.read_text() == "keep me" and not (tmp_path / "nowhere").exists()


def test_create_regular_creates_or_empties_a_regular_file(tmp_path: Path) -> None:
    old = tmp_path / "old"
    old.write_text("previous content")
    for path in (old, tmp_path / "new"):
        fd = create_regular(path)
        try:
            os.write(fd, b"new")
        finally:
            os.close(fd)
        assert path.read_bytes() == b"new"
    assert (tmp_path / "new").stat().st_mode & 0o777 == 0o640 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
