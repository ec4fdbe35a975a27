"""Gate evidence in a release: recording a gate run into the manifest.

``vladctl gate ... --record`` calls :func:`record_evidence`: the run's report becomes a
``report`` artifact of the candidate (``gate-report.json``, and ``gate-report.html``
beside it), and each gate *it ran* a ``[[gates]]`` entry naming it with its sha256 and
verdict; the manifest is rewritten through :mod:`vlad.release.authoring` (hashes
refreshed). The signature no longer matches afterwards: the release owner re-signs with
``vladctl sign``.

The rule that judges the evidence (what deploy, activation and rollback demand) is
:mod:`vlad.release.evidence`; its names are re-exported here for the gate tools.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from vlad.release.evidence import (
    EvidenceMissing,
    check_evidence,
    enforce_evidence,
    judge_evidence,
    report_verdicts,
    required_gates,
)
from vlad_tools.gates.results import GATE_ORDER, REPORT_FORMAT, GateError

__all__ = [
    "REPORT_HTML",
    "REPORT_JSON",
    "EvidenceMissing",
    "check_evidence",
    "enforce_evidence",
    "judge_evidence",
    "record_evidence",
    "required_gates",
]

REPORT_JSON = "gate-report.json"
REPORT_HTML = "gate-report.html"


def record_evidence(release_dir: str | Path, report_dir: str | Path) -> list[dict[str, Any]]:
    """Record a gate run in a release folder's manifest; returns the ``[[gates]]`` entries it wrote.

    The run's ``report.json`` (and ``report.html``) become ``gate-report.json`` (``.html``),
    ``report`` artifacts. Exactly the gates the run ran (not those it skipped) get an entry
    pointing at it, with the report's verdict. An entry of a gate this run did not run is
    kept only together with its own report: a previous ``gate-report.json`` still
    referenced is kept as ``gate-report-<sha256[:12]>.json`` (and its ``.html``), and an
    entry whose vlad report was made for other artifacts is dropped. Reports no entry
    references any more are removed. So every entry's report says exactly what the entry
    says. A performance gate's measured peak memory becomes the manifest's ``[memory]``.
    Sign the release again afterwards (``vladctl sign``).
    """
    from vlad.release.authoring import refresh_hashes, write_manifest
    from vlad.release.manifest import MANIFEST_FILE, parse_manifest, read_manifest_document

    root, src = Path(release_dir), Path(report_dir)
    report_path = src / "report.json"
    try:
        report = json.loads(report_path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise GateError(f"{report_path}: cannot read the gate report ({exc}); run `vladctl gate` first") from None
    if not isinstance(report, dict) or report.get("format") != REPORT_FORMAT:
        raise GateError(f"{report_path}: not a vlad gate report")
    candidate = report.get("candidate")
    if (
        not isinstance(candidate, dict)
        or not isinstance(candidate.get("path"), str)
        or not isinstance(candidate.get("artifacts"), dict)
    ):
        raise GateError(f"{report_path}: not a vlad gate report (no candidate path and artifacts)")
    tested = Path(candidate["path"]).resolve()
    if tested != root.resolve():
        raise GateError(f"{report_path} judged {tested}, not {root.resolve()}: record a release's own report")
    doc = read_manifest_document(root)
    parse_manifest(doc, str(root / MANIFEST_FILE))  # every key below is then known to be there
    current = {a["path"]: a["sha256"] for a in doc.get("artifacts", [])}
    changed = [p for p, sha in candidate["artifacts"].items() if current.get(p) != sha]
    if changed:
        raise GateError(f"the release changed since it was gated ({', '.join(changed)}): run the gates again")
    ran = {gate: status for gate, status in report_verdicts(report).items() if status != "skipped"}
    if not ran:
        raise GateError(f"{report_path}: the run ran no gate; nothing to record")

    kept = [g for g in doc.get("gates", []) if g.get("gate") not in ran and _still_evidence(root, doc, g)]
    if any(g.get("report") == REPORT_JSON for g in kept):
        # The current report still backs gates this run did not run: keep it under its hash.
        kept_name = f"gate-report-{current[REPORT_JSON][:12]}"
        for suffix in (".json", ".html"):
            old = root / f"gate-report{suffix}"
            if old.is_file():
                old.replace(root / f"{kept_name}{suffix}")
        kept = [{**g, "report": f"{kept_name}.json"} if g.get("report") == REPORT_JSON else g for g in kept]
    shutil.copyfile(report_path, root / REPORT_JSON)
    if (src / "report.html").is_file():
        shutil.copyfile(src / "report.html", root / REPORT_HTML)
    else:
        (root / REPORT_HTML).unlink(missing_ok=True)
    gates = kept + [
        {"gate": name, "report": REPORT_JSON, "passed": status == "passed", "sha256": ""}
        for name, status in ran.items()
    ]
    gates.sort(key=lambda g: GATE_ORDER.index(g["gate"]) if g.get("gate") in GATE_ORDER else len(GATE_ORDER))
    referenced = {g["report"] for g in gates}
    wanted = _gate_reports(root, referenced)
    artifacts = [a for a in doc.get("artifacts", []) if not _is_gate_report(a.get("path", ""))]
    artifacts += [{"path": n, "role": "report", "size": 0, "sha256": ""} for n in sorted(wanted)]
    for path in root.glob("gate-report*"):
        if path.is_file() and path.name not in wanted:
            path.unlink()
    data = refresh_hashes({**doc, "artifacts": artifacts, "gates": gates}, root)
    perf = [g for g in report["gates"] if isinstance(g, dict) and g.get("gate") == "performance"]
    if "performance" in ran and perf:  # the measured peak replaces a planned or earlier figure
        from vlad_tools.gates.performance import measured_memory

        data["memory"] = measured_memory(perf[0].get("details") or {}) or data.get("memory")
        data = {k: v for k, v in data.items() if v is not None}
    write_manifest(root, data)
    return [g for g in data["gates"] if g["gate"] in ran]


def _is_gate_report(name: str) -> bool:
    return "/" not in name and name.startswith("gate-report") and name.endswith((".json", ".html"))


def _gate_reports(root: Path, referenced: set[str]) -> set[str]:
    """The gate-report files to keep: those referenced, and the HTML twin of each."""
    wanted = {r for r in referenced if _is_gate_report(r)}
    wanted |= {r[: -len(".json")] + ".html" for r in wanted if (root / (r[: -len(".json")] + ".html")).is_file()}
    return wanted


def _still_evidence(root: Path, doc: dict[str, Any], entry: dict[str, Any]) -> bool:
    """A kept entry's report is in the folder, and (for a vlad report) says the same as the
    entry and was made for the artifacts the manifest lists now."""
    report = str(entry.get("report", ""))
    path = root / report
    if not path.is_file() or path.is_symlink():
        return False
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return True  # an external report: its hash is the evidence
    verdict = report_verdicts(content).get(str(entry.get("gate")))
    if not verdict:
        return not report_verdicts(content)  # a vlad report without this gate backs nothing
    if (verdict == "passed") != (entry.get("passed") is True):
        return False
    tested = (content.get("candidate") or {}).get("artifacts") or {}
    current = {a["path"]: a["sha256"] for a in doc.get("artifacts", [])}
    return all(current.get(p) == sha for p, sha in tested.items())
