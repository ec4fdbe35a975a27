"""Data movement: host <-> device copies and the network to an edge or cloud server.

Network formulas (source A, VLA-Perf ``network_latency.py``)::

    transfer_ms = bytes * overhead * 8 / (Mbit/s * 1000)
    one_way_ms  = base_latency_ms + transfer_ms        (summed over the hops of a path)

Payloads: a camera frame is ``H * W * 3`` bytes times the JPEG ratio, an action chunk
``dof * chunk * 4`` bytes. Over a path of several hops (robot -> Wi-Fi -> cloud) every
hop adds its base latency and its transfer time; a pipelined stream is limited by its
slowest hop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vlad_tools.planner.spec import BYTES_PER_ELEMENT, Hardware, Network, PlannerError, VLAModel


@dataclass(frozen=True)
class Payload:
    """What crosses the network per inference: camera frames up, the action chunk down."""

    image_bytes: float
    action_bytes: float
    images: int = 1

    def to_dict(self) -> dict:
        """JSON-able summary."""
        return {"image_bytes": self.image_bytes, "images": self.images, "action_bytes": self.action_bytes}


def payload_for(
    model: VLAModel,
    network: Network | None = None,
    *,
    image_size: tuple[int, int] | None = None,
    images: int | None = None,
    jpeg_ratio: float | None = None,
    dof: int | None = None,
    chunk: int | None = None,
) -> Payload:
    """The payload of one inference of ``model``; every argument overrides the model's."""
    net = network or Network(key="default", name="default", upload_mbps=1, download_mbps=1, latency_ms=0)
    h, w = image_size or (model.vision.image_height, model.vision.image_width)
    ratio = net.conventions.jpeg_ratio if jpeg_ratio is None else jpeg_ratio
    n = model.vision.cameras if images is None else images
    per_image = int(h * w * 3 * ratio)  # integer bytes, as source A rounds a frame
    actions = (dof or model.action.dof) * (chunk or model.action.chunk) * net.conventions.action_bytes_per_value
    return Payload(image_bytes=float(per_image * n), action_bytes=float(actions), images=n)


def transfer_ms(nbytes: float, mbps: float, overhead: float) -> float:
    """Time to push ``nbytes`` through ``mbps`` with protocol ``overhead``."""
    return nbytes * overhead * 8 / (mbps * 1000)


@dataclass(frozen=True)
class NetworkTimes:
    """One inference's trip over a network path, in ms."""

    up_ms: float  # base latency + transfer of the frames, all hops
    down_ms: float  # base latency + transfer of the actions, all hops
    up_transfer_ms: float
    down_transfer_ms: float
    stream_hz: float  # frames per second a pipelined stream sustains (slowest hop)

    def to_dict(self) -> dict:
        """JSON-able summary."""
        return {k: round(v, 6) for k, v in vars(self).items()}


def network_times(path: Sequence[Network], payload: Payload) -> NetworkTimes:
    """Up and down times over the hops of ``path`` (empty: on-device, all zero)."""
    up = down = up_x = down_x = 0.0
    stream = float("inf")
    for net in path:
        u = transfer_ms(payload.image_bytes, net.upload_mbps, net.conventions.protocol_overhead)
        d = transfer_ms(payload.action_bytes, net.download_mbps, net.conventions.protocol_overhead)
        up, down = up + net.latency_ms + u, down + net.latency_ms + d
        up_x, down_x = up_x + u, down_x + d
        # Base latency is hidden by pipelining; a hop time-multiplexes frames up and
        # actions down (source A, compute_network_throughput_hz).
        stream = min(stream, 1000.0 / (u + d) if u + d > 0 else float("inf"))
    return NetworkTimes(up, down, up_x, down_x, stream)


def host_transfer_ms(model: VLAModel, hw: Hardware) -> dict[str, float]:
    """Host -> device copy of the preprocessed frames and device -> host of the chunk
    (zero on unified memory). Frames travel at the model's precision, actions as fp32."""
    if hw.host_link_bandwidth is None:
        return {"h2d": 0.0, "d2h": 0.0}
    v, a = model.vision, model.action
    frames = model.batch * v.cameras * 3 * v.image_height * v.image_width * BYTES_PER_ELEMENT[model.precision]
    actions = model.batch * a.chunk * a.dof * 4
    return {"h2d": 1e3 * frames / hw.host_link_bandwidth, "d2h": 1e3 * actions / hw.host_link_bandwidth}


def parse_path(spec: str | Network | Sequence[str | Network] | None, load) -> tuple[Network, ...]:
    """A network path from ``"wifi-7"``, ``"ethernet-10g,fast-cloud"`` or a sequence."""
    if spec is None or spec == "" or spec == ():
        return ()
    if isinstance(spec, Network):
        return (spec,)
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    path = tuple(load(s.strip() if isinstance(s, str) else s) for s in items)
    if not path:
        raise PlannerError("empty network path")
    return path
