"""ONNX external data: the files a model's tensors keep their bytes in, and the one rule for them.

An ONNX model above 2 GB keeps its weights beside it: each such tensor names, in
``TensorProto.external_data``, a ``location`` relative to the model's folder (docs/releases.md,
``[memory]``). The model file is hashed and signed, but what it points to is read by the
backend at load: a location that leaves the release folder would make a verified release
load bytes nobody hashed. ONNX Runtime refuses an absolute location or one leaving the
model's folder (recent versions only); vlad refuses it, and more, before any backend sees
the model, with one check, :func:`external_data_problems`, called by
:func:`vlad.release.signing.verify_release` (``vladctl verify``, staging, activation, deploy
and every load of a signed release) and by the load of an unsigned release: every location
must be a plain relative path (no ``..``, not absolute) to an artifact of the release, a
listed one for a signed release, so a model reads nothing that was not hashed with it.

The references are read from the protobuf wire format itself (a robot has no ``onnx``
package), walked message by message from the model to its graphs (subgraphs of
control-flow nodes, functions and training graphs included), their nodes' attributes and
every tensor; each field the walk does not need, the weights above all, is skipped by its
length and never read (``pread`` a block at a time, not a memory map: a file truncated
meanwhile must be a refusal, not SIGBUS). A file that does not parse as an ONNX model has
no references here: its backend refuses it at load.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Collection, Iterable, Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from vlad.errors import VladError
from vlad.files import open_beneath
from vlad.release.artifacts import ByContent, FileCheck

if TYPE_CHECKING:
    from vlad.release.manifest import Manifest

__all__ = ["external_data_problems", "external_data_refs", "release_models"]

# The messages that hold tensors, by the fields that lead to them (onnx.proto3).
_MODEL, _GRAPH, _NODE, _ATTRIBUTE, _SPARSE, _FUNCTION, _TRAINING, _TENSOR = range(8)
_CHILDREN: dict[int, dict[int, int]] = {
    _MODEL: {7: _GRAPH, 20: _TRAINING, 25: _FUNCTION},  # graph, training_info, functions
    _TRAINING: {1: _GRAPH, 2: _GRAPH},  # initialization, algorithm
    _GRAPH: {1: _NODE, 5: _TENSOR, 15: _SPARSE},  # node, initializer, sparse_initializer
    _NODE: {5: _ATTRIBUTE},  # attribute
    _FUNCTION: {7: _NODE, 11: _ATTRIBUTE},  # node, attribute_proto
    # t, g, tensors, graphs, sparse_tensor, sparse_tensors
    _ATTRIBUTE: {5: _TENSOR, 6: _GRAPH, 10: _TENSOR, 11: _GRAPH, 22: _SPARSE, 23: _SPARSE},
    _SPARSE: {1: _TENSOR, 2: _TENSOR},  # values, indices
}
_TENSOR_NAME, _TENSOR_EXTERNAL_DATA = 8, 13
# protobuf's own default recursion limit: a model nested deeper does not load anywhere.
_MAX_DEPTH = 100
_MAX_NAME = 256  # bytes of a tensor name shown in a problem
_MAX_LOCATION = 4095  # bytes of a path (PATH_MAX less the NUL)


class _Malformed(Exception):
    """Not the wire format of a protobuf message."""


class _File:
    """Random access to an open file by ``pread``, one block at a time."""

    BLOCK = 1 << 16

    def __init__(self, fd: int, size: int) -> None:
        self.fd, self.size = fd, size
        self.base, self.block = 0, b""

    def byte(self, pos: int) -> int:
        off = pos - self.base
        if not 0 <= off < len(self.block):
            self.base = pos - pos % self.BLOCK
            self.block = os.pread(self.fd, self.BLOCK, self.base)
            off = pos - self.base
            if off >= len(self.block):
                raise _Malformed  # past the end (the file shrank since its size was taken)
        return self.block[off]

    def read(self, start: int, stop: int, cap: int) -> bytes:
        """``[start, stop)``, at most ``cap`` bytes of it."""
        n = min(stop - start, cap)
        data = os.pread(self.fd, n, start)
        if len(data) != n:
            raise _Malformed
        return data


def external_data_refs(path: str | Path, fd: int | None = None) -> list[tuple[str, str]]:
    """``(tensor name, location)`` of every external data reference of the ONNX model at
    ``path`` (or open as ``fd``, which stays open), in file order; empty for a model without
    any and for a file that is not an ONNX model."""
    own = fd is None
    if fd is None:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        try:
            return list(_walk(_File(fd, size), _MODEL, 0, size, 0))
        except _Malformed:
            return []  # not a model: nothing a backend would read either
    finally:
        if own:
            os.close(fd)


def release_models(manifest: Manifest) -> list[str]:
    """The files of a release whose external data is checked: every ``.onnx`` artifact and
    the backend's artifact whatever its name (ONNX Runtime reads a model by its content)."""
    onnx = {a.path for a in manifest.artifacts if a.path.lower().endswith(".onnx")}
    return sorted(onnx | {manifest.backend.artifact})


# The references of every model walked, by its sha256: a model verified again is not walked again.
_REFS: ByContent[tuple[tuple[str, str], ...]] = ByContent()


def _refs(model: str, fd: int) -> tuple[tuple[str, str], ...]:
    return tuple(external_data_refs(model, fd))


def external_data_problems(
    folder: str | Path,
    models: Iterable[str],
    artifacts: Collection[str] | None,
    hashed: Mapping[str, FileCheck] | None = None,
) -> list[str]:
    """One line per external data location of the ONNX ``models`` (paths relative to
    ``folder``) that breaks the rule: it must be a plain relative path, taken from the
    model's own folder, to one of ``artifacts`` (the manifest's listed paths), or, with
    ``artifacts`` None (an unsigned release), to a regular file inside ``folder`` opened
    without following a link. A model that cannot be opened is left to the caller's
    file checks. ``hashed``: the checks of the files just hashed; a model still the very
    file hashed has its references from an earlier walk of the same bytes, if any."""
    problems = []
    for model in models:
        try:
            fd = open_beneath(folder, model)
        except (OSError, VladError):
            continue
        try:
            check = (hashed or {}).get(model)
            sha256 = check.sha256 if check is not None and check.same_file(os.fstat(fd)) else None
            refs = _REFS.get(sha256, functools.partial(_refs, model, fd))
        finally:
            os.close(fd)
        seen: set[str] = set()
        for tensor, location in refs:
            if location in seen:
                continue
            seen.add(location)
            problem = _location_problem(Path(folder), model, location, artifacts)
            if problem is not None:
                problems.append(f"{model}: tensor {tensor!r} keeps its data in {location!r}, {problem}")
    return problems


def _location_problem(folder: Path, model: str, location: str, artifacts: Collection[str] | None) -> str | None:
    if len(location.encode()) > _MAX_LOCATION:
        return "which is not a file name (longer than a path may be)"
    parts = location.split("/")
    if location.startswith("/") or "\\" in location or ".." in parts or "\x00" in location:
        return "outside the release folder (a model's external data must be an artifact of its release)"
    parts = [p for p in parts if p not in ("", ".")]
    if not parts:
        return "which is not a file name"
    target = PurePosixPath(model).parent.joinpath(*parts).as_posix()
    if artifacts is not None:
        return None if target in artifacts else f"which is not a listed artifact of the release ({target})"
    try:
        os.close(open_beneath(folder, target))
    except FileNotFoundError:
        return f"which is not in the release folder ({target})"
    except (OSError, VladError) as exc:
        return f"which cannot be read there ({exc})"
    return None


def _walk(buf: _File, kind: int, pos: int, end: int, depth: int) -> Iterator[tuple[str, str]]:
    """The references inside the message of ``kind`` at ``buf[pos:end]``."""
    if depth > _MAX_DEPTH:
        raise _Malformed
    if kind == _TENSOR:
        yield from _tensor(buf, pos, end)
        return
    children = _CHILDREN[kind]
    for number, start, stop in _fields(buf, pos, end):
        child = children.get(number)
        if child is not None:
            yield from _walk(buf, child, start, stop, depth + 1)


def _tensor(buf: _File, pos: int, end: int) -> Iterator[tuple[str, str]]:
    name, locations = "", []
    for number, start, stop in _fields(buf, pos, end):
        if number == _TENSOR_NAME:
            name = buf.read(start, stop, _MAX_NAME).decode("utf-8", "replace")
        elif number == _TENSOR_EXTERNAL_DATA:
            # key = 1, value = 2; a location longer than any path is cut, and refused as such
            entry = {n: buf.read(a, b, _MAX_LOCATION + 1) for n, a, b in _fields(buf, start, stop)}
            if entry.get(1) == b"location":
                locations.append(entry.get(2, b"").decode("utf-8", "replace"))
    for location in locations:  # every one, though a reader takes the last: none may leave
        yield name, location


def _fields(buf: _File, pos: int, end: int) -> Iterator[tuple[int, int, int]]:
    """``(field number, start, end)`` of each length-delimited field of the message at
    ``buf[pos:end]``; the other fields are skipped, groups included."""
    while pos < end:
        key, pos = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise _Malformed
        if wire == 2:
            n, pos = _varint(buf, pos, end)
            if pos + n > end:
                raise _Malformed
            yield number, pos, pos + n
            pos += n
        else:
            pos = _skip(buf, number, wire, pos, end)


def _skip(buf: _File, number: int, wire: int, pos: int, end: int, depth: int = 0) -> int:
    if wire == 0:
        return _varint(buf, pos, end)[1]
    if wire in (1, 5):
        pos += 8 if wire == 1 else 4
        if pos > end:
            raise _Malformed
        return pos
    if wire == 3:  # a group: its fields up to the end-group tag of the same number
        if depth > _MAX_DEPTH:
            raise _Malformed
        while True:
            key, pos = _varint(buf, pos, end)
            if key & 7 == 4:
                if key >> 3 != number:
                    raise _Malformed
                return pos
            if key >> 3 == 0:
                raise _Malformed
            if key & 7 == 2:
                n, pos = _varint(buf, pos, end)
                pos += n
                if pos > end:
                    raise _Malformed
            else:
                pos = _skip(buf, key >> 3, key & 7, pos, end, depth + 1)
    raise _Malformed  # an end-group tag without its start, or wire types 6 and 7


def _varint(buf: _File, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while shift < 70:
        if pos >= end:
            raise _Malformed
        byte = buf.byte(pos)
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise _Malformed
