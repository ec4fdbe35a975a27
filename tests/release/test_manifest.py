"""Release manifests, signatures and verify_release on small synthetic releases."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import NOW, T0, make_keys, make_release
from vlad.cli import release as release_cli
from vlad.release.authoring import write_manifest
from vlad.release.manifest import (
    ManifestError,
    RuntimeSpec,
    canonical_bytes,
    load_manifest,
    parse_manifest,
    read_manifest_document,
)
from vlad.release.signing import (
    BadSignature,
    IntegrityError,
    KeyFileError,
    RuntimeMismatch,
    SignatureError,
    UnknownKey,
    UnsignedRelease,
    ValidityError,
    check_runtime,
    key_id,
    load_private_key,
    load_public_key,
    load_trusted_keys,
    sign_release,
    verify_release,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def keys(tmp_path):
    return make_keys(tmp_path)


@pytest.fixture()
def release(tmp_path, keys):
    return make_release(tmp_path / "rel", keys[0])


# ---- manifest format ----------------------------------------------------------------------


def test_valid_release_verifies(release, keys):
    v = verify_release(release, keys[1], NOW, installed=RuntimeSpec())
    assert v.id == "r1" and v.manifest.release.version_code == 1
    assert v.key_id == key_id(load_private_key(keys[0]))
    assert v.contract.sha256 == v.manifest.contract.sha256
    assert {a.role for a in v.manifest.artifacts} >= {"contract", "tokenizer", "model", "config", "report"}
    assert v.manifest.fallback[-1].kind == "hold" and v.manifest.canary.max_heartbeat_faults == 3
    assert v.warnings == ()


def test_every_problem_is_reported_at_once(release):
    data = read_manifest_document(release)
    del data["release"]["id"]
    data["artifacts"][0]["role"] = "weightz"
    data["fallback"] = [{"kind": "hold"}, {"kind": "previous_release"}]
    data["lineage"] = {"change": "quantization"}
    data["backend"]["artifact"] = "nope.onnx"
    data["colour"] = 1
    with pytest.raises(ManifestError) as info:
        parse_manifest(data, "m.toml")
    text = str(info.value)
    assert len(info.value.problems) >= 6
    for needle in (
        "release.id: missing",
        "artifacts[0].role: unknown value 'weightz'",
        "entries after the first 'hold'",
        "lineage.parent",
        "'nope.onnx' is not listed",
        "colour: unknown key",
    ):
        assert needle in text


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda d: d.update(signature="abc"), "signature: signatures are detached (manifest.sig)"),
        (lambda d: d.update(format="vlad.manifest/2"), "format: unsupported format 'vlad.manifest/2'"),
        (lambda d: d["artifacts"][0].update(path="manifest.sig"), "artifacts[0].path: 'manifest.sig' is one of"),
        (lambda d: d["artifacts"][0].update(sha256="AB" * 32), "artifacts[0].sha256: expected 64 lowercase hex"),
        (lambda d: d["artifacts"].append(dict(d["artifacts"][0])), "artifacts[5].path: duplicate artifact"),
        (lambda d: d["contract"].update(path="eval.json"), "contract.path: artifact 'eval.json' has role 'report'"),
        (lambda d: d["release"].update(id="active"), "release.id: 'active' must match"),
        (lambda d: d["release"].update(expires=T0), "release.expires: must be later than release.not_before"),
        (lambda d: d["release"].update(version_code=-1), "release.version_code: must be >= 0, got -1"),
        (lambda d: d.update(fallback=[{"kind": "policy"}, {"kind": "hold"}]), "fallback[0].release: a 'policy' entry"),
        (lambda d: d.update(fallback=[{"kind": "hold", "release": "r0"}]), "fallback[0].release: only a 'policy'"),
        (lambda d: d.update(lineage={"change": "lora_adapter", "parent": "r0"}), "lineage.adapter: a 'lora_adapter'"),
        (lambda d: d["gates"][0].update(sha256="0" * 64), "gates[0].sha256: differs from artifact 'eval.json'"),
        (lambda d: d["canary"].update(max_deadline_miss_rate=1.5), "canary.max_deadline_miss_rate: must be <= 1"),
        (lambda d: d["backend"]["options"].update(intra_op_threads=-1), "backend.options.intra_op_threads: expected"),
        (lambda d: d["backend"]["options"].update(providers="CPU"), "backend.options.providers: expected an array"),
    ],
)
def test_each_rule_names_its_key(release, edit, problem):
    data = read_manifest_document(release)
    edit(data)
    with pytest.raises(ManifestError) as info:
        parse_manifest(data, "m.toml")
    assert len(info.value.problems) == 1 and info.value.problems[0].startswith(problem), info.value.problems


def test_an_empty_artifact_list_is_refused_with_what_it_leaves_unlisted(release):
    data = read_manifest_document(release)
    data["artifacts"] = []
    with pytest.raises(ManifestError) as info:
        parse_manifest(data, "m.toml")
    assert info.value.problems == [
        "artifacts: a release needs at least one artifact",
        "contract.path: 'contract.toml' is not listed in [[artifacts]]",
        "backend.artifact: 'policy.onnx' is not listed in [[artifacts]]",
        "gates[0].report: 'eval.json' is not listed in [[artifacts]]",
    ]


def test_any_value_anywhere_gets_problems_never_a_crash(release):
    """Every key of a real manifest replaced by a value of another kind, or removed: the
    parser (its checks run on partly parsed data) answers with a ManifestError or a manifest."""
    import random

    doc = read_manifest_document(release)
    doc["memory"] = {"host_bytes": 1, "device_bytes": 0, "source": "operator"}
    doc["fallback"].insert(0, {"kind": "policy", "release": "r0"})
    doc["lineage"].update(parent="r0", adapter="policy.onnx")
    hostile = ["", "x", "../x", "manifest.toml", -1, 1.5, float("nan"), True, [], {}, [{}], [1], {"a": {}}, T0, "DEL"]

    def keys(node, prefix=()):
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for k, v in items:
            yield (*prefix, k)
            yield from keys(v, (*prefix, k))

    rng = random.Random(24)
    cases = [(k, v) for k in keys(doc) for v in hostile]
    for path, value in rng.sample(cases, 400):
        data = json.loads(json.dumps(doc, default=str))
        node = data
        for k in path[:-1]:
            node = node[k]
        if value == "DEL":
            del node[path[-1]]
        else:
            node[path[-1]] = value
        try:
            parse_manifest(data, "m.toml")
        except ManifestError as exc:
            assert exc.problems and all("\n" not in p for p in exc.problems)


def test_paths_must_stay_inside_the_release(release):
    data = read_manifest_document(release)
    data["artifacts"][0]["path"] = "../etc/passwd"
    with pytest.raises(ManifestError, match=r"plain relative path"):
        parse_manifest(data)


def test_signature_covers_the_raw_bytes(release, keys):
    """Canonical bytes ignore layout (the store compares by them), the signature does not:
    even a comment added after signing is refused, because the file is verified before it is
    parsed."""
    text = (release / "manifest.toml").read_text()
    (release / "manifest.toml").write_text("# a comment added after signing\n" + text.replace("\n\n", "\n"))
    assert canonical_bytes(read_manifest_document(release)) == load_manifest(release).canonical_bytes()
    with pytest.raises(BadSignature, match="edited after signing"):
        verify_release(release, keys[1], NOW, installed=RuntimeSpec())
    sign_release(release, keys[0])
    verify_release(release, keys[1], NOW, installed=RuntimeSpec())


@pytest.mark.parametrize(
    "payload",
    [
        b"format = nan\n",  # NaN where a string belongs
        b"x = " + b"[" * 5000 + b"]" * 5000 + b"\n",  # 5,000-deep nesting
        b"\xff\xfe not utf-8",
        b'[release]\nid = "a\x00b"\n',
    ],
)
def test_unsigned_hostile_manifest_is_refused_before_parsing(release, keys, payload):
    (release / "manifest.toml").write_bytes(payload)
    with pytest.raises(BadSignature, match="does not match manifest.toml"):
        verify_release(release, keys[1], NOW)


def test_hostile_manifest_fails_parsing_with_a_problem_not_a_crash(release):
    (release / "manifest.toml").write_bytes(b"x = " + b"[" * 5000 + b"]" * 5000 + b"\n")
    with pytest.raises(ManifestError, match="nest"):
        load_manifest(release)
    (release / "manifest.toml").write_bytes(b"format = nan\n")
    with pytest.raises(ManifestError):
        load_manifest(release)


def test_fifo_signature_or_manifest_is_refused_without_blocking(release, keys):
    (release / "manifest.sig").unlink()
    os.mkfifo(release / "manifest.sig")
    with pytest.raises(BadSignature, match="not a regular file|FIFO"):
        verify_release(release, keys[1], NOW)
    (release / "manifest.sig").unlink()
    sign_release_raw = release / "manifest.toml"
    sign_release_raw.unlink()
    os.mkfifo(sign_release_raw)
    with pytest.raises(ManifestError, match="not a regular file|FIFO"):
        load_manifest(release)


def test_oversized_files_are_refused(release, keys):
    (release / "manifest.sig").write_bytes(b" " * (1 << 20))
    with pytest.raises(BadSignature, match="allowed"):
        verify_release(release, keys[1], NOW)
    (release / "manifest.toml").write_bytes(b"#" * (2 << 20))
    with pytest.raises(ManifestError, match="allowed"):
        load_manifest(release)


def test_old_signature_format_asks_for_a_new_signature(release, keys):
    sig = json.loads((release / "manifest.sig").read_text())
    sig["format"] = "vlad.signature/1"
    (release / "manifest.sig").write_text(json.dumps(sig))
    with pytest.raises(BadSignature, match="re-sign"):
        verify_release(release, keys[1], NOW)


# ---- refusals: each names what failed ---------------------------------------------------------


def test_tampered_artifact_is_refused(release, keys):
    p = release / "policy.onnx"
    data = bytearray(p.read_bytes())
    data[3] ^= 0x01
    p.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=r"policy\.onnx: sha256 .* differs from manifest"):
        verify_release(release, keys[1], NOW)


def test_unknown_key_is_refused(tmp_path, keys):
    other, _ = make_keys(tmp_path / "other", "other")
    rel = make_release(tmp_path / "rel2", other)
    with pytest.raises(UnknownKey, match=rf"unknown key {key_id(load_private_key(other))}"):
        verify_release(rel, keys[1], NOW)


def test_signature_by_another_key_under_a_trusted_id_is_refused(tmp_path, release, keys):
    other, _ = make_keys(tmp_path / "other", "other")
    sig = json.loads((release / "manifest.sig").read_text())
    forged = load_private_key(other).sign((release / "manifest.toml").read_bytes())
    sig["signature"] = base64.b64encode(forged).decode()
    (release / "manifest.sig").write_text(json.dumps(sig))
    with pytest.raises(BadSignature, match="does not match manifest.toml"):
        verify_release(release, keys[1], NOW)


def test_manifest_edited_after_signing_is_refused(release, keys):
    p = release / "manifest.toml"
    p.write_text(p.read_text().replace("version_code = 1", "version_code = 7"))
    with pytest.raises(BadSignature, match=r"edited after signing"):
        verify_release(release, keys[1], NOW)


def test_unsigned_release_is_refused(release, keys):
    (release / "manifest.sig").unlink()
    with pytest.raises(UnsignedRelease, match=r"unsigned release \(no manifest.sig\)"):
        verify_release(release, keys[1], NOW)


def test_expired_and_not_yet_valid_are_refused(release, keys):
    with pytest.raises(ValidityError, match=r"r1 expired at 2031-01-01T00:00:00Z"):
        verify_release(release, keys[1], T0 + dt.timedelta(days=400))
    with pytest.raises(ValidityError, match=r"not valid before 2030-01-01T00:00:00Z"):
        verify_release(release, keys[1], T0 - dt.timedelta(seconds=1))
    # A rollback skips the window but nothing else.
    verify_release(release, keys[1], T0 + dt.timedelta(days=400), check_time=False, installed=RuntimeSpec())


def test_missing_and_extra_artifacts_are_refused(release, keys):
    (release / "model_config.json").unlink()
    (release / "extra.bin").write_bytes(b"x")
    with pytest.raises(IntegrityError) as info:
        verify_release(release, keys[1], NOW)
    assert "model_config.json: missing" in str(info.value)
    assert "extra.bin: not listed in the manifest" in str(info.value)


def test_contract_hash_mismatch_is_refused(release, keys):
    data = read_manifest_document(release)
    data["contract"]["sha256"] = "0" * 64
    write_manifest(release, data)
    sign_release(release, keys[0])
    with pytest.raises(IntegrityError, match=r"contract contract.toml: canonical sha256 .* differs"):
        verify_release(release, keys[1], NOW)


def test_failed_gate_is_evidence_not_an_integrity_failure(tmp_path, keys):
    """A failed gate verifies (the files are what was signed) and is judged as evidence:
    refused by the evidence rule, which an operator may override with a reason."""
    from vlad.release.evidence import judge_evidence

    rel = make_release(tmp_path / "bad", keys[0], gate_passed=False)
    v = verify_release(rel, keys[1], NOW)
    evidence = judge_evidence(v.manifest, v.path, v.files)
    assert evidence.status == "failed"
    assert evidence.problems == ("gate closed_loop (report eval.json): failed",)


def test_runtime_major_mismatch_refuses_minor_warns(tmp_path, keys):
    rel = make_release(tmp_path / "rt", keys[0], runtime={"onnxruntime": "1.18.0", "torch": "2.3.1"})
    v = verify_release(rel, keys[1], NOW, installed=RuntimeSpec(onnxruntime="1.20.1", torch="2.3.0"))
    assert v.warnings == ("onnxruntime: validated on 1.18.0, installed 1.20.1 (minor version differs)",)
    with pytest.raises(RuntimeMismatch, match=r"onnxruntime 2.0.0 installed, release validated on 1.18.0"):
        verify_release(rel, keys[1], NOW, installed=RuntimeSpec(onnxruntime="2.0.0", torch="2.3.0"))
    assert check_runtime(RuntimeSpec(tensorrt="10.3"), RuntimeSpec()) == [
        "tensorrt: validated on 10.3, not installed here"
    ]


# ---- keys -------------------------------------------------------------------------------------


def test_keys_pem_and_raw_base64(tmp_path, keys):
    private, trusted = keys
    assert (private.stat().st_mode & 0o777) == 0o600
    pub = load_public_key(next(trusted.glob("*.pub")))
    raw = pub.public_bytes(*_raw_format())
    (trusted / "raw.pub").write_text(base64.b64encode(raw).decode() + "\n")
    assert key_id(load_public_key(trusted / "raw.pub")) == key_id(pub) == hashlib.sha256(raw).hexdigest()[:16]
    assert set(load_trusted_keys(trusted)) == {key_id(pub)}
    (trusted / "junk.pub").write_text("not a key")
    with pytest.raises(KeyFileError, match=r"junk.pub: not an Ed25519 public key"):
        load_trusted_keys(trusted)


def test_world_writable_keys_folder_is_refused(keys):
    os.chmod(keys[1], 0o777)
    with pytest.raises(KeyFileError, match=r"writable by anyone"):
        load_trusted_keys(keys[1])


def test_demo_key_pair_matches():
    private = load_private_key(ROOT / "etc" / "vlad" / "demo-signing-key.pem")
    assert key_id(private) in load_trusted_keys(ROOT / "etc" / "vlad" / "keys.d")


def _raw_format():
    from cryptography.hazmat.primitives import serialization

    return serialization.Encoding.Raw, serialization.PublicFormat.Raw


# ---- command line -----------------------------------------------------------------------------


def test_cli_keygen_sign_verify_round_trip(tmp_path, capsys):
    assert release_cli.main(["keygen", "--out", str(tmp_path / "k"), "--name", "robot1"]) == 0
    private = tmp_path / "k" / "robot1.key"
    assert (private.stat().st_mode & 0o777) == 0o600
    trusted = tmp_path / "trusted"
    trusted.mkdir()
    shutil.copy(tmp_path / "k" / "robot1.pub", trusted)
    rel = make_release(
        tmp_path / "rel",
        None,
        not_before=dt.datetime(2020, 1, 1, tzinfo=dt.UTC),
        expires=dt.datetime(2999, 1, 1, tzinfo=dt.UTC),
    )

    assert release_cli.main(["verify", str(rel), "--keys", str(trusted)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "unsigned release" in err and err.count("\n") == 1

    assert release_cli.main(["sign", str(rel), "--key", str(private)]) == 0
    assert release_cli.main(["verify", str(rel), "--keys", str(trusted)]) == 0
    assert ": OK r1 1.0.1" in capsys.readouterr().out

    (rel / "model_config.json").write_text('{"width": 16}\n')
    assert release_cli.main(["verify", str(rel), "--keys", str(trusted)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model_config.json: size 14 bytes, manifest says 13" in err

    assert release_cli.main(["manifest", "update-hashes", str(rel)]) == 0
    assert release_cli.main(["verify", str(rel), "--keys", str(trusted)]) == 2
    assert "does not match manifest.toml" in capsys.readouterr().err
    assert release_cli.main(["sign", str(rel), "--key", str(private)]) == 0
    capsys.readouterr()
    assert release_cli.main(["verify", str(rel), "--keys", str(trusted), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["release"] == "r1"
    assert release_cli.main(["manifest", "show", str(rel)]) == 0
    assert "fallback  hold" in capsys.readouterr().out


def test_make_demo_manifest_script(tmp_path):
    rel = make_release(tmp_path / "demo", None)
    (rel / "manifest.toml").unlink()
    (rel / "eval.json").write_text(
        json.dumps(
            {
                "results": [
                    {"policy": "policy", "instruction": "reach", "success_rate": 0.9},
                    {"policy": "zero", "instruction": "reach", "success_rate": 0.0},
                ]
            }
        )
    )
    script = [sys.executable, str(ROOT / "scripts" / "make_demo_manifest.py"), "--release-dir", str(rel)]
    # The demo plan names golden fixtures and a recording: the release must hold them.
    proc = subprocess.run(script, capture_output=True, text=True, timeout=120)
    assert (
        proc.returncode == 2 and "is not a file of" in proc.stderr and "copy the file into the release" in proc.stderr
    )
    for name in ("golden.npz", "demo_recording.mcap"):
        shutil.copy(ROOT / "manifests" / "demo" / name, rel / name)
    proc = subprocess.run(script, capture_output=True, text=True, timeout=120)
    # Written, signed and verified; its evidence covers the closed loop only, the demo plan
    # requires all four gates: exit 1, saying so.
    assert proc.returncode == 1, proc.stderr
    assert "gate evidence missing: gate contract: no evidence in the manifest" in proc.stderr
    m = load_manifest(rel)
    assert m.release.id == "vlad-demo-reacher-1.0.0" and m.release.version_code == 1
    assert m.backend.options == {"intra_op_threads": 1} and m.runtime.python
    assert [g.gate for g in m.gates] == ["closed_loop"] and m.gates[0].passed
    assert m.gate_plan["equivalence"]["golden"] == "golden.npz"
    assert m.gate_plan["equivalence"]["recordings"] == ["demo_recording.mcap"]
    assert {a.path: a.role for a in m.artifacts}["demo_recording.mcap"] == "recording"


# ---- files are opened inside the release, never through a link ------------------------------


def _opened_paths(monkeypatch) -> list[str]:
    """Record the real path of every file os.open opens (the real open still happens)."""
    seen: list[str] = []
    real_open = os.open

    def spy(path, flags, mode=0o777, *, dir_fd=None):
        fd = real_open(path, flags, mode, dir_fd=dir_fd)
        seen.append(os.readlink(f"/proc/self/fd/{fd}"))
        return fd

    monkeypatch.setattr(os, "open", spy)
    return seen


def test_update_hashes_parses_the_manifest_before_it_opens_a_file(release, monkeypatch):
    """Authoring reads hand-edited manifests: a malformed one gets problems (never a crash),
    and a path outside the release or a symbolic link is refused before anything is opened."""
    from vlad.release.authoring import refresh_hashes

    doc = read_manifest_document(release)
    for edit, problem in [
        (lambda d: d["artifacts"].__setitem__(0, "x"), "artifacts[0]: expected a table, got a string"),
        (lambda d: d["artifacts"][0].pop("path"), "artifacts[0].path: missing"),
        (lambda d: d.__setitem__("contract", "x"), "contract: expected a table, got a string"),
        (lambda d: d["gates"].__setitem__(0, 1), "gates[0]: expected a table, got an integer"),
        (lambda d: d["artifacts"][0].update(path="../../etc/hostname"), "must be a plain relative path inside"),
    ]:
        data = json.loads(json.dumps(doc, default=str))
        edit(data)
        opened = _opened_paths(monkeypatch)
        with pytest.raises(ManifestError, match=re.escape(problem)):
            refresh_hashes(data, release)
        assert opened == []
        monkeypatch.undo()
    stale = json.loads(json.dumps(doc, default=str))
    for a in stale["artifacts"]:
        a.update(size=1, sha256="")
    stale["gates"][0]["sha256"] = ""
    assert refresh_hashes(stale, release) == json.loads(json.dumps(doc, default=str))
    (release / "model_config.json").unlink()
    (release / "model_config.json").symlink_to(release / "eval.json")
    with pytest.raises(ManifestError, match="model_config.json: cannot hash: .*symbolic link"):
        refresh_hashes(doc, release)


def test_symlinked_subfolder_is_refused_before_anything_behind_it_is_opened(tmp_path, keys, monkeypatch):
    """An artifact in a sub-folder that is later swapped for a link to a folder outside
    (holding an identical file): verification refuses the link and opens nothing outside."""
    from vlad.release.authoring import refresh_hashes

    base = make_release(tmp_path / "base", None)
    (base / "sub").mkdir()
    (base / "sub" / "weights.bin").write_bytes(b"w" * 1000)
    doc = read_manifest_document(base)
    doc["artifacts"].append({"path": "sub/weights.bin", "role": "weights", "size": 0, "sha256": ""})
    write_manifest(base, refresh_hashes(doc, base))
    sign_release(base, keys[0], now=NOW)
    assert verify_release(base, keys[1], NOW, installed=RuntimeSpec()).files["sub/weights.bin"].size == 1000
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "weights.bin").write_bytes(b"w" * 1000)  # identical: only the link gives it away
    shutil.rmtree(base / "sub")
    (base / "sub").symlink_to(outside, target_is_directory=True)

    opened = _opened_paths(monkeypatch)
    with pytest.raises(IntegrityError) as exc:
        verify_release(base, keys[1], NOW, installed=RuntimeSpec())
    assert "sub: a symbolic link to a folder" in str(exc.value) and "\n" not in str(exc.value)
    assert not [p for p in opened if p.startswith(str(outside))], opened


def test_symlinked_manifest_or_signature_is_refused(tmp_path, keys):
    rel = make_release(tmp_path / "rel", keys[0])
    elsewhere = tmp_path / "elsewhere.toml"
    shutil.move(rel / "manifest.toml", elsewhere)
    (rel / "manifest.toml").symlink_to(elsewhere)
    with pytest.raises(ManifestError, match="manifest.toml: a symbolic link"):
        verify_release(rel, keys[1], NOW)
    (rel / "manifest.toml").unlink()
    shutil.move(elsewhere, rel / "manifest.toml")
    shutil.move(rel / "manifest.sig", tmp_path / "sig")
    (rel / "manifest.sig").symlink_to(tmp_path / "sig")
    with pytest.raises(SignatureError, match="manifest.sig: a symbolic link"):
        verify_release(rel, keys[1], NOW)


def test_manifest_accepts_every_precision_label_the_backends_share(tmp_path, keys):
    from vlad.backend import PRECISIONS

    assert "tf32" in PRECISIONS
    for precision in PRECISIONS:
        rel = make_release(tmp_path / precision, keys[0], options={"intra_op_threads": 1, "precision": precision})
        assert verify_release(rel, keys[1], NOW).manifest.backend.options["precision"] == precision
    with pytest.raises(ManifestError, match=r"unknown precision 'fp4' \(known: fp32, tf32"):
        make_release(tmp_path / "fp4", keys[0], options={"precision": "fp4"})
