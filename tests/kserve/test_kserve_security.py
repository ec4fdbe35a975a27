"""TLS (server CA, client certificate) and the bearer token, against a real v2 server
that requires all three. Certificates are made here (cryptography), valid for 127.0.0.1."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

import numpy as np
import pytest

from tests.kserve.remote_server import require_server, started_server
from vlad.backend import example_inputs
from vlad.errors import RemoteUnavailable
from vlad_kserve import KServeBackend

ARTIFACT = Path(__file__).resolve().parents[2] / "manifests" / "demo" / "policy.onnx"


def _cert(subject: str, key, issuer_name, issuer_key, ca: bool = False, san=None):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    b = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer_name or x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if san:
        b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return b.sign(issuer_key or key, hashes.SHA256())


def make_pki(folder: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 / localhost and a client certificate (PEM files)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    def key():
        return ec.generate_private_key(ec.SECP256R1())

    def write(name: str, obj) -> Path:
        path = folder / name
        if hasattr(obj, "public_bytes") and hasattr(obj, "subject"):
            path.write_bytes(obj.public_bytes(serialization.Encoding.PEM))
        else:
            path.write_bytes(
                obj.private_bytes(
                    serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
                )
            )
        return path

    ca_key, srv_key, cli_key = key(), key(), key()
    ca = _cert("vlad test CA", ca_key, None, None, ca=True)
    srv = _cert(
        "127.0.0.1",
        srv_key,
        ca.subject,
        ca_key,
        san=[x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")],
    )
    cli = _cert("robot-0001", cli_key, ca.subject, ca_key)
    return {
        "ca": write("ca.pem", ca),
        "cert": write("server.pem", srv),
        "key": write("server.key", srv_key),
        "client_cert": write("client.pem", cli),
        "client_key": write("client.key", cli_key),
    }


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    require_server()  # before making the PKI
    folder = tmp_path_factory.mktemp("kserve-tls")
    pki = make_pki(folder)
    token = folder / "token"
    token.write_text("s3cret-token\n")
    token.chmod(0o600)
    with started_server(folder, extra=["--token-file", str(token)], tls=pki) as server:
        yield server, pki, token


def options(server, pki, protocol, **over):
    base = {
        "endpoint": server.endpoint(protocol),
        "tls_ca_file": str(pki["ca"]),
        "tls_cert_file": str(pki["client_cert"]),
        "tls_key_file": str(pki["client_key"]),
        "timeout_ms": 2000,
        "probe_interval_ms": 0,
    }
    return {k: v for k, v in {**base, **over}.items() if v is not None}


def test_tls_client_certificate_and_token(secure, contract, golden, protocol):
    server, pki, token = secure
    with KServeBackend().load(ARTIFACT, contract, options(server, pki, protocol, token_file=str(token))) as s:
        case = golden[0]
        out = s.infer(case["inputs"])
        assert np.abs(out["actions"] - case["outputs"]["actions"]).max() < 1e-4
        d = s.describe()
        assert d.extra["tls"] and d.extra["client_certificate"] and d.extra["token"]


def test_rotated_token_is_picked_up(secure, contract, tmp_path, protocol):
    server, pki, token = secure
    mine = tmp_path / "token"
    mine.write_text("old-token")
    with KServeBackend().load(ARTIFACT, contract, options(server, pki, protocol, token_file=str(mine))) as s:
        with pytest.raises(RemoteUnavailable, match="auth"):
            s.infer(example_inputs(contract))
        mine.write_text(token.read_text())  # rotated in place: no reload, no restart
        s.infer(example_inputs(contract))


def refused_at_load(session) -> None:
    """Never connected: the link is lost from the start with the reason, every inference is
    refused, and the prober keeps failing (the daemon serves its fallback meanwhile)."""
    try:
        st = session.stats()
        assert st.state == "lost" and "cannot reach" in st.last_error, st
        with pytest.raises(RemoteUnavailable):
            session.infer(example_inputs(contract_of(session)))
        assert session.stats().state == "lost" and session.stats().reconnects == 0
    finally:
        session.close()


def contract_of(session):
    return session.contract


def test_without_client_certificate_the_server_refuses(secure, contract, protocol):
    server, pki, _ = secure
    refused_at_load(
        KServeBackend().load(
            ARTIFACT,
            contract,
            options(server, pki, protocol, tls_cert_file=None, tls_key_file=None, connect_timeout_ms=3000),
        )
    )


def test_untrusted_server_certificate_is_refused(secure, contract, tmp_path, protocol):
    server, pki, _ = secure
    other = make_pki(tmp_path)  # another CA: the server's certificate does not chain to it
    refused_at_load(
        KServeBackend().load(
            ARTIFACT, contract, options(server, pki, protocol, tls_ca_file=str(other["ca"]), connect_timeout_ms=3000)
        )
    )
