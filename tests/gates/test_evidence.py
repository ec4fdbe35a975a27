"""Gate evidence in a release: recorded exactly as run, and a release plan that stays inside it.

``vladctl gate --record`` on subsets and stopped runs must leave a manifest whose every
``[[gates]]`` entry is backed by a report that says the same (issue: entries of gates not
run pointed at a report that said "skipped"). The demo release's own plan names only its
own files, so a copy of it re-runs its gates anywhere (the demo test in test_gates.py gates
such a copy).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.gates import candidates
from vlad.cli import vladctl_main as main


def disagreements(release: Path) -> list[str]:
    """Where the manifest's [[gates]] and the reports in the folder disagree (empty: never)."""
    from vlad.release.evidence import report_verdicts
    from vlad.release.manifest import load_manifest

    m = load_manifest(release)
    listed = {a.path: a.sha256 for a in m.artifacts}
    out = []
    for g in m.gates:
        path = release / g.report
        if g.report not in listed or not path.is_file():
            out.append(f"{g.gate}: report {g.report} not in the release")
            continue
        verdicts = report_verdicts(json.loads(path.read_text()))
        if verdicts and (verdicts.get(g.gate) == "passed") != g.passed:
            out.append(f"{g.gate}: entry says passed={g.passed}, {g.report} says {verdicts.get(g.gate)}")
    referenced = {g.report for g in m.gates}
    for p in release.glob("gate-report*.json"):
        if p.name not in referenced:
            out.append(f"{p.name}: a gate report no entry references")
    return out


def _gate(release: Path, baseline: Path, report: Path, *gates: str) -> int:
    return main(
        ["gate", str(release), "--baseline", str(baseline), "--report", str(report), "--record", "--no-html", "--quiet"]
        + (["--gates", ",".join(gates)] if gates else [])
    )


def test_record_writes_exactly_the_gates_it_ran(tmp_path, capsys):
    """Re-running a subset replaces only those gates' evidence; the other gates keep theirs
    with their own report; a stopped run records the gate that failed and nothing for the
    gates it skipped; the manifest never disagrees with a report."""
    release = tmp_path / "release"
    shutil.copytree(candidates.DEMO, release)
    demo_entries = {g["gate"]: g for g in _doc(release)["gates"]}
    assert disagreements(release) == []

    assert _gate(release, release, tmp_path / "r1", "contract") == 0
    gates = {g["gate"]: g for g in _doc(release)["gates"]}
    assert gates["contract"]["report"] == "gate-report.json"
    kept = f"gate-report-{demo_entries['closed_loop']['sha256'][:12]}.json"
    for gate in ("equivalence", "performance", "closed_loop"):  # not run: their own report kept
        assert gates[gate]["report"] == kept and gates[gate]["sha256"] == demo_entries[gate]["sha256"]
    assert (release / kept.replace(".json", ".html")).is_file()
    assert disagreements(release) == []

    # A run that stops at a failing contract gate: equivalence is skipped, not recorded.
    broken = candidates.changed_normalization(tmp_path / "other-normalization")
    assert _gate(release, broken, tmp_path / "r2", "contract", "equivalence") == 1
    gates = {g["gate"]: g for g in _doc(release)["gates"]}
    assert gates["contract"] == {**gates["contract"], "report": "gate-report.json", "passed": False}
    assert gates["equivalence"]["report"] == kept and gates["equivalence"]["passed"] is True
    report = json.loads((release / "gate-report.json").read_text())
    assert [(g["gate"], g["status"]) for g in report["gates"]] == [("contract", "failed"), ("equivalence", "skipped")]
    assert disagreements(release) == []

    # The contract gate again, passing: nothing else changes, no orphaned report stays.
    assert _gate(release, release, tmp_path / "r3", "contract") == 0
    gates = {g["gate"]: g for g in _doc(release)["gates"]}
    assert gates["contract"]["passed"] is True and {g["report"] for g in gates.values()} == {"gate-report.json", kept}
    # (--no-html: the run has no HTML report, so no stale gate-report.html stays either)
    assert sorted(p.name for p in release.glob("gate-report*")) == sorted(
        ["gate-report.json", kept, kept.replace(".json", ".html")]
    )
    assert disagreements(release) == []
    from vlad.release.evidence import judge_evidence

    assert judge_evidence(release, release).status == "passed"
    capsys.readouterr()


def _doc(release: Path) -> dict:
    from vlad.release.manifest import read_manifest_document

    return read_manifest_document(release)


def test_a_release_plan_naming_files_outside_the_release_is_refused(tmp_path):
    from vlad.release.manifest import read_manifest_document
    from vlad_tools.gates.plan import PlanError, load_plan

    doc = read_manifest_document(candidates.DEMO)
    doc["gate_plan"]["equivalence"]["golden"] = "../../elsewhere/golden.npz"
    doc["gate_plan"]["equivalence"]["recordings"] = ["unlisted.mcap"]
    with pytest.raises(PlanError) as exc:
        load_plan(candidates.DEMO, manifest_document=doc)
    text = str(exc.value)
    assert "equivalence.golden: '../../elsewhere/golden.npz' lies outside the release folder" in text
    assert "equivalence.recordings[0]: 'unlisted.mcap' is not an artifact of the release" in text


def test_recording_refuses_a_malformed_report_or_manifest_in_one_line(tmp_path):
    """A report without its candidate, or a manifest whose artifact entry lost its path, is a
    one-line error (GateError / ManifestError), never a KeyError from deep inside."""
    from vlad import tomlwrite
    from vlad.release.manifest import ManifestError
    from vlad_tools.gates.evidence import record_evidence
    from vlad_tools.gates.results import REPORT_FORMAT, GateError

    release, reports = tmp_path / "release", tmp_path / "reports"
    shutil.copytree(candidates.DEMO, release)
    reports.mkdir()
    (reports / "report.json").write_text(json.dumps({"format": REPORT_FORMAT, "gates": []}))
    with pytest.raises(GateError, match="not a vlad gate report"):
        record_evidence(release, reports)

    report = {"format": REPORT_FORMAT, "gates": [], "candidate": {"path": str(release), "artifacts": {}}}
    (reports / "report.json").write_text(json.dumps(report))
    doc = _doc(release)
    del doc["artifacts"][0]["path"]
    (release / "manifest.toml").write_text(tomlwrite.dumps(doc))  # unvalidated, as a hand edit would
    with pytest.raises(ManifestError, match=r"artifacts\[0\].path: missing"):
        record_evidence(release, reports)
