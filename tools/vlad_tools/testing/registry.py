"""A real OCI registry on loopback for the fleet tests and benchmark: Debian's
``docker-registry`` (the CNCF distribution registry) started on a free port with its
storage in a temporary folder, optionally behind TLS with a throwaway CA and with token
authentication from :class:`TokenServer` (the distribution token protocol: a JWT signed
by a key whose certificate the registry trusts, handed out for a user and password)."""

from __future__ import annotations

import base64
import datetime as dt
import http.server
import json
import secrets
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from vlad_tools.testing.daemon import free_port

REGISTRY_BIN = "docker-registry"


def registry_unavailable() -> str | None:
    """Why no registry can start here (None: it can)."""
    if shutil.which(REGISTRY_BIN) is None:
        return "docker-registry is not installed (Debian package docker-registry; ./scripts/bootstrap installs it)"
    return None


@dataclass(frozen=True)
class Tls:
    """A throwaway CA's certificate and a server certificate for 127.0.0.1 signed by it."""

    ca: Path
    cert: Path
    key: Path


def make_tls(folder: Path) -> Tls:
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "vlad test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    tls = Tls(folder / "ca.pem", folder / "server.pem", folder / "server.key")
    tls.ca.write_bytes(ca.public_bytes(pem))
    tls.cert.write_bytes(cert.public_bytes(pem))
    tls.key.write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return tls


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenServer:
    """The token service a registry with ``auth: token`` sends clients to: it checks a
    user and password (HTTP basic) and signs a JWT granting the scope asked for."""

    SERVICE = "vlad-test-registry"
    ISSUER = "vlad-test-token-server"

    def __init__(self, folder: Path, user: str, password: str, tls: Tls | None = None) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self.user, self.password = user, password
        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, self.ISSUER)])
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .sign(self.key, hashes.SHA256())
        )
        folder.mkdir(parents=True, exist_ok=True)
        self.bundle = folder / "token-ca.pem"
        self.bundle.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        self._x5c = base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()
        self.issued = 0
        self.refused = 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                server._answer(self)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls:  # credentials travel to it: HTTPS, as a client of a TLS registry insists
            import ssl

            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(tls.cert, tls.key)
            self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        scheme = "https" if tls else "http"
        self.realm = f"{scheme}://127.0.0.1:{self.httpd.server_address[1]}/token"
        threading.Thread(target=self.httpd.serve_forever, name="token-server", daemon=True).start()

    def _answer(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        import urllib.parse

        expected = "Basic " + base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        if handler.headers.get("Authorization") != expected:
            self.refused += 1
            handler.send_response(401)
            handler.end_headers()
            return
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(handler.path).query))
        access = []
        for scope in query.get("scope", "").split():
            kind, _, rest = scope.partition(":")
            name, _, actions = rest.rpartition(":")
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
        body = json.dumps({"token": self.token(access)}).encode()
        self.issued += 1
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def token(self, access: list[dict]) -> str:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

        now = int(time.time())
        header = {"typ": "JWT", "alg": "ES256", "x5c": [self._x5c]}
        claims = {
            "iss": self.ISSUER,
            "sub": self.user,
            "aud": self.SERVICE,
            "exp": now + 300,
            "nbf": now - 10,
            "iat": now,
            "jti": secrets.token_hex(8),
            "access": access,
        }
        signing_input = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        r, s = decode_dss_signature(self.key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
        return f"{signing_input}.{_b64url(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class RegistryProcess:
    """``docker-registry serve`` on 127.0.0.1 with its storage in ``folder``."""

    def __init__(self, folder: Path, *, tls: Tls | None = None, token: TokenServer | None = None) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.tls = tls
        lines = [
            "version: 0.1",
            "log: {level: warn, accesslog: {disabled: true}}",
            f"storage: {{filesystem: {{rootdirectory: {folder / 'storage'}}}, delete: {{enabled: true}}}}",
            "http:",
            f"  addr: {self.host}",
        ]
        if tls:
            lines += ["  tls:", f"    certificate: {tls.cert}", f"    key: {tls.key}"]
        if token:
            lines += [
                "auth:",
                "  token:",
                f"    realm: {token.realm}",
                f"    service: {token.SERVICE}",
                f"    issuer: {token.ISSUER}",
                f"    rootcertbundle: {token.bundle}",
            ]
        self.config = folder / "config.yml"
        self.config.write_text("\n".join(lines) + "\n")
        self.log_path = folder / "registry.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen([REGISTRY_BIN, "serve", str(self.config)], stdout=self._log, stderr=self._log)
        self._wait_ready(15.0)

    def _wait_ready(self, timeout_s: float) -> None:
        import ssl

        url = f"{'https' if self.tls else 'http'}://{self.host}/v2/"
        ctx = ssl.create_default_context(cafile=str(self.tls.ca)) if self.tls else None
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"docker-registry exited: {self.log_path.read_text()[-2000:]}")
            try:
                urllib.request.urlopen(url, timeout=1, context=ctx).close()
                return
            except urllib.error.HTTPError:
                return  # 401: up, asking for a token
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"docker-registry did not answer on {url} in {timeout_s:g} s")

    def stored_bytes(self) -> int:
        """Bytes of blob data the registry stores."""
        return sum(p.stat().st_size for p in (self.folder / "storage").rglob("data") if p.is_file())

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()
