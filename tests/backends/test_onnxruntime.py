"""ONNX Runtime specifics: the provider list is checked, never silently fallen back from."""

from __future__ import annotations

import numpy as np
import pytest

from vlad.errors import BackendError

ort = pytest.importorskip("onnxruntime")

from vlad_onnxruntime import OnnxRuntimeBackend, parse_providers  # noqa: E402

from .conftest import DEMO  # noqa: E402

ONNX = DEMO / "policy.onnx"
ONE_THREAD = {"intra_op_threads": 1, "inter_op_threads": 1}


@pytest.fixture(scope="module")
def backend():
    return OnnxRuntimeBackend()


def test_availability_lists_providers(backend):
    avail = backend.availability()
    assert avail.usable and "CPUExecutionProvider" in avail.providers
    assert avail.version == ort.__version__


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="CUDA EP present")
def test_missing_provider_is_refused_not_fallen_back(backend, contract):
    with pytest.raises(BackendError, match="requested CUDAExecutionProvider.*refusing to fall back"):
        backend.load(ONNX, contract, {"providers": ["CUDAExecutionProvider", "CPUExecutionProvider"]})


def test_unknown_provider_and_options_are_refused(backend, contract):
    with pytest.raises(BackendError, match="unknown execution provider 'CPUExecutionProvder'"):
        backend.load(ONNX, contract, {"providers": ["CPUExecutionProvder"]})
    with pytest.raises(BackendError, match="unknown option"):
        backend.load(ONNX, contract, {"intra_threads": 1})
    with pytest.raises(BackendError, match="graph_optimization_level"):
        backend.load(ONNX, contract, {"graph_optimization_level": "max"})
    with pytest.raises(BackendError, match="providers"):
        backend.load(ONNX, contract, {"providers": "CPUExecutionProvider"})


def test_provider_dropped_after_creation_is_refused(backend, contract, monkeypatch):
    """ORT drops a provider whose library or device fails at session creation; we must notice."""

    class Dropping(ort.InferenceSession):
        def get_providers(self):
            return []

    monkeypatch.setattr(ort, "InferenceSession", Dropping)
    with pytest.raises(BackendError, match="failed to register.*refusing to start"):
        backend.load(ONNX, contract, ONE_THREAD)


def test_gpu_request_without_cpu_disables_cpu_fallback(backend, contract, monkeypatch):
    seen = {}

    class Recording:
        def __init__(self, path, so, providers, provider_options):
            seen["fallback"] = so.get_session_config_entry("session.disable_cpu_ep_fallback")
            seen["providers"] = providers
            seen["options"] = provider_options
            raise RuntimeError("stop here\nsecond line")

    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(ort, "InferenceSession", Recording)
    with pytest.raises(BackendError, match="stop here$"):
        backend.load(ONNX, contract, {"providers": [["CUDAExecutionProvider", {"device_id": 0}]]})
    assert seen == {"fallback": "1", "providers": ["CUDAExecutionProvider"], "options": [{"device_id": "0"}]}


def test_parse_providers_merges_options():
    names, opts = parse_providers(
        {
            "providers": ["TensorrtExecutionProvider", ["CUDAExecutionProvider", {"device_id": 1}], "CPUExecutionProvider"],
            "provider_options": {"TensorrtExecutionProvider": {"trt_fp16_enable": False}},
        }
    )
    assert names == ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    assert opts == [{"trt_fp16_enable": "False"}, {"device_id": "1"}, {}]
    with pytest.raises(BackendError, match="listed twice"):
        parse_providers({"providers": ["CPUExecutionProvider", "CPUExecutionProvider"]})
    with pytest.raises(BackendError, match="not in providers"):
        parse_providers({"providers": ["CPUExecutionProvider"], "provider_options": {"CUDAExecutionProvider": {}}})


def test_node_placement_and_optimized_model_cache(backend, contract, golden, tmp_path):
    cache = tmp_path / "opt" / "policy.optimized.onnx"
    with backend.load(ONNX, contract, {**ONE_THREAD, "optimized_model_path": str(cache)}) as sess:
        d = sess.describe()
        assert d.providers == ("CPUExecutionProvider",)
        assert d.extra["nodes_per_provider"]["CPUExecutionProvider"] > 0
        assert cache.is_file()
        first = sess.infer(golden[0][0])["actions"]
        second = sess.infer(golden[1][0])["actions"]
        assert first is second  # output buffers are reused per batch size on CPU
    # The optimized graph loads with optimization off and gives the same answers.
    with backend.load(cache, contract, {**ONE_THREAD, "graph_optimization_level": "disable"}) as sess:
        out = sess.infer(golden[0][0])["actions"]
        assert np.abs(out - golden[0][1]["actions"]).max() <= 1e-4
