"""Releases for tests and benchmarks: the demo release of this checkout, unsigned copies of
it, and the payloads the serving benchmarks send.

* :data:`DEMO` (``manifests/demo``, signed with the demo-only key in :data:`DEMO_KEYS`) and
  :data:`DEMO_CONFIG` (``etc/vlad/demo.toml``): found beside the package in a source
  checkout, where the tests, the gates' examples and the benchmarks run;
* :func:`signed_demo_copy`: the demo re-signed (demo key) under another id and version,
  with a chosen backend, gate plan and canary thresholds (deploys, canaries, fleets);
* :func:`unsigned_copy`: the demo's contract, tokenizer and ONNX model in another folder,
  with another version or a changed contract line, served with ``verify = false`` (the
  fault rig, the remote and slowed backends);
* :class:`Payload`: a release and the observation a benchmark controller sends:
  :func:`demo_payload`, and :func:`synthetic_payload`: a release with two 224x224 RGB
  cameras, 8 proprio values and a 10x7 action chunk: its own contract, a small ONNX model
  built with ``onnx.helper`` (per-camera mean + a linear head, so engine time stays small and
  transport/preprocessing dominate), a manifest written with :mod:`vlad.release.authoring`
  and signed with a throwaway key generated into the same folder (never reused).
"""

from __future__ import annotations

import datetime as dt
import platform
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vlad.config import ChainEntry, FallbackConfig
from vlad.tomlwrite import dumps

REPO = Path(__file__).resolve().parents[3]  # the source checkout this package lives in
DEMO = REPO / "manifests" / "demo"
DEMO_CONFIG = REPO / "etc" / "vlad" / "demo.toml"
DEMO_KEYS = REPO / "etc" / "vlad" / "keys.d"

# What an unsigned copy holds: enough to serve the ONNX model (no manifest, no signature).
COPIED = ("contract.toml", "tokenizer.json", "policy.onnx")


def local_fallback(previous: Path, healthy_window_s: float = 1.0) -> FallbackConfig:
    """The test rigs' chain: ``previous`` (a release folder) on ONNX Runtime, one thread,
    then the hold posture."""
    entry = ChainEntry(
        kind="release",
        path=str(previous),
        backend="onnxruntime",
        artifact="policy.onnx",
        options={"intra_op_threads": 1},
    )
    return FallbackConfig(healthy_window_s=healthy_window_s, chain=(entry, ChainEntry(kind="hold")))


def unsigned_copy(dest: Path, *, version: str | None = None, edits: Mapping[str, str] | None = None) -> Path:
    """The demo's contract, tokenizer and ONNX model in ``dest`` (made), unsigned.

    ``version`` replaces the model version in the contract (``1.0.0``); each of ``edits``
    replaces one exact line of the contract text (``"e2e_deadline_ms = 20.0"`` ->
    ``"e2e_deadline_ms = 175.0"``), and a line that is not there is an error, so a changed
    demo contract cannot leave a copy silently unchanged.
    """
    dest.mkdir(parents=True)
    for name in COPIED[1:]:
        shutil.copy(DEMO / name, dest / name)
    text = (DEMO / "contract.toml").read_text()
    changes = dict(edits or {})
    if version is not None:
        changes['version = "1.0.0"'] = f'version = "{version}"'
    for old, new in changes.items():
        if old not in text:
            raise ValueError(f"unsigned_copy: {old!r} is not in the demo contract")
        text = text.replace(old, new, 1)
    (dest / "contract.toml").write_text(text)
    return dest


SYN_CAMERAS = ("left", "right")
SYN_HW = 224
SYN_PROPRIO = 8
SYN_CHUNK = 10
SYN_DIM = 7


@dataclass
class Payload:
    """A signed release and the observation a benchmark controller sends it."""

    name: str
    release: Path
    keys_dir: Path
    images: dict[str, np.ndarray]
    proprio: np.ndarray
    instruction: str | None
    action_shape: tuple[int, int]

    @property
    def raw_bytes(self) -> int:
        """Bytes of one raw observation (images, proprio, instruction)."""
        return (
            sum(a.nbytes for a in self.images.values()) + self.proprio.nbytes + len((self.instruction or "").encode())
        )


def demo_payload() -> Payload:
    """The signed demo release and its first golden observation."""
    from vlad.contract import load_contract
    from vlad_tools.gates.equivalence import (
        load_golden,
    )  # the one reader (vlad_tools.testing.golden imports this module)

    raw = load_golden(DEMO / "golden.npz")[0]["raw"]
    action = load_contract(DEMO / "contract.toml").action
    return Payload(
        "demo (1 camera 64x64, 4 proprio, language)",
        DEMO,
        DEMO_KEYS,
        {k: np.ascontiguousarray(v) for k, v in raw.images.items()},
        np.asarray(raw.proprio, np.float32),
        raw.instruction,
        (action.chunk_length, action.dim),
    )


def _contract_text() -> str:
    def tensor(name: str, layout: str, shape: list[int]) -> dict[str, Any]:
        return {"name": name, "dtype": "float32", "layout": layout, "shape": shape}

    def image(layout: str, dtype: str, **extra: Any) -> dict[str, Any]:
        return {"height": SYN_HW, "width": SYN_HW, "color_order": "RGB", "layout": layout, "dtype": dtype, **extra}

    contract = {
        "format": "vlad.contract/1",
        "model": {
            "id": "bench-two-cameras",
            "version": "1.0.0",
            "family": "synthetic",
            "description": "benchmark payload: two 224x224 RGB cameras, per-camera mean + linear head",
        },
        "cameras": [
            {
                "name": c,
                "input": f"image_{c}",
                "raw": image("HWC", "uint8"),
                "model": image(
                    "CHW",
                    "float32",
                    resize="none",
                    crop="none",
                    scale=255.0,
                    mean=[0.485, 0.456, 0.406],
                    std=[0.229, 0.224, 0.225],
                ),
            }
            for c in SYN_CAMERAS
        ],
        "proprio": {
            "input": "proprio",
            "dim": SYN_PROPRIO,
            "names": [f"joint{j}.position" for j in range(SYN_DIM)] + ["gripper.opening"],
            "units": ["rad"] * SYN_DIM + ["1"],
            "frame": "joint",
            "mean": [0.0] * SYN_PROPRIO,
            "std": [1.0] * SYN_PROPRIO,
        },
        "noise": {
            "input": "noise",
            "shape": [SYN_CHUNK, SYN_DIM],
            "dtype": "float32",
            "seeding": "philox-sequence",
            "seed": 0,
            "denoising_steps": 1,
        },
        "action": {
            "output": "actions",
            "chunk_length": SYN_CHUNK,
            "dim": SYN_DIM,
            "frame": "joint",
            "scale": 1.0,
            "on_nonfinite": "hold",
            "on_bound_violation": "clamp",
            "hold_posture": "hold_position",
            "joints": [
                {
                    "name": f"joint{j}",
                    "semantics": "position",
                    "unit": "rad",
                    "mean": 0.0,
                    "std": 1.0,
                    "lower": -3.0,
                    "upper": 3.0,
                    "rate_limit": 0.5,
                }
                for j in range(SYN_DIM)
            ],
        },
        "timing": {
            "control_period_ms": 20.0,
            "max_observation_age_ms": 60.0,
            "action_validity_ms": 200.0,
            "e2e_deadline_ms": 20.0,
        },
        "inputs": [
            *(tensor(f"image_{c}", "NCHW", [1, 3, SYN_HW, SYN_HW]) for c in SYN_CAMERAS),
            tensor("proprio", "ND", [1, SYN_PROPRIO]),
            tensor("noise", "NHD", [1, SYN_CHUNK, SYN_DIM]),
        ],
        "outputs": [tensor("actions", "NHD", [1, SYN_CHUNK, SYN_DIM])],
    }
    return dumps(contract, header="Synthetic benchmark release: two 224x224 RGB cameras (vlad_tools.testing.releases).")


def _onnx_model(path: Path) -> None:
    """actions = reshape(tanh(concat(mean_hw(left), mean_hw(right), proprio) @ W)) * 0.1 + noise * 0.01."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    feat = 3 * len(SYN_CAMERAS) + SYN_PROPRIO
    w = rng.standard_normal((feat, SYN_CHUNK * SYN_DIM)).astype(np.float32) * 0.1
    inits = [
        numpy_helper.from_array(w, "W"),
        numpy_helper.from_array(np.asarray([1, SYN_CHUNK, SYN_DIM], np.int64), "shape"),
        numpy_helper.from_array(np.asarray(0.1, np.float32), "k_act"),
        numpy_helper.from_array(np.asarray(0.01, np.float32), "k_noise"),
    ]
    nodes, feats = [], []
    for c in SYN_CAMERAS:
        nodes.append(helper.make_node("ReduceMean", [f"image_{c}"], [f"m_{c}"], axes=[2, 3], keepdims=0))
        feats.append(f"m_{c}")
    nodes += [
        helper.make_node("Concat", [*feats, "proprio"], ["f"], axis=1),
        helper.make_node("MatMul", ["f", "W"], ["h"]),
        helper.make_node("Tanh", ["h"], ["t"]),
        helper.make_node("Reshape", ["t", "shape"], ["r"]),
        helper.make_node("Mul", ["r", "k_act"], ["a"]),
        helper.make_node("Mul", ["noise", "k_noise"], ["n"]),
        helper.make_node("Add", ["a", "n"], ["actions"]),
    ]
    ins = [helper.make_tensor_value_info(f"image_{c}", TensorProto.FLOAT, [1, 3, SYN_HW, SYN_HW]) for c in SYN_CAMERAS]
    ins += [
        helper.make_tensor_value_info("proprio", TensorProto.FLOAT, [1, SYN_PROPRIO]),
        helper.make_tensor_value_info("noise", TensorProto.FLOAT, [1, SYN_CHUNK, SYN_DIM]),
    ]
    outs = [helper.make_tensor_value_info("actions", TensorProto.FLOAT, [1, SYN_CHUNK, SYN_DIM])]
    graph = helper.make_graph(nodes, "bench_two_cameras", ins, outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def synthetic_payload(folder: Path) -> Payload:
    """Build, sign (throwaway key) and describe the two-camera release under ``folder``."""
    from vlad.release.authoring import new_manifest_data, write_manifest
    from vlad.release.signing import generate_keypair, installed_runtime, sign_release

    release = folder / "release"
    keys = folder / "keys.d"
    secret = folder / "secret"
    release.mkdir(parents=True)
    (release / "contract.toml").write_text(_contract_text())
    _onnx_model(release / "policy.onnx")
    _, private, public = generate_keypair(secret, "bench-throwaway")
    keys.mkdir(mode=0o755)
    (keys / public.name).write_bytes(public.read_bytes())
    rt = installed_runtime()
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    data = new_manifest_data(
        release,
        release_id="bench-two-cameras-1.0.0",
        version="1.0.0",
        version_code=1,
        backend="onnxruntime",
        artifact="policy.onnx",
        options={"intra_op_threads": 1},
        not_before=now - dt.timedelta(days=1),
        expires=now + dt.timedelta(days=7),
        runtime={"python": platform.python_version(), "onnxruntime": rt.onnxruntime},
        description="benchmark payload (throwaway key)",
    )
    write_manifest(release, data)
    sign_release(release, private)
    rng = np.random.default_rng(1)
    images = {c: rng.integers(0, 256, (SYN_HW, SYN_HW, 3), dtype=np.uint8) for c in SYN_CAMERAS}
    proprio = np.zeros(SYN_PROPRIO, np.float32)
    return Payload(
        f"synthetic (2 cameras {SYN_HW}x{SYN_HW} RGB, {SYN_PROPRIO} proprio, no language)",
        release,
        keys,
        images,
        proprio,
        None,
        (SYN_CHUNK, SYN_DIM),
    )


def signed_demo_copy(
    dest: Path,
    version: str,
    code: int,
    backend: str = "onnxruntime",
    options: str | None = None,
    required_gates: tuple[str, ...] = ("closed_loop",),
    closed_loop_passes: bool = True,
    canary_window_s: float | None = None,
    canary_max_deadline_miss_rate: float | None = None,
) -> Path:
    """A signed copy of the demo release with another id and version.

    Its gate plan requires only ``required_gates``; the copy carries the demo's closed-loop
    evidence (eval.json, judged against a threshold it passes or, with
    ``closed_loop_passes=False``, fails) and no other, so the default deploys without --force.
    ``canary_window_s``, ``canary_max_deadline_miss_rate``: its ``[canary]`` thresholds
    (default: vlad's, a 600 s window)."""
    dest.mkdir(parents=True)
    plan = dest.parent / f"{dest.name}-gates.toml"
    plan.write_text("required = [" + ", ".join(f'"{g}"' for g in required_gates) + "]\n")
    for f in DEMO.iterdir():
        if f.name not in ("manifest.toml", "manifest.sig"):
            shutil.copy(f, dest / f.name)
    contract = dest / "contract.toml"
    contract.write_text(contract.read_text().replace('version = "1.0.0"', f'version = "{version}"', 1))
    args = [
        sys.executable,
        str(REPO / "scripts" / "make_demo_manifest.py"),
        "--release-dir",
        str(dest),
        "--release-id",
        f"vlad-demo-reacher-{version}",
        "--version",
        version,
        "--version-code",
        str(code),
        "--backend",
        backend,
        "--parent",
        "vlad-demo-reacher-1.0.0",
        "--min-success-rate",
        "0" if closed_loop_passes else "1.01",
        "--min-margin",
        "0",
        "--gate-plan",
        str(plan),
    ]
    if options:
        args += ["--options", options]
    if canary_window_s is not None:
        args += ["--canary-window-s", str(canary_window_s)]
    if canary_max_deadline_miss_rate is not None:
        args += ["--canary-max-deadline-miss-rate", str(canary_max_deadline_miss_rate)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120)
    passes = closed_loop_passes and required_gates == ("closed_loop",)
    if out.returncode != (0 if passes else 1):  # 1: the evidence does not pass
        raise RuntimeError(f"make_demo_manifest.py failed: {out.stdout}{out.stderr}")
    return dest
