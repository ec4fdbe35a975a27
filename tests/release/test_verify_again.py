"""A release verified again (a rollback, a canary's abort, while a policy serves) is hashed
again, but what was read from the same bytes is taken as it was: the model's external data
references (a walk of the whole ONNX file in Python) and the gate report's verdicts (a
JSON parse that holds the GIL throughout: tens of milliseconds for the demo's report)."""

from __future__ import annotations

import shutil

import pytest

from tests.helpers import KEYS
from vlad.release import evidence, external_data
from vlad.release.artifacts import ByContent
from vlad.release.evidence import judge_evidence
from vlad.release.manifest import read_manifest_document
from vlad.release.signing import IntegrityError, verify_release
from vlad_tools.testing import DEMO


def test_by_content_computes_once_per_sha256_and_keeps_the_newest():
    calls: list[str] = []
    cache: ByContent[str] = ByContent(size=2)

    def compute(value: str):
        return lambda: calls.append(value) or value

    assert cache.get("a", compute("A")) == cache.get("a", compute("other")) == "A"
    assert cache.get(None, compute("N")) == cache.get(None, compute("N")) == "N"  # not hashed: never kept
    cache.get("b", compute("B"))
    cache.get("a", compute("other"))  # "a" is now the newest of two
    cache.get("c", compute("C"))  # so "b" goes
    assert cache.get("b", compute("B2")) == "B2"
    assert calls == ["A", "N", "N", "B", "C", "B2"]


@pytest.fixture()
def counted(monkeypatch):
    """Fresh caches, and how often the model is walked and a report parsed."""
    monkeypatch.setattr(external_data, "_REFS", ByContent())
    monkeypatch.setattr(evidence, "_REPORTS", ByContent())
    calls = {"walk": 0, "parse": 0}
    walk, parse = external_data.external_data_refs, evidence._verdict_part

    def counted_walk(*args):
        calls["walk"] += 1
        return walk(*args)

    def counted_parse(data):
        calls["parse"] += 1
        return parse(data)

    monkeypatch.setattr(external_data, "external_data_refs", counted_walk)
    monkeypatch.setattr(evidence, "_verdict_part", counted_parse)
    return calls


def test_the_demo_verified_again_is_hashed_but_not_walked_or_parsed_again(tmp_path, counted):
    rel = shutil.copytree(DEMO, tmp_path / "demo")
    judged = []
    for _ in range(2):
        v = verify_release(rel, KEYS)
        judged.append(judge_evidence(v.manifest, v.path, v.files))
    assert counted == {"walk": 1, "parse": 1}
    assert judged[0] == judged[1] and judged[0].status == "passed", judged
    # Hashing is never skipped: a model changed since is refused, cache or not.
    data = bytearray((rel / "policy.onnx").read_bytes())
    data[100] ^= 1
    (rel / "policy.onnx").write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="policy.onnx"):
        verify_release(rel, KEYS)


def test_a_report_is_judged_from_what_it_says_whichever_release_lists_it(tmp_path, counted):
    """The verdicts kept are the report's; the rule (these artifacts, this serving
    configuration) is applied to each release afresh: the same report in a release whose
    model differs from the one it gated is still refused."""
    v = verify_release(shutil.copytree(DEMO, tmp_path / "demo"), KEYS)
    assert judge_evidence(v.manifest, v.path, v.files).status == "passed"
    other = read_manifest_document(v.path)  # the same manifest, but gated on another model
    for artifact in other["artifacts"]:
        if artifact["path"] == "policy.onnx":
            artifact["sha256"] = "0" * 64
    judged = judge_evidence(other, v.path, v.files)
    assert counted["parse"] == 1
    assert judged.status == "missing", judged
    assert all("made for other artifacts (policy.onnx differ)" in p for p in judged.problems), judged.problems
