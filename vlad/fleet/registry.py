"""Releases as OCI artifacts: pushed to and pulled from any registry that speaks the OCI
distribution protocol (docs/fleet.md).

One OCI image manifest per release, one blob per file, so the pulled folder is byte for
byte the signed release folder::

    manifest   application/vnd.oci.image.manifest.v1+json, artifactType ARTIFACT_TYPE
    config     CONFIG_TYPE: {"release", "version", "version_code"} (what a registry UI shows)
    layers     manifest.toml (MANIFEST_TYPE), manifest.sig (SIGNATURE_TYPE), then every
               artifact in manifest order (FILE_TYPE), each annotated with its path
               (org.opencontainers.image.title, as ORAS names files) and role

A blob's digest is the sha256 its signed manifest lists, so the signature binds every
byte: a pull verifies the signature of manifest.toml (fetched first, with manifest.sig)
before it asks for any other blob, then requires the layers to be exactly the signed
artifacts (path, size, digest), and streams each blob into a content-addressed cache
while hashing it: a tampered or truncated blob is refused there, before anything is
staged. The folder is then verified once more as the store would (:func:`verify_release`).

Content addressing: a blob already in the cache (``<cache>/sha256/<hex>``), or a file of a
release already in the store with the same signed sha256, is not transferred again; a
variant release over the same base weights moves only its own files. An interrupted
download leaves ``<hex>.partial`` and the next pull resumes it with an HTTP range request.
Push skips blobs the registry already holds (HEAD) and uploads the rest monolithically.

Transport: HTTPS by default (the system's CA store, or ``ca_file``); plain HTTP only when
asked (a registry on loopback or a lab network). Authentication: the registry's 401
challenge is answered, ``Basic`` with the credentials, ``Bearer`` by fetching a token from
the realm it names (the distribution token protocol), with credentials from
``$VLAD_REGISTRY_USER``/``$VLAD_REGISTRY_PASSWORD`` or a containers auth file
(``auths.<host>.auth``, as ``skopeo login``/``docker login`` write it).

The protocol is written here by hand on :mod:`http.client` rather than with the ``oras``
SDK: it is six requests, the robot install gains no dependency, and the pull can verify
the signature before downloading, hash while streaming, resume with a range request and
take blobs from the local store: none of which the SDK's pull offers.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import http.client
import json
import os
import re
import shutil
import ssl
import time
import tomllib
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from vlad.errors import VladError
from vlad.files import hash_file
from vlad.release.manifest import MANIFEST_FILE, MAX_MANIFEST_BYTES, SIGNATURE_FILE, Manifest
from vlad.release.signing import DEFAULT_KEYS_DIR, MAX_SIGNATURE_BYTES, verify_release

__all__ = [
    "ARTIFACT_TYPE",
    "Reference",
    "Registry",
    "RegistryError",
    "Transfer",
    "parse_reference",
    "pull",
    "push",
]

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
ARTIFACT_TYPE = "application/vnd.vlad.release.v1"
CONFIG_TYPE = "application/vnd.vlad.release.config.v1+json"
MANIFEST_TYPE = "application/vnd.vlad.release.manifest.v1+toml"
SIGNATURE_TYPE = "application/vnd.vlad.release.signature.v1+json"
FILE_TYPE = "application/vnd.vlad.release.file.v1"
TITLE = "org.opencontainers.image.title"
ROLE = "io.vlad.release.role"

MAX_OCI_MANIFEST_BYTES = 4 << 20  # the distribution registry's own limit
MAX_LAYERS = 10_000
BLOCK = 1 << 20
TIMEOUT_S = 60.0  # per socket operation
DEADLINE_S = 3600.0  # a whole pull (tens of GB over a slow link fit; a registry that trickles does not)
_DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
_REPO_RE = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*")
_TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_HOST_RE = re.compile(r"(?:[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?")

DEFAULT_CACHE = Path("/var/lib/vlad/blobs")  # beside the store's default root
Progress = Callable[[str], None]


class RegistryError(VladError):
    """A registry refused, failed or served something that is not the signed release."""


# -- references ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reference:
    """``host[:port]/repository[:tag][@sha256:...]``: where a release lives in a registry."""

    host: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    def __str__(self) -> str:
        tail = (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")
        return f"{self.host}/{self.repository}{tail}"

    @property
    def pinned(self) -> str:
        """The reference by digest (what a fleet deploys)."""
        return f"{self.host}/{self.repository}@{self.digest}"


def parse_reference(text: str) -> Reference:
    """Parse an OCI reference; the registry host is always named (no implicit docker.io)."""
    if not isinstance(text, str) or not text or len(text) > 1024 or not text.isprintable() or " " in text:
        raise RegistryError(f"not an OCI reference: {text[:80]!r} (expected host[:port]/repository[:tag][@sha256:...])")
    rest, _, digest = text.partition("@")
    host, slash, path = rest.partition("/")
    tag = None
    last = path.rsplit("/", 1)[-1]
    if ":" in last:
        path, _, tag = path.rpartition(":")
    problems = []
    if not slash or not _HOST_RE.fullmatch(host) or ("." not in host and ":" not in host and host != "localhost"):
        problems.append(f"registry host {host!r} (a name with a dot or a port, or localhost)")
    if not _REPO_RE.fullmatch(path) or len(path) > 255:
        problems.append(f"repository {path!r} (lower-case path components)")
    if tag is not None and not _TAG_RE.fullmatch(tag):
        problems.append(f"tag {tag!r}")
    if digest and not _DIGEST_RE.fullmatch(digest):
        problems.append(f"digest {digest[:80]!r} (sha256: and 64 lower-case hex digits)")
    if not tag and not digest:
        problems.append("a tag or a digest")
    if problems:
        raise RegistryError(f"bad OCI reference {text[:120]!r}: check the " + "; ".join(problems))
    return Reference(host, path, tag, digest or None)


# -- credentials --------------------------------------------------------------------------


def credentials(host: str, auth_file: Path | None = None) -> tuple[str, str] | None:
    """(user, password) for ``host``: the environment, else a containers auth file."""
    user, password = os.environ.get("VLAD_REGISTRY_USER"), os.environ.get("VLAD_REGISTRY_PASSWORD")
    if user and password is not None:
        return user, password
    candidates = [auth_file] if auth_file else []
    if not auth_file:
        if os.environ.get("REGISTRY_AUTH_FILE"):
            candidates.append(Path(os.environ["REGISTRY_AUTH_FILE"]))
        if os.environ.get("XDG_RUNTIME_DIR"):
            candidates.append(Path(os.environ["XDG_RUNTIME_DIR"]) / "containers" / "auth.json")
        candidates.append(Path.home() / ".docker" / "config.json")
    for path in candidates:
        try:
            data = json.loads(path.read_bytes()[: 1 << 20])
        except FileNotFoundError:
            if path is auth_file:
                raise RegistryError(f"auth file {path} does not exist") from None
            continue
        except (OSError, ValueError) as exc:
            raise RegistryError(f"auth file {path} is unreadable: {exc}") from None
        entry = (data.get("auths") or {}).get(host) if isinstance(data, dict) else None
        if isinstance(entry, dict) and isinstance(entry.get("auth"), str):
            try:
                user, _, password = base64.b64decode(entry["auth"], validate=True).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                raise RegistryError(f"auth file {path}: the entry for {host} is not base64 user:password") from None
            return user, password
    return None


# -- the HTTP side --------------------------------------------------------------------------


def _challenge(header: str) -> tuple[str, dict[str, str]]:
    scheme, _, params = header.strip().partition(" ")
    return scheme.lower(), dict(re.findall(r'(\w+)="([^"]*)"', params))


class Registry:
    """One registry: requests with its authentication, over HTTPS unless ``plain_http``."""

    def __init__(
        self,
        host: str,
        *,
        plain_http: bool = False,
        ca_file: Path | None = None,
        auth_file: Path | None = None,
        timeout_s: float = TIMEOUT_S,
    ) -> None:
        self.host = host
        self.plain_http = plain_http
        self.timeout_s = timeout_s
        self._tls = None if plain_http else ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
        self._auth_file = auth_file
        self._authorization: str | None = None
        self.requests = 0
        self.bytes_in = 0

    def _connection(self, netloc: str, https: bool) -> http.client.HTTPConnection:
        if https:
            return http.client.HTTPSConnection(netloc, timeout=self.timeout_s, context=self._tls)
        return http.client.HTTPConnection(netloc, timeout=self.timeout_s)

    def _authorize(self, challenge: str, scope_hint: str) -> None:
        scheme, params = _challenge(challenge)
        creds = credentials(self.host, self._auth_file)
        basic = "Basic " + base64.b64encode(f"{creds[0]}:{creds[1]}".encode()).decode() if creds else None
        if scheme == "basic":
            if basic is None:
                raise RegistryError(
                    f"{self.host} asks for a login: set VLAD_REGISTRY_USER and VLAD_REGISTRY_PASSWORD "
                    "or pass --authfile"
                )
            self._authorization = basic
            return
        if scheme != "bearer" or "realm" not in params:
            raise RegistryError(f"{self.host} asks for authentication vlad does not speak: {challenge[:80]!r}")
        query = {"service": params.get("service", ""), "scope": params.get("scope", scope_hint)}
        realm = urllib.parse.urlsplit(params["realm"])
        if realm.scheme not in ("https", "http") or (realm.scheme == "http" and not self.plain_http):
            raise RegistryError(f"{self.host}: token realm {params['realm'][:80]!r} is not HTTPS")
        path = realm.path + "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v})
        conn = self._connection(realm.netloc, realm.scheme == "https")
        try:
            conn.request("GET", path, headers={"Authorization": basic} if basic else {})
            resp = conn.getresponse()
            body = resp.read(1 << 20)
        except (OSError, http.client.HTTPException) as exc:
            raise RegistryError(f"token service {realm.netloc} unreachable: {exc}") from None
        finally:
            conn.close()
        if resp.status != 200:
            raise RegistryError(
                f"token service {realm.netloc} refused the login (HTTP {resp.status}): check credentials"
            )
        try:
            doc = json.loads(body)
            token = doc.get("token") or doc.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str) or not token.isprintable():
            raise RegistryError(f"token service {realm.netloc} sent no token")
        self._authorization = f"Bearer {token}"

    def request(
        self,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str] | None = None,
        body: bytes | BinaryIO | None = None,
        scope: str = "",
        ok: tuple[int, ...] = (200,),
    ) -> http.client.HTTPResponse:
        """Send one request, answering an auth challenge and following redirects; the
        response (status in ``ok``) is returned unread, its connection closes with it."""
        url = urllib.parse.urlsplit(f"{'http' if self.plain_http else 'https'}://{self.host}{path}")
        for attempt in range(6):
            hdrs = dict(headers or {})
            same_host = url.netloc == self.host
            if self._authorization and same_host:  # a redirect elsewhere (object storage) gets no credentials
                hdrs["Authorization"] = self._authorization
            if hasattr(body, "seek"):
                body.seek(0)  # type: ignore[union-attr]
            conn = self._connection(url.netloc, url.scheme == "https")
            target = url.path + (f"?{url.query}" if url.query else "")
            try:
                conn.request(method, target, body=body, headers=hdrs)
                resp = conn.getresponse()
            except ssl.SSLError as exc:
                conn.close()
                raise RegistryError(
                    f"TLS to {url.netloc} failed: {exc.reason or exc} (a private CA: pass --ca-file; "
                    "a plain-HTTP lab registry: --plain-http)"
                ) from None
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                raise RegistryError(f"registry {url.netloc} unreachable: {exc}") from None
            self.requests += 1
            if resp.status == 401 and same_host and attempt == 0:
                challenge = resp.getheader("WWW-Authenticate") or ""
                resp.read(1 << 16)
                conn.close()
                self._authorize(challenge, scope)
                continue
            if resp.status in (301, 302, 303, 307, 308):
                location = resp.getheader("Location") or ""
                resp.read(1 << 16)
                conn.close()
                url = urllib.parse.urlsplit(urllib.parse.urljoin(url.geturl(), location))
                if url.scheme not in ("http", "https"):
                    raise RegistryError(f"{self.host} redirected to {location[:80]!r}")
                if resp.status == 303:
                    method, body = "GET", None
                continue
            if resp.status not in ok:
                detail = _error_detail(resp.read(1 << 16))
                conn.close()
                raise RegistryError(f"{method} {self.host}{path.split('?')[0]}: HTTP {resp.status}{detail}")
            return resp
        raise RegistryError(f"{self.host}: too many redirects or authentication rounds for {path.split('?')[0]}")


def _error_detail(body: bytes) -> str:
    """The registry's error codes (the distribution spec's JSON errors), one line."""
    try:
        errors = json.loads(body).get("errors") or []
        text = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors if isinstance(e, dict))
    except (ValueError, AttributeError):
        text = ""
    return f" ({text[:160]})" if text else ""


# -- progress -------------------------------------------------------------------------------


@dataclass
class Transfer:
    """What a push or pull did: files, bytes moved over the network and taken locally."""

    reference: str = ""
    digest: str = ""
    files: int = 0
    bytes_total: int = 0
    bytes_moved: int = 0  # over the network (a resumed blob counts only its rest)
    bytes_local: int = 0  # from the cache or the store (dedupe), or already in the registry
    blobs_moved: int = 0
    blobs_local: int = 0
    resumed: int = 0
    seconds: float = 0.0
    requests: int = 0
    path: Path | None = None
    _t0: float = field(default_factory=time.monotonic, repr=False)
    _shown: float = field(default=0.0, repr=False)

    def tick(self, progress: Progress | None, verb: str, force: bool = False) -> None:
        now = time.monotonic()
        if progress is None or (not force and now - self._shown < 1.0):
            return
        self._shown = now
        done = self.bytes_moved + self.bytes_local
        rate = self.bytes_moved / max(now - self._t0, 1e-6) / 1e6
        progress(
            f"{verb}: {self.blobs_moved + self.blobs_local}/{self.files} files, "
            f"{done / 1e6:.1f}/{self.bytes_total / 1e6:.1f} MB ({self.bytes_local / 1e6:.1f} MB already here), "
            f"{rate:.1f} MB/s"
        )

    def summary(self, verb: str) -> str:
        return (
            f"{verb} {self.files} files, {self.bytes_total / 1e6:.2f} MB: {self.bytes_moved / 1e6:.2f} MB moved, "
            f"{self.bytes_local / 1e6:.2f} MB already there ({self.blobs_local} files)"
            + (f", {self.resumed} resumed" if self.resumed else "")
            + f", {self.seconds:.1f} s, {self.requests} requests"
        )


# -- push -------------------------------------------------------------------------------------


def _descriptor(media_type: str, digest: str, size: int, **annotations: str) -> dict[str, Any]:
    d: dict[str, Any] = {"mediaType": media_type, "digest": digest, "size": size}
    if annotations:
        d["annotations"] = annotations
    return d


def push(
    release: Path,
    ref: str,
    *,
    keys_dir: Path,
    registry: Registry | None = None,
    progress: Progress | None = None,
) -> Transfer:
    """Push the signed release folder ``release`` to ``ref`` (a tag); it is verified first
    (a release nobody could deploy is never published). The transfer's ``digest`` pins it."""
    target = parse_reference(ref)
    if target.digest:
        raise RegistryError(f"push to a tag, not a digest: {ref} (the digest is computed from what is pushed)")
    verified = verify_release(release, keys_dir)
    manifest, folder = verified.manifest, verified.path
    reg = registry or Registry(target.host)
    name = target.repository
    scope = f"repository:{name}:pull,push"
    files: list[tuple[str, str, str, int, dict[str, str]]] = []  # path, media type, digest, size, annotations
    for special, media in ((MANIFEST_FILE, MANIFEST_TYPE), (SIGNATURE_FILE, SIGNATURE_TYPE)):
        size, hexdigest = hash_file(folder / special)
        files.append((special, media, f"sha256:{hexdigest}", size, {TITLE: special}))
    for a in manifest.artifacts:  # hashes just verified against the signed manifest
        files.append((a.path, FILE_TYPE, f"sha256:{a.sha256}", a.size, {TITLE: a.path, ROLE: a.role}))
    config = json.dumps(
        {
            "release": manifest.release.id,
            "version": manifest.release.version,
            "version_code": manifest.release.version_code,
        },
        sort_keys=True,
    ).encode()
    t = Transfer(reference=str(target), files=len(files), bytes_total=sum(f[3] for f in files))
    for path, _, digest, size, _ in files:
        with (folder / path).open("rb") as f:
            moved = _upload_blob(reg, name, digest, size, f, scope)
        if moved:
            t.bytes_moved, t.blobs_moved = t.bytes_moved + size, t.blobs_moved + 1
        else:
            t.bytes_local, t.blobs_local = t.bytes_local + size, t.blobs_local + 1
        t.tick(progress, "push")
    config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
    _upload_blob(reg, name, config_digest, len(config), config, scope)
    document = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": ARTIFACT_TYPE,
        "config": _descriptor(CONFIG_TYPE, config_digest, len(config)),
        "layers": [_descriptor(media, digest, size, **ann) for _, media, digest, size, ann in files],
        "annotations": {"io.vlad.release.id": manifest.release.id},
    }
    body = json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    resp = reg.request(
        "PUT",
        f"/v2/{name}/manifests/{target.tag}",
        headers={"Content-Type": OCI_MANIFEST, "Content-Length": str(len(body))},
        body=body,
        scope=scope,
        ok=(201,),
    )
    served = resp.getheader("Docker-Content-Digest")
    resp.read()
    if served and served != digest:
        raise RegistryError(f"{reg.host} stored the manifest as {served}, not {digest}: check the registry")
    t.digest, t.requests = digest, reg.requests
    t.seconds = time.monotonic() - t._t0
    t.tick(progress, "push", force=True)
    return t


def _upload_blob(reg: Registry, name: str, digest: str, size: int, data: bytes | BinaryIO, scope: str) -> bool:
    """Upload one blob unless the registry has it (True: uploaded)."""
    head = reg.request("HEAD", f"/v2/{name}/blobs/{digest}", scope=scope, ok=(200, 404))
    head.read()
    if head.status == 200:
        return False
    start = reg.request("POST", f"/v2/{name}/blobs/uploads/", scope=scope, ok=(202,), headers={"Content-Length": "0"})
    start.read()
    location = start.getheader("Location") or ""
    loc = urllib.parse.urlsplit(location)
    if loc.netloc and loc.netloc != reg.host:
        raise RegistryError(f"{reg.host} wants the upload at another host ({loc.netloc}); not supported")
    query = urllib.parse.parse_qsl(loc.query) + [("digest", digest)]
    put = reg.request(
        "PUT",
        f"{loc.path}?{urllib.parse.urlencode(query)}",
        headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
        body=data,
        scope=scope,
        ok=(201,),
    )
    put.read()
    return True


# -- pull ---------------------------------------------------------------------------------------


def _fetch_manifest(reg: Registry, target: Reference) -> tuple[dict[str, Any], str]:
    scope = f"repository:{target.repository}:pull"
    resp = reg.request(
        "GET",
        f"/v2/{target.repository}/manifests/{target.digest or target.tag}",
        headers={"Accept": OCI_MANIFEST},
        scope=scope,
    )
    body = resp.read(MAX_OCI_MANIFEST_BYTES + 1)
    resp.close()
    if len(body) > MAX_OCI_MANIFEST_BYTES:
        raise RegistryError(f"{target}: manifest larger than {MAX_OCI_MANIFEST_BYTES} bytes")
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    if target.digest and digest != target.digest:
        raise RegistryError(f"{target}: the registry served a manifest with digest {digest}: refused")
    try:
        document = json.loads(body)
    except ValueError:
        raise RegistryError(f"{target}: the manifest is not JSON") from None
    if not isinstance(document, dict) or document.get("artifactType") != ARTIFACT_TYPE:
        kind = document.get("artifactType") or document.get("mediaType") if isinstance(document, dict) else None
        raise RegistryError(f"{target} is not a vlad release (artifact type {str(kind)[:80]!r})")
    return document, digest


def _layers(document: Mapping[str, Any], target: Reference) -> list[tuple[str, str, str, int]]:
    """(title, media type, digest, size) of each layer, checked for shape."""
    layers = document.get("layers")
    if not isinstance(layers, list) or not 2 <= len(layers) <= MAX_LAYERS:
        raise RegistryError(f"{target}: the manifest's layers are not a vlad release's")
    out = []
    for layer in layers:
        ann = layer.get("annotations") if isinstance(layer, dict) else None
        title = ann.get(TITLE) if isinstance(ann, dict) else None
        digest, size, media = layer.get("digest"), layer.get("size"), layer.get("mediaType")
        if not (
            isinstance(title, str)
            and isinstance(digest, str)
            and _DIGEST_RE.fullmatch(digest)
            and type(size) is int
            and size >= 0
            and isinstance(media, str)
        ):
            raise RegistryError(f"{target}: a layer lacks a title, a sha256 digest or a size")
        out.append((title, media, digest, size))
    return out


def _safe_relpath(title: str) -> bool:
    p = PurePosixPath(title)
    return (
        bool(title)
        and title.isprintable()
        and "\\" not in title
        and not p.is_absolute()
        and all(part not in ("", ".", "..") for part in title.split("/"))
    )


def _store_blobs(store_root: Path | None) -> dict[str, Path]:
    """sha256 -> a file of a release already in the store (hashed again when used)."""
    found: dict[str, Path] = {}
    if store_root is None:
        return found
    releases = store_root / "releases"
    try:
        folders = [p for p in releases.iterdir() if p.is_dir() and not p.is_symlink()]
    except OSError:
        return found
    for folder in folders:
        try:
            doc = tomllib.loads((folder / MANIFEST_FILE).read_text())
        except (OSError, ValueError):
            continue
        for a in doc.get("artifacts", []):
            if isinstance(a, dict) and isinstance(a.get("sha256"), str) and isinstance(a.get("path"), str):
                if _safe_relpath(a["path"]):
                    found.setdefault(a["sha256"], folder / a["path"])
    return found


def pull(
    ref: str,
    dest: Path,
    *,
    keys_dir: Path = DEFAULT_KEYS_DIR,
    cache: Path = DEFAULT_CACHE,
    store_root: Path | None = None,
    registry: Registry | None = None,
    progress: Progress | None = None,
    verify_files: bool = True,
    deadline_s: float = DEADLINE_S,
) -> Transfer:
    """Pull the release at ``ref`` into the new folder ``dest`` (verified: signature first,
    every blob against its signed digest while it streams, the folder as a whole at the
    end). Blobs come from ``cache`` or the store at ``store_root`` when they are there; the
    cache keeps what was downloaded; a download still running after ``deadline_s`` stops
    (its part is kept: the next pull resumes it). ``verify_files=False`` skips the final whole-folder
    check (a deploy verifies the folder again anyway)."""
    target = parse_reference(ref)
    dest = Path(dest)
    if dest.exists():
        raise RegistryError(f"{dest} exists: pull into a new folder")
    reg = registry or Registry(target.host)
    document, digest = _fetch_manifest(reg, target)
    layers = _layers(document, target)
    head = {title: (media, d, size) for title, media, d, size in layers[:2]}
    if set(head) != {MANIFEST_FILE, SIGNATURE_FILE}:
        raise RegistryError(f"{target}: the first layers are not {MANIFEST_FILE} and {SIGNATURE_FILE}")
    blobs = cache / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    staging = dest.with_name(f".{dest.name}.pulling")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    t = Transfer(reference=f"{target.host}/{target.repository}@{digest}", digest=digest, path=dest)
    t.files, t.bytes_total = len(layers), sum(size for *_, size in layers)
    try:
        fetch = _Fetcher(reg, target, blobs, _store_blobs(store_root), t, progress, t._t0 + deadline_s)
        limits = {MANIFEST_FILE: MAX_MANIFEST_BYTES, SIGNATURE_FILE: MAX_SIGNATURE_BYTES}
        for title in (MANIFEST_FILE, SIGNATURE_FILE):
            _, d, size = head[title]
            if size > limits[title]:
                raise RegistryError(f"{target}: {title} is {size} bytes (at most {limits[title]})")
            fetch.into(d, size, staging / title)
        # The signature, the manifest and its validity, before any other byte is asked for.
        signed = verify_release(staging, keys_dir, check_files=False).manifest
        _match(signed, layers[2:], target)
        for title, _, d, size in layers[2:]:
            path = staging / title
            path.parent.mkdir(parents=True, exist_ok=True)
            fetch.into(d, size, path)
        if verify_files:
            verify_release(staging, keys_dir)
        staging.rename(dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    t.requests = reg.requests
    t.seconds = time.monotonic() - t._t0
    t.tick(progress, "pull", force=True)
    return t


def _match(signed: Manifest, layers: list[tuple[str, str, str, int]], target: Reference) -> None:
    """The layers after manifest.toml and manifest.sig are exactly the signed artifacts."""
    want = {a.path: (f"sha256:{a.sha256}", a.size) for a in signed.artifacts}
    have = {title: (d, size) for title, _, d, size in layers}
    problems = []
    if len(have) != len(layers):
        problems.append("a file is named twice")
    for path, (d, size) in want.items():
        if path not in have:
            problems.append(f"{path} is missing")
        elif have[path] != (d, size):
            problems.append(f"{path} is not the signed file (digest or size differs)")
    problems += [f"{path} is not in the signed manifest" for path in have if path not in want]
    if problems:
        raise RegistryError(f"{target} does not match its signed manifest: " + "; ".join(problems[:5]))


class _Fetcher:
    """Blobs into files: from the cache, the store or the registry (resumed when partial)."""

    def __init__(
        self,
        reg: Registry,
        target: Reference,
        blobs: Path,
        store: Mapping[str, Path],
        t: Transfer,
        progress: Progress | None,
        deadline: float,
    ) -> None:
        self.reg, self.target, self.blobs, self.store, self.t, self.progress = reg, target, blobs, store, t, progress
        self.deadline = deadline  # time.monotonic(): a registry that trickles cannot hold a robot forever

    def into(self, digest: str, size: int, path: Path) -> None:
        hexdigest = digest.split(":", 1)[1]
        blob = self.blobs / hexdigest
        # One writer per blob: two pulls into one cache (two releases sharing weights) take
        # turns on it instead of writing the same partial file.
        with (self.blobs / f"{hexdigest}.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not _holds(blob, size, hexdigest):
                local = self.store.get(hexdigest)
                if local is None or not self._copy_checked(local, blob, size, hexdigest):
                    self._download(digest, size, blob)
                    self.t.blobs_moved += 1
                    _place(blob, path)
                    return
            self.t.blobs_local += 1
            self.t.bytes_local += size
            _place(blob, path)
        self.t.tick(self.progress, "pull")

    def _copy_checked(self, src: Path, blob: Path, size: int, hexdigest: str) -> bool:
        tmp = blob.with_name(f"{hexdigest}.copy")
        h = hashlib.sha256()
        try:
            with src.open("rb") as fin, tmp.open("wb") as fout:
                while chunk := fin.read(BLOCK):
                    h.update(chunk)
                    fout.write(chunk)
        except OSError:
            tmp.unlink(missing_ok=True)
            return False
        if h.hexdigest() != hexdigest or tmp.stat().st_size != size:
            tmp.unlink(missing_ok=True)
            return False
        os.replace(tmp, blob)
        return True

    def _download(self, digest: str, size: int, blob: Path) -> None:
        hexdigest = digest.split(":", 1)[1]
        partial = blob.with_name(f"{hexdigest}.partial")
        h = hashlib.sha256()
        have = 0
        if partial.is_file():
            have = partial.stat().st_size
            if have >= size:
                partial.unlink()
                have = 0
            else:
                with partial.open("rb") as f:
                    while chunk := f.read(BLOCK):
                        h.update(chunk)
        headers = {"Range": f"bytes={have}-"} if have else {}
        resp = self.reg.request(
            "GET",
            f"/v2/{self.target.repository}/blobs/{digest}",
            headers=headers,
            scope=f"repository:{self.target.repository}:pull",
            ok=(200, 206),
        )
        if have and resp.status == 200:  # the registry ignored the range: start over
            h, have = hashlib.sha256(), 0
        elif have:
            self.t.resumed += 1
        try:
            with partial.open("r+b" if have else "wb") as f:
                f.seek(have)
                f.truncate()
                while have < size and time.monotonic() <= self.deadline:
                    chunk = resp.read1(min(BLOCK, size - have))  # one receive's worth: the deadline is seen often
                    if not chunk:
                        break
                    f.write(chunk)
                    h.update(chunk)
                    have += len(chunk)
                    self.t.bytes_moved += len(chunk)
                    self.reg.bytes_in += len(chunk)
                    self.t.tick(self.progress, "pull")
                f.flush()
                os.fsync(f.fileno())
            extra = resp.read(1) if have >= size else b""
        except (OSError, http.client.HTTPException) as exc:
            raise RegistryError(
                f"{self.target}: download of {digest} broke off ({exc}); pull again to resume"
            ) from None
        finally:
            resp.close()
        if have < size and time.monotonic() > self.deadline:
            raise RegistryError(
                f"{self.target}: the pull ran past its deadline; {have} of {size} bytes of {digest} kept,"
                " pull again to resume"
            )
        if have < size:
            raise RegistryError(
                f"{self.target}: blob {digest} ended after {have} of {size} bytes; pull again to resume"
            )
        if extra or h.hexdigest() != hexdigest:
            partial.unlink(missing_ok=True)
            raise RegistryError(f"{self.target}: blob {digest} from the registry does not match its digest: refused")
        os.replace(partial, blob)


def _holds(path: Path, size: int, hexdigest: str) -> bool:
    """``path`` is a regular file of ``size`` bytes with that sha256 (a cached blob is
    hashed again each time it is used: the cache is not trusted)."""
    try:
        return path.stat().st_size == size and hash_file(path) == (size, hexdigest)
    except (OSError, VladError):
        return False


def _place(blob: Path, path: Path) -> None:
    """The cached blob at ``path``: a copy (a hard link would let a write to one change the other)."""
    shutil.copyfile(blob, path)
