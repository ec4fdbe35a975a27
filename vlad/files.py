"""Reading files that may be hostile: regular files only, bounded sizes, bounded nesting;
and creating a file a user names, refusing what is not one.

Release folders, config files and keys are read through here. A FIFO named
``manifest.sig`` would block ``open()`` forever, a device file or a 10 GB "contract"
would exhaust memory, and a 5,000-deep TOML array overflows the parser's recursion: each
is refused with one clear line (:class:`FileRefused`) before anything is parsed.

Files of a release folder are opened with :func:`open_beneath`: component by component,
each relative to its parent and with ``O_NOFOLLOW``, so a symbolic link anywhere in the
path (a linked file or a linked sub-folder) is refused before anything behind it is
opened, and no path can resolve outside the folder.

A file vlad writes where a user says (``vladctl record --out``) is opened by
:func:`create_regular`: a symbolic link, a FIFO or a device there is refused with one line.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vlad.errors import VladError

# Text files of a release, a config or a key are small; artifacts are hashed in blocks.
MAX_TEXT_BYTES = 4 * 2**20
# Deepest nesting of [ and { a TOML file of ours may have before it is parsed.
MAX_TOML_NESTING = 32


class FileRefused(VladError):
    """A file that is not a readable regular file of an acceptable size."""


def open_regular(path: str | Path) -> int:
    """Open ``path`` for reading without blocking, refusing anything but a regular file.

    ``O_NONBLOCK`` makes opening a FIFO return at once instead of waiting for a writer;
    the type is then checked on the open descriptor (no race with a swapped path).
    Returns the descriptor (blocking again); the caller closes it.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise FileRefused(f"{path}: cannot open ({exc.strerror or exc})") from None
    return _regular(fd, path)


def _regular(fd: int, path: Any) -> int:
    """``fd`` when it is a regular file (made blocking again), else closed and refused."""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused(f"{path}: not a regular file ({_kind(st.st_mode)}); refusing to read it")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def create_regular(path: str | Path, mode: int = 0o640) -> int:
    """Open ``path`` for writing, created (``mode``) or emptied, refusing anything but a
    regular file: a symbolic link is not followed (``O_NOFOLLOW``: writing through one
    would overwrite whatever it points to), a FIFO or device is refused on the opened
    descriptor (``O_NONBLOCK``: opening a FIFO no one reads fails at once instead of
    waiting), and an existing file is truncated only after that check.
    Returns the descriptor (blocking again); the caller closes it.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags, mode)
    except OSError as exc:
        try:
            kind = os.lstat(path).st_mode
        except OSError:
            kind = None
        if kind is not None and not stat.S_ISREG(kind):
            raise FileRefused(f"{path}: {_kind(kind)}; refusing to write to it") from None
        raise FileRefused(f"{path}: cannot create ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused(f"{path}: {_kind(st.st_mode)}; refusing to write to it")
        os.ftruncate(fd, 0)
        os.set_blocking(fd, True)
    except OSError as exc:
        os.close(fd)
        raise FileRefused(f"{path}: cannot write ({exc.strerror or exc})") from None
    except BaseException:
        os.close(fd)
        raise
    return fd


_NOFOLLOW_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NOFOLLOW_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)


def relative_parts(relpath: str) -> tuple[str, ...]:
    """The components of a plain relative path inside a folder; :class:`FileRefused` for an
    absolute path, ``..``, ``.``, an empty component or a backslash."""
    parts = tuple(relpath.split("/"))
    if not relpath or "\\" in relpath or any(p in ("", ".", "..") for p in parts):
        raise FileRefused(f"{relpath!r}: not a plain relative path inside the folder")
    return parts


def open_beneath(root: str | Path, relpath: str) -> int:
    """Open the regular file ``relpath`` inside the folder ``root`` without leaving it.

    Every component is opened relative to its parent's descriptor with ``O_NOFOLLOW``
    (sub-folders also with ``O_DIRECTORY``): a symbolic link at any depth is refused
    (:class:`FileRefused`, naming it) before anything it points to is opened, and a FIFO
    or device is refused on the opened descriptor (``O_NONBLOCK``: opening never blocks).
    ``root`` itself is opened as given (callers pass a resolved folder).
    FileNotFoundError when a component is missing. The caller closes the descriptor.
    """
    parts = relative_parts(relpath)
    try:
        parent = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise FileRefused(f"{root}: cannot open the folder ({exc.strerror or exc})") from None
    for i, name in enumerate(parts):
        last = i == len(parts) - 1
        try:
            fd = os.open(name, _NOFOLLOW_FILE if last else _NOFOLLOW_DIR, dir_fd=parent)
        except OSError as exc:
            problem = _open_problem(parent, name, "/".join(parts[: i + 1]), last, exc)
            os.close(parent)
            if problem is None:
                raise
            raise problem from None
        os.close(parent)
        parent = fd
    return _regular(parent, relpath)


def _open_problem(parent: int, name: str, where: str, last: bool, exc: OSError) -> FileRefused | None:
    """Why opening ``name`` under ``parent`` failed; None for a missing file (re-raised)."""
    if isinstance(exc, FileNotFoundError):
        return None
    try:
        linked = stat.S_ISLNK(os.lstat(name, dir_fd=parent).st_mode)
    except OSError:
        linked = False
    if linked:
        what = "a symbolic link" if last else "a symbolic link to a folder"
        return FileRefused(f"{where}: {what}; a release holds its own files")
    return FileRefused(f"{where}: cannot open ({exc.strerror or exc})")


def read_bytes_beneath(root: str | Path, relpath: str, max_bytes: int = MAX_TEXT_BYTES) -> bytes:
    """:func:`read_bytes` for a file inside a folder, opened by :func:`open_beneath`."""
    return _read_fd(open_beneath(root, relpath), f"{root}/{relpath}", max_bytes)


def read_bytes(path: str | Path, max_bytes: int = MAX_TEXT_BYTES) -> bytes:
    """The content of a regular file of at most ``max_bytes`` (FileNotFoundError if absent)."""
    return _read_fd(open_regular(path), path, max_bytes)


def _read_fd(fd: int, path: Any, max_bytes: int) -> bytes:
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > max_bytes:
            raise FileRefused(f"{path}: {size} bytes, more than the {max_bytes} allowed for this file")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:  # grew while we read
        raise FileRefused(f"{path}: more than the {max_bytes} bytes allowed for this file")
    return data


HASH_BLOCK = 4 << 20  # bytes per read: large enough that hashing, not the syscalls, dominates


def hash_fd(fd: int, progress: Callable[[int], None] | None = None) -> tuple[int, str]:
    """``(bytes read, sha256 hex)`` of an open file descriptor read to its end (the caller
    closes it). ``progress`` gets each block's byte count, for meters on long hashes.
    ``hashlib`` releases the GIL while it hashes, so threads hash files in parallel."""
    h, size = hashlib.sha256(), 0
    buf = bytearray(HASH_BLOCK)
    view = memoryview(buf)
    while n := os.readv(fd, [buf]):
        h.update(view[:n])
        size += n
        if progress is not None:
            progress(n)
    return size, h.hexdigest()


def hash_file(path: str | Path, progress: Callable[[int], None] | None = None) -> tuple[int, str]:
    """``(size, sha256 hex)`` of a regular file (anything else is refused), streamed."""
    fd = open_regular(path)
    try:
        return hash_fd(fd, progress)
    finally:
        os.close(fd)


def sha256_file(path: str | Path, progress: Callable[[int], None] | None = None) -> str:
    """Hex sha256 of a regular file (anything else is refused), streamed."""
    return hash_file(path, progress)[1]


def toml_nesting(text: str) -> int:
    """Deepest bracket nesting of ``text`` outside strings and comments (an upper bound is
    enough: the check only has to stop hostile depth before the recursive parser)."""
    depth = deepest = 0
    quote = ""
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if quote:
            if c == "\\" and quote == '"':
                i += 2
                continue
            if text.startswith(quote, i):
                i += len(quote)
                quote = ""
                continue
        elif c == "#":
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        elif c in "\"'":
            quote = c * 3 if text.startswith(c * 3, i) else c
            i += len(quote)
            continue
        elif c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth = max(0, depth - 1)
        i += 1
    return deepest


def parse_toml(raw: bytes, source: str) -> dict[str, Any]:
    """UTF-8 TOML bytes -> a table; :class:`FileRefused` with the reason on anything else."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FileRefused(f"{source}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if toml_nesting(text) > MAX_TOML_NESTING:
        raise FileRefused(f"{source}: nested deeper than {MAX_TOML_NESTING} levels; refusing to parse it")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise FileRefused(f"{source}: not valid TOML: {exc}") from None
    except RecursionError:
        raise FileRefused(f"{source}: nested too deeply to parse") from None


def load_toml(path: str | Path, max_bytes: int = MAX_TEXT_BYTES) -> dict[str, Any]:
    """Read and parse a TOML file defensively (see :func:`read_bytes`, :func:`parse_toml`)."""
    return parse_toml(read_bytes(path, max_bytes), str(path))


def load_toml_or_raise(
    path: str | Path, refuse: Callable[[str], Exception], missing: str = "no such file"
) -> dict[str, Any]:
    """:func:`load_toml` for a reader with its own error: a file that is absent, refused or
    unreadable raises ``refuse(problem)``, ``problem`` being one line without the path
    (``missing`` when there is no such file)."""
    try:
        return load_toml(path)
    except FileNotFoundError:
        problem = missing
    except FileRefused as exc:
        problem = str(exc).removeprefix(f"{path}: ")
    except OSError as exc:
        problem = f"cannot read: {exc.strerror or exc}"
    raise refuse(problem)


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return name
    return "not a regular file"
