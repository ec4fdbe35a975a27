"""PyTorch backend specifics: safe loading, options, devices."""

from __future__ import annotations

import pytest

from vlad.errors import BackendError

pytest.importorskip("torch")

from vlad_torch import TorchAOTIBackend, TorchBackend  # noqa: E402

from .conftest import DEMO  # noqa: E402


def test_unknown_option_and_bad_threads_are_refused(contract):
    with pytest.raises(BackendError, match=r"torch: options.thread: unknown key \(did you mean 'threads'\?\)"):
        TorchBackend().load(DEMO / "policy.pt2", contract, {"thread": 1})
    with pytest.raises(BackendError, match="torch: options.threads: must be >= 1, got 0"):
        TorchBackend().load(DEMO / "policy.pt2", contract, {"threads": 0})
    with pytest.raises(BackendError, match="torch-aoti: options.threads: expected an integer, got a boolean"):
        TorchAOTIBackend().load(DEMO / "policy.pt2", contract, {"threads": True})


def test_missing_cuda_is_refused():
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    from vlad_torch.session import resolve_device

    with pytest.raises(BackendError, match="CUDA is not available"):
        resolve_device("torch", "cuda")
    with pytest.raises(BackendError, match="not supported"):
        resolve_device("torch", "meta")


def test_not_a_program_is_refused(contract):
    with pytest.raises(BackendError, match="not a torch.export program"):
        TorchBackend().load(DEMO / "policy.onnx", contract)
    with pytest.raises(BackendError, match="does not exist"):
        TorchBackend().load(DEMO / "missing.pt2", contract)


def test_aoti_refuses_a_plain_program(contract):
    if not TorchAOTIBackend().availability().usable:
        pytest.skip(TorchAOTIBackend().availability().reason)
    with pytest.raises(BackendError, match="AOTInductor package|compile_aoti"):
        TorchAOTIBackend().load(DEMO / "policy.pt2", contract)


# ---------------------------------------------------------------------------------------
# Precision labels, TF32 flags, AOTInductor's CUDA toolkit (no GPU needed)
# ---------------------------------------------------------------------------------------


@pytest.fixture
def restore_tf32():
    """TF32 flags are process-wide: put back what was there."""
    import torch

    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = (matmul.fp32_precision, cudnn.conv.fp32_precision, cudnn.rnn.fp32_precision)
    yield
    matmul.fp32_precision, cudnn.conv.fp32_precision, cudnn.rnn.fp32_precision = saved


def test_tf32_flags_are_set_and_read_with_one_api(restore_tf32):
    """cuDNN convolutions default to TF32; an fp32 session turns TF32 off everywhere, with
    the per-backend API only (mixing it with allow_tf32 makes torch raise)."""
    import torch

    from vlad_torch.session import set_tf32, tf32_state

    set_tf32(torch, False)
    assert tf32_state(torch) == {"matmul": "ieee", "cudnn_conv": "ieee", "cudnn_rnn": "ieee"}
    set_tf32(torch, True)
    assert tf32_state(torch) == {"matmul": "tf32", "cudnn_conv": "tf32", "cudnn_rnn": "tf32"}


def test_precision_option_is_checked_against_the_device(contract):
    import torch

    from vlad_torch.session import resolve_precision

    cpu = torch.device("cpu")
    assert resolve_precision("torch", "fp32", cpu) == "fp32"
    with pytest.raises(BackendError, match="precision tf32 needs device 'cuda'; on cpu sessions compute in fp32"):
        resolve_precision("torch", "tf32", cpu)
    with pytest.raises(
        BackendError, match=r"torch: options.precision: unknown value 'fp64' \(known: fp32, tf32, fp16, bf16\)"
    ):
        TorchBackend().load(DEMO / "policy.pt2", contract, {"precision": "fp64"})
    with pytest.raises(BackendError, match="precision bf16 needs device 'cuda'"):
        TorchBackend().load(DEMO / "policy.pt2", contract, {"precision": "bf16", "threads": 1})


def test_cpu_session_reports_fp32(contract):
    with TorchBackend().load(DEMO / "policy.pt2", contract, {"threads": 1, "precision": "fp32"}) as s:
        assert s.describe().precision == "fp32"


def test_cuda_toolkit_detection(tmp_path):
    """AOTInductor compiles CUDA packages against the toolkit headers: found like torch
    finds them, and a missing piece is named."""
    from vlad_torch.aoti import cuda_toolkit_problem

    full = tmp_path / "cuda-13.0"
    (full / "include").mkdir(parents=True)
    (full / "include" / "cuda_runtime_api.h").write_text("")
    (full / "bin").mkdir()
    (full / "bin" / "nvcc").write_text("")
    bare = tmp_path / "runtime-only"
    bare.mkdir()
    nowhere = str(tmp_path / "absent")
    assert cuda_toolkit_problem({"CUDA_HOME": str(full)}, lambda _: None, nowhere) is None
    assert cuda_toolkit_problem({}, lambda _: str(full / "bin" / "nvcc"), nowhere) is None
    assert cuda_toolkit_problem({}, lambda _: None, str(full)) is None
    why = cuda_toolkit_problem({"CUDA_PATH": str(bare)}, lambda _: None, nowhere)
    assert (
        why
        == f"the CUDA toolkit at {bare} (from $CUDA_PATH) has no include/cuda_runtime_api.h; point CUDA_HOME at a full toolkit"
    )
    assert cuda_toolkit_problem({}, lambda _: None, nowhere).startswith("no CUDA toolkit found")


def test_aoti_cuda_compile_without_toolkit_says_what_is_missing(tmp_path, monkeypatch):
    import torch

    from vlad_torch import aoti

    if not torch.cuda.is_available():
        pytest.skip("resolve_device refuses cuda first without a GPU")
    monkeypatch.setattr(aoti, "cuda_toolkit_problem", lambda: "no CUDA toolkit found (test)")
    with pytest.raises(BackendError, match="cannot compile for cuda: no CUDA toolkit found"):
        aoti.compile_aoti(DEMO / "policy.pt2", tmp_path / "x.pt2", device="cuda")


# ---------------------------------------------------------------------------------------
# Hardware: torch on CUDA (skipped elsewhere, with the reason)
# ---------------------------------------------------------------------------------------


def _cuda_or_skip():
    import torch

    if not torch.cuda.is_available():
        pytest.skip(f"no CUDA device visible to torch {torch.__version__}")
    return torch


def _max_abs(session, golden) -> float:
    import numpy as np

    worst = 0.0
    for inputs, ref in golden:
        out = session.infer(inputs)
        worst = max(worst, max(float(np.abs(out[k].astype(np.float64) - r).max()) for k, r in ref.items()))
    return worst


@pytest.mark.gpu
def test_gpu_fp32_session_turns_tf32_off_even_after_another_turned_it_on(contract, golden, restore_tf32):
    from vlad_tools.testing.golden import MAX_ABS
    from vlad_torch.session import set_tf32, tf32_state

    torch = _cuda_or_skip()
    with TorchBackend().load(DEMO / "policy.pt2", contract, {"device": "cuda"}) as s:
        set_tf32(torch, True)  # e.g. a tf32 session or a library in the same process
        err = _max_abs(s, golden)
        assert tf32_state(torch) == {"matmul": "ieee", "cudnn_conv": "ieee", "cudnn_rnn": "ieee"}
        d = s.describe()
        assert d.precision == "fp32" and d.extra["tf32"] == "off"
        print(f"torch cuda fp32: max |err| {err:.3g}")
        assert err <= MAX_ABS["fp32"]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["tf32", "fp16", "bf16"])
def test_gpu_reduced_precisions_are_their_own_labels(contract, golden, precision, restore_tf32):
    from vlad_tools.testing.golden import MAX_ABS

    torch = _cuda_or_skip()
    if precision in ("tf32", "bf16") and torch.cuda.get_device_capability() < (8, 0):
        pytest.skip(f"{precision} needs compute capability >= 8.0")
    with TorchBackend().load(DEMO / "policy.pt2", contract, {"device": "cuda", "precision": precision}) as s:
        err = _max_abs(s, golden)
        out = s.infer(golden[0][0])
        assert all(v.dtype.name == "float32" for v in out.values())  # the contract's dtype
        assert s.describe().precision == precision
        print(f"torch cuda {precision}: max |err| {err:.3g}")
        assert err <= MAX_ABS[precision]


@pytest.mark.gpu
def test_gpu_h2d_time_is_the_device_copy_only(contract, golden):
    """Staging into pinned memory happens before the first event: h2d + compute + d2h
    is the device timeline of the call, never more than the call's wall time."""
    import time

    _cuda_or_skip()
    with TorchBackend().load(DEMO / "policy.pt2", contract, {"device": "cuda"}) as s:
        s.warmup(3)
        t0 = time.perf_counter()
        s.infer(golden[0][0])
        wall_ms = (time.perf_counter() - t0) * 1e3
        t = s.last_timing
        print(f"torch cuda: h2d {t.h2d_ms:.3f} compute {t.compute_ms:.3f} d2h {t.d2h_ms:.3f} wall {wall_ms:.3f} ms")
        assert 0 <= t.h2d_ms and t.total_ms <= wall_ms


# ---------------------------------------------------------------------------------------
# Real-time chunking by guidance (vlad_torch.guided)
# ---------------------------------------------------------------------------------------

GUIDED = {"threads": 1, "rtc_encoder": "policy_encoder.pt2", "rtc_velocity": "policy_velocity.pt2"}


def test_guidance_computes_the_plain_chunk_without_weights_and_continues_a_chunk_with_them(contract, golden):
    """The demo release's flow head as two programs, integrated with guidance: with every
    weight zero it is the exported graph's plain chunk; with weights it pulls the chunk
    towards the waypoints to continue (less exactly than the graph's inpainting, which
    reproduces weight-1 waypoints, and by the policy's own field, not by overwriting)."""
    import numpy as np

    from vlad.processing import normalize_actions
    from vlad.serving.rtc import soft_mask
    from vlad_tools.testing.golden import load_golden

    assert contract.rtc is not None
    out = contract.action.output
    plain = TorchBackend().load(DEMO / "policy.pt2", contract, {"threads": 1})
    guided = TorchBackend().load(DEMO / "policy.pt2", contract, GUIDED)
    inputs = dict(golden[0][0])  # this suite's golden: (model inputs, reference outputs)
    free = plain.infer(inputs)[out][0]
    np.testing.assert_allclose(guided.infer(inputs)[out][0], free, atol=1e-5)

    h, frozen = contract.action.chunk_length, 10
    shifted = load_golden()[0]["actions"] + np.float32(0.3)  # another plan, 0.3 rad off everywhere
    inputs[contract.rtc.actions_input] = normalize_actions(contract, shifted)[None]
    inputs[contract.rtc.weights_input] = soft_mask(h, frozen, 40)[None]
    target = inputs[contract.rtc.actions_input][0]
    pulled = guided.infer(inputs)[out][0]
    inpainted = plain.infer(inputs)[out][0]
    before = float(np.abs(free[:frozen] - target[:frozen]).mean())
    # The demo policy is nearly deterministic: the chunk a step predicts hardly depends on x
    # (the vector-Jacobian product is ~0.02 of its vector at t = 0, ~0.7 at t = 0.9), so at
    # the paper's beta = 5 guidance moves each frozen waypoint here 8-24 % of the way to its
    # target (the mean distance falls ~15 %), not half of it: towards it, never past it.
    share = (pulled[:frozen] - free[:frozen]) / (target[:frozen] - free[:frozen])
    assert share.min() > 0.05 and share.max() < 1.0, share
    assert float(np.abs(pulled[:frozen] - target[:frozen]).mean()) < 0.9 * before
    assert float(np.abs(inpainted[:frozen] - target[:frozen]).max()) < 1e-5  # the graph: exactly
    assert guided.describe().backend == "torch"


def test_guidance_options_are_checked(contract):
    with pytest.raises(BackendError, match="rtc_encoder and rtc_velocity go together"):
        TorchBackend().load(DEMO / "policy.pt2", contract, {"rtc_encoder": "policy_encoder.pt2"})
    with pytest.raises(BackendError, match="a file name beside the artifact"):
        TorchBackend().load(DEMO / "policy.pt2", contract, {**GUIDED, "rtc_velocity": "../policy_velocity.pt2"})
    with pytest.raises(BackendError, match="does not exist"):
        TorchBackend().load(DEMO / "policy.pt2", contract, {**GUIDED, "rtc_velocity": "missing.pt2"})
    with pytest.raises(BackendError, match="use backend 'torch'"):
        TorchAOTIBackend().load(DEMO / "policy.pt2", contract, GUIDED)
