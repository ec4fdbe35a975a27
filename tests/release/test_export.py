"""Export equivalence: the committed artifacts and a fresh export match PyTorch fp32."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from vlad.errors import ExportError
from vlad.release.export import compare, export_onnx


def _names(contract):
    return [spec.name for spec in contract.inputs]


def test_committed_onnx_matches_pytorch_weights(demo_dir, contract, golden):
    """The committed ONNX and .pt2 reproduce the PyTorch model built from the committed weights."""
    import onnxruntime as ort

    from vlad_tools.demo.release import load_trained_model

    model = load_trained_model(demo_dir)
    program = torch.export.load(str(demo_dir / "policy.pt2")).module()
    sess = ort.InferenceSession(str(demo_dir / "policy.onnx"), providers=["CPUExecutionProvider"])
    worst = 0.0
    for case in golden:
        args = [torch.from_numpy(case["inputs"][n]) for n in _names(contract)]
        with torch.inference_mode():
            ref = model(*args).numpy()
        # The fixtures are this model's outputs. Not bit-exact across machines: the same torch
        # build picks different kernels per CPU (AVX2 vs AVX-512), a few ulp apart.
        np.testing.assert_allclose(ref, case["outputs"]["actions"], rtol=0, atol=1e-6)
        pt2 = program(*args).detach().numpy()
        got = sess.run(["actions"], case["inputs"])[0]
        for name, out in (("pt2", pt2), ("onnx", got)):
            c = compare(name, ref, out)
            print(c.line())
            assert c.max_abs <= 1e-4, c.line()
            worst = max(worst, c.max_abs)
    print(f"worst fp32 max abs error over {len(golden)} fixtures: {worst:.3g}")


def test_onnx_metadata_pins_versions(demo_dir, contract):
    proto = onnx.load(str(demo_dir / "policy.onnx"))
    meta = {p.key: p.value for p in proto.metadata_props}
    for key in ("vlad.exporter", "vlad.opset", "vlad.torch_version", "vlad.onnx_version", "vlad.contract_model"):
        assert meta.get(key), key
    assert meta["vlad.opset"] == str(next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")))
    assert meta["vlad.contract_model"] == f"{contract.model.id}@{contract.model.version}"
    onnx.checker.check_model(proto, full_check=True)


def test_only_contract_axes_are_dynamic(demo_dir, contract):
    proto = onnx.load(str(demo_dir / "policy.onnx"))
    for vi in [*proto.graph.input, *proto.graph.output]:
        dims = vi.type.tensor_type.shape.dim
        symbolic = [i for i, d in enumerate(dims) if not d.HasField("dim_value")]
        spec = next(s for s in [*contract.inputs, *contract.outputs] if s.name == vi.name)
        assert symbolic == [ax.axis for ax in spec.dynamic], vi.name
        static = [d.dim_value for i, d in enumerate(dims) if i not in symbolic]
        assert static == [n for i, n in enumerate(spec.shape) if i not in symbolic], vi.name


@pytest.mark.slow  # ~45 s; test_committed_onnx_matches_pytorch_weights checks the shipped export
def test_fresh_export_is_equivalent(demo_dir, contract, golden, tmp_path):
    """Re-export from the weights: fixed shapes, intermediate prefix and dynamic batch are checked."""
    from vlad_tools.demo.release import load_trained_model

    model = load_trained_model(demo_dir)
    fixtures = [c["inputs"] for c in golden]
    comparisons = export_onnx(model, contract, fixtures, tmp_path / "p.onnx", log=print)
    names = {c.name for c in comparisons}
    assert names == {"actions", "prefix"}
    for c in comparisons:
        assert c.max_abs <= 1e-4, c.line()


def test_unsupported_operator_fails_loudly(contract, golden, tmp_path):
    """An operator without an ONNX translation is an ExportError, never an approximation."""

    @torch.library.custom_op("vlad_test::mystery", mutates_args=())
    def mystery(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @mystery.register_fake
    def _(x):
        return torch.empty_like(x)

    class Odd(torch.nn.Module):
        def forward(self, image_overhead, tokens, proprio, noise, rtc_actions, rtc_weights):
            return mystery(noise)

    with pytest.raises(ExportError, match="ONNX export failed: .*vlad_test.mystery"):
        export_onnx(Odd(), contract, [golden[0]["inputs"]], tmp_path / "odd.onnx", log=lambda m: None)


class _TwoCameraLike(torch.nn.Module):
    """A policy whose trunk (``prefix``) needs every input, the noise and the real-time chunking
    guide included: like a LeRobot Diffusion Policy with two cameras (two images, the state,
    the noise)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 2)

    def prefix(self, image_overhead, tokens, proprio, noise, rtc_actions, rtc_weights):
        guide = rtc_weights[:, :, None] * rtc_actions
        return self.proj(proprio)[:, None, :] + image_overhead.mean(dim=(1, 2, 3))[:, None, None] + noise + guide

    def forward(self, image_overhead, tokens, proprio, noise, rtc_actions, rtc_weights):
        trunk = self.prefix(image_overhead, tokens, proprio, noise, rtc_actions, rtc_weights)
        return torch.tanh(trunk) + tokens[:, :1, None].float() * 0


def test_the_prefix_is_computed_from_every_input(contract, golden, tmp_path):
    """export_onnx's intermediate check calls ``prefix`` with every input ``forward`` takes
    (it used to pass the first three: a second camera was then read as the state)."""
    fixtures = [c["inputs"] for c in golden[:2]]
    comparisons = export_onnx(_TwoCameraLike().eval(), contract, fixtures, tmp_path / "p.onnx", log=lambda m: None)
    prefix = next(c for c in comparisons if c.name == "prefix")
    assert prefix.max_abs <= 1e-5, prefix.line()


def test_an_export_failure_is_one_line_with_its_cause_and_nothing_else(contract, golden, tmp_path, capfd):
    """The exporter's progress prints, warnings and logged tracebacks stay off the terminal; the
    error is the root cause's line."""

    class Mismatched(torch.nn.Module):
        def forward(self, image_overhead, tokens, proprio, noise, rtc_actions, rtc_weights):
            return torch.cat([noise, proprio[:, None, :3]], dim=1)  # 2 vs 3 columns

    capfd.readouterr()
    with pytest.raises(ExportError) as e:
        export_onnx(Mismatched(), contract, [golden[0]["inputs"]], tmp_path / "m.onnx", log=lambda m: None)
    message = str(e.value)
    assert "\n" not in message and "\x1b" not in message, message
    assert message.startswith("ONNX export failed: RuntimeError: Sizes of tensors must match"), message
    out, err = capfd.readouterr()
    assert out == "" and err == "", (out[-2000:], err[-2000:])
