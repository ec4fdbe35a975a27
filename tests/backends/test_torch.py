"""PyTorch backend specifics: safe loading, options, devices."""

from __future__ import annotations

import pytest

from vlad.errors import BackendError

pytest.importorskip("torch")

from vlad_torch import TorchAOTIBackend, TorchBackend  # noqa: E402

from .conftest import DEMO  # noqa: E402


def test_unknown_option_and_bad_threads_are_refused(contract):
    with pytest.raises(BackendError, match="unknown option"):
        TorchBackend().load(DEMO / "policy.pt2", contract, {"thread": 1})
    with pytest.raises(BackendError, match="threads must be a positive integer"):
        TorchBackend().load(DEMO / "policy.pt2", contract, {"threads": 0})


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
