"""The daemon's sockets: binding safely, bounding what a peer can send, and who may connect.

* :func:`prepare_ipc` refuses an ipc endpoint another process serves (ZeroMQ would
  silently steal it) and creates its folder ``0770`` for the ``vlad`` group.
* :func:`listen_sockets` binds the listening sockets of an endpoint process (openpi, metrics):
  the daemon holds it from start to exit and hands it to each process it starts, so the
  address is never free while vlad runs (no other process can bind it between two of
  them) and connections wait in its backlog while one restarts.
* :func:`bind` applies the limits every bound socket gets: ``ZMQ_MAXMSGSIZE`` from the
  largest legal message (a bigger frame disconnects the peer before it is buffered; a
  1 GiB frame used to cost 2 GB of RSS) and a small receive high-water mark.
* :class:`Gatekeeper` is the ZAP handler: every connection to a bound socket is checked
  at handshake against the allow list of that socket's role. On ``ipc://`` ZeroMQ hands
  ZAP the peer's credentials (``SO_PEERCRED``: uid, gid, pid); on ``tcp://`` CurveZMQ
  authenticates the client's key. Refused connections are counted (``unauthorized``).
  The daemon's own endpoint processes (:mod:`vlad.daemon.endpoints`) are admitted to the
  observation socket beside the allow list: on ipc by their process id (the peer
  credentials name it), on tcp by the key pair the daemon made for them at start.
  Every admitted connection gets an identity, ``c<n>/<principal>`` (``uid:N`` on ipc,
  ``key:<Z85>`` on tcp), which ZeroMQ attaches to each message it delivers (``User-Id``):
  the liveness table binds a controller's name to it (:mod:`vlad.health.liveness`).
"""

from __future__ import annotations

import errno
import grp
import logging
import os
import pwd
import socket
import stat
from collections import Counter
from pathlib import Path

import zmq
from zmq.utils import z85

from vlad.config import Listen
from vlad.errors import StartupError
from vlad.threads import Worker

log = logging.getLogger("vlad.sockets")

ZAP_ENDPOINT = "inproc://zeromq.zap.01"


def prepare_ipc(endpoint: str, group: str) -> None:
    """Make an ``ipc://`` endpoint bindable, refusing one another process is serving.

    ZeroMQ silently steals an ipc path that is already bound, so probe it first: a live
    listener answers a connect (in use: refuse); a leftover file refuses it (stale:
    remove). The folder is created ``0770`` and handed to ``group`` when it exists, so
    directory permissions are the first access control.
    """
    if not endpoint.startswith("ipc://"):
        return
    path = Path(endpoint[len("ipc://") :])
    folder = path.parent
    if not folder.exists():
        try:
            folder.mkdir(mode=0o770, parents=True)
        except OSError as exc:
            raise StartupError(f"cannot create {folder} for {endpoint}: {exc.strerror}") from None
        try:
            os.chown(folder, -1, grp.getgrnam(group).gr_gid)
        except (KeyError, PermissionError):
            pass  # no such group on this machine, or not ours to give: keep the owner's
    _free_unix_path(path, f"endpoint {endpoint}", socket.SOCK_STREAM)


def _free_unix_path(path: Path, name: str, kind: int) -> None:
    """Remove a leftover socket file at ``path``; :class:`StartupError` naming ``name`` when
    the file is no socket or a live listener answers a connect on it (in use)."""
    if not (path.exists() or path.is_symlink()):
        return
    if not stat.S_ISSOCK(path.lstat().st_mode):
        raise StartupError(f"{name}: {path} exists and is not a socket; remove it or choose another path")
    probe = socket.socket(socket.AF_UNIX, kind)
    try:
        probe.settimeout(0.5)
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        path.unlink(missing_ok=True)
    except OSError as exc:
        raise StartupError(f"{name}: cannot probe {path}: {exc.strerror}") from None
    else:
        raise StartupError(f"{name} is in use by another process (is another vlad running?)")
    finally:
        probe.close()


def listen_sockets(address: Listen, name: str, backlog: int) -> list[socket.socket]:
    """The listening sockets of an endpoint process's ``address`` (``HOST:PORT``: one per
    address the host resolves to, as asyncio binds them; ``unix:PATH``: one), bound and
    listening. :class:`StartupError` with one line naming ``name`` (the config key) when
    the address is taken or cannot be bound.

    No ``SO_REUSEPORT``: no other socket can share the port. ``SO_REUSEADDR`` (as every
    server sets it) lets a restarted vlad bind while the last one's connections linger in
    TIME_WAIT, never while a socket listens on the address."""
    if address.unix:
        path = Path(address.path)
        _free_unix_path(path, f"{name} {address}", socket.SOCK_STREAM)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(address.path)
            sock.listen(backlog)
        except OSError as exc:
            sock.close()
            raise StartupError(f"{name} {address}: cannot listen: {exc.strerror or exc}") from None
        return [sock]
    try:
        infos = socket.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise StartupError(f"{name} {address}: cannot resolve {address.host!r}: {exc.strerror}") from None
    socks: list[socket.socket] = []
    try:
        for family, kind, proto, _, sockaddr in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(sockaddr)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise StartupError(
                        f"{name} {address}: the port is in use by another process "
                        f"(ss -ltnp 'sport = :{address.port}' shows which); stop it or choose another port"
                    ) from None
                raise StartupError(f"{name} {address}: cannot listen: {exc.strerror or exc}") from None
            sock.listen(backlog)
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return socks


def bind(
    sock: zmq.Socket,
    endpoint: str,
    *,
    role: str,
    max_message: int,
    rcvhwm: int | None = None,
    sndhwm: int | None = None,
    curve: tuple[bytes, bytes] | None = None,
) -> None:
    """Bind with the limits and the ZAP domain of ``role`` (see module docstring). The
    high-water marks are set here, before the bind: libzmq copies a socket's options into
    its listener at bind time, so a later change never reaches the connections it accepts."""
    sock.setsockopt(zmq.MAXMSGSIZE, max_message)
    if rcvhwm is not None:
        sock.setsockopt(zmq.RCVHWM, rcvhwm)
    if sndhwm is not None:
        sock.setsockopt(zmq.SNDHWM, sndhwm)
    sock.setsockopt(zmq.ZAP_DOMAIN, role.encode())
    if endpoint.startswith("tcp://"):
        if curve is None:
            raise StartupError(f"{endpoint}: tcp:// needs CurveZMQ keys (sockets.curve_secret_key, curve_clients_dir)")
        sock.curve_secretkey, sock.curve_publickey = curve
        sock.curve_server = True
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise StartupError(f"endpoint {endpoint} is already in use") from None
        raise StartupError(f"cannot bind {endpoint}: {exc.strerror}") from None
    if endpoint.startswith("ipc://"):
        os.chmod(endpoint[len("ipc://") :], stat.S_IRUSR | stat.S_IWUSR | stat.S_IRGRP | stat.S_IWGRP)


class Principal:
    """One allow-list entry: ``uid:N``, ``user:NAME``, ``group:NAME``, ``gid:N`` or ``key:Z85``."""

    def __init__(self, text: str) -> None:
        kind, sep, value = text.partition(":")
        if not sep or kind not in ("uid", "user", "gid", "group", "key") or not value:
            raise StartupError(f"allow-list entry {text!r}: expected uid:N, user:NAME, gid:N, group:NAME or key:Z85")
        self.text, self.kind, self.value = text, kind, value
        try:
            if kind == "uid" or kind == "gid":
                self.id = int(value)
            elif kind == "user":
                self.id = pwd.getpwnam(value).pw_uid
            elif kind == "group":
                self.id = grp.getgrnam(value).gr_gid
            else:
                self.id = -1
        except (KeyError, ValueError):
            raise StartupError(f"allow-list entry {text!r}: no such {kind} on this machine") from None

    def admits_peer(self, uid: int, gid: int) -> bool:
        if self.kind in ("uid", "user"):
            return uid == self.id
        if self.kind in ("gid", "group"):
            if gid == self.id:
                return True
            try:  # supplementary membership of the peer's user
                return pwd.getpwuid(uid).pw_name in grp.getgrgid(self.id).gr_mem
            except KeyError:
                return False
        return False


class Gatekeeper(Worker):
    """ZAP handler thread: admits a connection when its socket role's allow list does.

    ``allow`` maps a role (the bound socket's ZAP domain) to its principals; a role not
    in it admits every peer that reached the endpoint (directory permissions on ipc, an
    authorized CurveZMQ key on tcp). ``curve_keys`` are the authorized client keys (Z85).
    """

    def __init__(self, ctx: zmq.Context, allow: dict[str, list[Principal]], curve_keys: set[bytes]) -> None:
        super().__init__("vlad-zap")
        self.allow = allow
        self.curve_keys = curve_keys
        self.denied: Counter[str] = Counter()  # by role
        self.admitted: Counter[str] = Counter()
        # The daemon's endpoint processes, admitted to the observation socket whatever its
        # allow list says: their pids (ipc) and their CurveZMQ public keys (tcp, Z85).
        self.endpoint_pids: set[int] = set()
        self.endpoint_keys: set[bytes] = set()
        self.connections = 0  # numbers the identities of admitted connections
        self._sock = ctx.socket(zmq.REP)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(ZAP_ENDPOINT)

    def stop(self, timeout: float = 1.0) -> bool:
        ended = super().stop(timeout)
        self._sock.close(0)
        return ended

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self.wake_fd(), zmq.POLLIN)  # readable on stop()
        while not self.stopping:
            try:
                if self._sock not in dict(poller.poll(1000)):
                    continue
                request = self._sock.recv_multipart()
            except zmq.ZMQError:
                return
            try:
                reply = self.decide(request)
            except Exception:  # never leave a handshake unanswered: refuse it
                log.exception("ZAP request failed")
                reply = (b"500", b"internal error", b"")
            version, request_id = (request + [b"", b""])[:2]
            status, text, user = reply
            try:
                self._sock.send_multipart([version, request_id, status, text, user, b""])
            except zmq.ZMQError:
                return

    def decide(self, request: list[bytes]) -> tuple[bytes, bytes, bytes]:
        """(status code, text, user id) for one ZAP request (RFC 27)."""
        if len(request) < 6 or request[0] != b"1.0":
            return b"400", b"malformed ZAP request", b""
        domain, address, mechanism = (
            request[2].decode("ascii", "replace"),
            request[3].decode("ascii", "replace"),
            request[5],
        )
        principals = self.allow.get(domain)
        user = b""
        if mechanism == b"CURVE":
            key = z85.encode(request[6]) if len(request) > 6 and len(request[6]) == 32 else b""
            if key not in self.curve_keys:
                return self._deny(domain, f"unknown CurveZMQ key from {address}")
            user = b"key:" + key
            own = domain == "observations" and key in self.endpoint_keys
            if (
                principals is not None
                and not own
                and not any(p.kind == "key" and p.value.encode() == key for p in principals)
            ):
                return self._deny(domain, f"key {key.decode()} may not use {domain}")
        elif mechanism == b"NULL":
            creds = _peer_credentials(address)
            if principals is not None:
                own = creds is not None and domain == "observations" and creds[2] in self.endpoint_pids
                if creds is None or not (own or any(p.admits_peer(creds[0], creds[1]) for p in principals)):
                    return self._deny(domain, f"peer {address} (uid:gid:pid) may not use {domain}")
            user = f"uid:{creds[0]}".encode() if creds is not None else b""
        else:
            return self._deny(domain, f"mechanism {mechanism!r} not accepted")
        self.admitted[domain] += 1
        self.connections += 1
        return b"200", b"OK", f"c{self.connections}/".encode() + user

    def _deny(self, domain: str, why: str) -> tuple[bytes, bytes, bytes]:
        self.denied[domain] += 1
        n = sum(self.denied.values())
        if n <= 10 or n % 1000 == 0:
            log.warning("connection refused (%d so far): %s", n, why)
        return b"400", b"not authorized", b""


def _peer_credentials(address: str) -> tuple[int, int, int] | None:
    """(uid, gid, pid) from an ipc peer address as libzmq passes it to ZAP: ``host:uid:gid:pid``."""
    parts = address.rsplit(":", 3)
    if len(parts) != 4:
        return None
    try:
        return int(parts[1]), int(parts[2]), int(parts[3])
    except ValueError:
        return None


def load_curve(secret_key_file: str, clients_dir: str) -> tuple[tuple[bytes, bytes], set[bytes]]:
    """This server's key pair and the authorized client public keys (Z85)."""
    import zmq.auth

    try:
        public, secret = zmq.auth.load_certificate(secret_key_file)
    except (OSError, ValueError) as exc:
        raise StartupError(f"sockets.curve_secret_key {secret_key_file}: {exc}") from None
    if secret is None:
        raise StartupError(f"sockets.curve_secret_key {secret_key_file} holds no secret key")
    if not Path(clients_dir).is_dir():
        raise StartupError(f"sockets.curve_clients_dir {clients_dir} is not a folder")
    keys = set()
    for path in sorted(Path(clients_dir).glob("*.key")):
        try:
            key, _ = zmq.auth.load_certificate(str(path))
        except (OSError, ValueError) as exc:
            raise StartupError(f"client key {path}: {exc}") from None
        keys.add(key)
    return (secret, public), keys
