"""The π0-architecture model built from the planner's description, and its release.

The model's shapes come from tools/vlad_tools/planner/data/models/pi0.toml; at full size only the
parameter count is checked (on the meta device, nothing allocated). The release is built
at a small scale (width x0.125, two backbone layers, one in the others: ~5 M parameters, ~20 MB in fp32)
through the same streamed exports a full-size one uses, and loaded by the real ONNX
Runtime (external data) and torch backends.
"""

from __future__ import annotations

import json
import math

import numpy as np
import onnx
import pytest
import torch

from tests.conftest import ROOT
from vlad.errors import BackendError
from vlad_tools.pi0.model import Pi0Shape, build, init_tensor, parameter_count, scaled
from vlad_tools.pi0.release import Pi0Options, build_release, example_inputs, model_toml, release_model
from vlad_tools.planner.roofline import memory_footprint, parameter_counts
from vlad_tools.planner.spec import PlannerError, load_model, parse_model

KEYS = ROOT / "etc" / "vlad" / "keys.d"
DEMO_KEY = ROOT / "etc" / "vlad" / "demo-signing-key.pem"
SMALL = dict(width=0.125, vision_layers=1, backbone_layers=2, action_layers=1)


def test_full_size_has_the_planners_parameters():
    spec = load_model("pi0")
    counts = parameter_count(Pi0Shape(spec, 14, 64))
    planner = parameter_counts(spec)
    # the planner leaves out biases (SigLIP has them) and the embedding table (vocab = 0 here)
    assert counts["vision"] == pytest.approx(planner["vision"], rel=0.01)
    assert counts["backbone"] - 64 * 2048 == pytest.approx(planner["backbone"], rel=1e-4)
    # the expert's action, state and time projections are beyond the planner's blocks
    assert counts["expert"] == pytest.approx(planner["action"], rel=0.02)
    full = release_model(Pi0Options(), tokenizer_vocab=30)
    assert full.backbone.vocab == 257_152 and full.action.qkv_passes == 1
    assert 3.2e9 < parameter_count(Pi0Shape(full, 14, full.backbone.vocab))["total"] < 3.3e9


def test_a_smaller_model_keeps_the_inputs_outputs_and_attention_geometry():
    spec = load_model("pi0")
    small = scaled(spec, 0.125, vision_layers=2, backbone_layers=3, action_layers=2)
    assert small.prefix_tokens == spec.prefix_tokens == 800
    assert (small.action.chunk, small.action.dof, small.action.steps) == (50, 14, 10)
    b, a = small.backbone.transformer, small.action.transformer
    assert a is not None and (a.kv_heads, a.head_dim) == (b.kv_heads, b.head_dim) and b.layers == 3
    assert scaled(spec, 1.0) is spec
    with pytest.raises(PlannerError, match="width must be in"):
        scaled(spec, 1.5)
    # what the planner file would describe but the model cannot attend
    import dataclasses

    bad = dataclasses.replace(spec, action=spec.action.with_transformer(dataclasses.replace(a, head_dim=128)))
    with pytest.raises(PlannerError, match="must equal the backbone's"):
        build(Pi0Shape(bad, 14, 64))
    # the description round-trips through the release's planner-model.toml
    described = release_model(Pi0Options(**SMALL), tokenizer_vocab=30)
    import tomllib

    again = parse_model(tomllib.loads(model_toml(described)), "x")
    assert again.vision == described.vision and again.backbone == described.backbone
    assert again.action == described.action and dict(again.measure_scopes) == dict(described.measure_scopes)


def test_weights_depend_on_seed_and_name_only():
    a = init_tensor("backbone.blocks.0.q.weight", (64, 32), torch.float32, 7)
    assert torch.equal(a, init_tensor("backbone.blocks.0.q.weight", (64, 32), torch.float32, 7))
    assert not torch.equal(a, init_tensor("backbone.blocks.1.q.weight", (64, 32), torch.float32, 7))
    assert not torch.equal(a, init_tensor("backbone.blocks.0.q.weight", (64, 32), torch.float32, 8))
    assert a.std().item() == pytest.approx(1 / math.sqrt(64), rel=0.1)  # 1 / sqrt(fan in)
    b = init_tensor("backbone.blocks.0.q.weight", (64, 32), torch.bfloat16, 7)
    assert torch.equal(b, a.bfloat16())  # bf16 is the fp32 model rounded
    assert torch.equal(init_tensor("expert.norm.weight", (8,), torch.float32, 0), torch.ones(8))


@pytest.fixture(scope="module")
def small_release(tmp_path_factory):
    out = tmp_path_factory.mktemp("pi0") / "fp32"
    summary = build_release(out, Pi0Options(**SMALL), key=DEMO_KEY, keys_dir=KEYS, log=lambda m: None)
    return out, summary


@pytest.mark.slow  # the small release is exported once per module (~30 s)
def test_the_release_is_signed_with_external_data_and_its_memory_need(small_release):
    from vlad.release.signing import verify_release

    out, summary = small_release
    v = verify_release(out, KEYS)
    m = v.manifest
    roles = {a.path: a.role for a in m.artifacts}
    assert roles["policy.onnx.data"] == "weights" and roles["planner-model.toml"] == "config"
    assert m.backend.name == "onnxruntime" and m.backend.artifact == "policy.onnx"
    spec = load_model(out / "planner-model.toml")
    assert m.memory is not None and m.memory.source == "planner" and m.memory.device_bytes == 0
    assert m.memory.host_bytes == int(memory_footprint(spec)["total"])
    # every weight is in the external file, large ones at 64 KiB offsets; the graph stays small
    proto = onnx.load(str(out / "policy.onnx"), load_external_data=False)
    external = [t for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    offsets = {t.name: int({e.key: e.value for e in t.external_data}.get("offset", 0)) for t in external}
    big = [t for t in external if math.prod(t.dims) * 4 > (1 << 20)]
    assert big and all(offsets[t.name] % 65536 == 0 for t in big)
    assert sum(math.prod(t.dims) for t in external) * 4 == pytest.approx(summary["bytes"]["policy.onnx.data"], rel=0.01)
    meta = {p.key: p.value for p in proto.metadata_props}
    assert meta["vlad.contract_model"] == f"{spec.name}@1.0.0" and meta["vlad.opset"] == "18"
    contract = v.contract
    assert [c.input for c in contract.cameras] == ["image_base", "image_left_wrist", "image_right_wrist"]
    assert contract.language.max_tokens == 32 and contract.proprio.dim == 14
    assert contract.action.chunk_length == 50 and contract.noise.shape == (50, 14)


@pytest.mark.slow  # the small release is exported once per module (~30 s)
def test_both_backends_load_it_and_compute_what_pytorch_computes(small_release):
    from vlad.contract import load_contract
    from vlad.plugins import get_backend

    out, _ = small_release
    contract = load_contract(out / "contract.toml")
    spec = load_model(out / "planner-model.toml")
    model = build(Pi0Shape(spec, 14, spec.backbone.vocab), seed=0)
    inputs = example_inputs(contract)
    assert (inputs["tokens"] > 0).sum() == 3  # "fold the towel", padded
    with torch.inference_mode():
        ref = model(*(torch.from_numpy(inputs[s.name]) for s in contract.inputs)).numpy()
    assert ref.shape == (1, 50, 14) and np.isfinite(ref).all()
    with get_backend("onnxruntime").load(out / "policy.onnx", contract, {"intra_op_threads": 1}) as s:
        got = s.infer(inputs)["actions"]
        assert np.abs(got - ref).max() < 1e-4
    with get_backend("torch").load(out / "policy.pt2", contract, {"threads": 1}) as s:
        assert np.array_equal(s.infer(inputs)["actions"], ref)
        # the padding mask is real: another instruction gives other actions
        other = dict(inputs, tokens=np.zeros_like(inputs["tokens"]))
        other["tokens"][0, :2] = inputs["tokens"][0, 1:3]
        assert not np.allclose(s.infer(other)["actions"], ref)


def _mapped_bytes(path) -> int:
    """Bytes of ``path`` this process has memory-mapped now (/proc/self/maps)."""
    total = 0
    for line in open("/proc/self/maps", encoding="utf-8"):
        if line.rstrip().endswith(str(path)):
            start, end = line.split()[0].split("-")
            total += int(end, 16) - int(start, 16)
    return total


@pytest.mark.slow  # the small release is exported once per module (~30 s)
def test_onnx_runtime_keeps_the_weights_memory_mapped_when_asked(small_release):
    from vlad.contract import load_contract
    from vlad.plugins import get_backend

    out, _ = small_release
    contract = load_contract(out / "contract.toml")
    data = (out / "policy.onnx.data").resolve()
    inputs = example_inputs(contract)
    backend = get_backend("onnxruntime")
    results = {}
    for memory_map in (False, True):
        with backend.load(out / "policy.onnx", contract, {"intra_op_threads": 1, "memory_map": memory_map}) as s:
            results[memory_map] = s.infer(inputs)["actions"].copy()
            assert s.describe().extra["memory_map"] is memory_map
            mapped = _mapped_bytes(data)
        size = data.stat().st_size
        # packed copies replace the mapped MatMul weights; without packing they stay mapped
        assert (mapped > 0.8 * size) if memory_map else (mapped < 0.2 * size), (memory_map, mapped, size)
    assert np.allclose(results[True], results[False], atol=1e-5)
    with pytest.raises(BackendError, match="options.memory_map: expected true or false, got a string"):
        backend.load(out / "policy.onnx", contract, {"memory_map": "yes"})


@pytest.mark.slow  # the small release is exported once per module (~30 s)
def test_a_bf16_program_computes_in_bf16_on_the_cpu(tmp_path):
    from vlad.contract import load_contract
    from vlad.plugins import get_backend

    out = tmp_path / "bf16"
    progress: list[str] = []
    summary = build_release(out, Pi0Options(**SMALL, dtype="bf16"), log=progress.append)
    assert summary["backend"] == "torch"  # ONNX Runtime's CPU provider has no bf16 kernels
    # progress: a line when a tenth of the weights is written (a large tensor may pass two)
    assert sum(line.startswith("export: weights 100 % ") for line in progress) == 2  # .pt2, ONNX
    assert sum(line.startswith("export: weights") for line in progress) >= 14
    manifest_options = json.loads(json.dumps(summary))  # JSON-able
    assert manifest_options["memory"]["host_bytes"] > 0
    contract = load_contract(out / "contract.toml")
    spec = load_model(out / "planner-model.toml")
    assert spec.precision == "bf16"
    inputs = example_inputs(contract)
    model = build(Pi0Shape(spec, 14, spec.backbone.vocab), seed=0, dtype="bf16")
    with torch.inference_mode():
        ref = model(*(torch.from_numpy(inputs[s.name]) for s in contract.inputs)).numpy()
    backend = get_backend("torch")
    with backend.load(out / "policy.pt2", contract, {"threads": 1, "precision": "bf16"}) as s:
        assert s.describe().precision == "bf16"
        assert np.array_equal(s.infer(inputs)["actions"], ref)
    with pytest.raises(BackendError, match="weights are bf16, so it computes in bf16; set option precision = 'bf16'"):
        backend.load(out / "policy.pt2", contract, {"threads": 1})
    # the bf16 ONNX graph is valid (checked at export) and holds bf16 weights, for a GPU
    # provider; the CPU provider refuses it with the reason
    proto = onnx.load(str(out / "policy.onnx"), load_external_data=False)
    weights = [t for t in proto.graph.initializer if math.prod(t.dims) > 1000 and not t.name.startswith("rope_")]
    assert {t.data_type for t in weights} == {onnx.TensorProto.BFLOAT16}  # the RoPE tables stay fp32
    assert summary["bytes"]["policy.onnx.data"] < 0.55 * summary["bytes"]["policy.pt2"]
    with pytest.raises(BackendError, match="cannot create a session .*NOT_IMPLEMENTED"):
        get_backend("onnxruntime").load(out / "policy.onnx", contract, {"check_node_placement": False})


@pytest.mark.slow  # the small release is exported once per module (~30 s)
def test_the_planner_measures_the_release_with_its_own_description(small_release):
    from vlad_tools.planner.measure import measure_release

    out, _ = small_release
    m = measure_release(out, keys_dir=KEYS, short=True, calls=3, warmup=1)
    d = m.to_dict()
    assert d["model"] == load_model(out / "planner-model.toml").name and d["precision"] == "fp32"
    for comp in ("vision", "backbone", "action", "e2e"):
        assert d["rows"][comp]["measured_ms"] > 0 and d["rows"][comp]["predicted_ms"] > 0
    # the component sub-graphs ran on the external weights, cut at the exporter's scopes
    assert set(m.profile["boundaries"]) == {"vision", "backbone", "action"}
    x = d["execution"]
    assert x["chunk"] == 50 and x["control_period_ms"] == 20.0
    assert 0 <= x["sync"]["control_hz"] <= x["async"]["tick_hz"] == 50.0
