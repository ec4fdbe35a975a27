"""Optimization profiles derived from the release contract (pure: no TensorRT import).

A TensorRT engine with dynamic axes only accepts shapes inside the optimization profile it
was built with. The profile comes from the contract's ``[[inputs]]``: static axes are
fixed, dynamic axes span their ``[min, max]`` with ``opt`` as the tuning point. An engine
may be built narrower than the contract (option ``profile_max_batch``, e.g. to save
memory on a small Jetson); :func:`check_profile` then refuses inputs the contract would
accept but the engine cannot run, before anything is enqueued.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from vlad.contract import Contract
from vlad.errors import BackendError, InputRejected

BATCH_AXIS = "batch"


@dataclass(frozen=True, slots=True)
class TensorProfile:
    """min / opt / max shapes of one engine input."""

    name: str
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]

    def accepts(self, shape: tuple[int, ...]) -> bool:
        """Whether ``shape`` lies inside ``[min, max]`` on every axis."""
        return len(shape) == len(self.min) and all(
            lo <= s <= hi for s, lo, hi in zip(shape, self.min, self.max, strict=False)
        )


@dataclass(frozen=True, slots=True)
class Profile:
    """The single optimization profile of an engine, one entry per contract input, in
    contract order. ``narrowed`` says whether ``profile_max_batch`` cut it below the
    contract (error messages then name the option)."""

    tensors: tuple[TensorProfile, ...]
    narrowed: bool = False

    def __getitem__(self, name: str) -> TensorProfile:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    def to_dict(self) -> dict[str, dict[str, list[int]]]:
        """Plain form used for the cache key and the sidecar (``narrowed`` is derivable
        from the shapes and the contract, so it is not part of the identity)."""
        return {t.name: {"min": list(t.min), "opt": list(t.opt), "max": list(t.max)} for t in self.tensors}

    def canonical_json(self) -> str:
        """Canonical JSON (sorted keys, no whitespace): equal profiles give equal bytes."""
        return canonical_json(self.to_dict())

    def opt_shapes(self) -> dict[str, tuple[int, ...]]:
        """The shape of every input at the profile's tuning point (CUDA-graph capture)."""
        return {t.name: t.opt for t in self.tensors}

    def max_shapes(self) -> dict[str, tuple[int, ...]]:
        """The largest shape of every input (device buffers are sized for these)."""
        return {t.name: t.max for t in self.tensors}


def canonical_json(value: object) -> str:
    """JSON with sorted keys and no whitespace, so hashing it is stable across runs."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def derive_profile(contract: Contract, max_batch: int | None = None) -> Profile:
    """The optimization profile for ``contract``'s inputs.

    Static axes are fixed at the contract shape; each dynamic axis spans its
    ``[min, max]`` with ``opt`` as the tuning point. ``max_batch`` (option
    ``profile_max_batch``) lowers the upper bound of axes named ``batch``; ``opt`` is
    clamped into the narrowed range. A ``max_batch`` below an axis' minimum is refused.
    """
    if max_batch is not None and (isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1):
        raise BackendError(f"profile_max_batch must be a positive integer, got {max_batch!r}")
    tensors = []
    narrowed = False
    for spec in contract.inputs:
        lo, opt, hi = list(spec.min_shape), list(spec.opt_shape), list(spec.max_shape)
        for ax in spec.dynamic:
            if max_batch is None or ax.name != BATCH_AXIS or max_batch >= ax.max:
                continue
            if max_batch < ax.min:
                raise BackendError(
                    f"profile_max_batch {max_batch} is below the contract's minimum batch "
                    f"{ax.min} for input {spec.name!r}"
                )
            hi[ax.axis] = max_batch
            opt[ax.axis] = min(opt[ax.axis], max_batch)
            narrowed = True
        tensors.append(TensorProfile(spec.name, tuple(lo), tuple(opt), tuple(hi)))
    return Profile(tuple(tensors), narrowed)


def check_profile(profile: Profile, inputs: Mapping[str, np.ndarray]) -> None:
    """Refuse inputs whose shapes the engine's profile cannot run.

    :meth:`vlad.backend.Session.infer` already checked them against the contract; this
    catches an engine built narrower than the contract (``profile_max_batch``) before
    anything is copied or enqueued. Raises :class:`~vlad.errors.InputRejected`.
    """
    for t in profile.tensors:
        x = inputs.get(t.name)
        if x is None:
            raise InputRejected(f"input {t.name!r} is missing (the engine profile needs it)")
        shape = tuple(x.shape)
        if t.accepts(shape):
            continue
        hint = " (the engine was built with profile_max_batch)" if profile.narrowed else ""
        raise InputRejected(
            f"input {t.name!r}: shape {list(shape)} is outside the engine's optimization "
            f"profile min {list(t.min)} .. max {list(t.max)}{hint}"
        )
