"""A deploy and a rollback derive each fact about the release once.

The daemon is composed in this process (:func:`vlad.daemon.supervisor.assemble`, what
``vlad serve`` runs) on a release store in tmp, and the deploy and the rollback go through
the same release operations the control server calls. Around them, the real functions
are wrapped with counters, per release id: every Ed25519 signature check (the trusted
keys handed out wrap their key), every TOML parse and every validation of a manifest,
every judgement of gate evidence. Each must run exactly once for the release an
operation brings in: it is verified once, into the one staged release that loading and
activation take as it is.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections import Counter
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.helpers import KEYS, signed_demo_copy, store_config
from vlad.config import RealtimeConfig
from vlad.daemon.child import endpoints_in
from vlad.daemon.supervisor import assemble
from vlad.daemon.systemd import Notifier
from vlad.health.state import StateMachine
from vlad.release import evidence, loading, manifest, signing, store
from vlad_tools.testing import DEMO

V1, V2 = "vlad-demo-reacher-1.0.0", "vlad-demo-reacher-1.1.0"


class CountingKey:
    """A trusted public key that counts the signatures it checks, by the release they sign."""

    def __init__(self, key: Any, counts: Counter[tuple[str, str]]) -> None:
        self.key, self.counts = key, counts

    def verify(self, signature: bytes, data: bytes) -> None:
        self.counts["signature", tomllib.loads(data.decode())["release"]["id"]] += 1
        self.key.verify(signature, data)


@pytest.fixture()
def counts(monkeypatch: pytest.MonkeyPatch) -> Counter[tuple[str, str]]:
    """Counters around the real functions, wherever a module holds its own name for them."""
    seen: Counter[tuple[str, str]] = Counter()
    load_keys, parse_document, parse_manifest = (
        signing.load_trusted_keys,
        manifest.parse_document,
        manifest.parse_manifest,
    )
    judge = evidence.judge_evidence

    def counted_keys(*args: Any, **kwargs: Any) -> Any:
        keys = load_keys(*args, **kwargs)
        return {k: dataclasses.replace(t, key=CountingKey(t.key, seen)) for k, t in keys.items()}

    def counted_document(*args: Any, **kwargs: Any) -> Any:
        doc = parse_document(*args, **kwargs)
        seen["toml", str(doc.get("release", {}).get("id"))] += 1
        return doc

    def counted_manifest(*args: Any, **kwargs: Any) -> Any:
        m = parse_manifest(*args, **kwargs)
        seen["manifest", m.release.id] += 1
        return m

    def counted_judge(manifest_like: Any, *args: Any, **kwargs: Any) -> Any:
        seen["evidence", manifest_like.release.id] += 1
        return judge(manifest_like, *args, **kwargs)

    monkeypatch.setattr(signing, "load_trusted_keys", counted_keys)
    for module in (manifest, signing):
        monkeypatch.setattr(module, "parse_document", counted_document)
        monkeypatch.setattr(module, "parse_manifest", counted_manifest)
    # Every module that judges evidence under its own name for the function.
    for module in (evidence, store, loading):
        monkeypatch.setattr(module, "judge_evidence", counted_judge, raising=False)
    return seen


def _config(tmp: Path) -> Any:
    st = store.ReleaseStore(tmp / "store", KEYS)
    st.activate(st.stage(DEMO), who="test", why="initial")
    cfg = store_config(tmp / "store")
    run = tmp / "run"
    run.mkdir()
    sockets = dataclasses.replace(cfg.sockets, **endpoints_in(run))
    # gc_freeze off: this test process is not a daemon that finished loading.
    return dataclasses.replace(cfg, sockets=sockets, realtime=RealtimeConfig(gc_freeze=False)), st


def test_a_deploy_and_a_rollback_verify_parse_and_judge_the_release_once(tmp_path, counts):
    cfg, st = _config(tmp_path)
    v2 = signed_demo_copy(tmp_path / "v2", "1.1.0", 2)
    results: dict[str, Any] = {}
    seen: dict[str, Counter[tuple[str, str]]] = {}

    async def run() -> None:
        async with AsyncExitStack() as stack:
            daemon = await assemble(cfg, stack, Notifier(""), StateMachine())
            releases = daemon.controls.releases
            counts.clear()  # the start's own verification of the release it serves
            results["deploy"] = await releases.deploy(str(v2), "tech", "count the work", canary=False, force=False)
            seen["deploy"] = Counter(counts)
            counts.clear()
            results["rollback"] = await releases.rollback("tech", "count it again")
            seen["rollback"] = Counter(counts)

    anyio.run(run)
    assert results["deploy"]["release"] == "vlad-demo-reacher@1.1.0"
    assert results["rollback"]["release"] == "vlad-demo-reacher@1.0.0"
    assert st.active() == V1 and st.previous() == V2
    once = {"signature": 1, "toml": 1, "manifest": 1, "evidence": 1}
    assert {what: n for (what, rid), n in seen["deploy"].items() if rid == V2} == once, seen["deploy"]
    assert {what: n for (what, rid), n in seen["rollback"].items() if rid == V1} == once, seen["rollback"]
