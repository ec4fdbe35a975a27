"""The one implementation of pre- and post-processing that applies a release contract.

Training, the reference evaluation, the export checks and the serving path all call these
functions, so the tensors a model sees in the field are built exactly as they were when it
was trained. Everything here is numpy (no torch), so the daemon does not need torch.

    raw observation --preprocess()--> model inputs --(engine)--> model outputs --decode_actions()--> actions
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from vlad.contract import CameraSpec, Contract, LanguageSpec
from vlad.errors import NonFiniteObservation, ObservationError, TokenizerError
from vlad.files import sha256_file

if TYPE_CHECKING:
    from tokenizers import Tokenizer as _HFTokenizer


@dataclass(frozen=True, slots=True)
class RawObservation:
    """One observation as the robot's sensors deliver it, before any contract is applied.

    ``images`` maps camera name to the raw frame (shape, dtype, colour order and layout as
    in the contract's ``cameras.raw``); ``proprio`` is the joint state in contract units.
    ``client`` names the controller that sent it: a policy with ``[history]`` never mixes
    two controllers' frames in one window. ``executing``: what the controller reported it
    executes at the sensor time (``exec``: chunk seq and waypoint index; None: nothing;
    ``(-1, -1)``: no report). ``provisional``: the re-anchor announcement whose state it
    shows, not yet confirmed (0: the trusted state; vlad.serving.guard).
    """

    images: Mapping[str, np.ndarray]
    proprio: np.ndarray | None = None
    instruction: str | None = None
    sequence: int = 0
    sensor_time_ns: int = 0
    client: str | None = None
    executing: tuple[int, int] | None = (-1, -1)
    provisional: int = 0


# ---------------------------------------------------------------------------------------
# Language
# ---------------------------------------------------------------------------------------


@dataclass
class Tokenizer:
    """The contract's tokenizer: a ``tokenizers`` file pinned by sha256.

    The file hash is checked on load (a different vocabulary silently changes every token
    id), and so is the library's major.minor version (patch releases do not change how a
    saved tokenizer encodes).
    """

    spec: LanguageSpec
    path: Path
    _tok: _HFTokenizer = field(repr=False)
    _cache: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    @classmethod
    def from_contract(cls, contract: Contract) -> Tokenizer:
        spec = contract.language
        if spec is None:
            raise TokenizerError(f"contract {contract.model.id} declares no language input")
        if spec.library != "tokenizers":
            raise TokenizerError(f"tokenizer library {spec.library!r} is not supported (only 'tokenizers')")
        path = contract.tokenizer_path
        assert path is not None  # set whenever the contract has a language (checked above)
        if not path.is_file():
            raise TokenizerError(f"tokenizer file {path} is missing; the release is incomplete")
        digest = sha256_file(path)
        if digest != spec.sha256:
            raise TokenizerError(
                f"tokenizer file {path} has sha256 {digest[:16]}..., the contract pins "
                f"{spec.sha256[:16]}...; use the tokenizer shipped with the release"
            )
        installed = importlib.metadata.version("tokenizers")
        if installed.split(".")[:2] != spec.library_version.split(".")[:2]:
            raise TokenizerError(
                f"tokenizers {installed} is installed, the contract was made with "
                f"{spec.library_version}; install tokenizers=={spec.library_version}"
            )
        from tokenizers import Tokenizer as _HFTokenizer

        return cls(spec=spec, path=path, _tok=_HFTokenizer.from_file(str(path)))

    def encode(self, text: str) -> np.ndarray:
        """Token ids of ``text``, padded to ``max_tokens`` on the contract's side (int64)."""
        cached = self._cache.get(text)
        if cached is not None:
            return cached
        spec = self.spec
        ids = self._tok.encode(text).ids
        if len(ids) > spec.max_tokens:
            if spec.truncation == "error":
                raise TokenizerError(
                    f"instruction has {len(ids)} tokens, the contract allows {spec.max_tokens}: {text!r}"
                )
            ids = ids[: spec.max_tokens]
        pad = [spec.pad_id] * (spec.max_tokens - len(ids))
        ids = ids + pad if spec.padding_side == "right" else pad + ids
        out = np.asarray(ids, dtype=np.int64)
        out.setflags(write=False)
        if len(self._cache) < 64:  # instructions repeat; bound the cache anyway
            self._cache[text] = out
        return out


# ---------------------------------------------------------------------------------------
# Images
# ---------------------------------------------------------------------------------------


def _resize_bilinear(img: np.ndarray, h: int, w: int) -> np.ndarray:
    """Bilinear resize of an HWC float image with half-pixel centres (OpenCV/PIL convention)."""
    in_h, in_w = img.shape[:2]
    ys = np.clip((np.arange(h) + 0.5) * (in_h / h) - 0.5, 0, in_h - 1)
    xs = np.clip((np.arange(w) + 0.5) * (in_w / w) - 0.5, 0, in_w - 1)
    y0 = np.floor(ys).astype(np.int64)
    x0 = np.floor(xs).astype(np.int64)
    y1 = np.minimum(y0 + 1, in_h - 1)
    x1 = np.minimum(x0 + 1, in_w - 1)
    wy = (ys - y0).astype(img.dtype)[:, None, None]
    wx = (xs - x0).astype(img.dtype)[None, :, None]
    top = img[y0][:, x0] * (1 - wx) + img[y0][:, x1] * wx
    bottom = img[y1][:, x0] * (1 - wx) + img[y1][:, x1] * wx
    return top * (1 - wy) + bottom * wy


def _resize(img: np.ndarray, h: int, w: int, method: str) -> np.ndarray:
    in_h, in_w = img.shape[:2]
    if (in_h, in_w) == (h, w):
        return img
    if method == "none":
        raise ObservationError(f"image is {in_h}x{in_w}, the model needs {h}x{w} and the contract allows no resize")
    if method == "nearest":
        ys = np.minimum(((np.arange(h) + 0.5) * (in_h / h)).astype(np.int64), in_h - 1)
        xs = np.minimum(((np.arange(w) + 0.5) * (in_w / w)).astype(np.int64), in_w - 1)
        return img[ys][:, xs]
    if method == "area":
        if in_h % h or in_w % w:
            raise ObservationError(f"area resize needs an integer factor, got {in_h}x{in_w} -> {h}x{w}")
        fy, fx = in_h // h, in_w // w
        return img.reshape(h, fy, w, fx, img.shape[2]).mean(axis=(1, 3), dtype=img.dtype)
    return _resize_bilinear(img, h, w)


def _center_crop(img: np.ndarray, h: int, w: int) -> np.ndarray:
    """Crop the largest centred window with the model's aspect ratio."""
    in_h, in_w = img.shape[:2]
    if in_h * w > in_w * h:  # too tall
        ch = in_w * h // w
        top = (in_h - ch) // 2
        return img[top : top + ch]
    cw = in_h * w // h
    left = (in_w - cw) // 2
    return img[:, left : left + cw]


def preprocess_image(cam: CameraSpec, img: np.ndarray) -> np.ndarray:
    """Raw camera frame -> one model image (no batch axis), as the contract says."""
    raw, model = cam.raw, cam.model
    expected = (raw.height, raw.width, 3) if raw.layout == "HWC" else (3, raw.height, raw.width)
    if not isinstance(img, np.ndarray) or img.dtype != np.dtype(raw.dtype) or img.shape != expected:
        got = f"{img.dtype}{list(img.shape)}" if isinstance(img, np.ndarray) else type(img).__name__
        raise ObservationError(
            f"camera {cam.name!r}: expected {raw.dtype}{list(expected)} {raw.layout} {raw.color_order}, got {got}"
        )
    x = img if raw.layout == "HWC" else np.transpose(img, (1, 2, 0))
    if raw.color_order != model.color_order:
        x = x[..., ::-1]
    x = x.astype(np.float32)
    if model.crop == "center":
        x = _center_crop(x, model.height, model.width)
    x = _resize(x, model.height, model.width, model.resize)
    mean = np.asarray(model.mean, dtype=np.float32)
    std = np.asarray(model.std, dtype=np.float32)
    x = (x / np.float32(model.scale) - mean) / std
    if model.layout == "CHW":
        x = np.transpose(x, (2, 0, 1))
    return np.ascontiguousarray(x, dtype=np.dtype(model.dtype))


# ---------------------------------------------------------------------------------------
# Proprioception and noise
# ---------------------------------------------------------------------------------------


def preprocess_proprio(contract: Contract, proprio: np.ndarray | None) -> np.ndarray:
    """Joint state in contract units -> normalized float32 vector."""
    spec = contract.proprio
    assert spec is not None  # callers check contract.proprio first
    if proprio is None:
        raise ObservationError(f"observation has no proprio; the contract needs {spec.dim} values {list(spec.names)}")
    p = np.asarray(proprio)
    if p.shape != (spec.dim,) or not np.issubdtype(p.dtype, np.floating):
        raise ObservationError(f"proprio: expected float[{spec.dim}] {list(spec.names)}, got {p.dtype}{list(p.shape)}")
    if not np.all(np.isfinite(p)):
        raise NonFiniteObservation(f"proprio has non-finite values: {p.tolist()}")
    return ((p.astype(np.float32) - np.asarray(spec.mean, np.float32)) / np.asarray(spec.std, np.float32)).astype(
        np.float32
    )


def make_noise(contract: Contract, sequence: int, batch: int = 1) -> np.ndarray:
    """The initial flow-matching noise for one observation, by the contract's seeding rule.

    ``philox-sequence`` keys a Philox generator with ``seed + sequence``, so the same
    observation sequence gives the same noise on every backend and every replay.
    """
    spec = contract.noise
    assert spec is not None  # callers check contract.noise first
    shape = (batch, *spec.shape)
    if spec.seeding == "zeros":
        return np.zeros(shape, dtype=np.dtype(spec.dtype))
    gen = np.random.Generator(np.random.Philox(key=spec.seed + sequence))
    return gen.standard_normal(shape, dtype=np.float32).astype(np.dtype(spec.dtype), copy=False)


# ---------------------------------------------------------------------------------------
# Whole observation
# ---------------------------------------------------------------------------------------


def preprocess(contract: Contract, tokenizer: Tokenizer | None, obs: RawObservation) -> dict[str, np.ndarray]:
    """Raw observation -> the model's input tensors (batch of one), named as in the contract.

    One :class:`Preprocessor` (the serving path's own code) used once, so its arrays are the
    caller's. With ``[history]`` this is a window that starts at ``obs``: every one of its
    frames is ``obs`` (what :class:`Preprocessor` holds after a restart, and what LeRobot's
    observation queue holds after a reset).
    """
    return Preprocessor(contract, tokenizer).fill(obs)


def decode_actions(contract: Contract, outputs: Mapping[str, np.ndarray]) -> np.ndarray:
    """Model outputs -> an action chunk ``float32[chunk_length, dim]`` in contract units.

    Unnormalizes per joint (``x * std + mean``) and applies the contract's unit scale. Bounds
    and rate limits are not applied here: that is the final guard's job, which counts them.
    One :class:`ActionDecoder` (the serving path's own code) used once.
    """
    return ActionDecoder(contract).decode(outputs)


def normalize_actions(contract: Contract, actions: np.ndarray) -> np.ndarray:
    """Inverse of :func:`decode_actions`: actions in contract units -> the model's training target."""
    spec = contract.action
    mean = np.asarray([j.mean for j in spec.joints], dtype=np.float32)
    std = np.asarray([j.std for j in spec.joints], dtype=np.float32)
    return ((np.asarray(actions, np.float32) / np.float32(spec.scale) - mean) / std).astype(np.float32)


@dataclass(frozen=True, slots=True)
class Guide:
    """What real-time chunking conditions a chunk on (a contract with ``[rtc]``): the waypoints
    the new chunk is to continue, ``float32[chunk_length, dim]`` in contract units on the new
    chunk's time slots, and a weight per waypoint in [0, 1] (1: reproduce it, 0: free)."""

    actions: np.ndarray
    weights: np.ndarray


# ---------------------------------------------------------------------------------------
# The serving path: the same arithmetic into preallocated buffers
# ---------------------------------------------------------------------------------------


class Preprocessor:
    """Raw observations -> model inputs (:func:`preprocess`) for one contract, into buffers allocated once.

    The serving thread calls :meth:`fill` every cycle; it returns the same dict of the
    same arrays each time (the engine reads them before the next call). An 8-bit camera
    that needs no crop or resize goes through a per-channel lookup table built with
    :func:`preprocess_image`'s very same float32 operations (bit-identical; the golden
    fixtures check it), which also does the layout change in the same pass; other cameras
    take :func:`preprocess_image` and a copy.

    With ``[history]`` (``frames`` > 1) it also holds the observation window: the camera and
    proprio inputs are the last ``frames`` observations passed to :meth:`fill`, oldest first.
    A frame is checked in full before the window moves, so a rejected observation never
    enters it. The window restarts (every slot the newest frame, as LeRobot fills its queue
    after a reset) on the first observation, after a gap longer than
    ``timing.max_observation_age_ms`` between consecutive frames (the older frames are then
    stale, whatever the newest one is), when the sensor time runs backwards, when the
    ``client`` changes, and on :meth:`reset`. The same observation passed twice (a swap
    re-serves the newest) does not move the window.
    """

    def __init__(self, contract: Contract, tokenizer: Tokenizer | None) -> None:
        self.contract = contract
        self.tokenizer = tokenizer
        self.frames = contract.frames
        self.inputs: dict[str, np.ndarray] = {}
        self._cameras: list[tuple[CameraSpec, np.ndarray, np.ndarray | None]] = []
        # frames > 1: each frame is built in a staging buffer, then committed to the window
        self._staged: list[tuple[np.ndarray, np.ndarray]] = []  # (staging frame, window [1, T, ...])
        time_axis = (self.frames,) if self.frames > 1 else ()
        for cam in contract.cameras:
            m = cam.model
            frame = (3, m.height, m.width) if m.layout == "CHW" else (m.height, m.width, 3)
            window = np.zeros((1, *time_axis, *frame), dtype=np.dtype(m.dtype))
            self.inputs[cam.input] = window
            if self.frames > 1:
                stage = np.zeros((1, *frame), dtype=window.dtype)
                self._staged.append((stage, window))
                self._cameras.append((cam, stage, _channel_lut(cam)))
            else:
                self._cameras.append((cam, window, _channel_lut(cam)))
        self._instruction: str | None = None  # what the token buffer holds now
        if contract.language is not None:
            self.inputs[contract.language.input] = np.zeros((1, contract.language.max_tokens), np.int64)
        if contract.proprio is not None:
            spec = contract.proprio
            window = np.zeros((1, *time_axis, spec.dim), np.float32)
            self.inputs[spec.input] = window
            self._proprio = window
            if self.frames > 1:
                self._proprio = np.zeros((1, spec.dim), np.float32)
                self._staged.append((self._proprio, window))
            self._p_mean = np.asarray(spec.mean, np.float32)
            self._p_std = np.asarray(spec.std, np.float32)
        if contract.noise is not None:
            self.inputs[contract.noise.input] = np.zeros((1, *contract.noise.shape), np.dtype(contract.noise.dtype))
            self._noise = _NoiseSource(contract)
        self._guide: tuple[np.ndarray, np.ndarray] | None = None  # the [rtc] inputs
        if contract.rtc is not None:
            a = contract.action
            self._guide = (np.zeros((1, a.chunk_length, a.dim), np.float32), np.zeros((1, a.chunk_length), np.float32))
            self.inputs[contract.rtc.actions_input], self.inputs[contract.rtc.weights_input] = self._guide
            self._a_mean = np.asarray([j.mean for j in a.joints], np.float32)
            self._a_std = np.asarray([j.std for j in a.joints], np.float32)
            self._a_scale = np.float32(a.scale)
        self._max_gap_ns = int(contract.timing.max_observation_age_ms * 1e6)
        self.restarts = 0  # window restarts (frames > 1), for tests and status
        self.reset()

    def reset(self) -> None:
        """Restart the observation window at the next :meth:`fill` (frames > 1); e.g. after the
        trusted joint state re-anchored or the robot was re-homed."""
        self._filled = 0  # frames the window holds
        self._last: tuple[int, int, str | None] | None = None  # (sequence, sensor time, client)

    def fill(self, obs: RawObservation, guide: Guide | None = None) -> dict[str, np.ndarray]:
        """Raw observation -> the model inputs (the preallocated dict); ObservationError
        (NonFiniteObservation for NaN/Inf) for what does not fit the contract.

        ``guide``: what real-time chunking conditions the chunk on (a contract with
        ``[rtc]``); None computes the plain chunk (all weights zero)."""
        c = self.contract
        for cam, buf, lut in self._cameras:
            img = obs.images.get(cam.name)
            if img is None:
                raise ObservationError(f"observation has no image from camera {cam.name!r} (has: {sorted(obs.images)})")
            if lut is not None and img.shape == _raw_shape(cam) and img.dtype == np.uint8:
                order = _channel_order(cam)
                for k in range(3):
                    src = img[..., order[k]] if cam.raw.layout == "HWC" else img[order[k]]
                    dst = buf[0, k] if cam.model.layout == "CHW" else buf[0, ..., k]
                    np.take(lut[k], src, out=dst)
            else:
                buf[0] = preprocess_image(cam, img)
        if c.language is not None:
            if obs.instruction is None:
                raise ObservationError("observation has no instruction; the contract has a language input")
            assert self.tokenizer is not None  # a contract with a language input comes with its tokenizer
            if obs.instruction != self._instruction:  # a controller repeats its instruction: written once
                self.inputs[c.language.input][0] = self.tokenizer.encode(obs.instruction)  # cached per instruction
                self._instruction = obs.instruction
        if c.proprio is not None:
            spec = c.proprio
            p = obs.proprio
            if p is None:
                raise ObservationError(f"observation has no proprio; the contract needs {spec.dim} values")
            if p.shape != (spec.dim,) or p.dtype.kind != "f":
                raise ObservationError(f"proprio: expected float[{spec.dim}], got {p.dtype}{list(p.shape)}")
            if not np.isfinite(p).all():
                raise NonFiniteObservation(f"proprio has non-finite values: {p.tolist()}")
            out = self._proprio.reshape(-1)
            np.subtract(p.astype(np.float32, copy=False), self._p_mean, out=out)
            np.divide(out, self._p_std, out=out)
        if self._staged:
            self._commit(obs)
        if c.noise is not None:
            self._noise.fill(obs.sequence, self.inputs[c.noise.input])
        if self._guide is not None:
            actions, weights = self._guide
            if guide is None:
                weights[...] = 0.0
            else:  # normalize_actions' arithmetic, into the buffer
                np.divide(guide.actions, self._a_scale, out=actions[0])
                actions[0] -= self._a_mean
                actions[0] /= self._a_std
                weights[0] = guide.weights
        return self.inputs

    def prepare(self, sequence: int) -> None:
        """Work for the observation numbered ``sequence`` that needs nothing of it (its
        flow-matching noise), done ahead: :meth:`fill` then finds it ready."""
        if self.contract.noise is not None:
            self._noise.prepare(sequence)

    def take_in(self, earlier: Sequence[RawObservation]) -> None:
        """Observations accepted before the next one :meth:`fill` gets, superseded while an
        inference ran: they enter the window in order (the newest ``frames - 1`` of them), so
        a window holds consecutive observations however long the policy takes. One that
        does not fit the contract is left out (:meth:`fill` of the next one says why)."""
        for obs in earlier[len(earlier) - (self.frames - 1) :] if self.frames > 1 else ():
            try:
                self.fill(obs)
            except ObservationError:
                continue

    def _commit(self, obs: RawObservation) -> None:
        """Move the checked frame (the staging buffers) into the window."""
        key = (obs.sequence, obs.sensor_time_ns, obs.client)
        last = self._last
        if last == key and self._filled:
            return  # the same observation again: the window already ends with it
        restart = (
            last is None
            or not self._filled
            or obs.client != last[2]
            or obs.sensor_time_ns < last[1]
            or obs.sensor_time_ns - last[1] > self._max_gap_ns
        )
        for stage, window in self._staged:
            if restart:
                window[0] = stage  # broadcast over the time axis
            else:
                window[0, :-1] = window[0, 1:]  # numpy copies overlapping slices safely
                window[0, -1] = stage[0]
        if restart:
            self.restarts += 1
            self._filled = 1
        else:
            self._filled = min(self._filled + 1, self.frames)
        self._last = key


class _NoiseSource:
    """:func:`make_noise` without building a generator per call: one Philox generator whose
    state is reset to the key ``seed + sequence`` (the same stream, bit for bit)."""

    def __init__(self, contract: Contract) -> None:
        assert contract.noise is not None  # built only for a contract with a noise input
        self.spec = contract.noise
        self._bits = np.random.Philox(key=0)
        self._gen = np.random.Generator(self._bits)
        self._f32 = np.zeros((1, *self.spec.shape), np.float32)
        self._drawn_for: int | None = None  # the sequence whose noise _f32 holds

    def fill(self, sequence: int, out: np.ndarray) -> None:
        if self.spec.seeding == "zeros":
            out[...] = 0
            return
        if sequence != self._drawn_for:  # else drawn ahead (:meth:`prepare`)
            self._draw(sequence)
        out[...] = self._f32

    def prepare(self, sequence: int) -> None:
        """Draw the noise of ``sequence`` now (the same numbers :meth:`fill` would draw):
        the serving loop asks for the next observation's between two, off its hot path."""
        if self.spec.seeding != "zeros" and sequence != self._drawn_for:
            self._draw(sequence)

    def _draw(self, sequence: int) -> None:
        key = self.spec.seed + sequence
        state = self._bits.state
        state["state"]["key"][:] = (key & 0xFFFFFFFFFFFFFFFF, key >> 64)
        state["state"]["counter"][:] = 0
        state["buffer"][:] = 0
        state["buffer_pos"], state["has_uint32"], state["uinteger"] = 4, 0, 0
        self._bits.state = state
        self._gen.standard_normal(out=self._f32, dtype=np.float32)
        self._drawn_for = sequence


def _raw_shape(cam: CameraSpec) -> tuple[int, int, int]:
    r = cam.raw
    return (r.height, r.width, 3) if r.layout == "HWC" else (3, r.height, r.width)


def _channel_order(cam: CameraSpec) -> tuple[int, int, int]:
    return (0, 1, 2) if cam.raw.color_order == cam.model.color_order else (2, 1, 0)


def _channel_lut(cam: CameraSpec) -> np.ndarray | None:
    """uint8 value -> normalized model value per channel, when no crop or resize applies."""
    raw, m = cam.raw, cam.model
    if raw.dtype != "uint8" or (raw.height, raw.width) != (m.height, m.width):
        return None
    if m.crop == "center" and (raw.height, raw.width) != (m.height, m.width):
        return None
    values = np.arange(256, dtype=np.float32)
    mean = np.asarray(m.mean, dtype=np.float32)
    std = np.asarray(m.std, dtype=np.float32)
    # Exactly preprocess_image's float32 arithmetic, once per possible pixel value.
    lut = (values[None, :] / np.float32(m.scale) - mean[:, None]) / std[:, None]
    return lut.astype(np.dtype(m.dtype))


class ActionDecoder:
    """Model outputs -> actions in contract units (:func:`decode_actions`), into a buffer allocated once.

    :meth:`decode` returns the same array every call: a caller that keeps a chunk past
    the next cycle copies it.
    """

    def __init__(self, contract: Contract) -> None:
        spec = contract.action
        self.spec = spec
        self.mean = np.asarray([j.mean for j in spec.joints], dtype=np.float32)
        self.std = np.asarray([j.std for j in spec.joints], dtype=np.float32)
        self.scale = np.float32(spec.scale)
        self.out = np.zeros((spec.chunk_length, spec.dim), np.float32)

    def decode(self, outputs: Mapping[str, np.ndarray]) -> np.ndarray:
        spec = self.spec
        y = outputs.get(spec.output)
        if y is None:
            raise ObservationError(f"model produced no output {spec.output!r} (has: {sorted(outputs)})")
        if y.shape != (1, spec.chunk_length, spec.dim):
            raise ObservationError(
                f"output {spec.output!r}: expected [1, {spec.chunk_length}, {spec.dim}], got {list(y.shape)}"
            )
        out = self.out
        np.multiply(y[0].astype(np.float32, copy=False), self.std, out=out)
        out += self.mean
        out *= self.scale
        return out
