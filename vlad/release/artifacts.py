"""A release's files on disk: opened inside the folder, hashed once per operation, with progress.

Every artifact is opened with :func:`vlad.files.open_beneath` (no symbolic link at any
depth, nothing outside the folder) and hashed in one streamed pass of 4 MiB blocks
(``hashlib`` releases the GIL while it hashes them). A :class:`Meter` turns the bytes into
progress lines, at most one a second, and a final line with the rate in GB/s.

One operation hashes each artifact once. Staging copies and hashes in the same pass
(:func:`copy_artifacts`); the result is a :class:`FileCheck` per file: its sha256 and its
identity on disk (device, inode, size, modification and change times). The later steps
of the same operation (verifying the staged copy, loading it, activating it) hand that
result on and only compare identities (:func:`hash_artifacts` with ``known``): one
``fstat`` per file. A file rewritten, replaced, truncated or changed in mode since has
another identity and is hashed again. A new operation (another ``vladctl`` run, a daemon
start) hashes afresh: what another process hashed is not trusted.

What is read *from* a file's bytes once they are hashed (a model's external data
references, a gate report's verdicts) is kept by that sha256 in a :class:`ByContent`: the
same bytes give the same answer, so verifying a release again (a rollback, a canary's
abort, while a policy serves) hashes its files but does not walk the model or parse the
report again. That walk and that parse are the Python-heavy part of a verification; the
JSON parser holds the GIL for the whole parse (tens of milliseconds for the demo's 1.7 MB
report), and the serving threads wait for it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from vlad.errors import VladError
from vlad.files import FileRefused, hash_fd, open_beneath

Progress = Callable[[str], None]

BLOCK = 4 << 20  # bytes per read: large enough that hashing, not the syscalls, dominates
REPORT_EVERY_S = 1.0


@dataclass(frozen=True, slots=True)
class FileCheck:
    """A file's sha256 and its identity on disk when it was hashed."""

    path: str
    size: int
    sha256: str
    dev: int
    ino: int
    mtime_ns: int
    ctime_ns: int

    def same_file(self, st: os.stat_result) -> bool:
        """The file behind ``st`` is the very one hashed, unchanged since."""
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) == (
            self.dev,
            self.ino,
            self.size,
            self.mtime_ns,
            self.ctime_ns,
        )


T = TypeVar("T")


class ByContent(Generic[T]):
    """Values computed from a file's bytes, kept by their sha256 (the newest ``size``;
    thread-safe: the daemon verifies in worker threads)."""

    def __init__(self, size: int = 32) -> None:
        self.size = size
        self._values: OrderedDict[str, T] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, sha256: str | None, compute: Callable[[], T]) -> T:
        """The value for the bytes of ``sha256``, computed once; ``sha256`` None (bytes not
        hashed, or changed since): computed, not kept."""
        if sha256 is None:
            return compute()
        with self._lock:
            if sha256 in self._values:
                self._values.move_to_end(sha256)
                return self._values[sha256]
        value = compute()  # outside the lock: two threads may both compute, never wait on each other
        with self._lock:
            self._values[sha256] = value
            while len(self._values) > self.size:
                self._values.popitem(last=False)
        return value


def _check(path: str, st: os.stat_result, sha256: str) -> FileCheck:
    return FileCheck(path, st.st_size, sha256, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


class Meter:
    """Bytes hashed (or copied) so far; progress lines at most once a second, with the rate."""

    def __init__(self, what: str, total: int, progress: Progress | None) -> None:
        self.what, self.total, self.progress = what, total, progress
        self.done = 0
        self.t0 = self._last = time.monotonic()

    def add(self, n: int, name: str) -> None:
        self.done += n
        now = time.monotonic()
        if self.progress is not None and now - self._last >= REPORT_EVERY_S:
            self._last = now
            pct = 100 * self.done / self.total if self.total else 100.0
            self.progress(
                f"{self.what}: {_gb(self.done)} of {_gb(self.total)} ({pct:.0f} %, {self.rate():.2f} GB/s), {name}"
            )

    def rate(self) -> float:
        """GB/s so far (10^9 bytes)."""
        return self.done / max(time.monotonic() - self.t0, 1e-9) / 1e9

    def seconds(self) -> float:
        return time.monotonic() - self.t0

    def summary(self, files: int) -> str:
        return f"{self.what}: {files} file(s), {_gb(self.done)} in {self.seconds():.2f} s ({self.rate():.2f} GB/s)"


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


@dataclass(frozen=True)
class HashResult:
    """What :func:`hash_artifacts` / :func:`copy_artifacts` found."""

    checks: dict[str, FileCheck]  # relative path -> check, for every file that could be read
    problems: list[str]  # one line each: missing, refused, wrong size or hash
    hashed_bytes: int  # bytes actually read and hashed (0 when every identity was known)
    seconds: float
    summary: str


def hash_artifacts(
    folder: str | Path,
    expected: Iterable[tuple[str, int, str]],
    *,
    known: Mapping[str, FileCheck] | None = None,
    progress: Progress | None = None,
    what: str = "hashing",
) -> HashResult:
    """Check each ``(relative path, size, sha256)`` of ``folder``: open it inside the folder,
    compare the size, then hash it, unless ``known`` holds a check of this very file with
    the expected hash (the identity is compared instead: one ``fstat``)."""
    expected = list(expected)
    known = known or {}
    checks: dict[str, FileCheck] = {}
    problems: list[str] = []
    todo: list[tuple[str, int, str, int, os.stat_result]] = []
    for path, size, sha in expected:
        fd = _open_listed(folder, path, problems)
        if fd is None:
            continue
        st = os.fstat(fd)
        if st.st_size != size:  # cheap check first: a different size needs no hashing
            os.close(fd)
            problems.append(f"{path}: size {st.st_size} bytes, manifest says {size}")
            continue
        prior = known.get(path)
        if prior is not None and prior.sha256 == sha and prior.same_file(st):
            os.close(fd)
            checks[path] = prior
            continue
        todo.append((path, size, sha, fd, st))
    meter = Meter(what, sum(t[1] for t in todo), progress)
    for path, _size, sha, fd, st in todo:
        try:
            digest = hash_fd(fd, functools.partial(meter.add, name=path))[1]
        except OSError as exc:
            problems.append(f"{path}: cannot read: {exc.strerror or exc}")
            continue
        finally:
            os.close(fd)
        checks[path] = _check(path, st, digest)
        if digest != sha:
            problems.append(f"{path}: sha256 {digest[:16]}… differs from manifest {sha[:16]}…")
    return HashResult(checks, problems, meter.done, meter.seconds(), meter.summary(len(todo)))


def copy_artifacts(
    src: str | Path,
    dst: str | Path,
    expected: Iterable[tuple[str, int, str]],
    *,
    progress: Progress | None = None,
    mode: int = 0o444,
) -> HashResult:
    """Copy each ``(relative path, size, sha256)`` from ``src`` into ``dst`` (new files,
    fsynced, ``mode``), hashing the bytes as they pass: the copy is checked against the
    manifest in the same read. The checks describe the files in ``dst``."""
    expected = list(expected)
    meter = Meter("copying and hashing", sum(size for _, size, _ in expected), progress)
    checks: dict[str, FileCheck] = {}
    problems: list[str] = []
    buf = bytearray(BLOCK)
    view = memoryview(buf)
    for path, size, sha in expected:
        fin = _open_listed(src, path, problems)
        if fin is None:
            continue
        target = Path(dst) / path
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fout = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except OSError:
            os.close(fin)
            raise
        h, n_total = hashlib.sha256(), 0
        try:
            if os.fstat(fin).st_size != size:
                problems.append(f"{path}: size {os.fstat(fin).st_size} bytes, manifest says {size}")
                continue
            while n := os.readv(fin, [buf]):
                h.update(view[:n])
                written = 0
                while written < n:
                    written += os.write(fout, view[written:n])
                n_total += n
                meter.add(n, path)
            os.fsync(fout)
            os.fchmod(fout, mode)  # before the identity is taken: chmod changes the ctime
            st = os.fstat(fout)
        finally:
            os.close(fin)
            os.close(fout)
        digest = h.hexdigest()
        if n_total != size:
            problems.append(f"{path}: {n_total} bytes read, manifest says {size} (changed while copied)")
        elif digest != sha:
            problems.append(f"{path}: sha256 {digest[:16]}… differs from manifest {sha[:16]}…")
        checks[path] = _check(path, st, digest)
    return HashResult(checks, problems, meter.done, meter.seconds(), meter.summary(len(expected)))


def changed(folder: str | Path, checks: Mapping[str, FileCheck]) -> list[str]:
    """Files of ``checks`` that are no longer the file hashed (missing, replaced or
    modified): one ``fstat`` each, no hashing. What a running daemon can afford to ask often."""
    out = []
    for path, check in checks.items():
        try:
            fd = open_beneath(folder, path)
        except (OSError, VladError):
            out.append(path)
            continue
        try:
            if not check.same_file(os.fstat(fd)):
                out.append(path)
        finally:
            os.close(fd)
    return out


def _open_listed(folder: str | Path, path: str, problems: list[str]) -> int | None:
    """A listed artifact opened beneath ``folder`` (:func:`open_beneath`), or None with the problem recorded."""
    try:
        return open_beneath(folder, path)
    except FileNotFoundError:
        problems.append(f"{path}: missing")
    except FileRefused as exc:
        problems.append(str(exc))
    return None
