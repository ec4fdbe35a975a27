"""The gates end to end: the demo passes all four, each broken candidate fails its gate.

Real everything: ``vlad serve`` subprocesses on real sockets, ONNX Runtime and PyTorch,
MuJoCo, the demo's signing key for the recorded evidence. Runs are small (few episodes
and calls, see conftest.SMALL); no figure is asserted against a time, only verdicts the
gates computed from the plan's budgets, and the slowed backend's sleep (100 ms, five times
the 20 ms deadline) as a lower bound. The candidates that fail a gate without a daemon
(contract, equivalence) are test_offline_gates.py's.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from tests.gates import candidates
from tests.gates.conftest import DEMO_PLAN, ROOT, SMALL, gate_cli, gate_named, small_plan, why

KEYS = ROOT / "etc" / "vlad" / "keys.d"
DEMO_KEY = ROOT / "etc" / "vlad" / "demo-signing-key.pem"


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """``vladctl gate`` on a copy of the demo release elsewhere with itself as the baseline (as
    the demo is gated, docs/gates.md), by the plan its manifest carries (the same as
    etc/vlad/demo-gates.toml, paths inside the release), with --record. The closed-loop gate
    then takes the candidate's episodes as the baseline's; a baseline served by its own daemon
    is the no-language test's."""
    tmp = tmp_path_factory.mktemp("demo-gate")
    release = shutil.copytree(candidates.DEMO, tmp / "robot" / candidates.DEMO.name)
    out = gate_cli(
        str(release),
        "--baseline",
        str(release),
        "--report",
        str(tmp / "report"),
        "--record",
        *SMALL,
    )
    return release, tmp / "report", out


def test_demo_release_passes_every_gate(demo_run):
    release, report_dir, out = demo_run
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads((report_dir / "report.json").read_text())
    assert report["passed"], why(report)
    assert [g["gate"] for g in report["gates"]] == ["contract", "equivalence", "performance", "closed_loop"]
    assert all(g["status"] == "passed" for g in report["gates"])
    # Progress for each gate and each long step, and the verdict table at the end.
    for line in (
        "[1/4] contract gate",
        "[4/4] closed_loop gate",
        "warm steady state",
        "episode 4/4",
        "golden 4/4",
        "replay demo_recording.mcap 40/40",
    ):
        assert line in out.stdout, line
    assert re.search(r"^closed_loop\s+PASSED", out.stdout, re.M)
    # What the report must carry beside the verdicts.
    perf = gate_named(report, "performance")["details"]
    assert set(perf["scenarios"]) == {"warm", "burst", "cpu_hog", "debug_logging"}
    assert perf["scenarios"]["warm"]["stages_ms"]["engine"]["count"] > 0
    # the recording's episode starts announce re-anchors: sent, answered by the next one, not measured
    assert perf["scenarios"]["warm"]["announced"] > 0
    assert perf["peak_rss_mib"] > 0 and perf["shape_switches"]["shapes"] == [1, 4, 8]
    eq = gate_named(report, "equivalence")["details"]
    assert "tensorrt" in eq["skipped"]  # skipped with the reason, not silently
    cl = gate_named(report, "closed_loop")["details"]
    assert cl["baseline_is_candidate"]  # its own baseline: no second daemon for the same episodes
    assert all(
        0 <= r["wilson95"][0] <= r["rate"] <= r["wilson95"][1] <= 1 for r in cl["candidate"]["per_instruction"].values()
    )
    for key in ("cpu", "governor", "loadavg_1_5_15", "versions", "gpu", "temperatures_c"):
        assert key in report["conditions"]


def test_the_demo_release_gates_from_a_copy_by_its_own_plan(demo_run):
    """Everything the demo's signed plan names is inside the release: a copy elsewhere runs
    its gates (golden fixtures and the recording) from its own files."""
    release, report_dir, out = demo_run
    report = json.loads((report_dir / "report.json").read_text())
    assert report["plan"]["source"].endswith("manifest.toml [gate_plan]"), report["plan"]
    assert report["plan"]["base_dir"] == str(release)
    golden = gate_named(report, "equivalence")["details"]["golden"]
    assert golden["path"] == str(release / "golden.npz") and golden["fixtures"] == 4
    assert "replay demo_recording.mcap 40/40" in out.stdout


def test_recorded_evidence_is_signed_and_passes_the_deploy_check(demo_run):
    from vlad.release.manifest import load_manifest
    from vlad.release.signing import sign_release, verify_release
    from vlad_tools.gates.evidence import check_evidence, enforce_evidence

    release, _, out = demo_run
    assert "sign it again" in out.stdout
    manifest = load_manifest(release)
    assert {g.gate: g.passed for g in manifest.gates} == dict.fromkeys(
        ("contract", "equivalence", "performance", "closed_loop"), True
    )
    assert {g.report for g in manifest.gates} == {"gate-report.json"}
    assert manifest.artifact("gate-report.html").role == "report"
    # the performance gate's measured peak is the release's memory need from now on
    report = json.loads((release / "gate-report.json").read_text())
    peak = gate_named(report, "performance")["details"]["peak_rss_mib"]
    assert manifest.memory is not None and manifest.memory.source == "performance-gate"
    assert manifest.memory.host_bytes == int(peak * 2**20) and manifest.memory.device_bytes == 0
    sign_release(release, DEMO_KEY)
    verified = verify_release(release, KEYS)
    assert check_evidence(verified.manifest, release) == []
    assert enforce_evidence(verified.manifest, release) == {
        "evidence": "passed",
        "forced": False,
        "why": None,
        "problems": [],
    }


def test_evidence_for_other_artifacts_or_a_changed_report_is_refused(demo_run, tmp_path):
    from vlad.release.authoring import update_hashes
    from vlad.release.manifest import load_manifest
    from vlad_tools.gates.evidence import check_evidence

    release = shutil.copytree(demo_run[0], tmp_path / "release")
    (release / "manifest.sig").unlink(missing_ok=True)
    report = release / "gate-report.json"
    report.write_text(report.read_text().replace('"passed": true', '"passed": false', 1))
    problems = check_evidence(load_manifest(release), release)
    assert problems and all("hash mismatch" in p for p in problems), problems

    release = shutil.copytree(demo_run[0], tmp_path / "rebuilt")
    (release / "policy.onnx").write_bytes((release / "policy.onnx").read_bytes() + b"\0")
    problems = check_evidence(update_hashes(release), release)  # a rebuilt artifact, hashes refreshed
    assert len(problems) == 4 and all("made for other artifacts (policy.onnx differ)" in p for p in problems)


def test_html_report_renders_in_headless_chromium(demo_run, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (scripts/bootstrap installs Debian's chromium when run as root)")
    html = demo_run[1] / "report.html"
    profile = tmp_path / "profile"
    profile.mkdir()
    out = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--virtual-time-budget=5000",
            "--dump-dom",
            html.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    status = re.search(r'id="render-status" data-rendered="(\d+)" data-total="(\d+)"', out.stdout)
    assert status, out.stdout[:2000]
    rendered, total = map(int, status.groups())
    assert total == 4 and rendered == total  # latency CDF, action errors, rollout divergence, success rates
    sizes = re.findall(r'data-rendered="(\d+)x(\d+)"', out.stdout)
    assert len(sizes) == 4 and all(int(w) > 100 and int(h) > 100 for w, h in sizes)
    assert "failed" not in re.findall(r'data-rendered="([^"]+)"', out.stdout)
    assert "http://" not in html.read_text() and "https://" not in html.read_text()  # self-contained


def test_slowed_backend_fails_the_performance_gate(built):
    release = candidates.slowed_backend(built / "slow")
    # The demo plan without the debug-logging run (a second cold start) and the shape
    # switches (engine calls at 100 ms each): the verdict at stake is the warm one.
    plan = built / "slow-gates.toml"
    text = DEMO_PLAN.read_text().replace('"../../manifests/demo/', f'"{ROOT}/manifests/demo/')
    plan.write_text(
        text.replace("\n[performance]\n", "\n[performance]\ndebug_logging = false\nshape_switch_calls = 0\n", 1)
    )
    assert "debug_logging = false" in plan.read_text()
    out = gate_cli(
        str(release),
        "--baseline",
        str(candidates.DEMO),
        "--plan",
        str(plan),
        "--report",
        str(built / "slow-report"),
        # the gate at stake: its outputs are the demo's (the wrapper only waits), so the
        # equivalence gate has nothing to find here, and the HTML report is the demo test's
        "--gates",
        "contract,performance",
        "--no-html",
        "--perf-calls",
        "40",
        "--bursts",
        "5",
        "--no-hog",
        env=candidates.SLOW_ENV,
    )
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads((built / "slow-report" / "report.json").read_text())
    assert [g["status"] for g in report["gates"]] == ["passed", "failed"], why(report)
    perf = gate_named(report, "performance")
    assert perf["reasons"][0].startswith("warm: end-to-end p99")
    assert "debug_logging" not in perf["details"]["scenarios"]  # the plan's options held
    warm = next(c for c in perf["checks"] if c["name"] == "warm: end-to-end p99")
    # The sleep is a lower bound: 5x the deadline. When the deadline monitor moved every warm
    # observation to the fallback hold (a loaded machine), nothing was answered and the
    # report holds "inf" (JSON has no infinity).
    assert warm["limit"] == 20.0 and float(warm["value"]) >= 100.0, warm
    assert re.search(r"^performance\s+FAILED\s+warm: end-to-end p99", out.stdout, re.M)


def test_policy_ignoring_the_instruction_fails_the_closed_loop_gate(built, ignores_instruction):
    from vlad_tools.gates.runner import run_gates

    release, plan_file = ignores_instruction
    # Its performance is the demo's (same graph on the same engine), measured in the demo test.
    report = run_gates(
        release,
        candidates.DEMO,
        built / "no-language-report",
        # the CPU-hog run and the run at the target's latency (150 ms) are the demo test's:
        # here only the verdict on the instruction matters, and two seeds per instruction
        # decide it (0 of 2 where the demo reaches 2 of 2)
        plan=small_plan(
            {"closed_loop": {"fidelity_under_hog": False, "latency_ms": 0.0, "episodes": 2}}, plan_file=plan_file
        ),
        # the equivalence gate compares the export with its own torch reference, which ignores
        # the instruction just the same: nothing to find there (and 5-8 s of loading torch)
        gates=["contract", "closed_loop"],
        progress=lambda m: None,
        html=False,
    )
    assert [g["status"] for g in report["gates"]] == ["passed", "failed"], why(report)
    cl = gate_named(report, "closed_loop")
    assert any(r.startswith("success rate 'reach the point opposite the red target': 0") for r in cl["reasons"])
    assert cl["details"]["baseline_is_candidate"] is False  # the baseline served by its own daemon
    per = cl["details"]["candidate"]["per_instruction"]
    assert per["reach the red target"]["rate"] >= 0.5  # it does follow the one instruction it hears
    assert cl["details"]["baseline"]["per_instruction"]["reach the point opposite the red target"]["rate"] >= 0.5
