"""vlad's TensorRT backend plugin (entry point ``tensorrt`` in the ``vlad`` group).

Importing this package never imports TensorRT: the backend registers everywhere and its
``availability()`` says why it cannot run where TensorRT, cuda-python or a GPU is missing.
See docs/tensorrt.md.
"""

from __future__ import annotations

from vlad.hookspecs import hookimpl
from vlad_tensorrt.backend import TensorRTBackend, TensorRTOptions

__all__ = ["TensorRTBackend", "TensorRTOptions", "vlad_backends"]


@hookimpl
def vlad_backends() -> list[TensorRTBackend]:
    """The TensorRT backend."""
    return [TensorRTBackend()]
