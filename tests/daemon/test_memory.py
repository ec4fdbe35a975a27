"""Memory planning (vlad.daemon.memory): what a release needs, what the loaded policies hold,
refusals with the numbers, and the swap strategy, on the real daemon with signed releases.

The releases are copies of the demo release whose manifest states a ``[memory]`` need
(signed again with the demo key); the daemon's budget is set so that the need fits alone
but not beside the serving release, whose figure the daemon measured at its load.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.helpers import signed_demo_copy, store_config, wait_chunks, wait_release
from vlad.config import MemoryConfig
from vlad.daemon.memory import GB, MemoryBudget, PolicyMemory, claimed_manifest, stated_need
from vlad.errors import VladError
from vlad_tools.testing import DEMO, PERIOD_S, ControllerSim, load_golden, max_gap, start_daemon

KEYS = ROOT / "etc" / "vlad" / "keys.d"
DEMO_KEY = ROOT / "etc" / "vlad" / "demo-signing-key.pem"
MB = 2**20


def with_memory(release: Path, host_bytes: int, source: str = "operator") -> Path:
    """State ``host_bytes`` in ``release``'s manifest and sign it again (demo key)."""
    from vlad.release.authoring import write_manifest
    from vlad.release.manifest import read_manifest_document
    from vlad.release.signing import sign_release

    data = read_manifest_document(release)
    data["memory"] = {"host_bytes": host_bytes, "device_bytes": 0, "source": source}
    write_manifest(release, data)
    sign_release(release, DEMO_KEY)
    return release


# -- the budget, alone -----------------------------------------------------------------------


def test_budget_fits_refuses_with_numbers_or_swaps():
    loaded = {
        "release:a@1": PolicyMemory(700 * MB, 0, "measured"),
        "fallback1:b@1": PolicyMemory(100 * MB, 0, "measured"),
    }
    need = PolicyMemory(600 * MB, 0, "manifest (planner)")
    assert MemoryBudget(0, 0, "refuse").plan("deploy", "c", need, loaded, "release:a@1").action == "fits"
    assert MemoryBudget(1500, 0, "refuse").plan("deploy", "c", need, loaded, "release:a@1").action == "fits"
    with pytest.raises(VladError) as exc:
        MemoryBudget(1000, 0, "refuse").plan("deploy", "c", need, loaded, "release:a@1")
    msg = str(exc.value)
    assert msg.startswith("deploy of c refused: 0.63 GB of host memory (manifest (planner)) beside the 0.84 GB")
    assert "release:a@1 0.73 GB, fallback1:b@1 0.10 GB" in msg and "over the 1.05 GB budget" in msg
    assert "memory.host_budget_mb = 1000" in msg and 'set memory.swap = "fallback"' in msg
    assert MemoryBudget(1000, 0, "fallback").plan("deploy", "c", need, loaded, "release:a@1").action == "swap"
    with pytest.raises(VladError, match="does not fit even in place of the serving release"):
        MemoryBudget(650, 0, "fallback").plan("deploy", "c", need, loaded, "release:a@1")
    with pytest.raises(VladError, match="shadow run or canary holds both releases"):
        MemoryBudget(1000, 0, "fallback").plan("shadow", "c", need, loaded, None)
    # device memory is planned apart from host memory
    gpu = PolicyMemory(0, 5 * 2**30, "manifest (performance-gate)")
    with pytest.raises(VladError, match="of device memory"):
        MemoryBudget(0, 8 * 1024, "refuse").plan("shadow", "c", gpu, {"r": PolicyMemory(0, 4 * 2**30, "measured")})


def test_the_budget_hands_the_status_its_typed_part():
    loaded = {"release:a@1": PolicyMemory(700 * MB, 0, "measured"), "shadow:b@1": PolicyMemory(1, 2, "estimate")}
    st = MemoryBudget(1000, 0, "fallback").status(loaded, host_rss_bytes=5, readings_bytes={"available": 9.0})
    assert (st.host_rss_bytes, st.readings_bytes, st.swap) == (5, {"available": 9.0}, "fallback")
    assert (st.budget_host_bytes, st.budget_device_bytes) == (1000 * MB, None)  # 0: no budget
    assert st.policies == loaded and (st.policies_host_bytes, st.policies_device_bytes) == (700 * MB + 1, 2)


def test_a_need_is_read_only_from_an_authenticated_manifest(tmp_path):
    rel = tmp_path / "rel"
    shutil.copytree(DEMO, rel)
    with_memory(rel, 3 * 2**30, "performance-gate")

    def need(folder: Path, keys: str | None) -> PolicyMemory:
        return stated_need(folder, claimed_manifest(folder, keys))

    assert need(rel, str(KEYS)) == PolicyMemory(3 * 2**30, 0, "manifest (performance-gate)")
    # without verification (release.verify = false) the manifest is read as it is
    assert need(rel, None).host_bytes == 3 * 2**30
    # an edited manifest no longer carries its signature: its claim is not believed
    text = (rel / "manifest.toml").read_text().replace(f"host_bytes = {3 * 2**30}", "host_bytes = 1")
    (rel / "manifest.toml").write_text(text)
    estimated = need(rel, str(KEYS))
    model_files = sum(p.stat().st_size for p in DEMO.glob("*") if p.suffix in (".onnx", ".pt2"))
    assert estimated.source.startswith("estimate") and estimated.host_bytes >= (DEMO / "policy.onnx").stat().st_size
    assert estimated.host_bytes <= model_files + (DEMO / "policy_weights.pt").stat().st_size
    assert need(tmp_path / "missing", str(KEYS)).host_bytes == 0


# -- on the real daemon ------------------------------------------------------------------------


def _daemon(tmp_path: Path, budget_mb: float, swap: str):
    from vlad.release.store import ReleaseStore

    store_root = tmp_path / "store"
    store = ReleaseStore(store_root, KEYS)
    store.activate(store.stage(DEMO), who="test", why="initial")
    config = dataclasses.replace(store_config(store_root), memory=MemoryConfig(host_budget_mb=budget_mb, swap=swap))
    return start_daemon(tmp_path, config=config), store


def _measured_release_mb(client) -> float:
    mem = client.status()["memory"]
    [(name, fig)] = mem["policies"].items()
    assert name == "release:vlad-demo-reacher@1.0.0" and fig["source"] == "measured"
    # the load grew the daemon's memory (ONNX Runtime session, warm-up): a real figure
    assert fig["host_bytes"] > 1 * MB and mem["policies_host_bytes"] == fig["host_bytes"]
    return fig["host_bytes"] / MB


def test_operations_that_do_not_fit_are_refused_with_the_numbers(tmp_path):
    from vlad.client import ClientError

    budget_mb = 2000
    d, store = _daemon(tmp_path, budget_mb, "refuse")
    client = d.client()
    try:
        wait_release(client, "vlad-demo-reacher@1.0.0")
        held = _measured_release_mb(client)
        assert client.status()["memory"]["budget_host_bytes"] == budget_mb * MB
        # needs the whole budget: alone it would fit, beside the serving release it does not
        big = with_memory(signed_demo_copy(tmp_path / "big", "1.1.0", 2), budget_mb * MB)
        for op, args in (("deploy", {"who": "t", "why": "w"}), ("shadow_start", {})):
            with pytest.raises(ClientError) as exc:
                client.control(op, timeout_ms=60_000, path=str(big), **args)
            msg = str(exc.value)
            assert f"beside the {held * MB / GB:.2f} GB the loaded policies hold" in msg, msg
            assert f"over the {budget_mb * MB / GB:.2f} GB budget (memory.host_budget_mb = {budget_mb})" in msg
        assert "would fit in place of release:vlad-demo-reacher@1.0.0" in msg or "shadow run" in msg
        with pytest.raises(ClientError, match="canary of .* refused"):
            client.control("deploy", timeout_ms=60_000, path=str(big), who="t", why="w", canary=True)
        # nothing was staged or loaded: the store and the serving release are unchanged
        assert (
            store.active() == "vlad-demo-reacher-1.0.0"
            and not (tmp_path / "store" / "releases" / "vlad-demo-reacher-1.1.0").exists()
        )
        st = client.status()
        assert st["release"] == "vlad-demo-reacher@1.0.0" and st["shadow"] is None
        # a release whose need fits is deployed as usual
        small = with_memory(signed_demo_copy(tmp_path / "small", "1.2.0", 3), 10 * MB)
        r = client.control("deploy", timeout_ms=120_000, path=str(small), who="t", why="w")
        assert r["release"] == "vlad-demo-reacher@1.2.0" and "swap_gap_s" not in r
    finally:
        client.close()
        d.stop()
    assert "Traceback" not in d.log(), d.log()


def test_swap_serves_the_fallback_while_a_release_too_large_for_two_loads(tmp_path):
    budget_mb = 2000
    d, store = _daemon(tmp_path, budget_mb, "fallback")
    client = d.client()
    ctl = ControllerSim(client, load_golden()[0]).start()
    try:
        wait_release(client, "vlad-demo-reacher@1.0.0")
        _measured_release_mb(client)
        big = with_memory(signed_demo_copy(tmp_path / "big", "1.1.0", 2), budget_mb * MB)
        t0 = time.monotonic()
        result: dict = {}
        deploying = threading.Thread(
            target=lambda: result.update(client.control("deploy", timeout_ms=120_000, path=str(big), who="t", why="w"))
        )
        deploying.start()
        deploying.join(120)
        st = wait_release(client, "vlad-demo-reacher@1.1.0")
        assert result["release"] == "vlad-demo-reacher@1.1.0" and result["swap_gap_s"] > 0
        wait_chunks(ctl, n=10)  # and the new release streaming after the swap
        seen = ctl.since(t0)
        # the robot got a command every period throughout: holds while the release loaded
        assert max_gap(seen) <= 4 * PERIOD_S
        holds = [c for c in seen if c.is_hold]
        assert holds and (holds[-1].t_receive_ns - holds[0].t_receive_ns) / 1e9 <= result["swap_gap_s"] + 0.5
        kinds = [(e["kind"], e["reason"]) for e in client.control("events", limit=50)]
        swaps = [r for k, r in kinds if k == "memory_swap"]
        assert any("closed to make room for vlad-demo-reacher-1.1.0" in r for r in swaps), kinds
        assert any(f"serves after {result['swap_gap_s']:.3f} s on the fallback chain" in r for r in swaps), kinds
        assert store.active() == "vlad-demo-reacher-1.1.0"
        assert st["quarantined"] == {} and list(st["memory"]["policies"]) == ["release:vlad-demo-reacher@1.1.0"]
    finally:
        ctl.stop()
        client.close()
        d.stop()
    assert "Traceback" not in d.log(), d.log()


def test_the_performance_gate_records_its_measured_peak_as_the_need(tmp_path):
    from vlad.release.manifest import load_manifest
    from vlad_tools.gates.evidence import record_evidence
    from vlad_tools.gates.results import REPORT_FORMAT

    rel = tmp_path / "rel"
    shutil.copytree(DEMO, rel)
    with_memory(rel, 10 * MB, "planner")
    before = load_manifest(rel)
    report = tmp_path / "report"
    report.mkdir()

    def record(peak_rss_mib: float | None, artifacts) -> None:
        """A passed performance gate's report on ``artifacts`` (with their hashes), recorded into the release."""
        perf = {"peak_rss_mib": peak_rss_mib, "gpu_memory_mib": None}
        (report / "report.json").write_text(
            json.dumps(
                {
                    "format": REPORT_FORMAT,
                    "candidate": {"path": str(rel), "artifacts": {a.path: a.sha256 for a in artifacts}},
                    "gates": [{"gate": "performance", "status": "passed", "details": perf}],
                }
            )
        )
        record_evidence(rel, report)

    record(812.5, before.artifacts)
    m = load_manifest(rel)
    assert m.memory == type(m.memory)(int(812.5 * MB), 0, "performance-gate")
    # a report without a measured peak leaves the stated need as it was
    record(None, m.artifacts)
    assert load_manifest(rel).memory == m.memory


def test_a_broken_memory_table_is_refused_with_every_problem():
    from vlad.release.manifest import ManifestError, parse_manifest, read_manifest_document

    doc = read_manifest_document(DEMO)
    doc["memory"] = {"host_bytes": -1, "device_bytes": "a lot", "source": "guess", "peak": 3}
    with pytest.raises(ManifestError) as exc:
        parse_manifest(doc, "m")
    problems = exc.value.problems
    assert "memory.host_bytes: must be >= 0, got -1" in problems
    assert "memory.device_bytes: expected an integer, got a string" in problems
    assert any(p.startswith("memory.source: unknown value 'guess'") for p in problems)
    assert any(p.startswith("memory.peak: unknown key") for p in problems)
    doc["memory"] = {"host_bytes": True, "device_bytes": 0, "source": "planner"}  # a bool is no size
    with pytest.raises(ManifestError, match="memory.host_bytes: expected an integer, got a boolean"):
        parse_manifest(doc, "m")


def test_the_budget_in_the_configuration_is_checked(tmp_path):
    from vlad.config import ConfigError, load_config

    cfg = tmp_path / "vlad.toml"
    cfg.write_text('[memory]\nhost_budget_mb = -5\nswap = "sometimes"\n')
    with pytest.raises(ConfigError) as exc:
        load_config(cfg)
    text = str(exc.value)
    assert "memory.host_budget_mb" in text and "memory.swap" in text
