"""Releases through a real OCI registry (Debian's docker-registry on loopback): push, pull
by digest byte for byte, dedupe of a variant release, resume, refusal of what a registry
(or whoever can write to it) changed, TLS with token authentication, ``vladctl deploy REF``
on a live daemon."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys

import pytest

from tests.conftest import VLAD
from tests.helpers import KEYS, signed_demo_copy, store_config, wait_release
from vlad.fleet.registry import (
    FILE_TYPE,
    Registry,
    RegistryError,
    _upload_blob,
    parse_reference,
    pull,
    push,
)
from vlad_tools.testing import DEMO, start_daemon
from vlad_tools.testing.registry import RegistryProcess, TokenServer, make_tls, registry_unavailable

pytestmark = pytest.mark.skipif(registry_unavailable() is not None, reason=str(registry_unavailable()))
VLADCTL = VLAD.parent / "vladctl"


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    r = RegistryProcess(tmp_path_factory.mktemp("registry"))
    yield r
    r.close()


@pytest.fixture(scope="module")
def pushed(registry):
    """The demo release pushed once: (reference by digest, transfer)."""
    t = push(
        DEMO, f"{registry.host}/robots/reacher:1.0.0", keys_dir=KEYS, registry=Registry(registry.host, plain_http=True)
    )
    return f"{registry.host}/robots/reacher@{t.digest}", t


def files_of(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_pulled_release_is_byte_for_byte_the_signed_folder_and_comes_from_the_cache_the_second_time(
    registry, pushed, tmp_path
):
    ref, t = pushed
    assert t.files == len(files_of(DEMO)) and t.bytes_moved == t.bytes_total
    again = push(
        DEMO, f"{registry.host}/robots/reacher:again", keys_dir=KEYS, registry=Registry(registry.host, plain_http=True)
    )
    assert again.digest == t.digest and again.bytes_moved == 0  # the registry has every blob
    got = pull(
        ref, tmp_path / "a", keys_dir=KEYS, cache=tmp_path / "cache", registry=Registry(registry.host, plain_http=True)
    )
    assert files_of(tmp_path / "a") == files_of(DEMO)
    assert got.bytes_moved == got.bytes_total and got.blobs_local == 0
    second = pull(
        ref, tmp_path / "b", keys_dir=KEYS, cache=tmp_path / "cache", registry=Registry(registry.host, plain_http=True)
    )
    assert second.bytes_moved == 0 and second.blobs_local == second.files
    assert files_of(tmp_path / "b") == files_of(DEMO)
    with pytest.raises(RegistryError, match="exists: pull into a new folder"):
        pull(
            ref,
            tmp_path / "b",
            keys_dir=KEYS,
            cache=tmp_path / "cache",
            registry=Registry(registry.host, plain_http=True),
        )


def test_a_variant_release_moves_only_its_own_files_and_a_store_serves_as_cache(registry, pushed, tmp_path):
    """A robot whose store holds the base release pulls a variant (same weights, another
    contract line and signature): only the differing files cross the network."""
    from vlad.release.store import ReleaseStore

    ref, _ = pushed
    store = ReleaseStore(tmp_path / "store", KEYS)
    store.stage(DEMO)
    variant = signed_demo_copy(tmp_path / "v2", "1.1.0", 2)
    v = push(
        variant,
        f"{registry.host}/robots/reacher:1.1.0",
        keys_dir=KEYS,
        registry=Registry(registry.host, plain_http=True),
    )
    changed = {
        name
        for name, data in files_of(variant).items()
        if (DEMO / name).is_file() is False or (DEMO / name).read_bytes() != data
    }
    assert "policy.onnx" not in changed and "contract.toml" in changed
    assert v.blobs_moved == len(changed)  # the push, too, only uploads what the registry lacks
    got = pull(
        f"{registry.host}/robots/reacher@{v.digest}",
        tmp_path / "pulled",
        keys_dir=KEYS,
        cache=tmp_path / "cache",
        store_root=tmp_path / "store",
        registry=Registry(registry.host, plain_http=True),
    )
    assert got.blobs_moved == len(changed)
    assert got.bytes_moved == sum(len(files_of(variant)[n]) for n in changed) < got.bytes_total / 10
    assert files_of(tmp_path / "pulled") == files_of(variant)


def test_an_interrupted_pull_resumes_where_it_stopped(registry, pushed, tmp_path):
    ref, _ = pushed
    onnx = (DEMO / "policy.onnx").read_bytes()
    digest = hashlib.sha256(onnx).hexdigest()
    (tmp_path / "cache" / "sha256").mkdir(parents=True)
    (tmp_path / "cache" / "sha256" / f"{digest}.partial").write_bytes(onnx[: len(onnx) // 2])
    got = pull(
        ref, tmp_path / "a", keys_dir=KEYS, cache=tmp_path / "cache", registry=Registry(registry.host, plain_http=True)
    )
    assert got.resumed == 1 and got.bytes_moved == got.bytes_total - len(onnx) // 2
    assert files_of(tmp_path / "a") == files_of(DEMO)


def blob_data(registry, digest: str):
    hexd = digest.split(":")[1]
    return registry.folder / "storage" / "docker" / "registry" / "v2" / "blobs" / "sha256" / hexd[:2] / hexd / "data"


def test_a_blob_changed_in_the_registry_is_refused_before_anything_is_staged(registry, tmp_path):
    variant = signed_demo_copy(tmp_path / "v3", "1.3.0", 3)
    reg = Registry(registry.host, plain_http=True)
    t = push(variant, f"{registry.host}/robots/tamper:1", keys_dir=KEYS, registry=reg)
    contract = blob_data(registry, "sha256:" + hashlib.sha256((variant / "contract.toml").read_bytes()).hexdigest())
    data = bytearray(contract.read_bytes())
    data[10] ^= 1
    contract.write_bytes(bytes(data))
    try:
        with pytest.raises(RegistryError, match="contract.toml|does not match its digest"):
            pull(
                f"{registry.host}/robots/tamper@{t.digest}",
                tmp_path / "out",
                keys_dir=KEYS,
                cache=tmp_path / "c",
                registry=reg,
            )
        assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))
    finally:
        data[10] ^= 1
        contract.write_bytes(bytes(data))


def forge(registry, repo: str, tag: str, edit) -> str:
    """Push a manifest that is the demo's with ``edit`` applied (someone who can write to
    the registry, not the signer); returns its pinned reference."""
    reg = Registry(registry.host, plain_http=True)
    t = push(DEMO, f"{registry.host}/{repo}:base", keys_dir=KEYS, registry=reg)
    resp = reg.request(
        "GET", f"/v2/{repo}/manifests/{t.digest}", headers={"Accept": "application/vnd.oci.image.manifest.v1+json"}
    )
    doc = json.loads(resp.read())
    edit(doc, reg, repo)
    body = json.dumps(doc).encode()
    reg.request(
        "PUT",
        f"/v2/{repo}/manifests/{tag}",
        headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"},
        body=body,
        ok=(201,),
    ).read()
    return f"{registry.host}/{repo}@sha256:{hashlib.sha256(body).hexdigest()}"


def swap_blob(name: str, data: bytes):
    def edit(doc, reg, repo):
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        _upload_blob(reg, repo, digest, len(data), data, "")
        for layer in doc["layers"]:
            if layer["annotations"]["org.opencontainers.image.title"] == name:
                layer["digest"], layer["size"] = digest, len(data)

    return edit


def add_layer(name: str, data: bytes):
    def edit(doc, reg, repo):
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        _upload_blob(reg, repo, digest, len(data), data, "")
        doc["layers"].append(
            {
                "mediaType": FILE_TYPE,
                "digest": digest,
                "size": len(data),
                "annotations": {"org.opencontainers.image.title": name},
            }
        )

    return edit


@pytest.mark.parametrize(
    ("edit", "refusal"),
    [
        (swap_blob("policy.onnx", b"not the model"), "policy.onnx is not the signed file"),
        (swap_blob("manifest.toml", (DEMO / "manifest.toml").read_bytes().replace(b"1.0.0", b"9.0.0")), "signature"),
        (add_layer("../../escape", b"x"), r"\.\./\.\./escape is not in the signed manifest"),
        (add_layer("policy.onnx", b"x"), "named twice"),
    ],
    ids=["swapped-model", "edited-manifest", "path-escape", "duplicate"],
)
def test_a_forged_registry_manifest_is_refused_before_any_artifact_is_downloaded(registry, tmp_path, edit, refusal):
    ref = forge(registry, "robots/forged", "evil", edit)
    reg = Registry(registry.host, plain_http=True)
    with pytest.raises(RegistryError if refusal != "signature" else Exception, match=refusal) as exc:
        pull(ref, tmp_path / "out", keys_dir=KEYS, cache=tmp_path / "c", registry=reg)
    assert "\n" not in str(exc.value)
    assert not (tmp_path / "out").exists() and not (tmp_path / "../escape").exists()
    # Only the OCI manifest, manifest.toml and manifest.sig were asked for.
    small = sum((DEMO / f).stat().st_size for f in ("manifest.toml", "manifest.sig"))
    assert reg.requests <= 3 and reg.bytes_in <= small + 100


def test_a_manifest_that_is_not_a_vlad_release_or_not_the_digest_asked_is_refused(registry, pushed, tmp_path):
    ref, _ = pushed
    reg = Registry(registry.host, plain_http=True)
    wrong = ref[:-64] + "0" * 64
    with pytest.raises(RegistryError, match="MANIFEST_UNKNOWN|HTTP 404"):
        pull(wrong, tmp_path / "o", keys_dir=KEYS, cache=tmp_path / "c", registry=reg)
    other = forge(registry, "robots/image", "x", lambda doc, reg, repo: doc.pop("artifactType"))
    with pytest.raises(RegistryError, match="is not a vlad release"):
        pull(other, tmp_path / "o", keys_dir=KEYS, cache=tmp_path / "c", registry=reg)


@pytest.mark.parametrize(
    "text",
    [
        "reacher:1",
        "localhost/Robots:1",
        "host.io/r",
        "host.io/r@sha256:abc",
        "host.io/r:a b",
        "h.io/r:" + "t" * 200,
        "\x1b[31m/x:1",
    ],
)
def test_bad_references_get_one_line(text):
    with pytest.raises(RegistryError) as exc:
        parse_reference(text)
    assert "\n" not in str(exc.value) and "\x1b" not in str(exc.value)


def test_tls_and_token_authentication(tmp_path, monkeypatch):
    """A registry behind TLS (a private CA) that sends clients to a token service: push and
    pull with the right login; one line naming the fix for a wrong login or an unknown CA."""
    tls = make_tls(tmp_path / "tls")
    tokens = TokenServer(tmp_path, "robot", "s3cret", tls=tls)
    r = RegistryProcess(tmp_path / "reg", tls=tls, token=tokens)
    try:
        ref = f"{r.host}/fleet/reacher:1.0.0"
        monkeypatch.setenv("VLAD_REGISTRY_USER", "robot")
        monkeypatch.setenv("VLAD_REGISTRY_PASSWORD", "wrong")
        with pytest.raises(RegistryError, match="refused the login"):
            push(DEMO, ref, keys_dir=KEYS, registry=Registry(r.host, ca_file=tls.ca))
        monkeypatch.setenv("VLAD_REGISTRY_PASSWORD", "s3cret")
        with pytest.raises(RegistryError, match="TLS to .* failed.*--ca-file"):
            push(DEMO, ref, keys_dir=KEYS, registry=Registry(r.host))
        plain = TokenServer(tmp_path / "plain", "robot", "s3cret")  # a realm on plain HTTP: no credentials sent
        r2 = RegistryProcess(tmp_path / "reg2", tls=tls, token=plain)
        try:
            with pytest.raises(RegistryError, match="is not HTTPS"):
                push(DEMO, f"{r2.host}/fleet/reacher:1", keys_dir=KEYS, registry=Registry(r2.host, ca_file=tls.ca))
            assert plain.issued == plain.refused == 0
        finally:
            r2.close()
            plain.close()
        t = push(DEMO, ref, keys_dir=KEYS, registry=Registry(r.host, ca_file=tls.ca))
        auth = tmp_path / "auth.json"  # the login as skopeo/docker write it
        import base64

        auth.write_text(json.dumps({"auths": {r.host: {"auth": base64.b64encode(b"robot:s3cret").decode()}}}))
        monkeypatch.delenv("VLAD_REGISTRY_USER")
        got = pull(
            f"{r.host}/fleet/reacher@{t.digest}",
            tmp_path / "out",
            keys_dir=KEYS,
            cache=tmp_path / "c",
            registry=Registry(r.host, ca_file=tls.ca, auth_file=auth),
        )
        assert files_of(tmp_path / "out") == files_of(DEMO) and got.bytes_moved == got.bytes_total
        assert tokens.issued >= 2 and tokens.refused >= 1
    finally:
        r.close()
        tokens.close()


def test_vladctl_deploys_a_reference_pinned_by_digest_on_a_live_daemon(registry, tmp_path):
    from vlad.release.store import ReleaseStore

    store_root = tmp_path / "store"
    store = ReleaseStore(store_root, KEYS)
    store.activate(store.stage(DEMO), who="test", why="initial")
    v2 = signed_demo_copy(tmp_path / "v2", "1.1.0", 2)
    out = subprocess.run(
        [str(VLADCTL), "push", str(v2), f"{registry.host}/robots/deploy:1.1.0", "--keys", str(KEYS), "--plain-http"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    pinned = out.stdout.strip()
    assert pinned.startswith(f"{registry.host}/robots/deploy@sha256:")
    d = start_daemon(tmp_path, config=store_config(store_root))
    client = d.client()
    try:
        base = [str(VLADCTL), "deploy", "--endpoint", d.endpoints["control"], "--why", "fleet wave 1", "--who", "ci"]
        tag = subprocess.run(
            base + [f"{registry.host}/robots/deploy:1.1.0"], capture_output=True, text=True, timeout=60
        )
        assert tag.returncode != 0 and "pinned by digest" in tag.stderr and len(tag.stderr.strip().splitlines()) == 1
        out = subprocess.run(
            base + [pinned, "--root", str(store_root), "--keys", str(KEYS), "--plain-http"],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert out.returncode == 0, out.stderr
        assert "deployed vlad-demo-reacher@1.1.0" in out.stdout and "pulled" in out.stderr
        wait_release(client, "vlad-demo-reacher@1.1.0")
        assert store.active() == "vlad-demo-reacher-1.1.0"
        assert not any((store_root / "incoming").iterdir())  # the pulled folder is gone, the store has its copy
        assert len(list((store_root / "blobs" / "sha256").iterdir())) >= 2  # contract, manifest... pulled
    finally:
        client.close()
        d.stop()
    assert "Traceback" not in d.log()
    shutil.rmtree(store_root, ignore_errors=True)


def test_the_kserve_v2_server_serves_a_release_pulled_from_the_registry(registry, pushed, tmp_path):
    """The same artifact for remote inference: the v2 server pulls the pinned reference,
    verified, into its model folder and serves it; an unsigned reference is refused."""
    from vlad_kserve.testing import ServerProcess, server_unavailable

    if (why := server_unavailable()) is not None:
        pytest.skip(why)
    ref, _ = pushed
    server = ServerProcess(
        tmp_path, release=ref, extra=["--keys", str(KEYS), "--model-dir", str(tmp_path / "models"), "--plain-http"]
    )
    server.start()
    try:
        import urllib.request

        with urllib.request.urlopen(f"{server.endpoint('http')}/v2/models/vlad-demo-reacher", timeout=5) as r:
            meta = json.loads(r.read())
        assert meta["name"] == "vlad-demo-reacher" and meta["inputs"]
        assert "pulled 15 files" in server.log()
        assert files_of(next((tmp_path / "models").glob("[0-9a-f]*"))) == files_of(DEMO)
    finally:
        server.stop()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "vlad_kserve.server",
            "--release",
            ref,
            "--plain-http",
            "--model-dir",
            str(tmp_path / "m2"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0 and "pass --keys" in out.stderr


def test_a_pull_past_its_deadline_stops_and_the_next_one_completes(registry, pushed, tmp_path):
    """A registry that trickles cannot hold a robot: the pull stops at its deadline with one
    line, keeping what it got (resuming it: test_an_interrupted_pull_resumes_where_it_stopped);
    the next pull completes."""
    ref, _ = pushed
    cache = tmp_path / "cache"
    with pytest.raises(RegistryError, match="ran past its deadline.*pull again to resume") as exc:
        pull(
            ref,
            tmp_path / "a",
            keys_dir=KEYS,
            cache=cache,
            registry=Registry(registry.host, plain_http=True),
            deadline_s=0,
        )
    assert "\n" not in str(exc.value) and not (tmp_path / "a").exists()
    got = pull(ref, tmp_path / "a", keys_dir=KEYS, cache=cache, registry=Registry(registry.host, plain_http=True))
    assert files_of(tmp_path / "a") == files_of(DEMO) and got.blobs_moved + got.blobs_local == got.files


def test_two_pulls_into_one_cache_at_once_both_complete(registry, pushed, tmp_path):
    import threading

    ref, _ = pushed
    results: dict[str, object] = {}

    def one(name: str) -> None:
        try:
            results[name] = pull(
                ref,
                tmp_path / name,
                keys_dir=KEYS,
                cache=tmp_path / "cache",
                registry=Registry(registry.host, plain_http=True),
            )
        except Exception as exc:  # reported below
            results[name] = exc

    threads = [threading.Thread(target=one, args=(n,)) for n in ("a", "b")]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert all(not isinstance(r, Exception) for r in results.values()), results
    assert files_of(tmp_path / "a") == files_of(tmp_path / "b") == files_of(DEMO)
    moved = sum(r.blobs_moved for r in results.values())  # type: ignore[attr-defined]
    assert moved == len(files_of(DEMO))  # each blob crossed the network once
