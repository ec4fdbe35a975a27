"""The Mender update module ``vlad-release`` (update module protocol v3).

Mender runs it as ``vlad-release STATE FILES_DIR`` for every state of a deployment whose
artifact has the payload type ``vlad-release``. The payload is a signed release folder's
files (``manifest.toml``, ``manifest.sig`` and every artifact the manifest lists, flat) or
one file ``vlad-release.ref`` naming the release in an OCI registry by digest. The module
never installs anything itself: it hands the release to the running daemon's ``deploy``
as a canary (signature, hashes, downgrade and gate evidence are judged there, never
forced), so a release vlad refuses, or a canary vlad aborts, fails the Mender deployment,
and Mender's phased rollout stops and rolls back.

States (others print nothing and succeed, as the protocol asks):

* ``Download``: nothing; Mender stores the payload in ``FILES_DIR/files``.
* ``ArtifactInstall``: assemble the release folder where the daemon can read it, deploy it
  as a canary, record what was deployed and what served before (``FILES_DIR/tmp``).
* ``NeedsArtifactReboot``: ``No``; ``SupportsRollback``: ``Yes``.
* ``ArtifactCommit``: wait for the canary's verdict (its window plus a margin): passed
  succeeds, aborted or still undecided fails (Mender then runs ``ArtifactRollback``).
* ``ArtifactRollback``: back to the previous release through the daemon, unless the canary
  abort already did that; idempotent.
* ``Cleanup``: remove the assembled folder.

Configuration: ``$VLAD_MENDER_CONFIG`` or ``/etc/vlad/mender.toml`` (optional; see
:class:`ModuleConfig`), ``$VLAD_MENDER_ENDPOINT`` overriding its endpoint. Every failure is
one line on stderr and a non-zero exit, which Mender logs and reports as the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from vlad.errors import DaemonUnreachable, ExitCode, VladError

MODULE = "vlad-release"
DEFAULT_CONFIG = Path("/etc/vlad/mender.toml")
REF_FILE = "vlad-release.ref"
STATE_FILE = "vlad-release.json"  # in FILES_DIR/tmp: Mender keeps it from install to commit
WHO = "mender"
# `host/repo@sha256:<64 hex>`: a reference pinned by digest, never a movable tag
PINNED_REF = re.compile(r"[^\s@]+@sha256:[0-9a-f]{64}")


class ModuleError(VladError):
    """A failure of the module itself (payload, configuration, verdict); one line."""


@dataclass(frozen=True)
class ModuleConfig:
    """``/etc/vlad/mender.toml``: every key optional."""

    daemon_config: str = "/etc/vlad/vlad.toml"  # the daemon's config: its control endpoint and store root
    endpoint: str = ""  # control endpoint; default: the daemon config's sockets.control (as vladctl)
    curve_key: str = ""  # CurveZMQ client secret key file, for a tcp:// endpoint
    curve_server_key: str = ""  # CurveZMQ daemon public key file
    staging_dir: str = ""  # where releases are assembled; default: <store root>/incoming
    keys_dir: str = ""  # trusted keys for an OCI pull; default: the daemon's release.keys_dir
    registry_plain_http: bool = False  # the registry of a vlad-release.ref speaks HTTP (a lab registry)
    registry_ca_file: str = ""  # CA certificate(s) for that registry's TLS; default: the system's
    timeout_ms: int = 2000  # one status / events request (vladctl's --timeout-ms default)
    deploy_timeout_s: float = 300.0  # the deploy request: verify, stage, load and warm on the robot
    canary_margin_s: float = 60.0  # ArtifactCommit waits the canary window plus this
    canary_timeout_s: float = 0.0  # > 0: wait this long instead of window + margin
    poll_s: float = 1.0  # how often ArtifactCommit asks the daemon's status


def load_module_config() -> ModuleConfig:
    """The config file (``$VLAD_MENDER_CONFIG``, else ``/etc/vlad/mender.toml`` if present)."""
    from vlad.files import load_toml

    named = os.environ.get("VLAD_MENDER_CONFIG")
    path = Path(named) if named else DEFAULT_CONFIG
    if named and not path.is_file():
        raise ModuleError(f"$VLAD_MENDER_CONFIG names {path}, which is not a file; fix the variable or create the file")
    data: dict[str, Any] = load_toml(path) if named or path.exists() else {}
    known = {f.name: f for f in fields(ModuleConfig)}
    values: dict[str, Any] = {}
    for key, value in data.items():
        f = known.get(key)
        if f is None:
            raise ModuleError(f"{path}: unknown key {key!r}; known keys: {', '.join(known)}")
        default = f.default
        ok = isinstance(value, type(default)) or (isinstance(default, float) and isinstance(value, int))
        if not ok or (isinstance(value, bool) and not isinstance(default, bool)):
            raise ModuleError(f"{path}: {key} must be a {type(default).__name__}, not {value!r}")
        values[key] = float(value) if isinstance(default, float) else value
    if os.environ.get("VLAD_MENDER_ENDPOINT"):
        values["endpoint"] = os.environ["VLAD_MENDER_ENDPOINT"]
    return ModuleConfig(**values)


class Daemon:
    """The running daemon, asked exactly as ``vladctl`` asks it (:func:`vlad.cli.common.request`)."""

    def __init__(self, cfg: ModuleConfig) -> None:
        self.cfg = cfg
        # The Namespace vladctl's daemon commands parse: request() and with_progress() take it.
        self.args = argparse.Namespace(
            config=cfg.daemon_config,
            endpoint=cfg.endpoint or None,
            timeout_ms=cfg.timeout_ms,
            curve_key=cfg.curve_key or None,
            curve_server_key=cfg.curve_server_key or None,
        )

    def request(self, cmd: str, timeout_s: float | None = None, **kw: Any) -> Any:
        from vlad.cli.common import request

        return request(self.args, cmd, int(timeout_s * 1000) if timeout_s else None, **kw)

    def status(self) -> Any:
        from vlad.snapshot import parse_status

        return parse_status(self.request("status"))

    def daemon_settings(self) -> Any:
        from vlad.cli.common import load_config_or_defaults

        return load_config_or_defaults(self.cfg.daemon_config)


# ---- the record kept from install to commit / rollback -------------------------------------


def record_path(files_dir: Path) -> Path:
    return files_dir / "tmp" / STATE_FILE


def read_record(files_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(record_path(files_dir).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ModuleError(f"{record_path(files_dir)} is unreadable ({exc}); see `vladctl history`") from None
    return data if isinstance(data, dict) else None


def write_record(files_dir: Path, record: dict[str, Any]) -> None:
    """Written whole, then renamed: a crash leaves the old record or the new one."""
    path = record_path(files_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_suffix(".part")
    part.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(part, path)


def artifact_name(files_dir: Path) -> str:
    """The Mender artifact being installed, for the reasons recorded in vlad's history."""
    try:
        return (files_dir / "header" / "artifact_name").read_text().strip() or "(unnamed)"
    except OSError:
        return "(unnamed)"


# ---- states --------------------------------------------------------------------------------


def staging_dir(cfg: ModuleConfig, daemon: Daemon) -> Path:
    if cfg.staging_dir:
        return Path(cfg.staging_dir)
    # Mender's own work tree is root-only (0700); the daemon runs as its own user and
    # reads the release from a folder it can reach: its store's root.
    return Path(daemon.daemon_settings().store.root) / "incoming"


def assembled(files_dir: Path, cfg: ModuleConfig, daemon: Daemon) -> Path:
    """The folder this install's release is assembled in (one per Mender payload tree)."""
    return staging_dir(cfg, daemon) / f"mender-{files_dir.parent.name}"


def assemble(files_dir: Path, dest: Path, cfg: ModuleConfig, daemon: Daemon) -> Path:
    """The payload as a release folder the daemon can read: ``dest``, or the folder an OCI
    pull returned for a ``vlad-release.ref`` payload."""
    payload = files_dir / "files"
    if not payload.is_dir():
        raise ModuleError(f"no payload in {payload}: build the artifact with `-f` for every file of the release")
    names = sorted(p.name for p in payload.iterdir())
    if dest.exists():
        shutil.rmtree(dest)  # a previous try of this same install: start clean
    if not dest.parent.exists():
        dest.parent.mkdir(parents=True)
        # Made by Mender (root, maybe umask 077): the daemon's user must pass through it.
        os.chmod(dest.parent, 0o755)
    if names == [REF_FILE]:
        return pull(payload / REF_FILE, dest, cfg, daemon)
    if "manifest.toml" not in names or "manifest.sig" not in names:
        raise ModuleError(
            f"the payload ({', '.join(names) or 'empty'}) is not a signed release: it needs manifest.toml,"
            f" manifest.sig and every file the manifest lists, or one {REF_FILE}"
        )
    dest.mkdir()
    for name in names:
        src = payload / name
        if src.is_symlink() or not src.is_file():
            raise ModuleError(f"payload file {name} is not a regular file; a release is flat regular files")
        shutil.copyfile(src, dest / name)
        # Readable by the daemon's user whatever umask Mender runs with; the release is
        # signed, not secret, and the store copies it in before anything uses it.
        os.chmod(dest / name, 0o644)
    os.chmod(dest, 0o755)
    return dest


def pull(ref_file: Path, dest: Path, cfg: ModuleConfig, daemon: Daemon) -> Path:
    ref = ref_file.read_text().strip()
    if not PINNED_REF.fullmatch(ref):
        raise ModuleError(
            f"{REF_FILE} holds {ref[:120]!r}, not one reference pinned by digest (host/repo@sha256:<64 hex>)"
        )
    from vlad.fleet.registry import Registry, parse_reference
    from vlad.fleet.registry import pull as registry_pull

    settings = daemon.daemon_settings()
    keys = cfg.keys_dir or os.environ.get("VLAD_KEYS_DIR") or settings.release.keys_dir
    root = Path(settings.store.root)
    registry = Registry(
        parse_reference(ref).host,
        plain_http=cfg.registry_plain_http,
        ca_file=Path(cfg.registry_ca_file) if cfg.registry_ca_file else None,
    )
    print(f"pulling {ref}", flush=True)
    # Verified by the pull (signature first, every blob against its signed digest) and
    # again by the daemon's deploy, like a folder payload. Blobs the robot's store or
    # cache already holds are not downloaded again.
    t = registry_pull(
        ref,
        dest,
        keys_dir=Path(keys),
        cache=root / "blobs",
        store_root=root,
        registry=registry,
        progress=lambda line: print(line, flush=True),
        verify_files=False,  # the deploy verifies the folder while it stages it
    )
    print(t.summary("pulled"), flush=True)
    for p in [dest, *dest.rglob("*")]:  # readable by the daemon's user, as assemble() does
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    return dest


def canary_window_s(folder: Path) -> float:
    """The release's ``[canary] window_s`` (vlad's default when the manifest has none)."""
    from vlad.release.manifest import CANARY_DEFAULTS, read_manifest_document

    window = read_manifest_document(folder).get("canary", {}).get("window_s", CANARY_DEFAULTS["window_s"])
    return float(window)


def artifact_install(files_dir: Path, cfg: ModuleConfig) -> int:
    from vlad.cli.daemon import with_progress

    daemon = Daemon(cfg)
    before = daemon.status()
    if before.canary is not None:
        raise ModuleError(f"a canary of {before.canary.release} is running on this robot; deploy again once it ends")
    dest = assembled(files_dir, cfg, daemon)
    name = artifact_name(files_dir)
    record: dict[str, Any] = {"artifact": name, "staging": str(dest), "previous": before.release, "activated": False}
    write_record(files_dir, record)  # first: Cleanup finds the folder, a crash after the deploy what served before
    folder = assemble(files_dir, dest, cfg, daemon)
    record["window_s"] = canary_window_s(folder)
    print(f"deploying {folder} as a canary (vlad serves {before.release})", flush=True)
    r = with_progress(
        daemon.args,
        lambda: daemon.request(
            "deploy",
            cfg.deploy_timeout_s,
            path=str(folder),
            who=WHO,
            why=f"Mender artifact {name}",
            canary=True,
            force=False,  # never: vlad's refusal is the deployment's failure
        ),
    )
    record.update(activated=True, release=r["release"], previous=r["previous"], deployed_at=time.time())
    write_record(files_dir, record)
    print(f"deployed {r['release']} as a canary for {record['window_s']:g} s; previous {r['previous']}", flush=True)
    return 0


def canary_abort_reason(daemon: Daemon, release: str) -> str | None:
    from vlad.snapshot import parse_events

    aborts = [
        e
        for e in parse_events(daemon.request("events", limit=200))
        if e.kind == "canary_abort" and e.details.get("release") == release
    ]
    return aborts[-1].reason if aborts else None


def artifact_commit(files_dir: Path, cfg: ModuleConfig) -> int:
    record = read_record(files_dir)
    if not record or not record.get("activated"):
        raise ModuleError("no release deployed by this install to commit; see `vladctl history`")
    daemon = Daemon(cfg)
    release, previous = str(record["release"]), str(record["previous"])
    window = float(record["window_s"])
    left = max(0.0, float(record["deployed_at"]) + window - time.time())
    budget = cfg.canary_timeout_s if cfg.canary_timeout_s > 0 else left + cfg.canary_margin_s
    deadline = time.monotonic() + budget
    shown = -1
    while True:
        try:
            st = daemon.status()
        except DaemonUnreachable as exc:
            if time.monotonic() >= deadline:
                raise ModuleError(f"no verdict on the canary of {release}: {exc}") from None
            print(f"waiting for vlad: {exc}", flush=True)
            time.sleep(cfg.poll_s)
            continue
        if st.canary is not None and st.canary.release == release:
            if int(st.canary.elapsed_s) // 5 != shown:  # a line every 5 s of the window
                shown = int(st.canary.elapsed_s) // 5
                print(f"canary of {release}: {st.canary.elapsed_s:.0f}/{st.canary.window_s:.0f} s", flush=True)
        elif st.canary is None and st.release == release:
            print(f"canary of {release} passed; vlad serves it", flush=True)
            return 0
        else:
            reason = canary_abort_reason(daemon, release)
            if reason is not None:
                raise ModuleError(f"{reason}; vlad serves {st.release} again")
            raise ModuleError(
                f"vlad serves {st.release}, not {release} (previous {previous}): changed outside this deployment;"
                " see `vladctl history`"
            )
        if time.monotonic() >= deadline:
            raise ModuleError(
                f"the canary of {release} has no verdict after {budget:.0f} s (window {window:g} s);"
                " failing the deployment, which rolls it back"
            )
        time.sleep(cfg.poll_s)


def artifact_rollback(files_dir: Path, cfg: ModuleConfig) -> int:
    record = read_record(files_dir)
    if not record or not record.get("activated"):
        print("nothing to roll back: this install activated no release", flush=True)
        return 0
    if record.get("rolled_back"):
        print(f"already rolled back to {record['previous']}", flush=True)
        return 0
    daemon = Daemon(cfg)
    release, previous = str(record["release"]), str(record["previous"])
    st = daemon.status()
    if st.release == previous and st.canary is None:
        print(f"vlad already serves {previous} (the canary of {release} was aborted)", flush=True)
    elif st.release == release:
        r = daemon.request(
            "rollback", cfg.deploy_timeout_s, who=WHO, why=f"Mender rolled back artifact {record['artifact']}"
        )
        print(f"rolled back to {r['release']} (from {r.get('aborted') or r.get('rolled_back_from')})", flush=True)
    else:
        raise ModuleError(
            f"vlad serves {st.release}, neither {release} (this deployment) nor {previous}: not rolling back"
            " a release someone else deployed; see `vladctl history`"
        )
    record["rolled_back"] = True
    write_record(files_dir, record)
    return 0


def cleanup(files_dir: Path, cfg: ModuleConfig) -> int:
    """Remove the assembled folder (an OCI pull's lies beneath it too): the store copied the
    release in when it staged it. Mender removes FILES_DIR/tmp, the record, itself."""
    record = read_record(files_dir)
    if record and record.get("staging"):
        shutil.rmtree(record["staging"], ignore_errors=True)
    return 0


QUERIES = {"NeedsArtifactReboot": "No", "SupportsRollback": "Yes", "ProvidePayloadFileSizes": "No"}
STATES = {
    "ArtifactInstall": artifact_install,
    "ArtifactCommit": artifact_commit,
    "ArtifactRollback": artifact_rollback,
    "Cleanup": cleanup,
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print(f"usage: {MODULE} STATE FILES_DIR (run by the Mender client)", file=sys.stderr)
        return ExitCode.ERROR
    state, files_dir = argv[0], Path(argv[1])
    if state in QUERIES:
        print(QUERIES[state])
        return 0
    run = STATES.get(state)
    if run is None:  # Download, ArtifactFailure, states of later protocols: nothing to do
        return 0
    try:
        return run(files_dir, load_module_config())
    except DaemonUnreachable as exc:
        print(f"{MODULE}: {state}: {exc}", file=sys.stderr)
        return ExitCode.UNREACHABLE
    except (VladError, OSError) as exc:
        print(f"{MODULE}: {state}: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    except Exception as exc:  # Mender shows stderr to whoever reads the deployment log: one line
        print(f"{MODULE}: {state}: unexpected {type(exc).__name__}: {exc} (a bug: please report it)", file=sys.stderr)
        return ExitCode.ERROR


if __name__ == "__main__":
    sys.exit(main())
