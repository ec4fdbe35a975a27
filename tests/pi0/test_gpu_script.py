"""scripts/gpu_pi0.py without a GPU: its CPU path at a tiny size, the hardware lookup, the table.

The CUDA-only steps (CUDA graphs, torch.compile, the backend on cuda) run on a GPU
machine; docs/planner.md says which figures are pending such a run.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

_spec = importlib.util.spec_from_file_location("gpu_pi0", ROOT / "scripts" / "gpu_pi0.py")
assert _spec is not None and _spec.loader is not None
gpu_pi0 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_pi0)


def test_gpu_names_map_to_planner_hardware():
    from vlad_tools.planner.spec import load_hardware_file

    known = load_hardware_file()
    for name, key in (
        ("NVIDIA H200", "h200"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("NVIDIA Jetson AGX Orin", "jetson-agx-orin-64gb"),
    ):
        assert gpu_pi0.hardware_key(name) == key and key in known
    assert gpu_pi0.hardware_key("NVIDIA L4") is None


def test_the_cpu_path_measures_and_predicts_each_component(cpu_run):
    proc, r = cpu_run
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert r["dtype"] == "fp32" and r["model"] == "pi0-x0.125-v1-b1-a1"
    assert set(r["measured"]) == {"eager"}  # CUDA graphs and the cuda backend need a GPU
    for comp in ("vision", "backbone", "action", "e2e"):
        assert r["measured"]["eager"][comp]["p50_ms"] > 0
        assert r["predicted"]["pi0.toml (source A)"][comp] > 0
    # the published figure the planner reproduces (docs/planner.md): 5.51 ms on an H200
    assert abs(r["predicted"]["pi0.toml (source A)"]["e2e"] - 5.51) < 0.01
    assert "predicted: built model" in proc.stdout and "e2e" in proc.stdout


def test_the_table_names_a_missing_hardware_entry():
    out = {
        "measured": {"eager": {c: {"p50_ms": 1.0} for c in ("vision", "backbone", "action", "e2e")}},
        "calls": 1,
        "warmup": 0,
        "device": "NVIDIA L4",
        "torch": "x",
        "hardware": None,
    }
    assert "give --hardware to predict" in gpu_pi0.table(out)


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict]:
    """One run of the script's CPU path at a tiny size, as the GPU machine has it: PyTorch and
    this checkout, every other module vlad depends on made unimportable. (The process and
    its JSON report.)"""
    out = tmp_path_factory.mktemp("gpu-pi0") / "gpu.json"
    blocked = ("numpy", "onnx", "onnxruntime", "tokenizers", "zmq", "psutil", "cryptography", "msgpack")
    argv = ["gpu_pi0.py", "--device", "cpu", "--scale", "0.125", "--layers", "1", "--calls", "2", "--warmup", "1"]
    argv += ["--hardware", "h200", "--json", str(out)]
    code = (
        "import sys, runpy\n"
        f"for m in {blocked!r}: sys.modules[m] = None\n"
        f"sys.argv = {argv!r}\n"
        "runpy.run_path('scripts/gpu_pi0.py', run_name='__main__')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    return proc, json.loads(out.read_text()) if out.is_file() else {}


def test_it_needs_nothing_but_torch(cpu_run):
    """The GPU machine has PyTorch and this checkout, nothing else vlad depends on."""
    proc, _ = cpu_run
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "predicted: pi0.toml (source A)" in proc.stdout
