"""The one implementation of pre- and post-processing that applies a release contract.

Training, the reference evaluation, the export checks and the serving path all call these
functions, so the tensors a model sees in the field are built exactly as they were when it
was trained. Everything here is numpy (no torch), so the daemon does not need torch.

    raw observation --preprocess()--> model inputs --(engine)--> model outputs --decode_actions()--> actions
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vlad.contract import CameraSpec, Contract, LanguageSpec
from vlad.errors import NonFiniteObservation, ObservationError, TokenizerError


@dataclass(frozen=True, slots=True)
class RawObservation:
    """One observation as the robot's sensors deliver it, before any contract is applied.

    ``images`` maps camera name to the raw frame (shape, dtype, colour order and layout as
    in the contract's ``cameras.raw``); ``proprio`` is the joint state in contract units.
    """

    images: Mapping[str, np.ndarray]
    proprio: np.ndarray | None = None
    instruction: str | None = None
    sequence: int = 0
    sensor_time_ns: int = 0


# ---------------------------------------------------------------------------------------
# Language
# ---------------------------------------------------------------------------------------


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass
class Tokenizer:
    """The contract's tokenizer: a ``tokenizers`` file pinned by sha256.

    The file hash is checked on load (a different vocabulary silently changes every token
    id), and so is the library's major.minor version (patch releases do not change how a
    saved tokenizer encodes).
    """

    spec: LanguageSpec
    path: Path
    _tok: object = field(repr=False)
    _cache: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    @classmethod
    def from_contract(cls, contract: Contract) -> "Tokenizer":
        spec = contract.language
        if spec is None:
            raise TokenizerError(f"contract {contract.model.id} declares no language input")
        if spec.library != "tokenizers":
            raise TokenizerError(f"tokenizer library {spec.library!r} is not supported (only 'tokenizers')")
        path = contract.tokenizer_path
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
    shape = (batch, *spec.shape)
    if spec.seeding == "zeros":
        return np.zeros(shape, dtype=np.dtype(spec.dtype))
    gen = np.random.Generator(np.random.Philox(key=spec.seed + sequence))
    return gen.standard_normal(shape, dtype=np.float32).astype(np.dtype(spec.dtype), copy=False)


# ---------------------------------------------------------------------------------------
# Whole observation
# ---------------------------------------------------------------------------------------


def preprocess(contract: Contract, tokenizer: Tokenizer | None, obs: RawObservation) -> dict[str, np.ndarray]:
    """Raw observation -> the model's input tensors (batch of one), named as in the contract."""
    inputs: dict[str, np.ndarray] = {}
    for cam in contract.cameras:
        img = obs.images.get(cam.name)
        if img is None:
            raise ObservationError(f"observation has no image from camera {cam.name!r} (has: {sorted(obs.images)})")
        inputs[cam.input] = preprocess_image(cam, img)[None]
    if contract.language is not None:
        if obs.instruction is None:
            raise ObservationError("observation has no instruction; the contract has a language input")
        inputs[contract.language.input] = tokenizer.encode(obs.instruction)[None]
    if contract.proprio is not None:
        inputs[contract.proprio.input] = preprocess_proprio(contract, obs.proprio)[None]
    if contract.noise is not None:
        inputs[contract.noise.input] = make_noise(contract, obs.sequence)
    return inputs


def decode_actions(contract: Contract, outputs: Mapping[str, np.ndarray]) -> np.ndarray:
    """Model outputs -> an action chunk ``float32[chunk_length, dim]`` in contract units.

    Unnormalizes per joint (``x * std + mean``) and applies the contract's unit scale. Bounds
    and rate limits are not applied here: that is the final guard's job, which counts them.
    """
    spec = contract.action
    y = outputs.get(spec.output)
    if y is None:
        raise ObservationError(f"model produced no output {spec.output!r} (has: {sorted(outputs)})")
    if y.shape != (1, spec.chunk_length, spec.dim):
        raise ObservationError(f"output {spec.output!r}: expected [1, {spec.chunk_length}, {spec.dim}], got {list(y.shape)}")
    mean = np.asarray([j.mean for j in spec.joints], dtype=np.float32)
    std = np.asarray([j.std for j in spec.joints], dtype=np.float32)
    return ((y[0].astype(np.float32) * std + mean) * np.float32(spec.scale)).astype(np.float32)


def normalize_actions(contract: Contract, actions: np.ndarray) -> np.ndarray:
    """Inverse of :func:`decode_actions`: actions in contract units -> the model's training target."""
    spec = contract.action
    mean = np.asarray([j.mean for j in spec.joints], dtype=np.float32)
    std = np.asarray([j.std for j in spec.joints], dtype=np.float32)
    return ((np.asarray(actions, np.float32) / np.float32(spec.scale) - mean) / std).astype(np.float32)
