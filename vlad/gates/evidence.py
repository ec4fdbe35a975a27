"""Gate evidence in a release: recording it into the manifest, and checking it before deploy.

``vladctl gate ... --record`` calls :func:`record_evidence`: the report becomes a ``report``
artifact of the candidate (``gate-report.json``, and ``gate-report.html`` beside it), and
each gate's verdict a ``[[gates]]`` entry naming it with its sha256; the manifest is
rewritten through :mod:`vlad.release.manifest` (hashes refreshed). The signature no
longer matches afterwards: the release owner re-signs with ``vladctl sign``.

``vladctl deploy`` calls :func:`check_evidence` (or :func:`enforce_evidence`, which
raises unless the operator forces the deploy with a recorded reason): every gate the
manifest requires must have a passing entry whose report is in the release with the
hash the manifest lists, and a vlad gate report must say the gate passed *for these
artifacts* (the evidence of another build of the model does not count).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vlad.errors import VladError
from vlad.gates.results import GATE_ORDER, REPORT_FORMAT, GateError

REPORT_JSON = "gate-report.json"
REPORT_HTML = "gate-report.html"


class EvidenceMissing(VladError):
    """A release lacks passing gate evidence and the deploy was not forced."""


def _document(manifest_like: Any) -> Mapping[str, Any]:
    """The manifest as TOML-shaped data, from a Manifest, a mapping, or a release folder."""
    if isinstance(manifest_like, Mapping):
        return manifest_like
    if isinstance(manifest_like, (str, Path)):
        from vlad.release.manifest import read_manifest_document

        return read_manifest_document(manifest_like)
    doc = getattr(manifest_like, "document", None)
    if isinstance(doc, Mapping) and doc:
        return doc
    return manifest_like.to_dict()


def required_gates(manifest_like: Any) -> list[str]:
    """The gates a release requires: ``[gate_plan].required`` when present, else all four."""
    plan = _document(manifest_like).get("gate_plan")
    if isinstance(plan, Mapping) and isinstance(plan.get("required"), list):
        return [g for g in plan["required"] if g in GATE_ORDER]
    return list(GATE_ORDER)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_evidence(manifest_like: Any, release_dir: str | Path) -> list[str]:
    """Problems with the gate evidence of the release in ``release_dir``; empty = deployable.

    ``manifest_like`` is the release's :class:`~vlad.release.manifest.Manifest` (or its
    parsed TOML document). Per required gate: an entry in ``[[gates]]``, ``passed = true``,
    its report present with the sha256 the entry and ``[[artifacts]]`` list, and, for a
    vlad gate report, the gate passed in it on the artifacts this manifest lists.
    """
    doc = _document(manifest_like)
    root = Path(release_dir)
    artifacts = {a.get("path"): a for a in doc.get("artifacts", []) if isinstance(a, Mapping)}
    entries = [g for g in doc.get("gates", []) if isinstance(g, Mapping)]
    problems: list[str] = []
    reports: dict[str, Any] = {}
    for gate in required_gates(doc):
        mine = [g for g in entries if g.get("gate") == gate]
        if not mine:
            problems.append(f"gate {gate}: no evidence in the manifest")
            continue
        for g in mine:
            report = str(g.get("report", ""))
            where = f"gate {gate} (report {report})"
            if g.get("passed") is not True:
                problems.append(f"{where}: failed")
                continue
            path = root / report
            if not path.is_file():
                problems.append(f"{where}: report file missing from the release")
                continue
            digest = _sha256(path)
            if g.get("sha256") != digest:
                problems.append(
                    f"{where}: report hash mismatch (file {digest[:12]}, [[gates]] says {str(g.get('sha256'))[:12]})"
                )
                continue
            listed = artifacts.get(report)
            if listed is None or listed.get("sha256") != digest:
                problems.append(f"{where}: report is not a listed artifact with this hash")
                continue
            if report not in reports:
                reports[report] = _load_report(path)
            problems += _report_problems(where, gate, reports[report], artifacts)
    return problems


def _load_report(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None  # not JSON: an external report (e.g. a lab's PDF); its hash is what is trusted


def _report_problems(where: str, gate: str, report: Any, artifacts: Mapping[Any, Any]) -> list[str]:
    """A vlad gate report must say the gate passed, on exactly these artifacts."""
    if not isinstance(report, Mapping) or report.get("format") != REPORT_FORMAT:
        return []
    verdict = next((g for g in report.get("gates", []) if g.get("gate") == gate), None)
    if verdict is None:
        return [f"{where}: the report has no {gate} gate"]
    if verdict.get("status") != "passed":
        return [f"{where}: the report says {verdict.get('status')}"]
    tested = (report.get("candidate") or {}).get("artifacts") or {}
    changed = sorted(p for p, sha in tested.items() if p in artifacts and artifacts[p].get("sha256") != sha)
    gone = sorted(p for p in tested if p not in artifacts)
    if changed or gone:
        return [f"{where}: made for other artifacts ({', '.join(changed + gone)} differ): run the gates again"]
    return []


def enforce_evidence(
    manifest_like: Any, release_dir: str | Path, *, force: bool = False, why: str | None = None
) -> dict[str, Any]:
    """What ``vladctl deploy`` records: raises :class:`EvidenceMissing` when evidence is
    missing and the deploy is not forced with a reason; returns the decision otherwise
    (``{"forced": bool, "why": str | None, "problems": [...]}``) for the history."""
    problems = check_evidence(manifest_like, release_dir)
    if not problems:
        return {"forced": False, "why": why, "problems": []}
    if force and why and why.strip():
        return {"forced": True, "why": why, "problems": problems}
    if force:
        raise EvidenceMissing(
            "--force needs --why: say why this release may run without passing gate evidence "
            "(it is recorded in the history)"
        )
    raise EvidenceMissing(
        f"release {Path(release_dir).name} lacks passing gate evidence: {'; '.join(problems)}. "
        f"Run `vladctl gate {release_dir} --baseline CURRENT --report DIR --record` and re-sign, "
        "or deploy with --force --why '...' (recorded)"
    )


def record_evidence(release_dir: str | Path, report_dir: str | Path) -> list[dict[str, Any]]:
    """Add a gate report to a release folder's manifest as evidence; returns the ``[[gates]]``.

    Copies ``report.json`` (and ``report.html``) into the release as ``gate-report.json``
    (``.html``), lists them as ``report`` artifacts, replaces the ``[[gates]]`` entries of
    the gates the report ran, refreshes every hash and writes the manifest; a performance
    gate's measured peak memory becomes the manifest's ``[memory]``. Sign it again
    afterwards (``vladctl sign``).
    """
    from vlad.release.authoring import refresh_hashes, write_manifest
    from vlad.release.manifest import read_manifest_document

    root, src = Path(release_dir), Path(report_dir)
    report_path = src / "report.json"
    try:
        report = json.loads(report_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise GateError(f"{report_path}: cannot read the gate report ({exc}); run `vladctl gate` first") from None
    if report.get("format") != REPORT_FORMAT:
        raise GateError(f"{report_path}: not a vlad gate report")
    tested = Path(report["candidate"]["path"]).resolve()
    if tested != root.resolve():
        raise GateError(f"{report_path} judged {tested}, not {root.resolve()}: record a release's own report")
    doc = read_manifest_document(root)
    current = {a["path"]: a["sha256"] for a in doc.get("artifacts", [])}
    changed = [p for p, sha in report["candidate"]["artifacts"].items() if current.get(p) != sha]
    if changed:
        raise GateError(f"the release changed since it was gated ({', '.join(changed)}): run the gates again")
    shutil.copyfile(report_path, root / REPORT_JSON)
    names = [REPORT_JSON]
    if (src / "report.html").is_file():
        shutil.copyfile(src / "report.html", root / REPORT_HTML)
        names.append(REPORT_HTML)
    artifacts = [a for a in doc.get("artifacts", []) if a.get("path") not in names]
    artifacts += [{"path": n, "role": "report", "size": 0, "sha256": ""} for n in names]
    ran = {g["gate"]: g for g in report["gates"] if g["status"] != "skipped"}
    gates = [g for g in doc.get("gates", []) if g.get("gate") not in ran]
    gates += [
        {"gate": name, "report": REPORT_JSON, "passed": g["status"] == "passed", "sha256": ""}
        for name, g in ran.items()
    ]
    data = refresh_hashes({**doc, "artifacts": artifacts, "gates": gates}, root)
    if "performance" in ran:  # the measured peak replaces a planned or earlier figure
        from vlad.gates.performance import measured_memory

        data["memory"] = measured_memory(ran["performance"].get("details") or {}) or data.get("memory")
        data = {k: v for k, v in data.items() if v is not None}
    write_manifest(root, data)
    return [g for g in data["gates"] if g["gate"] in ran]
