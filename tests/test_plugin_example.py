"""The example plugins of docs/plugins.md, installed the two ways vlad finds plugins.

* ``VLAD_PLUGIN_MODULES``: the modules by import path (an integrator's local plugin);
* a real entry point: ``vlad_example-0.1.0.dist-info/entry_points.txt``, written from the
  example's own ``pyproject.toml``, in a folder on ``PYTHONPATH`` — what ``pip install``
  leaves in site-packages, read by importlib.metadata and pluggy exactly the same way.

Each time a real daemon (``vlad serve``, vlad_tools.testing) serves the demo release's
contract on the ``example-onnx`` backend, and the door monitor's finding shows in
``vladctl status``. The doc itself is checked too: every hook is documented, and every
code excerpt is in the example's files.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import tomllib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT
from tests.helpers import exchange
from vlad import hookspecs
from vlad.config import Config, ReleaseConfig, ServeConfig
from vlad_tools.testing import DEMO, QUIET_MONITORS, load_golden, start_daemon, wait_until

EXAMPLE = ROOT / "docs" / "examples" / "vlad_example"
DOC = ROOT / "docs" / "plugins.md"
VLADCTL = Path(sys.executable).parent / "vladctl"
RELEASE = "vlad-demo-reacher@1.0.0"


def example_config() -> Config:
    """The demo release, unsigned, on the example backend (a signed manifest would name it)."""
    return Config(
        release=ReleaseConfig(
            path=str(DEMO), verify=False, backend="example-onnx", artifact="policy.onnx", options={"threads": 1}
        ),
        serve=ServeConfig(warmup=2),
    )


def vladctl(*args: str, env: dict[str, str] | None = None) -> str:
    import os

    out = subprocess.run(
        [str(VLADCTL), *args], capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=30
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


class Holding:
    """A controller that executes no chunk (``exec`` none): it holds its measured pose."""

    def __init__(self, client) -> None:
        self.client = client

    def publish_observation(self, **kw) -> None:
        self.client.publish_observation(**kw, executing=None)

    def recv_actions(self, **kw):
        return self.client.recv_actions(**kw)


def serve_and_check(tmp_path: Path, env: dict[str, str]) -> None:
    """The daemon serves the contract on example-onnx; the door's finding comes and goes."""
    import onnxruntime as ort

    from vlad.contract import load_contract
    from vlad.processing import Guide, Preprocessor, Tokenizer, decode_actions
    from vlad.serving.guard import ActionGuard
    from vlad.serving.rtc import soft_mask

    door = tmp_path / "door"
    door.write_text("closed")
    env = {**env, "VLAD_EXAMPLE_DOOR_FILE": str(door)}
    d = start_daemon(tmp_path, QUIET_MONITORS, env=env, config=example_config())
    client = d.client()
    control = d.endpoints["control"]
    try:
        # The chunks are the contract's: the same actions the offline pipeline computes, guarded
        # by the same guard. The controller executes nothing (it holds its measured pose), so
        # each chunk's seams start from the observation's joint state, as they do in process.
        contract = load_contract(DEMO / "contract.toml")
        tok = Tokenizer.from_contract(contract)
        ref_sess = ort.InferenceSession(str(DEMO / "policy.onnx"), providers=["CPUExecutionProvider"])
        pre = Preprocessor(contract, tok)
        guard = ActionGuard(contract)
        holding = Holding(client)
        cases = load_golden()
        assert cases
        for i, case in enumerate(cases):
            chunk = exchange(holding, case, 100 + i)
            assert chunk.release == RELEASE and chunk.source.startswith("release")
            assert chunk.actions.shape == (contract.action.chunk_length, contract.action.dim)
            assert guard.trusted.judge(case["raw"].proprio, chunk.t_sensor_ns) is None
            executing = guard.executing(None, chunk.t_sensor_ns, None)
            guide = None  # real-time chunking, where the daemon's latency made it continue the hold
            if chunk.rtc is not None:
                assert chunk.rtc[0] == executing.chunk == 0
                n, delay = contract.action.chunk_length, chunk.rtc[1]
                guide = Guide(executing.path[1:], soft_mask(n, delay, max(delay, executing.covered)))
            inputs = pre.fill(replace(case["raw"], sequence=100 + i), guide)
            ref = decode_actions(contract, {"actions": ref_sess.run(["actions"], inputs)[0]})
            # The daemon guarded it just before it left (t_issue): in the same slot, or the one before.
            for now in (chunk.t_issue_ns, chunk.t_issue_ns - chunk.period_ns):
                v = guard.check(
                    ref.copy(), now, chunk.valid_until_ns, chunk.t_sensor_ns, executing=executing, remember=False
                )
                if v.interventions == chunk.interventions and np.allclose(chunk.actions, v.actions, atol=1e-5):
                    break
            assert v.interventions == chunk.interventions
            np.testing.assert_allclose(chunk.actions, v.actions, atol=1e-5)

        status = vladctl("status", "--endpoint", control, env=env)
        assert re.search(r"^backend +example-onnx \(onnxruntime ", status, re.M), status
        assert "enclosure door open" not in status
        door.write_text("open")
        # awaited on the status socket (a vladctl process per poll costs a second each), then shown
        wait_until(lambda: any(f["monitor"] == "door" for f in client.status()["findings"]), 15, "the door finding")
        status = vladctl("status", "--endpoint", control, env=env)
        assert re.search(r"^warn +enclosure door open$", status, re.M), status
        st = json.loads(vladctl("status", "--json", "--endpoint", control, env=env))
        # A warning alone: DEGRADED, still serving the release (unless the busy machine adds a fault).
        assert st["state"] in ("DEGRADED", "FALLBACK") and st["backend"]["name"] == "example-onnx"
        assert any(f["monitor"] == "door" and f["code"] == "door_open" for f in st["findings"])
        door.write_text("closed")
        wait_until(lambda: all(f["monitor"] != "door" for f in client.status()["findings"]), 15, "the door to clear")
    finally:
        client.close()
        d.stop()
    assert "Traceback" not in d.log(), d.log()


def test_example_loaded_by_module_path(tmp_path):
    env = {"PYTHONPATH": str(EXAMPLE), "VLAD_PLUGIN_MODULES": "vlad_example.backend,vlad_example.door"}
    serve_and_check(tmp_path, env)


def write_dist_info(site: Path) -> dict[str, str]:
    """What ``pip install docs/examples/vlad_example`` records for importlib.metadata: the
    distribution's name and version, and its entry points from the example's pyproject."""
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    points = project["entry-points"]["vlad"]
    info = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    (info / "entry_points.txt").write_text("[vlad]\n" + "".join(f"{k} = {v}\n" for k, v in points.items()))
    return points


def test_example_loaded_through_its_entry_points(tmp_path):
    site = tmp_path / "site"
    points = write_dist_info(site)
    env = {"PYTHONPATH": f"{site}:{EXAMPLE}"}
    listed = json.loads(vladctl("plugins", "--json", env=env))
    mine = {p["name"]: p for p in listed["plugins"] if p["distribution"] == "vlad-example"}
    assert set(mine) == set(points) == {"example-backend", "example-door"}
    assert all(p["version"] == "0.1.0" for p in mine.values())
    assert {b["backend"] for b in listed["backends"] if b.get("usable")} >= {"example-onnx"}
    # VLAD_PLUGINS selects entry points by name: without this one, no example-onnx.
    listed = json.loads(vladctl("plugins", "--json", env={**env, "VLAD_PLUGINS": "onnxruntime"}))
    assert "example-onnx" not in {b["backend"] for b in listed["backends"]}
    serve_and_check(tmp_path, env)


# ---------------------------------------------------------------------------------------
# The page itself
# ---------------------------------------------------------------------------------------


def test_every_hook_is_documented():
    doc = DOC.read_text()
    hooks = [name for name, f in vars(hookspecs).items() if callable(f) and hasattr(f, f"{hookspecs.PROJECT}_spec")]
    assert hooks
    for name in hooks:
        assert f"`{name}" in doc, f"docs/plugins.md does not document the {name} hook"


def test_code_excerpts_are_the_examples_code():
    """Every python block of the page is a verbatim excerpt of the example's files, so the
    page cannot drift from the code the tests run."""
    doc = DOC.read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, re.S)
    assert blocks
    sources = "\n".join(p.read_text() for p in EXAMPLE.rglob("*.py"))
    for block in blocks:
        assert block.strip() in sources, f"not in docs/examples/vlad_example:\n{block}"
    from vlad.config import parse_config

    for block in re.findall(r"```toml\n(.*?)```", doc, re.S):
        if "[project" in block:  # packaging: the example's own (the page indents it in a list)
            assert textwrap.dedent(block).strip() in (EXAMPLE / "pyproject.toml").read_text(), block
        else:  # a daemon config: one vlad accepts
            parse_config(tomllib.loads(block))


def test_readme_lists_the_page():
    assert "`docs/plugins.md`" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("name", ["backend", "door"])
def test_example_modules_import_no_runtime(name):
    """Loading plugins must stay cheap: the example imports onnxruntime only when it loads a release."""
    code = f"import sys; import vlad_example.{name}; print('onnxruntime' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PYTHONPATH": str(EXAMPLE)}
    )
    assert out.stdout.strip() == "False"
