"""ONNX Runtime specifics: the provider list is checked, never silently fallen back from."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vlad.errors import BackendError

ort = pytest.importorskip("onnxruntime")

from vlad_onnxruntime import OnnxRuntimeBackend, OrtOptions  # noqa: E402

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
    with pytest.raises(BackendError, match=r"options.intra_threads: unknown key \(did you mean 'intra_op_threads'\?\)"):
        backend.load(ONNX, contract, {"intra_threads": 1})
    with pytest.raises(BackendError, match="graph_optimization_level: unknown value 'max'"):
        backend.load(ONNX, contract, {"graph_optimization_level": "max"})
    with pytest.raises(BackendError, match="options.providers: expected an array, got a string"):
        backend.load(ONNX, contract, {"providers": "CPUExecutionProvider"})


def test_provider_dropped_after_creation_is_refused(backend, contract, monkeypatch):
    """ORT drops a provider whose library or device fails at session creation; we must notice."""

    class Dropping(ort.InferenceSession):
        def get_providers(self):
            return []

    monkeypatch.setattr(ort, "InferenceSession", Dropping)
    with pytest.raises(BackendError, match="failed to register.*refusing to start"):
        backend.load(ONNX, contract, ONE_THREAD)


def test_gpu_request_lets_ort_place_shape_nodes_and_turns_tf32_off(backend, contract, monkeypatch):
    """No session.disable_cpu_ep_fallback (it refuses the demo's Shape -> Concat -> Expand
    shape nodes outright); the CUDA provider computes fp32 (use_tf32=0); the wheels' CUDA
    libraries are loaded before the session, so torch need not be imported first."""
    seen = {}

    class Recording:
        def __init__(self, path, so, providers, provider_options):
            try:
                seen["fallback"] = so.get_session_config_entry("session.disable_cpu_ep_fallback")
            except Exception:  # ORT raises for a key that was never set
                seen["fallback"] = None
            seen["providers"] = providers
            seen["options"] = provider_options
            raise RuntimeError("stop here\nsecond line")

    preloaded = []
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(ort, "preload_dlls", lambda **kw: preloaded.append(kw), raising=False)
    monkeypatch.setattr(ort, "InferenceSession", Recording)
    with pytest.raises(BackendError, match="stop here$"):
        backend.load(ONNX, contract, {"providers": [["CUDAExecutionProvider", {"device_id": 0}]]})
    assert seen == {
        "fallback": None,
        "providers": ["CUDAExecutionProvider"],
        "options": [{"device_id": "0", "use_tf32": "0"}],
    }
    assert preloaded == [{}]


def test_provider_list_merges_options():
    names, opts = OrtOptions.parse(
        {
            "providers": [
                "TensorrtExecutionProvider",
                ["CUDAExecutionProvider", {"device_id": 1}],
                "CPUExecutionProvider",
            ],
            "provider_options": {"TensorrtExecutionProvider": {"trt_max_workspace_size": 2**30}},
        }
    ).provider_list()
    assert names == ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    assert opts == [{"trt_max_workspace_size": str(2**30)}, {"device_id": "1"}, {}]
    with pytest.raises(BackendError, match="listed twice"):
        OrtOptions.parse({"providers": ["CPUExecutionProvider", "CPUExecutionProvider"]})
    with pytest.raises(BackendError, match="not in providers"):
        OrtOptions.parse({"providers": ["CPUExecutionProvider"], "provider_options": {"CUDAExecutionProvider": {}}})


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


# ---------------------------------------------------------------------------------------
# Node placement judged from the profile (no GPU needed: a real CPU profile, relabelled)
# ---------------------------------------------------------------------------------------

from vlad_onnxruntime import gpu as gpu_paths  # noqa: E402
from vlad_onnxruntime.placement import judge_placement, nodes_from_profile  # noqa: E402

CUDA, TRT, CPU = "CUDAExecutionProvider", "TensorrtExecutionProvider", "CPUExecutionProvider"


@pytest.fixture(scope="module")
def demo_profile(tmp_path_factory, contract) -> list[dict]:
    """The profile events of one real run of the demo policy on ONNX Runtime's CPU provider."""
    import json

    from vlad.backend import example_inputs

    so = ort.SessionOptions()
    so.enable_profiling = True
    so.intra_op_num_threads = 1
    so.profile_file_prefix = str(tmp_path_factory.mktemp("profile") / "demo")
    sess = ort.InferenceSession(str(ONNX), so, providers=[CPU])
    sess.run(None, example_inputs(contract))
    with open(sess.end_profiling()) as f:
        return json.load(f)


def _relabel(events: list[dict], on_cpu: set[str], default: str = CUDA) -> list[dict]:
    """The same profile as if ``default`` had run every node except those named in ``on_cpu``."""
    out = []
    for ev in events:
        ev = {**ev, "args": dict(ev.get("args", {}))}
        if ev.get("cat") == "Node" and "provider" in ev["args"]:
            node = ev["name"].removesuffix("_kernel_time")
            ev["args"]["provider"] = CPU if node in on_cpu else default
        out.append(ev)
    return out


def test_profile_nodes_carry_op_provider_and_output_types(demo_profile):
    nodes = {n.name: n for n in nodes_from_profile(demo_profile)}
    assert len(nodes) > 500
    concat = nodes["node_Concat_11"]
    assert (concat.op, concat.provider, concat.outputs) == ("Concat", CPU, (("int64", (4,)),))
    assert concat.is_shape_computation
    expand = nodes["node_expand"]
    assert expand.outputs == (("float", (1, 2, 64, 64)),) and not expand.is_shape_computation


def test_shape_nodes_on_the_cpu_are_allowed(demo_profile):
    """ORT puts the demo's Shape -> Concat (int64) on the CPU on purpose; that is fine."""
    events = _relabel(demo_profile, {"node_Shape_0", "node_Concat_11"})
    placement, refusal = judge_placement(events, [CUDA])
    assert refusal is None
    assert [n.name for n in placement.cpu_shape_nodes] == ["node_Shape_0", "node_Concat_11"]
    assert not placement.cpu_compute_nodes
    assert placement.nodes_per_provider[CPU] == 2 and placement.nodes_per_provider[CUDA] > 500


def test_compute_nodes_on_the_cpu_are_refused(demo_profile):
    events = _relabel(demo_profile, {"node_Concat_11", "node_expand", "node_linear"})
    placement, refusal = judge_placement(events, [CUDA])
    assert sorted(n.name for n in placement.cpu_compute_nodes) == ["node_expand", "node_linear"]
    assert refusal.startswith("2 compute node(s) fell back to CPUExecutionProvider, which was not requested")
    assert "Expand 'node_expand' -> float[1, 2, 64, 64]" in refusal and "add CPUExecutionProvider" in refusal
    # Listed by the release, the CPU may run them.
    assert judge_placement(events, [CUDA, CPU])[1] is None


def test_first_provider_that_runs_nothing_is_refused(demo_profile):
    events = _relabel(demo_profile, set(), default=CUDA)
    _, refusal = judge_placement(events, [TRT, CUDA])
    assert refusal.startswith("requested TensorrtExecutionProvider first but it runs none of the graph's nodes")
    assert judge_placement(_relabel(demo_profile, set(), default=TRT), [TRT, CUDA])[1] is None


def test_large_integer_outputs_are_compute_not_shapes():
    ev = {
        "cat": "Node",
        "name": "big_kernel_time",
        "args": {"op_name": "Range", "provider": CPU, "output_type_shape": [{"int64": [4096]}]},
    }
    placement, refusal = judge_placement(
        [ev, {**ev, "name": "gpu_kernel_time", "args": {**ev["args"], "provider": CUDA}}], [CUDA]
    )
    assert [n.name for n in placement.cpu_compute_nodes] == ["big"] and "Range 'big'" in refusal


# ---------------------------------------------------------------------------------------
# Precision labels, TensorRT provider profile and cache, libraries, exclusive wheels
# ---------------------------------------------------------------------------------------

AMPERE = gpu_paths.GpuIdentity("NVIDIA A100", (8, 0))
TURING = gpu_paths.GpuIdentity("NVIDIA T4", (7, 5))


@pytest.mark.parametrize(
    ("names", "precision", "gpu", "label", "options"),
    [
        ([CUDA], "fp32", None, "fp32", {CUDA: {"use_tf32": "0"}}),
        ([CUDA, CPU], "fp32", None, "fp32", {CUDA: {"use_tf32": "0"}}),
        ([CUDA], "tf32", AMPERE, "tf32", {CUDA: {"use_tf32": "1"}}),
        ([TRT, CUDA], "tf32", AMPERE, "tf32", {CUDA: {"use_tf32": "1"}, TRT: {"trt_fp16_enable": "0"}}),
        ([TRT, CUDA], "fp16", TURING, "fp16", {CUDA: {"use_tf32": "1"}, TRT: {"trt_fp16_enable": "1"}}),
        ([TRT], "bf16", AMPERE, "bf16", {TRT: {"trt_fp16_enable": "0", "trt_bf16_enable": "1"}}),
        ([TRT, CUDA], "fp32", TURING, "fp32", {CUDA: {"use_tf32": "0"}, TRT: {"trt_fp16_enable": "0"}}),
        ([CPU], "fp32", None, "fp32", {}),
    ],
)
def test_precision_plan_makes_the_label_true(names, precision, gpu, label, options):
    assert gpu_paths.precision_plan(names, precision, gpu) == (label, options)


@pytest.mark.parametrize(
    ("names", "precision", "gpu", "message"),
    [
        ([CUDA], "tf32", TURING, "tf32 needs compute capability >= 8.0 .*has 7.5"),
        ([CUDA], "fp16", AMPERE, "fp16 on CUDAExecutionProvider needs a fp16 ONNX export"),
        ([TRT, CUDA], "fp32", AMPERE, "fp32 cannot be guaranteed on TensorrtExecutionProvider.*TF32"),
        ([TRT], "bf16", TURING, "bf16 needs compute capability >= 8.0"),
        ([TRT], "tf32", None, "cannot identify the GPU"),
        ([CPU], "tf32", None, "needs a GPU provider first"),
    ],
)
def test_precision_plan_refuses_an_untrue_label(names, precision, gpu, message):
    with pytest.raises(BackendError, match=message):
        gpu_paths.precision_plan(names, precision, gpu)


def test_precision_provider_options_are_owned_by_the_backend(backend, contract):
    with pytest.raises(BackendError, match="option use_tf32 is set by the backend .set the backend option precision"):
        backend.load(ONNX, contract, {"providers": [[CUDA, {"use_tf32": 1}]]})
    with pytest.raises(BackendError, match="trt_engine_cache_path is set by the backend .derived from the contract"):
        OrtOptions.parse({"providers": [TRT], "provider_options": {TRT: {"trt_engine_cache_path": "/tmp/x"}}})
    with pytest.raises(BackendError, match=r"precision: unknown value 'fp64' \(known: fp32, tf32, fp16, bf16\)"):
        backend.load(ONNX, contract, {**ONE_THREAD, "precision": "fp64"})


def test_tensorrt_provider_gets_the_contract_profile(contract):
    assert gpu_paths.trt_profile_options(contract) == {
        "trt_profile_min_shapes": "image_overhead:1x3x64x64,tokens:1x8,proprio:1x4,noise:1x50x2,"
        "rtc_actions:1x50x2,rtc_weights:1x50",
        "trt_profile_opt_shapes": "image_overhead:1x3x64x64,tokens:1x8,proprio:1x4,noise:1x50x2,"
        "rtc_actions:1x50x2,rtc_weights:1x50",
        "trt_profile_max_shapes": "image_overhead:8x3x64x64,tokens:8x8,proprio:8x4,noise:8x50x2,"
        "rtc_actions:8x50x2,rtc_weights:8x50",
    }


def test_tensorrt_provider_cache_folder_is_keyed_by_every_ingredient(contract, tmp_path):
    profile = gpu_paths.trt_profile_options(contract)
    base = ("a" * 64, "1.31.1", "10.16.1.11", AMPERE, "tf32", profile)
    key = gpu_paths.trt_cache_key(*base)
    changed = [
        ("b" * 64, *base[1:]),
        (base[0], "1.30.0", *base[2:]),
        (*base[:2], "10.15.1.29", *base[3:]),
        (*base[:3], gpu_paths.GpuIdentity("NVIDIA H100", (9, 0)), *base[4:]),
        (*base[:4], "fp16", base[5]),
        (*base[:5], {**profile, "trt_profile_max_shapes": "x"}),
    ]
    keys = {gpu_paths.trt_cache_key(*c) for c in changed}
    assert key not in keys and len(keys) == len(changed)
    opts = gpu_paths.trt_cache_options(tmp_path, key)
    assert opts["trt_engine_cache_path"] == str(tmp_path / "onnxruntime-trt" / key)
    assert opts["trt_engine_cache_enable"] == "1" and opts["trt_timing_cache_path"] == opts["trt_engine_cache_path"]


def test_tensorrt_provider_session_options_end_to_end(backend, contract, monkeypatch, tmp_path):
    """What the TensorRT provider is handed: the precision flags, the contract's profile and
    the keyed cache folder under cache_dir (a stand-in session records them)."""
    seen = {}

    class Recording:
        def __init__(self, path, so, providers, provider_options):
            seen.update(zip(providers, provider_options, strict=True))
            raise RuntimeError("recorded")

    monkeypatch.setattr(ort, "get_available_providers", lambda: [TRT, CUDA, CPU])
    monkeypatch.setattr(ort, "InferenceSession", Recording)
    monkeypatch.setattr(gpu_paths, "gpu_identity", lambda device: AMPERE)
    monkeypatch.setattr(gpu_paths, "prepare_gpu_libraries", lambda ort, names: "")
    with pytest.raises(BackendError, match="recorded"):
        backend.load(ONNX, contract, {"providers": [TRT, CUDA], "precision": "fp16", "cache_dir": str(tmp_path)})
    trt = seen[TRT]
    assert trt["trt_fp16_enable"] == "1" and trt["trt_profile_max_shapes"].startswith("image_overhead:8x3x64x64")
    folder = Path(trt["trt_engine_cache_path"])
    assert folder.parent == tmp_path / "onnxruntime-trt" and folder.is_dir()
    assert seen[CUDA] == {"use_tf32": "1"}


def test_library_loading_problems_are_kept_for_the_error(monkeypatch):
    monkeypatch.setattr(
        ort, "preload_dlls", lambda **kw: print("Failed to load libcudnn.so.9: not found"), raising=False
    )
    monkeypatch.setitem(__import__("sys").modules, "tensorrt", None)
    notes = gpu_paths.prepare_gpu_libraries(ort, [TRT, CUDA])
    assert "Failed to load libcudnn.so.9" in notes and "tensorrt does not import" in notes
    assert gpu_paths.prepare_gpu_libraries(ort, [CPU]) == ""


def test_both_runtime_wheels_installed_is_refused(backend, monkeypatch):
    installed = {"onnxruntime", "onnxruntime-gpu"}
    assert gpu_paths.installed_runtime_distributions(installed.__contains__) == ["onnxruntime", "onnxruntime-gpu"]
    monkeypatch.setattr(gpu_paths, "installed_runtime_distributions", lambda: ["onnxruntime", "onnxruntime-gpu"])
    avail = backend.availability()
    assert not avail.usable
    assert avail.reason == (
        "onnxruntime and onnxruntime-gpu are both installed and overwrite each other's files; "
        "pip uninstall -y onnxruntime onnxruntime-gpu, then install one ('vlad[cpu]' or 'vlad[gpu]')"
    )


def test_this_environment_has_one_runtime_wheel():
    assert len(gpu_paths.installed_runtime_distributions()) == 1


# ---------------------------------------------------------------------------------------
# Hardware: ONNX Runtime's CUDA and TensorRT providers (skipped elsewhere, with the reason)
# ---------------------------------------------------------------------------------------


def _require_provider(name: str) -> gpu_paths.GpuIdentity:
    if name not in ort.get_available_providers():
        pytest.skip(
            f"onnxruntime {ort.__version__} offers no {name} (install vlad[gpu] on a machine with an NVIDIA GPU)"
        )
    gpu = gpu_paths.gpu_identity(0)
    if gpu is None:
        pytest.skip("no NVIDIA GPU visible through NVML (nvidia-ml-py)")
    return gpu


def _golden_max_abs(sess, golden) -> float:
    worst = 0.0
    for inputs, ref in golden:
        out = sess.infer(inputs)
        worst = max(worst, max(float(np.abs(out[k] - r).max()) for k, r in ref.items()))
    return worst


@pytest.mark.gpu
def test_gpu_cuda_provider_fp32_without_cpu_in_providers(backend, contract, golden):
    """The demo loads on CUDA alone (its shape nodes may sit on the CPU), in true fp32."""
    from vlad_tools.testing.golden import MAX_ABS

    _require_provider(CUDA)
    with backend.load(ONNX, contract, {"providers": [CUDA]}) as sess:
        d = sess.describe()
        assert d.precision == "fp32" and d.device == "cuda:0"
        assert d.extra["provider_options"][CUDA]["use_tf32"] == "0"
        assert d.extra["nodes_per_provider"][CUDA] > 0
        err = _golden_max_abs(sess, golden)
        print(f"onnxruntime CUDA fp32: max |err| {err:.3g}; CPU shape nodes: {d.extra['cpu_shape_nodes']}")
        assert err <= MAX_ABS["fp32"]
        t = sess.last_timing
        assert t.h2d_ms is not None and t.d2h_ms is not None


@pytest.mark.gpu
def test_gpu_cuda_provider_tf32_is_its_own_label(backend, contract, golden):
    from vlad_tools.testing.golden import MAX_ABS

    gpu = _require_provider(CUDA)
    if gpu.compute_capability < (8, 0):
        pytest.skip(f"TF32 needs compute capability >= 8.0; {gpu.name} has {gpu.cc}")
    with backend.load(ONNX, contract, {"providers": [CUDA], "precision": "tf32"}) as sess:
        assert sess.describe().precision == "tf32"
        assert sess.describe().extra["provider_options"][CUDA]["use_tf32"] == "1"
        err = _golden_max_abs(sess, golden)
        print(f"onnxruntime CUDA tf32: max |err| {err:.3g}")
        assert err <= MAX_ABS["tf32"]


@pytest.mark.gpu
def test_gpu_tensorrt_provider_uses_the_profile_and_a_keyed_cache(backend, contract, golden, engine_cache_root):
    from vlad_tools.testing.golden import MAX_ABS

    gpu = _require_provider(TRT)
    precision = "tf32" if gpu.compute_capability >= (8, 0) else "fp32"
    cache = engine_cache_root / "onnxruntime"
    opts = {"providers": [TRT, CUDA], "precision": precision, "cache_dir": str(cache)}
    with backend.load(ONNX, contract, opts) as sess:
        d = sess.describe()
        assert d.precision == precision and d.extra["nodes_per_provider"].get(TRT)
        folder = Path(d.extra["trt_engine_cache"])
        for batch in (1, 3, 8):  # one engine for the whole profile
            sess.infer(example_inputs_batch(contract, batch))
        err = _golden_max_abs(sess, golden)
        print(f"onnxruntime TensorRT {precision}: max |err| {err:.3g}")
        assert err <= MAX_ABS[precision]
    engines = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    assert any(name.endswith(".engine") for name in engines), f"no engine cached in {folder}: {sorted(engines)}"
    with backend.load(ONNX, contract, opts) as again:
        again.infer(example_inputs_batch(contract, 8))
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == engines  # reused, nothing rebuilt


def example_inputs_batch(contract, batch: int):
    from vlad.backend import example_inputs

    return example_inputs(contract, batch=batch)
