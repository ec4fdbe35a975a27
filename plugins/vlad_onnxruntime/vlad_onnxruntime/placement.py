"""Which execution provider ran each node, judged from ONNX Runtime's profile (pure).

With a GPU provider, ONNX Runtime deliberately places small shape computations on the CPU
provider: nodes that only work on the int64 output of a ``Shape`` (``Shape -> Concat ->``
the shape input of an ``Expand`` or ``Reshape``), because copying a few integers to the
GPU and back costs more than computing them on the host. ``session.disable_cpu_ep_fallback``
cannot tell those from real compute and refuses such a model outright (the demo policy
among them). So the backend lets ORT place nodes, runs once under the profiler, and judges
each node the CPU ran:

- a **shape computation** — every output an integer or bool tensor of at most
  :data:`SHAPE_NODE_MAX_ELEMENTS` elements — is allowed on the CPU;
- anything else on the CPU is **compute** that fell back from the GPU: refused (unless the
  release lists ``CPUExecutionProvider`` itself).

The profile is Chrome-trace JSON: one event per node run with ``cat == "Node"``, a name
ending in ``_kernel_time`` and ``args`` holding ``op_name``, ``provider`` and
``output_type_shape`` (a list of ``{dtype: shape}``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

CPU = "CPUExecutionProvider"
# ORT keeps a CPU placement when the tensors involved are "small" (its threshold for small
# initializers is 100 elements); shape vectors are far smaller than that.
SHAPE_NODE_MAX_ELEMENTS = 100
INTEGER_TYPES = frozenset({"int64", "int32", "int16", "int8", "uint64", "uint32", "uint16", "uint8", "bool"})
_SUFFIX = "_kernel_time"


@dataclass(frozen=True, slots=True)
class NodeRun:
    """One graph node as the profiler saw it."""

    name: str
    op: str
    provider: str
    outputs: tuple[tuple[str, tuple[int, ...]], ...]  # (dtype, shape) per output

    @property
    def is_shape_computation(self) -> bool:
        """Integer/bool outputs only, each at most SHAPE_NODE_MAX_ELEMENTS elements."""
        return all(
            dtype in INTEGER_TYPES and int(np.prod(shape, dtype=np.int64)) <= SHAPE_NODE_MAX_ELEMENTS
            for dtype, shape in self.outputs
        )

    def __str__(self) -> str:
        outs = ", ".join(f"{dtype}{list(shape)}" for dtype, shape in self.outputs) or "no outputs"
        return f"{self.op} {self.name!r} -> {outs}"


@dataclass(frozen=True, slots=True)
class Placement:
    """Nodes per provider, and the CPU nodes split into allowed shape computations and
    compute that fell back."""

    nodes_per_provider: dict[str, int]
    cpu_shape_nodes: tuple[NodeRun, ...]
    cpu_compute_nodes: tuple[NodeRun, ...]


def nodes_from_profile(events: Iterable[Mapping[str, Any]]) -> list[NodeRun]:
    """The distinct nodes in a profile (a node run several times is counted once)."""
    seen: dict[str, NodeRun] = {}
    for ev in events:
        name = ev.get("name", "")
        if ev.get("cat") != "Node" or not name.endswith(_SUFFIX):
            continue
        args = ev.get("args", {}) or {}
        provider = args.get("provider")
        if not provider:
            continue
        node = name[: -len(_SUFFIX)]
        if node in seen:
            continue
        outputs = []
        for item in args.get("output_type_shape", []) or []:
            for dtype, shape in dict(item).items():
                outputs.append((str(dtype), tuple(int(d) for d in shape)))
        seen[node] = NodeRun(node, str(args.get("op_name", "?")), str(provider), tuple(outputs))
    return list(seen.values())


def judge_placement(events: Iterable[Mapping[str, Any]], requested: list[str]) -> tuple[Placement, str | None]:
    """Judge a profile of one run against the requested provider list.

    Returns the placement and the reason to refuse the session (None when it may run):
    the first requested provider runs no node at all (e.g. a TensorRT provider that took no
    subgraph), or compute nodes ran on the CPU although the CPU provider was not requested.
    """
    nodes = nodes_from_profile(events)
    counts = dict(Counter(n.provider for n in nodes))
    cpu = [n for n in nodes if n.provider == CPU]
    shape_nodes = tuple(n for n in cpu if n.is_shape_computation)
    compute = tuple(n for n in cpu if not n.is_shape_computation)
    placement = Placement(counts, shape_nodes, compute)
    if counts and not counts.get(requested[0]):
        return placement, f"requested {requested[0]} first but it runs none of the graph's nodes ({counts})"
    if CPU not in requested and compute:
        shown = "; ".join(str(n) for n in compute[:5]) + (f"; ... {len(compute) - 5} more" if len(compute) > 5 else "")
        return placement, (
            f"{len(compute)} compute node(s) fell back to {CPU}, which was not requested: {shown} "
            f"(only shape computations may run there); add {CPU} to providers to allow it"
        )
    return placement, None
