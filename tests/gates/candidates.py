"""Deliberately broken candidate releases, built from the demo release into a folder.

Each is a complete, valid, unsigned release folder (manifest written by
:mod:`vlad.release.manifest`), broken in exactly one way that one gate must catch:

* :func:`changed_normalization`: one image normalization constant of the contract differs
  (contract gate);
* :func:`perturbed_weight`: the demo's ONNX artifact with one weight matrix perturbed in
  place, the ``torch.export`` program left as trained (equivalence gate);
* :func:`slowed_backend`: served by ``wrapped`` (tools/vlad_tools/gates/wrapped.py) slowed to 100 ms per
  inference against a 20 ms deadline (performance gate);
* :func:`ignores_instruction`: a model that always reads the tokens of the first
  instruction, exported consistently (program and ONNX) with its own golden fixtures, so
  it is equivalent to its own reference but reaches the wrong goal for the other
  instruction (closed-loop gate).
"""

from __future__ import annotations

import datetime as dt
import io
import shutil
import warnings
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np

from vlad_tools.testing import DEMO, PLUGIN_ENV

ROOT = Path(__file__).resolve().parents[2]
SLOW_ENV = PLUGIN_ENV  # the daemon loads the wrapper backend


def copy_demo(dest: Path, skip: tuple[str, ...] = ()) -> Path:
    """The demo release's files (not its manifest or signature) in ``dest``."""
    dest.mkdir(parents=True)
    for f in DEMO.iterdir():
        if f.name not in ("manifest.toml", "manifest.sig", *skip):
            shutil.copy(f, dest / f.name)
    return dest


def write_manifest(
    dest: Path,
    release_id: str,
    backend: str = "onnxruntime",
    artifact: str = "policy.onnx",
    options: dict | None = None,
    change: str = "export_only",
) -> Path:
    """An unsigned manifest for the files now in ``dest``."""
    from vlad.release.authoring import new_manifest_data
    from vlad.release.authoring import write_manifest as write

    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    lineage = {"change": change, "parent": "vlad-demo-reacher-1.0.0"} if change != "retrain" else {"change": change}
    data = new_manifest_data(
        dest,
        release_id=release_id,
        version="1.0.1",
        version_code=2,
        backend=backend,
        artifact=artifact,
        options=options or {"intra_op_threads": 1},
        not_before=now - dt.timedelta(days=1),
        expires=now + dt.timedelta(days=30),
        lineage=lineage,
    )
    write(dest, data)
    return dest


def changed_normalization(dest: Path) -> Path:
    """The camera's blue-channel std 0.25 -> 0.26: the model would be fed other values."""
    copy_demo(dest)
    contract = dest / "contract.toml"
    text = contract.read_text()
    assert "std = [0.25, 0.25, 0.25]" in text
    contract.write_text(text.replace("std = [0.25, 0.25, 0.25]", "std = [0.25, 0.25, 0.26]", 1))
    return write_manifest(dest, "vlad-demo-reacher-normalization")


def _onnx_export(model, contract, path: Path) -> None:
    """Re-export ``model`` to ONNX with the contract's names and dynamic batch axis.

    The TorchScript exporter, not the dynamo one :mod:`vlad.release.export` uses for
    releases: the dynamo export of the demo takes 25-40 s on a 2-core CI machine, this one
    about 1.5 s, and for a test candidate only the graph's numbers matter (its equivalence to
    PyTorch is exactly what the gate measures).
    """
    import torch

    names = [s.name for s in contract.inputs]
    outputs = [s.name for s in contract.outputs]
    example = tuple(torch.zeros(s.opt_shape, dtype=getattr(torch, s.dtype)) for s in contract.inputs)
    axes = {n: {ax.axis: ax.name for ax in s.dynamic} for s in [*contract.inputs, *contract.outputs] for n in [s.name]}
    with warnings.catch_warnings(), redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            example,
            str(path),
            dynamo=False,
            opset_version=18,
            input_names=names,
            output_names=outputs,
            dynamic_axes=axes,
        )


def perturbed_weight(dest: Path, scale: float = 0.02, seed: int = 0) -> Path:
    """The demo's ONNX graph with the action head's output projection (``act_out.1.weight``)
    perturbed by N(0, scale) in place; policy.pt2 (the PyTorch reference) stays as trained.

    The initializer is found by its values (the trained weight, as the exporter stored it:
    transposed for a MatMul), exactly one, and only it changes. (A re-export of the perturbed
    model would take seconds of tracing per candidate for the same graph.)"""
    import onnx
    import torch
    from onnx import numpy_helper

    copy_demo(dest)
    trained = torch.load(DEMO / "policy_weights.pt", weights_only=True, map_location="cpu")["act_out.1.weight"].numpy()
    model = onnx.load(str(dest / "policy.onnx"))
    found = [
        (i, transposed)
        for i, init in enumerate(model.graph.initializer)
        for transposed, w in ((False, trained), (True, trained.T))
        if tuple(init.dims) == w.shape and np.array_equal(numpy_helper.to_array(init), w)
    ]
    assert len(found) == 1, f"act_out.1.weight is {len(found)} initializers of the demo ONNX, not one"
    index, transposed = found[0]
    noise = np.random.default_rng(seed).standard_normal(trained.shape).astype(np.float32) * np.float32(scale)
    init = model.graph.initializer[index]
    init.CopyFrom(numpy_helper.from_array(trained.T + noise.T if transposed else trained + noise, init.name))
    onnx.save(model, str(dest / "policy.onnx"))
    return write_manifest(dest, "vlad-demo-reacher-perturbed")


def slowed_backend(dest: Path, delay_ms: float = 100.0) -> Path:
    """The demo served by ``wrapped``: real outputs, 100 ms per inference."""
    copy_demo(dest)
    return write_manifest(
        dest,
        "vlad-demo-reacher-slow",
        backend="wrapped",
        options={"inner": "onnxruntime", "delay_ms": delay_ms, "intra_op_threads": 1},
    )


def ignores_instruction(dest: Path, fixtures: Path) -> Path:
    """A consistent release of a model that always reads the first instruction's tokens.

    Both artifacts (``torch.export`` program and ONNX) and the golden fixtures (written to
    ``fixtures``, outside the release) come from the same wrapped model.
    """
    import torch

    from vlad.contract import load_contract
    from vlad.processing import Tokenizer
    from vlad.release.export import export_program
    from vlad_tools.demo import sim
    from vlad_tools.demo.release import load_trained_model, write_golden_fixtures

    copy_demo(dest, skip=("policy.onnx", "policy.pt2"))
    contract = load_contract(DEMO / "contract.toml")
    tokenizer = Tokenizer.from_contract(contract)
    fixed = torch.from_numpy(np.array(tokenizer.encode(sim.INSTRUCTIONS[0]))[None])

    class IgnoresInstruction(torch.nn.Module):
        def __init__(self, inner) -> None:
            super().__init__()
            self.inner = inner
            self.register_buffer("fixed", fixed)

        # Argument names = the contract's input names: torch.export matches dynamic shapes by them.
        def forward(self, image_overhead, tokens, proprio, noise, rtc_actions, rtc_weights):
            fixed = self.fixed.expand(tokens.shape[0], -1)
            return self.inner(image_overhead, fixed, proprio, noise, rtc_actions, rtc_weights)

    model = IgnoresInstruction(load_trained_model(DEMO)).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch on read-only numpy views: copied, harmless here
        inputs = write_golden_fixtures(model, contract, tokenizer, fixtures)
    export_program(model, contract, inputs[0], dest / "policy.pt2")
    _onnx_export(model, contract, dest / "policy.onnx")
    return write_manifest(dest, "vlad-demo-reacher-no-language", change="retrain")
