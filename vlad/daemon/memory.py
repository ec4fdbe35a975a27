"""Memory planning: what each loaded policy holds, what a new release needs, and the budget.

A robot holds the release being served and its fallback policies in one memory, and during
a deploy, shadow run or canary a candidate as well (a deploy loads the new release beside
the serving one, so the swap is a pointer change). With π0-sized releases (6.5 GB in bf16)
two of them may not fit. So before a release operation loads anything:

* every loaded policy's figure is what it **measured**: the growth of the daemon's resident
  memory (and of the device's peak allocation, where the backend reports one) while it
  was loaded and warmed up;
* a candidate's need is what its manifest states (``[memory]``: the planner's figure or
  the performance gate's measured peak), from the manifest the operation authenticated
  (:func:`vlad.release.signing.authenticate`) before anything else of the release is read;
  a release that states nothing is estimated from the size of its model and weight files
  (a lower bound: state it);
* the operation is refused, with the numbers, when ``loaded + need`` exceeds the budget of
  ``[memory]`` in the daemon's configuration (0: no budget).

With ``swap = "fallback"`` a deploy or rollback that does not fit beside the serving release
but fits in its place is carried out by **swapping**: the fallback chain serves while the
old release is closed and the new one loads (the gap is measured and recorded). A shadow
run or a canary needs both releases at once, so it is refused instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from vlad.backend import host_rss_bytes
from vlad.errors import VladError
from vlad.release.loading import LoadedPolicy
from vlad.snapshot import MemoryStatus, PolicyMemory  # the status carries the same figures

if TYPE_CHECKING:
    from vlad.release.manifest import Manifest

GB = 1e9
MODEL_ROLES = ("model", "weights", "engine", "adapter")


def measured_load(load: Callable[[], LoadedPolicy]) -> tuple[LoadedPolicy, PolicyMemory]:
    """Run ``load`` (verify, load, warm up) and measure what it added: resident memory growth,
    and the session's device peak where the backend reports one."""
    before = host_rss_bytes()
    policy = load()
    grown = max(0, host_rss_bytes() - before)
    try:
        device = policy.session.memory().device_peak_bytes or 0
    except Exception:  # a figure for the status, never a reason for a load to fail
        device = 0
    return policy, PolicyMemory(grown, int(device), "measured")


def stated_need(folder: Path, manifest: Manifest | None) -> PolicyMemory:
    """What the release in ``folder`` needs: its ``manifest``'s ``[memory]``, or an estimate.

    ``manifest`` is one the caller authenticated (or, with ``release.verify = false``, read
    as it is); None (a release that cannot be authenticated, which the load then refuses
    with the reason): estimated from the folder's model files.
    """
    if manifest is not None and manifest.memory is not None:
        m = manifest.memory
        return PolicyMemory(m.host_bytes, m.device_bytes, f"manifest ({m.source})")
    if manifest is not None:
        files = [folder / a.path for a in manifest.artifacts if a.role in MODEL_ROLES]
    else:
        files = [p for p in folder.glob("*") if p.suffix in (".onnx", ".pt2", ".data", ".engine", ".plan")]
    size = 0
    for f in files:
        try:
            size += f.stat().st_size
        except OSError:
            continue  # missing: the load says so
    return PolicyMemory(size, 0, "estimate (model files' size)")


def claimed_manifest(folder: Path, keys_dir: str | None) -> Manifest | None:
    """The manifest of ``folder`` to size a shadow run by: authenticated with ``keys_dir``
    (None: ``release.verify = false``, read as it is); None when it cannot be (unsigned,
    unknown key, bad signature, invalid): the load refuses it with the reason."""
    from vlad.release.manifest import parse_document, parse_manifest, read_manifest_bytes
    from vlad.release.signing import authenticate

    try:
        if keys_dir is not None:
            return authenticate(folder, keys_dir).manifest
        return parse_manifest(parse_document(read_manifest_bytes(folder), str(folder)), str(folder))
    except Exception:
        return None


@dataclass(frozen=True)
class Plan:
    """What a release operation may do: ``fits`` beside everything, or ``swap`` (serve the
    fallback chain while the serving release makes room)."""

    action: Literal["fits", "swap"]
    need: PolicyMemory
    loaded: Mapping[str, PolicyMemory]


class MemoryBudget:
    """The ``[memory]`` budget of the configuration, applied to release operations."""

    def __init__(self, host_budget_mb: float, device_budget_mb: float, swap: str) -> None:
        self.host = int(host_budget_mb * 2**20)
        self.device = int(device_budget_mb * 2**20)
        self.swap = swap

    def status(
        self, loaded: Mapping[str, PolicyMemory], host_rss_bytes: int, readings_bytes: Mapping[str, float]
    ) -> MemoryStatus:
        """For the status: the daemon's resident memory and the sensors' memory readings
        (given), the budget, what every loaded policy holds, and the sum."""
        return MemoryStatus(
            host_rss_bytes=host_rss_bytes,
            readings_bytes=readings_bytes,
            budget_host_bytes=self.host or None,
            budget_device_bytes=self.device or None,
            swap=self.swap,
            policies=dict(loaded),
            policies_host_bytes=sum(v.host_bytes for v in loaded.values()),
            policies_device_bytes=sum(v.device_bytes for v in loaded.values()),
        )

    def over(self, need: PolicyMemory, loaded: Mapping[str, PolicyMemory]) -> list[str]:
        """Where ``need`` beside ``loaded`` exceeds the budget, as message parts (empty: fits)."""
        out = []
        for kind, budget, key in (("host", self.host, "host_bytes"), ("device", self.device, "device_bytes")):
            held = sum(getattr(m, key) for m in loaded.values())
            want = getattr(need, key)
            if budget and held + want > budget:
                parts = ", ".join(f"{name} {getattr(m, key) / GB:.2f} GB" for name, m in loaded.items())
                out.append(
                    f"{want / GB:.2f} GB of {kind} memory ({need.source}) beside the {held / GB:.2f} GB "
                    f"the loaded policies hold ({parts or 'none'}) is {(held + want) / GB:.2f} GB, over the "
                    f"{budget / GB:.2f} GB budget (memory.{kind}_budget_mb = {budget / 2**20:g})"
                )
        return out

    def plan(
        self,
        operation: str,
        release: str,
        need: PolicyMemory,
        loaded: Mapping[str, PolicyMemory],
        replaces: str | None = None,
    ) -> Plan:
        """``fits``, ``swap`` (a deploy or rollback that fits once ``replaces``, the serving
        release, is closed, with ``swap = "fallback"``), or a :class:`VladError` with the numbers."""
        problems = self.over(need, loaded)
        if not problems:
            return Plan("fits", need, loaded)
        without = {k: v for k, v in loaded.items() if k != replaces}
        if replaces is not None and not self.over(need, without):
            if self.swap == "fallback":
                return Plan("swap", need, loaded)
            hint = (
                f'; it would fit in place of {replaces}: set memory.swap = "fallback" to serve the '
                "fallback chain while it loads"
            )
        elif replaces is not None:
            hint = "; it does not fit even in place of the serving release: raise the budget or drop a fallback"
        else:
            hint = "; a shadow run or canary holds both releases: stop the shadow run or raise the budget"
        raise VladError(f"{operation} of {release} refused: " + "; ".join(problems) + hint)


def swap_gap(t0_ns: int) -> float:
    """Seconds since ``t0_ns`` (when the fallback chain took over), for the swap's record."""
    return round((time.monotonic_ns() - t0_ns) / 1e9, 3)
