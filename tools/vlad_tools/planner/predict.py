"""Predictions: a model on hardware at a placement, in a mode; and a contract's feasibility.

Placements: ``on-device`` (the robot's own accelerator), ``edge`` (a server over one
network) and ``cloud`` (a path of networks, e.g. Ethernet then a cloud link).

Modes (source A, VLA-Perf section on asynchronous inference):

* ``sync``: the robot sends a frame and waits; ``e2e = up + h2d + compute + d2h + down``
  and the achievable rate is ``1000 / e2e``;
* ``async``: the next frame is sent while the last one is computed and executed, every
  stage overlaps: ``Hz = min(1000 / compute, 1000 / copies, network stream Hz)``; the
  latency from frame to action stays ``e2e``;
* ``dual``: a slow System 2 (the backbone) refreshes the context at ``s2_hz``, a fast
  System 1 (frame up, vision, action expert, actions down) runs in the rest of the time:
  ``Hz = max((1 - s2_hz * S2) / S1, sync Hz)``, reaction latency ``S1``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vlad_tools.planner.network import NetworkTimes, Payload, host_transfer_ms, network_times, parse_path, payload_for
from vlad_tools.planner.roofline import ComponentTime, component_ops, component_time, memory_footprint, parameter_counts
from vlad_tools.planner.spec import Hardware, Network, PlannerError, VLAModel, load_hardware, load_model, load_network

PLACEMENTS = ("on-device", "edge", "cloud")
MODES = ("sync", "async", "dual")


@dataclass(frozen=True)
class Prediction:
    """The planner's answer for one configuration. Times in ms."""

    model: VLAModel
    hardware: Hardware
    placement: str
    mode: str
    path: tuple[Network, ...]
    payload: Payload
    components: dict[str, ComponentTime]
    host: dict[str, float]
    net: NetworkTimes
    memory: dict[str, float]
    s2_hz: float = 10.0
    params: dict[str, int] = field(default_factory=dict)

    @property
    def precision(self) -> str:
        return self.model.precision

    @property
    def compute_ms(self) -> float:
        """Vision + backbone + action on the accelerator."""
        return sum(c.ms for c in self.components.values())

    @property
    def copies_ms(self) -> float:
        return self.host["h2d"] + self.host["d2h"]

    @property
    def sync_e2e_ms(self) -> float:
        """Frame sent -> actions received, when nothing overlaps."""
        return self.net.up_ms + self.copies_ms + self.compute_ms + self.net.down_ms

    @property
    def system1_ms(self) -> float:
        """Dual-system fast loop: frame up, vision, action head, actions down."""
        c = self.components
        return self.net.up_ms + self.copies_ms + c["vision"].ms + c["action"].ms + self.net.down_ms

    @property
    def e2e_ms(self) -> float:
        """Frame -> action latency in this mode (dual: the fast loop's)."""
        return self.system1_ms if self.mode == "dual" else self.sync_e2e_ms

    @property
    def sync_hz(self) -> float:
        return 1000.0 / self.sync_e2e_ms

    @property
    def hz(self) -> float:
        """Achievable inference rate in this mode."""
        if self.mode == "sync":
            return self.sync_hz
        if self.mode == "async":
            return min(1000.0 / max(self.compute_ms, self.copies_ms), self.net.stream_hz)
        s2 = self.components["backbone"].ms / 1000.0
        free = 1.0 - self.s2_hz * s2
        return max(free / (self.system1_ms / 1000.0) if free > 0 else 0.0, self.sync_hz)

    @property
    def fits(self) -> bool:
        """Whether weights, KV cache and the largest activation fit in device memory."""
        return self.memory["total"] <= self.hardware.memory_bytes

    def to_dict(self) -> dict[str, Any]:
        """JSON-able result, with the inputs it was computed from."""
        r = lambda x: round(x, 6)  # noqa: E731
        return {
            "model": self.model.name, "hardware": self.hardware.key, "precision": self.precision,
            "placement": self.placement, "mode": self.mode, "network": [n.key for n in self.path],
            "inputs": {
                "batch": self.model.batch, "cameras": self.model.vision.cameras,
                "tokens_per_image": self.model.vision.tokens_per_image, "prefix_tokens": self.model.prefix_tokens,
                "chunk": self.model.action.chunk, "dof": self.model.action.dof, "steps": self.model.action.steps,
                "action_kind": self.model.action.kind, "s2_hz": self.s2_hz, "payload": self.payload.to_dict(),
                "hardware": self.hardware.to_dict(), "networks": [n.to_dict() for n in self.path],
            },
            "components": {k: c.to_dict(self.precision) for k, c in self.components.items()},
            "host_to_device_ms": r(self.host["h2d"]), "device_to_host_ms": r(self.host["d2h"]),
            "network_up_ms": r(self.net.up_ms), "network_down_ms": r(self.net.down_ms),
            "network_stream_hz": r(self.net.stream_hz) if self.path else None,
            "compute_ms": r(self.compute_ms), "e2e_ms": r(self.e2e_ms), "sync_e2e_ms": r(self.sync_e2e_ms),
            "hz": r(self.hz), "sync_hz": r(self.sync_hz),
            "params": self.params,
            "memory_gb": {k: r(v / self.hardware.gb) for k, v in self.memory.items()},
            "memory_capacity_gb": r(self.hardware.memory_bytes / self.hardware.gb), "fits": self.fits,
        }  # fmt: skip


def predict(
    model: VLAModel | str,
    hardware: Hardware | str,
    *,
    placement: str = "on-device",
    mode: str = "sync",
    network: str | Network | Sequence[str | Network] | None = None,
    s2_hz: float = 10.0,
    payload: Payload | None = None,
    **overrides: Any,
) -> Prediction:
    """Predict ``model`` on ``hardware``.

    ``network``: a network key, a comma-separated path (``"ethernet-10g,fast-cloud"``) or
    a sequence; needed for ``edge`` and ``cloud``, refused ``on-device``. ``overrides``
    (``steps``, ``chunk``, ``dof``, ``cameras``, ``language_tokens``, ``precision``,
    ``batch``) replace the model's values. ``payload`` replaces the network payload
    derived from the model (camera frames and action chunk).
    """
    model = load_model(model).with_overrides(**overrides)
    hardware = load_hardware(hardware)
    if placement not in PLACEMENTS:
        raise PlannerError(f"unknown placement {placement!r} (one of {', '.join(PLACEMENTS)})")
    if mode not in MODES:
        raise PlannerError(f"unknown mode {mode!r} (one of {', '.join(MODES)})")
    path = parse_path(network, load_network)
    if placement == "on-device" and path:
        raise PlannerError("on-device placement uses no network; drop --network or choose edge/cloud")
    if placement != "on-device" and not path:
        raise PlannerError(f"{placement} placement needs a network (e.g. wifi-7, or ethernet-10g,fast-cloud)")
    if s2_hz <= 0:
        raise PlannerError("the System 2 rate must be > 0 Hz")
    payload = payload or payload_for(model, path[0] if path else None)
    components = {
        name: component_time(name, ops, hardware, model.precision) for name, ops in component_ops(model).items()
    }
    return Prediction(
        model=model,
        hardware=hardware,
        placement=placement,
        mode=mode,
        path=path,
        payload=payload,
        components=components,
        host=host_transfer_ms(model, hardware),
        net=network_times(path, payload),
        memory=memory_footprint(model),
        s2_hz=s2_hz,
        params=parameter_counts(model),
    )


def align_to_contract(model: VLAModel, contract: Any) -> VLAModel:
    """The model with the release contract's chunk, action dim, camera count, language
    tokens and denoising steps (the contract is what the release really runs)."""
    steps = contract.noise.denoising_steps if getattr(contract, "noise", None) else None
    tokens = contract.language.max_tokens if getattr(contract, "language", None) else None
    return model.with_overrides(
        chunk=contract.action.chunk_length,
        dof=contract.action.dim,
        cameras=len(contract.cameras) or None,
        language_tokens=tokens,
        steps=steps if model.action.kind == "flow" else None,
    )


def feasibility(
    contract: Any,
    model: VLAModel | str | None,
    hardware: Hardware | str,
    *,
    placement: str = "on-device",
    mode: str = "sync",
    network: str | Sequence[str] | None = None,
    s2_hz: float = 10.0,
    measured_e2e_ms: float | None = None,
    align: bool = True,
) -> dict[str, Any]:
    """Can ``contract`` be met by ``model`` on ``hardware``? A JSON-able dict for gates.

    Keys: everything of :meth:`Prediction.to_dict`, plus the contract's period, deadline
    and validity, ``meets_deadline`` (predicted e2e <= deadline), ``meets_period``
    (one inference cycle fits a control period), ``chunk_horizon_ms`` and
    ``sustains_chunk_rate`` (a cycle fits the chunk's horizon: async execution never runs
    dry), ``measured_e2e_ms`` / ``measured_meets_deadline`` when given, and ``flagged``
    with ``reasons``: the predicted or measured e2e latency exceeds the deadline, or the
    model does not fit in memory. ``model=None`` takes the built-in description listing
    the contract's ``model.id``.
    """
    model = load_model(model if model is not None else contract.model.id)
    if align:
        model = align_to_contract(model, contract)
    path = parse_path(network, load_network)
    payload = None
    if path and contract.cameras:  # the robot sends its raw frames, whatever the model resizes to
        raw = contract.cameras[0].raw
        payload = payload_for(model, path[0], image_size=(raw.height, raw.width), images=len(contract.cameras))
    p = predict(model, hardware, placement=placement, mode=mode, network=path, s2_hz=s2_hz, payload=payload)
    t = contract.timing
    out = p.to_dict()
    cycle_ms = 1000.0 / p.hz
    horizon = model.action.chunk * t.control_period_ms
    out.update({
        "contract": {"model_id": contract.model.id, "version": contract.model.version, "sha256": contract.sha256},
        "aligned_to_contract": align,
        "control_period_ms": t.control_period_ms, "e2e_deadline_ms": t.e2e_deadline_ms,
        "action_validity_ms": t.action_validity_ms, "cycle_ms": round(cycle_ms, 6),
        "meets_deadline": p.e2e_ms <= t.e2e_deadline_ms, "meets_period": cycle_ms <= t.control_period_ms,
        "chunk_horizon_ms": horizon, "sustains_chunk_rate": cycle_ms <= horizon,
        "measured_e2e_ms": measured_e2e_ms,
        "measured_meets_deadline": None if measured_e2e_ms is None else measured_e2e_ms <= t.e2e_deadline_ms,
    })  # fmt: skip
    reasons = []
    if not out["meets_deadline"]:
        reasons.append(f"predicted e2e {p.e2e_ms:.2f} ms exceeds the {t.e2e_deadline_ms:g} ms deadline")
    if measured_e2e_ms is not None and not out["measured_meets_deadline"]:
        reasons.append(f"measured e2e {measured_e2e_ms:.2f} ms exceeds the {t.e2e_deadline_ms:g} ms deadline")
    if not p.fits:
        gb = p.hardware.gb
        reasons.append(
            f"needs {p.memory['total'] / gb:.1f} GB, {p.hardware.name} has {p.hardware.memory_bytes / gb:.1f} GB"
        )
    out["flagged"], out["reasons"] = bool(reasons), reasons
    return out
