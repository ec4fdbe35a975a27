"""vlad backend plugin for ONNX Runtime: the ``onnxruntime`` backend.

Registered through the ``vlad`` entry-point group like any third-party plugin. Importing
this package does not import onnxruntime; the backend imports it when asked to.
"""

from __future__ import annotations

from vlad.hookspecs import hookimpl
from vlad_onnxruntime.backend import OnnxRuntimeBackend, OnnxRuntimeSession
from vlad_onnxruntime.options import OrtOptions

__all__ = ["OnnxRuntimeBackend", "OnnxRuntimeSession", "OrtOptions", "vlad_backends"]


@hookimpl
def vlad_backends() -> list:
    """The ONNX Runtime backend."""
    return [OnnxRuntimeBackend()]
