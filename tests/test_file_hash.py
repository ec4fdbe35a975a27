"""The one streamed file hash (vlad.files.hash_file): right digest and size, progress, refusals."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from vlad.files import HASH_BLOCK, FileRefused, hash_file, sha256_file


@pytest.mark.parametrize("size", [0, 1, HASH_BLOCK, HASH_BLOCK + 1])
def test_digest_size_and_progress(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    (tmp_path / "f").write_bytes(data)
    seen: list[int] = []
    assert hash_file(tmp_path / "f", seen.append) == (size, hashlib.sha256(data).hexdigest())
    assert sum(seen) == size and all(n > 0 for n in seen)
    assert sha256_file(tmp_path / "f") == hashlib.sha256(data).hexdigest()


def test_non_regular_files_are_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")  # opening it for reading would block forever
    with pytest.raises(FileRefused):
        hash_file(tmp_path / "fifo")
    with pytest.raises(FileRefused):
        hash_file(tmp_path)
