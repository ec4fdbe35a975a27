"""Gate evidence: the one rule every way to "active" goes through.

A release becomes active in three ways: ``vladctl release activate`` (the store), the
daemon's ``deploy`` (which activates in the store) and a rollback (the store's, from
``vladctl rollback``, the daemon's ``rollback`` or a canary abort). Each goes through the
store: the evidence is judged once (:func:`judge_evidence`), when the release is staged or
verified in the store (:class:`~vlad.release.store.StagedRelease`), and the rule
(:func:`require_evidence`) is applied once, by :meth:`~vlad.release.store.ReleaseStore.admit`,
before the release becomes active:

* **passed**: for every gate the manifest requires (``[gate_plan].required``, else all
  four), a ``[[gates]]`` entry with ``passed = true`` whose report is a listed artifact
  with the hash the entry names, and, for a vlad gate report, the gate passed in it on
  exactly the serving configuration and artifacts this manifest lists;
* **missing** (no entry, a report that is not this release's, ...) or **failed** (an entry
  or its report says the gate failed): refused, unless the operator forces it *with a
  reason*; the store records the override in its journal (``vladctl history`` and the
  daemon's status show it).

Integrity (signature, hashes, files) is checked before, by
:func:`vlad.release.signing.verify_release`, and is never overridable.

A daemon that starts on a release reports the same verdict in its status
(:mod:`vlad.daemon.releases`): ``passed``, ``forced`` (the store's journal holds the
override) or ``unverified`` (neither: served, but flagged loudly; see docs/releases.md).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vlad.errors import VladError
from vlad.files import open_beneath
from vlad.release.artifacts import ByContent, FileCheck
from vlad.release.manifest import GATES

__all__ = [
    "GATES",
    "REPORT_FORMAT",
    "Evidence",
    "EvidenceMissing",
    "check_evidence",
    "enforce_evidence",
    "judge_evidence",
    "report_verdicts",
    "require_evidence",
    "required_gates",
]

REPORT_FORMAT = "vlad.gate-report/1"
# A gate report is JSON of a few MiB at most (figures, plots' data); larger is not one.
MAX_REPORT_BYTES = 256 * 2**20


class EvidenceMissing(VladError):
    """A release lacks passing gate evidence (missing or failed) and was not forced with a reason."""


@dataclass(frozen=True)
class Evidence:
    """The verdict on a release's gate evidence: ``passed``, ``missing`` or ``failed``."""

    status: str
    problems: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status == "passed"

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "problems": list(self.problems)}


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
        return [g for g in plan["required"] if g in GATES]
    return list(GATES)


def judge_evidence(
    manifest_like: Any, release_dir: str | Path, files: Mapping[str, FileCheck] | None = None
) -> Evidence:
    """The gate evidence of the release in ``release_dir`` (its manifest or document).

    ``files``: the hashes a verification of this folder just computed
    (:attr:`~vlad.release.signing.VerifiedRelease.files`); a report file still the one
    hashed is not hashed again.
    """
    doc = _document(manifest_like)
    root = Path(release_dir)
    artifacts = {a.get("path"): a for a in doc.get("artifacts", []) if isinstance(a, Mapping)}
    entries = [g for g in doc.get("gates", []) if isinstance(g, Mapping)]
    problems: list[str] = []
    failed = False
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
                failed = True
                continue
            listed = artifacts.get(report)
            if listed is None or listed.get("sha256") != g.get("sha256"):
                problems.append(f"{where}: the report is not a listed artifact with the hash [[gates]] names")
                continue
            if report not in reports:
                reports[report] = _read_report(root, report, str(listed.get("sha256")), (files or {}).get(report))
            content = reports[report]
            if isinstance(content, str):  # a problem reading it
                problems.append(f"{where}: {content}")
                continue
            more, says_failed = _report_problems(where, gate, content, doc, artifacts)
            problems += more
            failed |= says_failed
    status = "passed" if not problems else "failed" if failed else "missing"
    return Evidence(status, tuple(problems))


def _read_report(root: Path, report: str, sha256: str, known: FileCheck | None) -> Any:
    """The report's parsed JSON (None: not JSON, an external report whose hash is what is
    trusted), or a problem string. Read inside the folder, never through a link; hashed
    unless ``known`` says this very file was just hashed with ``sha256``."""
    try:
        fd = open_beneath(root, report)
    except FileNotFoundError:
        return "report file missing from the release"
    except VladError as exc:
        return str(exc)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if st.st_size > MAX_REPORT_BYTES:
            return f"report of {st.st_size} bytes, more than the {MAX_REPORT_BYTES} a gate report may have"
        data = f.read(MAX_REPORT_BYTES + 1)
    trusted = known is not None and known.sha256 == sha256 and known.same_file(st)
    digest = sha256 if trusted else hashlib.sha256(data).hexdigest()
    if digest != sha256:
        return f"report hash mismatch (file {digest[:12]}, the manifest says {sha256[:12]})"
    return _REPORTS.get(digest, lambda: _verdict_part(data))


# What the evidence rule reads of each report parsed, by its sha256: a release verified
# again (a rollback, a canary's abort) does not parse its report again.
_REPORTS: ByContent[Any] = ByContent()


def _verdict_part(data: bytes) -> Any:
    """The parts of a report that :func:`_report_problems` reads (its format, candidate and
    each gate's verdict); None for a file that is not JSON or not a vlad gate report
    (external evidence: its hash is what is trusted)."""
    try:
        report = json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(report, Mapping) or report.get("format") != REPORT_FORMAT:
        return None
    return {
        "format": REPORT_FORMAT,
        "candidate": report.get("candidate"),
        "gates": [{"gate": gate, "status": status} for gate, status in report_verdicts(report).items()],
    }


def report_verdicts(report: Any) -> dict[str, str]:
    """Gate -> status (``passed``, ``failed``, ``error``, ``skipped``) in a vlad gate report."""
    if not isinstance(report, Mapping) or report.get("format") != REPORT_FORMAT:
        return {}
    gates = report.get("gates")
    out: dict[str, str] = {}
    for g in gates if isinstance(gates, list) else []:
        if isinstance(g, Mapping) and isinstance(g.get("gate"), str):
            out[g["gate"]] = str(g.get("status"))
    return out


def _report_problems(
    where: str, gate: str, report: Any, doc: Mapping[str, Any], artifacts: Mapping[Any, Any]
) -> tuple[list[str], bool]:
    """A vlad gate report must say the gate passed, on this serving configuration and
    these artifacts. Returns (problems, whether the report says the gate failed)."""
    if not isinstance(report, Mapping) or report.get("format") != REPORT_FORMAT:
        return [], False  # an external report (a lab's PDF, eval.json): its hash is the evidence
    status = report_verdicts(report).get(gate)
    if status is None:
        return [f"{where}: the report has no {gate} gate"], False
    if status != "passed":
        return [f"{where}: the report says {status}"], status in ("failed", "error")
    candidate = report.get("candidate")
    candidate = candidate if isinstance(candidate, Mapping) else {}
    tested = candidate.get("artifacts")
    tested = tested if isinstance(tested, Mapping) else {}
    changed = sorted(str(p) for p, sha in tested.items() if p in artifacts and artifacts[p].get("sha256") != sha)
    gone = sorted(str(p) for p in tested if p not in artifacts)
    backend = _table(doc, "backend")
    serving = artifacts.get(backend.get("artifact"))
    if serving is not None and backend.get("artifact") not in tested:
        gone.append(f"{backend.get('artifact')} (the serving artifact was not gated)")
    if changed or gone:
        return [f"{where}: made for other artifacts ({', '.join(changed + gone)} differ): run the gates again"], False
    gated = candidate.get("serving")
    if isinstance(gated, Mapping) and backend and _serving(gated) != _serving(backend):
        return [
            f"{where}: made for backend {_serving(gated)}, the manifest serves {_serving(backend)}: run the gates again"
        ], False
    return [], False


def _table(doc: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = doc.get(key)
    return value if isinstance(value, Mapping) else {}


def _serving(spec: Mapping[str, Any]) -> str:
    name = spec.get("backend", spec.get("name"))
    options = spec.get("options") if isinstance(spec.get("options"), Mapping) else {}
    return f"{name} on {spec.get('artifact')} {json.dumps(options, sort_keys=True, default=str)}"


def check_evidence(
    manifest_like: Any, release_dir: str | Path, files: Mapping[str, FileCheck] | None = None
) -> list[str]:
    """Problems with the gate evidence of the release in ``release_dir``; empty = deployable."""
    return list(judge_evidence(manifest_like, release_dir, files).problems)


def require_evidence(
    evidence: Evidence, release_id: str, release_dir: str | Path, *, force: bool, why: str | None, retry: str
) -> dict[str, Any]:
    """The rule: passing evidence, or ``force`` with a reason. Raises
    :class:`EvidenceMissing` (one line: what is wrong and what to do) otherwise; returns
    what the store's journal records. ``retry`` is the command that forces it, e.g.
    ``vladctl release activate ID --force --why '...'``."""
    record: dict[str, Any] = {"evidence": evidence.status}
    if evidence.ok:
        return record
    record["evidence_problems"] = list(evidence.problems)
    if force and why and why.strip():
        return record
    if force:
        raise EvidenceMissing(
            f"--force needs --why: say why release {release_id} may run without passing gate evidence "
            "(it is recorded in the history)"
        )
    shown = "; ".join(evidence.problems[:4]) + ("; ..." if len(evidence.problems) > 4 else "")
    if evidence.status == "failed":
        raise EvidenceMissing(
            f"release {release_id} failed its gates ({shown}): fix it and gate it again (its report says why), "
            f"or run it anyway with `{retry}` (recorded in the history)"
        )
    raise EvidenceMissing(
        f"release {release_id} lacks passing gate evidence ({shown}): run "
        f"`vladctl gate {release_dir} --baseline CURRENT --report DIR --record` where it is built, "
        f"sign it again and stage the new release, or run it anyway with `{retry}` (recorded in the history)"
    )


def enforce_evidence(
    manifest_like: Any,
    release_dir: str | Path,
    *,
    force: bool = False,
    why: str | None = None,
    files: Mapping[str, FileCheck] | None = None,
) -> dict[str, Any]:
    """:func:`judge_evidence` then :func:`require_evidence` for a deploy; returns
    ``{"evidence": status, "forced": bool, "why": ..., "problems": [...]}``."""
    evidence = judge_evidence(manifest_like, release_dir, files)
    doc = _document(manifest_like)
    release = _table(doc, "release")
    rid = str(release.get("id") or Path(release_dir).name)
    require_evidence(
        evidence, rid, release_dir, force=force, why=why, retry=f"vladctl deploy {release_dir} --force --why '...'"
    )
    return {
        "evidence": evidence.status,
        "forced": not evidence.ok,
        "why": why,
        "problems": list(evidence.problems),
    }
