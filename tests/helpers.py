"""Helpers the test modules share (beyond :mod:`vlad_tools.testing`, which the package ships):
small signed releases, the demo release re-signed under another version, and waits on a
live daemon's state and a simulated controller's chunks.

Test modules import from here, never from each other.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import shutil
import time
from pathlib import Path

from vlad.config import Config, ReleaseConfig, ServeConfig, StoreConfig
from vlad.protocol import ActionChunk
from vlad.release.authoring import new_manifest_data, write_manifest
from vlad.release.signing import generate_keypair, sign_release
from vlad_tools.testing import PERIOD_S, ControllerSim, wait_until
from vlad_tools.testing.releases import REPO as ROOT
from vlad_tools.testing.releases import signed_demo_copy  # noqa: F401 (the tests' name for it)

KEYS = ROOT / "etc" / "vlad" / "keys.d"  # the demo signing key's public half
DEMO_CONTRACT = ROOT / "manifests" / "demo" / "contract.toml"


def history_data(contract, frames: int) -> dict:
    """The demo contract as TOML data, with ``[history] frames`` and the time axis added."""
    import copy

    data = copy.deepcopy(contract.to_dict())
    data["history"] = {"frames": frames}
    for t in data["inputs"]:
        if t["name"] == contract.cameras[0].input:
            t["layout"], t["shape"] = "NTCHW", [1, frames, *t["shape"][1:]]
        if t["name"] == contract.proprio.input:
            t["layout"], t["shape"] = "NTD", [1, frames, *t["shape"][1:]]
    return data


# ---------------------------------------------------------------------------------------
# Small synthetic releases (manifest, signing, store tests)
# ---------------------------------------------------------------------------------------

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
NOW = T0 + dt.timedelta(days=10)
TOKENIZER = {
    "version": "1.0",
    "model": {"type": "WordLevel", "vocab": {"[PAD]": 0, "[UNK]": 1, "reach": 2}, "unk_token": "[UNK]"},
}


def make_keys(base: Path, name: str = "test") -> tuple[Path, Path]:
    """A key pair in base/private and a trusted-keys folder base/keys.d with its public half."""
    _, private, public = generate_keypair(base / "private", name)
    trusted = base / "keys.d"
    trusted.mkdir(exist_ok=True)
    shutil.copy(public, trusted / public.name)
    return private, trusted


def make_release(
    folder: Path,
    private_key: Path | None,
    *,
    release_id: str = "r1",
    version_code: int = 1,
    payload: bytes = b"model bytes",
    gate_passed: bool | None = True,
    required: tuple[str, ...] = ("closed_loop",),
    **overrides,
) -> Path:
    """A tiny but real release: the demo contract (tokenizer hash patched), a small tokenizer,
    fake model/config/report files, a manifest and (with ``private_key``) its signature.

    Its gate plan requires ``required``; ``eval.json`` is its closed-loop evidence, passed
    or failed (``gate_passed``; None: no evidence at all)."""
    folder.mkdir(parents=True)
    tok = json.dumps(TOKENIZER).encode()
    (folder / "tokenizer.json").write_bytes(tok)
    contract = re.sub(
        r'sha256 = "[0-9a-f]{64}"', f'sha256 = "{hashlib.sha256(tok).hexdigest()}"', DEMO_CONTRACT.read_text()
    )
    (folder / "contract.toml").write_text(contract)
    (folder / "policy.onnx").write_bytes(payload * 10)
    (folder / "model_config.json").write_text('{"width": 8}\n')
    (folder / "eval.json").write_text('{"results": []}\n')
    args = dict(
        release_id=release_id,
        version=f"1.0.{version_code}",
        version_code=version_code,
        backend="onnxruntime",
        artifact="policy.onnx",
        options={"intra_op_threads": 1},
        not_before=T0,
        expires=T0 + dt.timedelta(days=365),
        gates=[] if gate_passed is None else [{"gate": "closed_loop", "report": "eval.json", "passed": gate_passed}],
    )
    args.update(overrides)
    data = new_manifest_data(folder, **args)
    data["gate_plan"] = {"required": list(required)}
    write_manifest(folder, data)
    if private_key is not None:
        sign_release(folder, private_key, now=NOW)
    return folder


# ---------------------------------------------------------------------------------------
# The demo release under another version (deploy, memory, FIFO tests)
# ---------------------------------------------------------------------------------------


def store_config(store_root: Path) -> Config:
    """A daemon serving the store's active release (signed: verified with the demo key)."""
    return Config(
        release=ReleaseConfig(path=str(store_root / "releases" / "active"), keys_dir=str(KEYS)),
        serve=ServeConfig(warmup=3),
        store=StoreConfig(root=str(store_root)),
    )


# ---------------------------------------------------------------------------------------
# A live daemon and its controller
# ---------------------------------------------------------------------------------------

# What "no gap" is checked as on a shared 2-core test machine: a chunk at least every 3
# control periods (+10 ms). The daemon bridges a silent policy after 1.5 periods (longest
# gap between chunks 21-35 ms on a quiet machine: docs/benchmarks.md, "Hot-swap"); the rest
# is scheduling jitter while the whole suite runs beside it. Each chunk is valid for 8
# periods, so the controller always holds a valid command; without bridging the gap would
# last until the inference deadline moved down the chain.
MAX_GAP_S = 3 * PERIOD_S + 0.01


def wait_release(client, release: str, timeout: float = 10.0) -> dict:
    st: dict = {}

    def serving() -> bool:
        st.update(client.status())
        return st["release"] == release and st["state"] in ("ACTIVE", "DEGRADED")

    try:
        wait_until(serving, timeout, f"{release} serving", poll=0.05)
        return st
    except AssertionError:
        pass
    events = [(e["kind"], e["reason"]) for e in client.control("events", limit=30)]
    raise AssertionError(
        f"serving {st['release']} ({st['state']}), wanted {release}; findings {st['findings']}; events {events}"
    )


def wait_state(client, state: str, serving_prefix: str | None = None, timeout: float = 10.0) -> dict:
    """The daemon's status once it is in ``state`` serving a policy whose id starts with
    ``serving_prefix``; DEGRADED (the release serving with warnings, e.g. a p99 over budget on
    a loaded machine) counts as ACTIVE."""
    last: dict = {}

    def reached() -> bool:
        last.clear()
        last.update(client.status())
        ok = last["state"] == state or (state == "ACTIVE" and last["state"] == "DEGRADED")
        return ok and (serving_prefix is None or last["serving"].startswith(serving_prefix))

    try:
        wait_until(reached, timeout, poll=0.05)
    except AssertionError:
        raise AssertionError(
            f"state {last.get('state')} serving {last.get('serving')}, wanted {state} {serving_prefix}; "
            f"quarantined {last.get('quarantined')}; findings {last.get('findings')}"
        ) from None
    return dict(last)


def wait_chunks(ctl: ControllerSim, source: str = "", n: int = 10, timeout: float = 10.0) -> list[ActionChunk]:
    """The first ``n`` chunks from a source starting with ``source`` (any source: "") that
    ``ctl`` gets from now."""
    t0 = time.monotonic()

    def got() -> list[ActionChunk]:
        return [c for c in ctl.since(t0) if c.source.startswith(source)]

    try:
        wait_until(lambda: len(got()) >= n, timeout, poll=0.02)
    except AssertionError:
        raise AssertionError(
            f"fewer than {n} chunks from {source!r}; got {[c.source for c in ctl.since(t0)][-20:]}"
        ) from None
    return got()


def golden_obs(case):
    raw = case["raw"]
    return dict(images=dict(raw.images), proprio=raw.proprio, instruction=raw.instruction)


def exchange(client, case, seq, tries=50):
    """Publish until the chunk for ``seq`` arrives (the first few may hit the slow joiner).

    Every try carries a fresh sensor time, so a slow machine never turns a retry stale.
    """
    sent = set()
    for _ in range(tries):
        t_sensor = time.monotonic_ns()
        sent.add(t_sensor)
        client.publish_observation(**golden_obs(case), seq=seq, t_sensor_ns=t_sensor)
        chunk = client.recv_actions(timeout_ms=200)
        deadline = time.monotonic() + 0.3
        while chunk is not None and (chunk.obs_seq != seq or chunk.is_hold):
            # hold postures keep coming while the daemon holds: look only briefly
            chunk = client.recv_actions(timeout_ms=50) if time.monotonic() < deadline else None
        if chunk is not None:
            assert chunk.t_sensor_ns in sent
            return chunk
    raise AssertionError(f"no action chunk for observation {seq}")
