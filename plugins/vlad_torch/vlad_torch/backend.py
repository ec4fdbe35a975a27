"""The ``torch`` backend: a ``torch.export`` program (``.pt2``) run eagerly by PyTorch.

Loading goes through :func:`torch.export.load` only: the archive holds a serialized graph
and tensors, no pickled classes and no code, so a release artifact cannot execute anything
on load (torch.load is never called with weights_only disabled).

Options: ``device`` (``"cpu"`` default, ``"cuda"``, ``"cuda:N"``), ``threads``
(``torch.set_num_threads``; process-wide) and ``precision`` (``"fp32"`` default; on CUDA
also ``"tf32"``, ``"fp16"`` and ``"bf16"``, see :mod:`vlad_torch.session`). A program
exported with bf16 or fp16 weights computes in that precision on any device, and its
``precision`` option must name it. ``rtc_encoder`` / ``rtc_velocity`` (file names beside
the artifact) and ``rtc_guidance``: real-time chunking by guidance instead of the graph's
own inpainting (:mod:`vlad_torch.guided`).

Memory: :func:`torch.export.load` copies each weight record of the archive into its own
storage (it has no memory-mapped load), so a loaded program holds its weights once, in
anonymous memory, and a cold start reads the whole file.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vlad.backend import Availability, Backend
from vlad.contract import Contract
from vlad.errors import BackendError, BackendUnavailable
from vlad_torch.session import (
    TorchOptions,
    TorchSession,
    apply_threads,
    check_names,
    resolve_device,
    resolve_precision,
    weights_precision,
)


def torch_availability(runtime: str = "torch") -> Availability:
    """Whether torch imports here, its version, and the devices it can use."""
    if importlib.util.find_spec("torch") is None:
        return Availability(False, runtime, reason="torch is not installed (pip install 'vlad[torch]')")
    try:
        import torch
    except Exception as exc:  # a broken install (missing shared library) is "not usable"
        return Availability(False, runtime, reason=f"torch does not import: {exc}")
    devices = ["cpu"]
    if torch.cuda.is_available():
        devices += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return Availability(True, runtime, version=torch.__version__, devices=tuple(devices))


def require(availability: Availability) -> None:
    """Raise :class:`BackendUnavailable` with the reason when the runtime is not usable."""
    if not availability.usable:
        raise BackendUnavailable(f"{availability.runtime}: {availability.reason}")


class TorchBackend(Backend):
    """PyTorch eager execution of a ``torch.export`` program."""

    name = "torch"

    def availability(self) -> Availability:
        """torch importable; devices: ``cpu`` and every visible CUDA device."""
        return torch_availability()

    def artifact_suffixes(self) -> tuple[str, ...]:
        """A ``torch.export.save`` archive."""
        return (".pt2",)

    def load(self, artifact: Path, contract: Contract, options: Mapping[str, Any] | None = None) -> TorchSession:
        """Load the program, move it to the requested device and check its signature."""
        options = dict(options or {})
        opts = TorchOptions.parse(self.name, options)
        require(self.availability())
        import torch

        artifact = Path(artifact)
        guides = self._guide_paths(artifact, opts)  # before the seconds a program takes to load
        device = resolve_device(self.name, opts.device)
        threads = apply_threads(opts.threads)
        try:
            program = torch.export.load(str(artifact))
        except FileNotFoundError as exc:
            raise BackendError(f"{self.name}: artifact {artifact} does not exist") from exc
        except Exception as exc:
            raise BackendError(f"{self.name}: {artifact} is not a torch.export program: {_first_line(exc)}") from exc
        weights = weights_precision(program.state_dict.values())
        precision = resolve_precision(self.name, opts.precision, device, weights=weights)
        names = check_names(
            self.name, "inputs", list(program.graph_signature.user_inputs), [s.name for s in contract.inputs]
        )
        n_out = len(program.graph_signature.user_outputs)
        if n_out != len(contract.outputs):
            raise BackendError(
                f"{self.name}: the program has {n_out} output(s), the contract declares {[s.name for s in contract.outputs]}"
            )
        if device.type != "cpu":
            from torch.export.passes import move_to_device_pass

            # Moves parameters, buffers and the device constants baked into the graph;
            # Module.to() would miss the latter.
            program = move_to_device_pass(program, device)
        module: Any = program.module()
        if guides:
            module = self._guided(guides, contract, opts, names, device)
        return TorchSession(
            contract,
            artifact,
            options,
            backend_name=self.name,
            fn=module,
            input_order=names,
            device=device,
            threads=threads,
            precision=precision,
            autocast=weights == "fp32",
        )

    def _guide_paths(self, artifact: Path, opts: TorchOptions) -> list[Path]:
        """The encoder and velocity programs beside ``artifact`` that guide the flow (none:
        the plain program), checked: both options or neither, file names, present."""
        if not (opts.rtc_encoder or opts.rtc_velocity):
            return []
        if not (opts.rtc_encoder and opts.rtc_velocity):
            raise BackendError(f"{self.name}: options rtc_encoder and rtc_velocity go together")
        paths = []
        for option, name in (("rtc_encoder", opts.rtc_encoder), ("rtc_velocity", opts.rtc_velocity)):
            if "/" in name or name in (".", ".."):
                raise BackendError(f"{self.name}: option {option} = {name!r}: a file name beside the artifact")
            if not (artifact.parent / name).is_file():
                raise BackendError(f"{self.name}: artifact {artifact.parent / name} does not exist")
            paths.append(artifact.parent / name)
        return paths

    def _guided(self, guides: list[Path], contract: Contract, opts: TorchOptions, names: list[str], device: Any) -> Any:
        """The guided flow from the encoder and velocity programs (vlad_torch.guided)."""
        from vlad_torch.guided import GuidedFlow

        encoder, velocity = (self._program(path, device).module() for path in guides)
        return GuidedFlow(contract, names, encoder, velocity, opts.rtc_guidance)

    def _program(self, path: Path, device: Any) -> Any:
        import torch

        try:
            program = torch.export.load(str(path))
        except FileNotFoundError as exc:
            raise BackendError(f"{self.name}: artifact {path} does not exist") from exc
        except Exception as exc:
            raise BackendError(f"{self.name}: {path} is not a torch.export program: {_first_line(exc)}") from exc
        if device.type != "cpu":
            from torch.export.passes import move_to_device_pass

            program = move_to_device_pass(program, device)
        return program


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
