"""The on-robot release store: verified copies, ``active``/``previous`` pointers, a journal.

Layout under the root (``/var/lib/vlad`` by default; docs/releases.md explains it)::

    releases/<release_id>/      verified, read-only copies (manifest, signature, artifacts)
    releases/active             -> ../current/active     (fixed links: the daemon reads
    releases/previous           -> ../current/previous    releases/active)
    current                     -> .ptr-<n>               the ONE switched pointer
    .ptr-<n>/active             -> ../releases/<id>
    .ptr-<n>/previous           -> ../releases/<id>
    engines/<cache_key>/        engine caches built on this robot (never removed here)
    history.jsonl               journal of activations and rollbacks (intent, then done)

Gate evidence: activation and rollback make a release active only through
:mod:`vlad.release.evidence` (passing evidence, or ``force`` with a reason, recorded in the
journal with what it overrode). Hashing: staging hashes each artifact once, while it
copies; the :class:`~vlad.release.signing.VerifiedRelease` it returns can be handed to
:meth:`ReleaseStore.activate` (and the daemon's loader) so they compare file identities
instead of hashing again (:mod:`vlad.release.artifacts`).

Atomicity: a release directory becomes visible only by ``rename`` of a complete,
re-verified temp copy; ``active`` and ``previous`` switch together by renaming one
symlink (``current``) over the old one after the new generation directory and the temp
link are fsynced. A kill at any instant therefore leaves the old or the new pair, never a
mix, and never a half-copied release under its name. The pointers are authoritative; the
journal is written ahead (intent) and completed (done) and reconciled with the pointers
when a store is opened.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import fcntl
import getpass
import json
import os
import re
import secrets
import shutil
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vlad.errors import VladError
from vlad.files import read_bytes_beneath
from vlad.release.artifacts import Progress, copy_artifacts
from vlad.release.evidence import require_verified_evidence
from vlad.release.manifest import MANIFEST_FILE, MAX_MANIFEST_BYTES, RELEASE_ID_RE, SIGNATURE_FILE, rfc3339
from vlad.release.signing import (
    DEFAULT_KEYS_DIR,
    MAX_SIGNATURE_BYTES,
    IntegrityError,
    ValidityError,
    VerifiedRelease,
    verify_release,
)
from vlad.schema import LINE_MAX_LEN, line_problem, one_line

__all__ = ["DEFAULT_ROOT", "DowngradeRefused", "HistoryEntry", "ReleaseStore", "StoreError", "default_operator"]

DEFAULT_ROOT = Path("/var/lib/vlad")
_PTR_RE = re.compile(r"\.ptr-(\d+)")
_CACHE_KEY_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}")

# Tests set this (in a subprocess) to a crash point name to SIGKILL the process there.
# Points: stage_copied, stage_renamed, intent_logged, pointer_dir_written,
# pointer_temp_written, after_rename, done_logged.
_CRASH_AT: str | None = None


def _crash_point(name: str) -> None:
    if _CRASH_AT == name:
        os.kill(os.getpid(), signal.SIGKILL)


class StoreError(VladError):
    """A store operation was refused or the store is unusable."""


class DowngradeRefused(StoreError):
    """Activating an older, never-activated release (or one marked bad) without ``force``."""


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One completed activation or rollback from ``history.jsonl``."""

    seq: int
    time: str
    event: str  # "activate" | "rollback"
    who: str
    why: str
    from_release: str | None
    to_release: str
    from_version_code: int | None
    to_version_code: int | None
    forced: bool = False
    recovered: bool = False
    # Gate evidence of to_release when it was made active: "passed", "missing" or
    # "failed" (then forced); None in records written before the journal kept it.
    evidence: str | None = None
    evidence_problems: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()  # what ``forced`` overrode, one line each

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> HistoryEntry:
        """The entry of a journal record, its text safe to print whoever wrote it: every
        control or format character escaped, ``who``, ``why`` and the other single values
        cut at :data:`~vlad.schema.LINE_MAX_LEN` characters (a journal written before the
        store refused such text may hold any; the journal itself keeps what was written)."""
        names = {f.name for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for key, value in record.items():
            if key not in names:
                continue
            if isinstance(value, list):
                value = tuple(one_line(v, None) if isinstance(v, str) else v for v in value)
            elif isinstance(value, str):
                value = one_line(value, LINE_MAX_LEN)
            values[key] = value
        return cls(**values)

    def flags(self) -> str:
        """`` [forced: evidence missing, downgrade]`` etc. for one-line listings."""
        out = []
        if self.forced:
            what = [o.split(":", 1)[0] for o in self.overrides]
            out.append(f"[forced: {', '.join(what)}]" if what else "[forced]")
        if self.evidence is None:
            out.append("[evidence not recorded]")
        if self.recovered:
            out.append("[recovered]")
        return (" " + " ".join(out)) if out else ""


def default_operator() -> str:
    """Who is acting: ``$VLAD_OPERATOR``, else ``$SUDO_USER``, else the login name."""
    for var in ("VLAD_OPERATOR", "SUDO_USER"):
        if os.environ.get(var):
            return os.environ[var]
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid:{os.getuid()}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_new(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _extra_files(src: VerifiedRelease) -> list[str]:
    from vlad.release.signing import extra_files

    return extra_files(src.path, src.manifest)


def _known(verified: VerifiedRelease | None, path: Path) -> Any:
    """The hashes of an earlier step of this operation, when they describe ``path``."""
    if verified is None or verified.path.resolve() != path.resolve():
        return None
    return verified.files


def _evidence_override(evidence: dict[str, Any]) -> list[str]:
    if evidence["evidence"] == "passed":
        return []
    return [f"evidence {evidence['evidence']}: " + "; ".join(evidence.get("evidence_problems", []))]


def _operator_text(who: str | None, why: str) -> str:
    """``who`` (default: :func:`default_operator`), once it and ``why`` are each one line of
    text: :func:`vlad.schema.line_problem`, the rule the daemon's control server applies to
    the same arguments, so every path to "active" records the same kind of text."""
    who = who or default_operator()
    for name, value in (("who", who), ("why", why)):
        problem = line_problem(value) if isinstance(value, str) else "expected a string"
        if problem is not None:
            raise StoreError(f"--{name}: {problem}")
    return who


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ReleaseStore:
    """Verified releases under ``root`` with atomically switched ``active``/``previous``.

    Opening a store it may write to cleans what an interrupted operation left behind
    (temp copies, pointer temps, unfinished journal records); see :meth:`recover`.
    """

    def __init__(
        self,
        root: str | Path = DEFAULT_ROOT,
        keys_dir: str | Path = DEFAULT_KEYS_DIR,
        *,
        create: bool = True,
        recover: bool = True,
        lock_timeout_s: float = 5.0,
    ) -> None:
        self.root = Path(root)
        self.keys_dir = Path(keys_dir)
        self.lock_timeout_s = lock_timeout_s
        self.releases_dir = self.root / "releases"
        self.engines_dir = self.root / "engines"
        self.history_path = self.root / "history.jsonl"
        if create:
            for d in (self.root, self.releases_dir, self.engines_dir):
                d.mkdir(parents=True, exist_ok=True)
        elif not self.releases_dir.is_dir():
            raise StoreError(f"{self.root}: not a release store (no releases/)")
        if recover and os.access(self.root, os.W_OK):
            self.recover()

    # ---- reading ---------------------------------------------------------------------

    def release_path(self, release_id: str) -> Path:
        """The folder of a staged release (StoreError for an invalid or unknown id)."""
        if not RELEASE_ID_RE.fullmatch(release_id) or release_id in ("active", "previous"):
            raise StoreError(f"{release_id!r} is not a release id")
        path = self.releases_dir / release_id
        if path.is_symlink() or not path.is_dir():
            raise StoreError(
                f"release {release_id} is not staged in {self.releases_dir} "
                f"(staged: {', '.join(self.list_releases()) or 'none'})"
            )
        return path

    def list_releases(self) -> list[str]:
        """Ids of the staged releases (temp copies and the pointer links are not releases)."""
        return sorted(
            p.name
            for p in self.releases_dir.iterdir()
            if not p.name.startswith(".") and not p.is_symlink() and p.is_dir()
        )

    def _pointer(self, name: str) -> str | None:
        try:
            return Path(os.readlink(self.root / "current" / name)).name
        except (FileNotFoundError, NotADirectoryError):
            return None

    def active(self) -> str | None:
        """The active release id, or None before the first activation."""
        return self._pointer("active")

    def previous(self) -> str | None:
        """The release a rollback returns to, or None."""
        return self._pointer("previous")

    def active_path(self) -> Path | None:
        """The active release's folder, resolved once: read files through this, not the link."""
        active = self.active()
        return self.releases_dir / active if active else None

    def engine_cache_dir(self, cache_key: str) -> Path:
        """``engines/<cache_key>/`` (created): where a backend keeps engines built on this robot."""
        if not _CACHE_KEY_RE.fullmatch(cache_key):
            raise StoreError(f"{cache_key!r} is not a valid engine cache key")
        path = self.engines_dir / cache_key
        path.mkdir(parents=True, exist_ok=True)
        return path

    def journal(self) -> list[dict[str, Any]]:
        """Every record of ``history.jsonl`` (intents, completions, aborts), oldest first."""
        try:
            text = self.history_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        records = []
        for line in text.splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a torn last line from a crash; recover() truncates it
        return records

    def history(self) -> list[HistoryEntry]:
        """Completed activations and rollbacks, oldest first."""
        return [HistoryEntry.from_record(r) for r in self.journal() if r.get("phase") == "done"]

    def last_activation(self, release_id: str) -> HistoryEntry | None:
        """The newest completed activation or rollback that made ``release_id`` active."""
        return next((e for e in reversed(self.history()) if e.to_release == release_id), None)

    def activated_versions(self) -> set[int]:
        """``version_code`` of every release ever activated here (and of the current pair)."""
        codes = {e.to_version_code for e in self.history() if e.to_version_code is not None}
        codes |= {e.from_version_code for e in self.history() if e.from_version_code is not None}
        for rid in (self.active(), self.previous()):
            if rid:
                with contextlib.suppress(StoreError, VladError, OSError):
                    codes.add(self._version_code(rid))
        return codes

    def activated_releases(self) -> set[str]:
        """Ids of every release ever activated here (and the current pair)."""
        ids = {e.to_release for e in self.history()}
        ids |= {r for r in (self.active(), self.previous()) if r}
        return ids

    def bad_releases(self) -> set[str]:
        """Releases rolled back from and not re-activated since: activation needs ``force``."""
        bad: set[str] = set()
        for e in self.history():
            bad.discard(e.to_release)
            if e.event == "rollback" and e.from_release:
                bad.add(e.from_release)
        return bad

    def _version_code(self, release_id: str) -> int:
        from vlad.release.manifest import read_manifest_document

        return int(read_manifest_document(self.releases_dir / release_id)["release"]["version_code"])

    # ---- staging ---------------------------------------------------------------------

    def stage(
        self,
        src_dir: str | Path,
        keys_dir: str | Path | None = None,
        now: dt.datetime | None = None,
        progress: Progress | None = None,
    ) -> str:
        """Verify the release folder ``src_dir`` and copy it into the store; returns its id
        (:meth:`stage_release` returns the verification too)."""
        return self.stage_release(src_dir, keys_dir, now, progress).id

    def stage_release(
        self,
        src_dir: str | Path,
        keys_dir: str | Path | None = None,
        now: dt.datetime | None = None,
        progress: Progress | None = None,
    ) -> VerifiedRelease:
        """Verify the release folder ``src_dir`` and copy it into the store.

        The source's signature, manifest and window are checked first; the artifacts are
        then copied into a temp folder inside ``releases/`` and hashed in the same pass
        (each file fsynced, read-only), the copy's manifest and signature verified again
        (the source may change meanwhile) and the folder renamed into place. Staging an
        identical release again copies nothing, but the folder offered is verified in full
        (refused as ``vladctl verify`` refuses it) and the staged copy too; a different
        release under a staged id is refused. A release whose not_before lies ahead may be staged; an expired one may
        not. Returns the staged copy's verification: pass it to :meth:`activate` (and the
        loader) so that nothing is hashed twice.
        """
        keys = Path(keys_dir) if keys_dir is not None else self.keys_dir
        now = now or dt.datetime.now(dt.UTC)
        src = verify_release(src_dir, keys, now, check_time=False, check_files=False)
        if now >= src.manifest.release.expires:
            raise ValidityError(
                f"release {src.path}: {src.id} expired at {rfc3339(src.manifest.release.expires)}; not staging it"
            )
        dest = self.releases_dir / src.id
        if dest.exists():
            return self._already_staged(src, dest, keys, now, progress)
        extra = [p for p in _extra_files(src) if p]
        if extra:
            raise IntegrityError(f"release {src.path}", extra)
        if not os.access(self.releases_dir, os.W_OK):
            raise StoreError(f"{self.releases_dir}: no permission to stage releases (run as root or the vlad user)")
        tmp = self.releases_dir / f".stage-{os.getpid()}-{secrets.token_hex(4)}"
        tmp.mkdir()
        try:
            for name, limit in ((MANIFEST_FILE, MAX_MANIFEST_BYTES), (SIGNATURE_FILE, MAX_SIGNATURE_BYTES)):
                _write_new(tmp / name, read_bytes_beneath(src.path, name, limit))
            copied = copy_artifacts(
                src.path, tmp, ((a.path, a.size, a.sha256) for a in src.manifest.artifacts), progress=progress
            )
            if copied.problems:
                raise IntegrityError(f"release {src.path}", copied.problems)
            if progress is not None:
                progress(copied.summary)
            for d in sorted({p.parent for p in tmp.rglob("*")} | {tmp}, key=lambda p: -len(p.parts)):
                _fsync_dir(d)
            _crash_point("stage_copied")
            # The copy's own bytes decide: signature over the manifest copied, every file
            # the one just hashed (identities compared, nothing read again).
            staged = verify_release(tmp, keys, now, check_time=False, known=copied.checks)
            with self._lock():
                if dest.exists():
                    return self._already_staged(src, dest, keys, now, progress)
                os.rename(tmp, dest)
                _fsync_dir(self.releases_dir)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        _crash_point("stage_renamed")
        return dataclasses.replace(
            staged, path=dest.resolve(), hashing=copied.summary, hashed_bytes=copied.hashed_bytes
        )

    def _already_staged(
        self, src: VerifiedRelease, dest: Path, keys: Path, now: dt.datetime, progress: Progress | None
    ) -> VerifiedRelease:
        """The staged copy of the release ``src`` offers again, once both are found intact.

        The folder offered is judged in full, as ``vladctl verify`` judges it (every file,
        no link, nothing unlisted): a staged copy must never hide that the folder offered
        is not intact. Then the staged copy, which is what activation and loading read.
        """
        staged = verify_release(dest, keys, now, check_time=False, check_files=False)
        if staged.manifest.canonical_bytes() != src.manifest.canonical_bytes():
            raise StoreError(
                f"release {src.id} is already staged with a different manifest; "
                f"a changed release needs a new release id"
            )
        if src.path != dest.resolve():  # the staged folder itself offered: judged once, below
            verify_release(src.path, keys, now, check_time=False, progress=progress)
        return verify_release(dest, keys, now, check_time=False, progress=progress)

    # ---- switching -------------------------------------------------------------------

    def activate(
        self,
        release_id: str,
        who: str | None = None,
        why: str = "",
        force: bool = False,
        now: dt.datetime | None = None,
        verified: VerifiedRelease | None = None,
        progress: Progress | None = None,
    ) -> HistoryEntry:
        """Make a staged release active; the active one becomes ``previous``.

        The release is verified again (signature, validity window, every file; with
        ``verified``, the result of this operation's staging or loading, files still the
        ones hashed then are not hashed again). Refused without ``force`` (and a ``why``):
        gate evidence missing or failed (:class:`~vlad.release.evidence.EvidenceMissing`);
        a ``version_code`` lower than the highest ever activated here for a release never
        activated here, and a release marked bad by a rollback (:class:`DowngradeRefused`).
        An integrity failure is never overridden. ``who`` and ``why`` must each be one line
        of text (:func:`vlad.schema.line_problem`), checked before anything is read.
        """
        who = _operator_text(who, why)
        with self._lock():
            path = self.release_path(release_id)
            current = self.active()
            if current == release_id:
                raise StoreError(f"release {release_id} is already active")
            verified = verify_release(path, self.keys_dir, now, known=_known(verified, path), progress=progress)
            if verified.id != release_id:
                raise StoreError(f"{path}: holds release {verified.id}, not {release_id}")
            evidence = require_verified_evidence(
                verified, path, force=force, why=why, retry=f"vladctl release activate {release_id} --force --why '...'"
            )
            overrides = _evidence_override(evidence)
            code = verified.manifest.release.version_code
            seen = self.activated_versions()
            # A release that never ran here must be newer than everything that did: a
            # reused (or lower) version_code is refused, whatever release carries it.
            if seen and release_id not in self.activated_releases() and code <= max(seen):
                if not force:
                    raise DowngradeRefused(
                        f"release {release_id} (version_code {code}) is not newer than releases already "
                        f"activated here (highest version_code {max(seen)}) and was never active here; "
                        f"use --force --why '...' to downgrade deliberately"
                    )
                overrides.append(f"downgrade: version_code {code} <= {max(seen)} activated here")
            if release_id in self.bad_releases():
                if not force:
                    raise DowngradeRefused(
                        f"release {release_id} was rolled back from; use --force --why '...' to activate it again"
                    )
                overrides.append(f"bad release: {release_id} was rolled back from")
            return self._switch("activate", release_id, current, who, why, force, code, evidence, overrides)

    def rollback(
        self,
        who: str | None = None,
        why: str = "",
        force: bool = False,
        verified: VerifiedRelease | None = None,
        progress: Progress | None = None,
    ) -> HistoryEntry:
        """Swap ``active`` and ``previous``: the one-step rollback, always allowed by version.

        The release rolled back from becomes ``previous`` (so the step can be undone) but
        is marked bad: rolling back again to it needs ``force``. The target is verified
        (signature and files) but not against its validity window: returning to the release
        that ran here before must not be blocked by a date. Its gate evidence is judged
        like an activation's: a target without passing evidence (e.g. one activated before
        the evidence rule) needs ``force`` and a ``why``. ``who`` and ``why`` as for
        :meth:`activate`.
        """
        who = _operator_text(who, why)
        with self._lock():
            current, target = self.active(), self.previous()
            if target is None or target == current:
                raise StoreError("nothing to roll back to (no previous release)")
            overrides: list[str] = []
            if target in self.bad_releases():
                if not force:
                    raise DowngradeRefused(
                        f"previous release {target} was rolled back from; use --force --why '...' to return to it"
                    )
                overrides.append(f"bad release: {target} was rolled back from")
            path = self.release_path(target)
            verified = verify_release(
                path, self.keys_dir, check_time=False, known=_known(verified, path), progress=progress
            )
            evidence = require_verified_evidence(
                verified, path, force=force, why=why, retry="vladctl rollback --force --why '...'"
            )
            overrides = _evidence_override(evidence) + overrides
            return self._switch(
                "rollback",
                target,
                current,
                who,
                why,
                force,
                verified.manifest.release.version_code,
                evidence,
                overrides,
            )

    def _switch(
        self,
        event: str,
        to: str,
        from_: str | None,
        who: str,
        why: str,
        forced: bool,
        to_code: int,
        evidence: dict[str, Any],
        overrides: list[str],
    ) -> HistoryEntry:
        records = self.journal()
        record: dict[str, Any] = {
            "seq": max((r.get("seq", 0) for r in records), default=0) + 1,
            "time": rfc3339(dt.datetime.now(dt.UTC)),
            "event": event,
            "phase": "intent",
            "who": who,
            "why": why,
            "from_release": from_,
            "to_release": to,
            "from_version_code": self._version_code(from_) if from_ else None,
            "to_version_code": to_code,
            "forced": forced,
            **evidence,
            "overrides": overrides,
        }
        self._append(record)
        _crash_point("intent_logged")

        old_gen = self._generation()
        gen_dir = self.root / f".ptr-{(old_gen or 0) + 1}"
        if gen_dir.exists():
            shutil.rmtree(gen_dir)  # left by an interrupted switch; current never pointed here
        gen_dir.mkdir()
        os.symlink(f"../releases/{to}", gen_dir / "active")
        if from_:
            os.symlink(f"../releases/{from_}", gen_dir / "previous")
        _fsync_dir(gen_dir)
        _fsync_dir(self.root)
        _crash_point("pointer_dir_written")

        tmp_link = self.root / ".current.tmp"
        tmp_link.unlink(missing_ok=True)
        os.symlink(gen_dir.name, tmp_link)
        _fsync_dir(self.root)
        _crash_point("pointer_temp_written")
        os.replace(tmp_link, self.root / "current")  # the commit point
        _fsync_dir(self.root)
        _crash_point("after_rename")

        done = {**record, "phase": "done", "time": rfc3339(dt.datetime.now(dt.UTC))}
        self._append(done)
        _crash_point("done_logged")
        if old_gen is not None:
            shutil.rmtree(self.root / f".ptr-{old_gen}", ignore_errors=True)
        self._ensure_links()
        return HistoryEntry.from_record(done)

    def _generation(self) -> int | None:
        try:
            m = _PTR_RE.fullmatch(os.readlink(self.root / "current"))
        except FileNotFoundError:
            return None
        return int(m.group(1)) if m else None

    def _append(self, record: dict[str, Any]) -> None:
        new = not self.history_path.exists()
        fd = os.open(self.history_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(record, sort_keys=True) + "\n").encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        if new:
            _fsync_dir(self.root)

    def _ensure_links(self) -> None:
        for name in ("active", "previous"):
            link = self.releases_dir / name
            if not link.is_symlink():
                if link.exists():
                    raise StoreError(f"{link} exists and is not the store's link; move it away")
                os.symlink(f"../current/{name}", link)

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        """One writer at a time (two vladctl runs, or vladctl and an updater)."""
        try:
            fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        except PermissionError as exc:
            raise StoreError(
                f"{self.root}: no permission to change the release store (run as root or the vlad user)"
            ) from exc
        try:
            # Bounded: a stuck or slow other writer must not freeze the caller (the daemon
            # answers its control requests from a thread pool, vladctl a human).
            deadline = time.monotonic() + self.lock_timeout_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise StoreError(
                            f"{self.root}: the release store is locked by another process "
                            f"(waited {self.lock_timeout_s:g} s); try again"
                        ) from None
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)

    # ---- maintenance -----------------------------------------------------------------

    def recover(self) -> list[str]:
        """Clean up after an interrupted operation; returns what was done, one line each.

        Removes temp copies of dead processes, pointer temps and unused pointer
        generations, truncates a torn journal line, and closes an unfinished journal intent
        as ``done`` (recovered) or ``aborted`` according to the pointers, which are
        authoritative.
        """
        done: list[str] = []
        with self._lock():
            for p in self.releases_dir.glob(".*"):
                m = re.fullmatch(r"\.(stage|trash)-(\d+)-[0-9a-f]+", p.name)
                if m and not (m.group(1) == "stage" and _pid_alive(int(m.group(2)))):
                    shutil.rmtree(p, ignore_errors=True)
                    done.append(f"removed interrupted {m.group(1)} folder {p.name}")
            tmp_link = self.root / ".current.tmp"
            if tmp_link.is_symlink():
                tmp_link.unlink()
                done.append("removed an unused pointer temp link")
            gen = self._generation()
            for p in self.root.glob(".ptr-*"):
                if p.name != f".ptr-{gen}":
                    shutil.rmtree(p, ignore_errors=True)
                    done.append(f"removed unused pointer generation {p.name}")
            done += self._recover_journal()
            if gen is not None:
                self._ensure_links()
        return done

    def _recover_journal(self) -> list[str]:
        try:
            data = self.history_path.read_bytes()
        except FileNotFoundError:
            return []
        out = []
        if data and not data.endswith(b"\n"):
            with open(self.history_path, "r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)
                os.fsync(f.fileno())
            out.append("truncated a torn journal line")
        records = self.journal()
        if not records or records[-1].get("phase") != "intent":
            return out
        intent = records[-1]
        committed = self.active() == intent["to_release"] and self.previous() == intent["from_release"]
        phase = "done" if committed else "aborted"
        self._append({**intent, "phase": phase, "recovered": True, "time": rfc3339(dt.datetime.now(dt.UTC))})
        out.append(f"journal: interrupted {intent['event']} to {intent['to_release']} marked {phase}")
        return out

    def gc(self, keep: int = 3) -> list[str]:
        """Remove staged releases that are neither active, previous nor among the ``keep``
        most recently activated; returns their ids. Engine caches are never removed here.
        """
        with self._lock():
            protected = {self.active(), self.previous()}
            recent: list[str] = []
            for e in reversed(self.history()):
                if e.to_release not in recent:
                    recent.append(e.to_release)
            protected |= set(recent[:keep])
            removed = []
            for rid in self.list_releases():
                if rid in protected:
                    continue
                # Rename first: a half-deleted folder must never be visible as a release.
                trash = self.releases_dir / f".trash-{os.getpid()}-{secrets.token_hex(4)}"
                os.rename(self.releases_dir / rid, trash)
                _fsync_dir(self.releases_dir)
                shutil.rmtree(trash, ignore_errors=True)
                removed.append(rid)
            return removed
