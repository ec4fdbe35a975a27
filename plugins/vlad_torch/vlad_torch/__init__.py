"""vlad backend plugin for PyTorch: ``torch`` (torch.export programs, eager) and
``torch-aoti`` (AOTInductor packages, see :func:`compile_aoti`).

Registered through the ``vlad`` entry-point group like any third-party plugin. Importing
this package does not import torch; the backends import it when asked to do something.
"""

from __future__ import annotations

from vlad.hookspecs import hookimpl
from vlad_torch.aoti import TorchAOTIBackend, compile_aoti
from vlad_torch.backend import TorchBackend

__all__ = ["TorchAOTIBackend", "TorchBackend", "compile_aoti", "vlad_backends"]


@hookimpl
def vlad_backends() -> list:
    """The PyTorch backends: eager ``torch`` and compiled ``torch-aoti``."""
    return [TorchBackend(), TorchAOTIBackend()]
