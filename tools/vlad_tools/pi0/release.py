"""A signed π0-sized release from the planner's description: contract, tokenizer, exports, manifest.

    build_release(out, Pi0Options(width=1.0, dtype="bf16", formats=("pt2",)), key=...)

writes into ``out``:

* ``contract.toml``: three cameras (224 x 224 RGB), 32 language tokens, a 14-joint state
  (a bimanual arm: 6 joints and a gripper per side), the flow's noise, a 50 x 14 chunk;
* ``tokenizer.json``: the demo's word-level tokenizer builder over this task's instructions;
* ``planner-model.toml``: the planner description the model was built from (scaled, with
  the embedding table it really has), so ``vladctl plan --measure`` predicts this model;
* ``policy.pt2`` and/or ``policy.onnx`` + ``policy.onnx.data``, exported streamed
  (:func:`vlad.release.export.export_program_streamed`, ``export_onnx_streamed``): the
  weights are produced one tensor at a time, never all at once;
* ``manifest.toml`` with ``[memory]`` (the planner's memory-fit figure, until the
  performance gate records a measured peak) and ``manifest.sig`` when a key is given.

The weights are random (:func:`vlad_tools.pi0.model.init_tensor`): the release is for sizing,
deployment and latency work, not for moving a robot. Its guard bounds and rate limits keep
every action it could emit inside a bimanual arm's joint ranges.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vlad.tomlwrite import dumps
from vlad_tools.planner.spec import PlannerError, VLAModel, load_model

CAMERAS = ("base", "left_wrist", "right_wrist")
INSTRUCTIONS = (
    "fold the towel",
    "pick up the cup and put it in the bin",
    "open the drawer",
    "stack the red block on the blue block",
    "hand the marker to the other arm",
)
SIDES = ("left", "right")
ARM = ("waist", "shoulder", "elbow", "forearm_roll", "wrist_angle", "wrist_rotate")
# π0's PaliGemma vocabulary (0.53 B parameters at 2048 wide): looked up, not multiplied, but
# it is a sixth of the weights a robot has to hold. The planner's file leaves it out.
PI0_VOCAB = 257_152
FORMATS = ("pt2", "onnx")
MEASURE_SCOPES = {"vision": ["vision"], "backbone": ["backbone"], "action": ["expert"]}


@dataclass(frozen=True)
class Pi0Options:
    """What to build: size (``width`` and layer counts), weights, formats, timing."""

    width: float = 1.0
    vision_layers: int | None = None
    backbone_layers: int | None = None
    action_layers: int | None = None
    vocab: int | None = None  # None: π0's at full size, the tokenizer's when scaled
    seed: int = 0
    dtype: str = "fp32"  # fp32 | bf16
    formats: tuple[str, ...] = FORMATS
    backend: str | None = None  # None: onnxruntime for fp32 with ONNX, else torch
    threads: int = 2
    memory_map: bool = True  # onnxruntime: weights stay memory-mapped (no packed copies)
    control_period_ms: float = 20.0
    action_validity_ms: float = 1000.0  # the chunk's 50 waypoints at 20 ms
    e2e_deadline_ms: float = 250.0
    version: str = "1.0.0"
    version_code: int = 1

    @property
    def scaled(self) -> bool:
        return self.width != 1.0 or any((self.vision_layers, self.backbone_layers, self.action_layers))


def release_model(opts: Pi0Options, tokenizer_vocab: int) -> VLAModel:
    """The planner description of the model ``opts`` builds (vocab and precision included)."""
    from vlad_tools.pi0.model import scaled

    if opts.dtype not in ("fp32", "bf16"):
        raise PlannerError(f"dtype must be fp32 or bf16, got {opts.dtype!r}")
    spec = scaled(
        load_model("pi0"),
        opts.width,
        vision_layers=opts.vision_layers,
        backbone_layers=opts.backbone_layers,
        action_layers=opts.action_layers,
    )
    vocab = opts.vocab or (tokenizer_vocab if opts.scaled else PI0_VOCAB)
    if vocab < tokenizer_vocab:
        raise PlannerError(f"vocab {vocab} is smaller than the tokenizer's {tokenizer_vocab} ids")
    action = spec.action
    return dataclasses.replace(
        spec,
        ids=(spec.name,),
        precision=opts.dtype,
        description=f"{spec.description}; built by vlad_tools.pi0 with random weights (seed {opts.seed})",
        backbone=dataclasses.replace(spec.backbone, vocab=vocab),
        # The built expert projects Q/K/V once per layer (pi0.toml's 2 reproduces source A).
        action=dataclasses.replace(action, qkv_passes=1),
        measure_scopes={k: tuple(v) for k, v in MEASURE_SCOPES.items()},
    )


def model_toml(spec: VLAModel) -> str:
    """``spec`` as a planner model file (``tools/vlad_tools/planner/data/models/*.toml`` format)."""
    v, b, a = spec.vision, spec.backbone, spec.action
    assert v.transformer is not None and a.transformer is not None  # a π0 description

    def stack(t: Any) -> dict[str, Any]:
        keys = ("layers", "hidden", "ffn", "gated_ffn", "heads", "kv_heads", "head_dim")
        return {k: getattr(t, k) for k in keys}

    data = {
        "model": {
            "name": spec.name,
            "ids": list(spec.ids),
            "description": spec.description,
            "precision": spec.precision,
            "batch": spec.batch,
            "source": spec.source,
        },
        "vision": {
            "kind": "vit",
            "cameras": v.cameras,
            "image_height": v.image_height,
            "image_width": v.image_width,
            "tokens_per_image": v.tokens_per_image,
            **stack(v.transformer),
        },
        "backbone": {
            **stack(b.transformer),
            "language_tokens": b.language_tokens,
            "state_tokens": b.state_tokens,
            "vocab": b.vocab,
        },
        "action": {
            "kind": "flow",
            **stack(a.transformer),
            "chunk": a.chunk,
            "dof": a.dof,
            "steps": a.steps,
            "context": a.context,
            "qkv_passes": a.qkv_passes,
        },
        "measure": {k: list(v) for k, v in spec.measure_scopes.items()},
    }
    return dumps(data, header="Written by vlad_tools.pi0.release: the description this release's model was built from.")


def contract_toml(spec: VLAModel, opts: Pi0Options, tokenizer_sha256: str, tokenizers_version: str) -> str:
    """The release contract: shapes from ``spec``, the tokenizer pinned, timing from ``opts``."""
    v, b, a = spec.vision, spec.backbone, spec.action
    joints = [f"{side}_{j}" for side in SIDES for j in (*ARM, "gripper")]
    if len(joints) != a.dof:
        raise PlannerError(f"the contract describes a 14-joint bimanual arm; the model has {a.dof} action values")
    units = ["rad"] * 6 + ["1"]
    image = {"height": v.image_height, "width": v.image_width, "color_order": "RGB"}

    def joint(name: str, unit: str) -> dict[str, Any]:
        # Random weights: actions ~ mean + std * O(1); the bounds hold them with room.
        gripper = unit == "1"
        return {
            "name": name,
            "semantics": "position",
            "unit": unit,
            "mean": 0.5 if gripper else 0.0,
            "std": 0.05 if gripper else 0.1,
            "lower": 0.0 if gripper else -3.14,
            "upper": 1.0 if gripper else 3.14,
            "rate_limit": 0.05 if gripper else 0.1,
        }

    tensors = [(f"image_{c}", "float32", "NCHW", [1, 3, v.image_height, v.image_width]) for c in CAMERAS]
    tensors += [
        ("tokens", "int64", "NL", [1, b.language_tokens]),
        ("state", "float32", "ND", [1, a.dof]),
        ("noise", "float32", "NHD", [1, a.chunk, a.dof]),
    ]
    data: dict[str, Any] = {
        "format": "vlad.contract/1",
        "model": {"id": spec.name, "version": opts.version, "family": "pi0", "description": spec.description},
        "cameras": [
            {
                "name": cam,
                "input": f"image_{cam}",
                "raw": {**image, "layout": "HWC", "dtype": "uint8"},
                "model": {
                    **image,
                    "layout": "CHW",
                    "dtype": "float32",
                    "resize": "none",
                    "crop": "none",
                    "scale": 255.0,
                    "mean": [0.5, 0.5, 0.5],  # SigLIP: pixels to [-1, 1]
                    "std": [0.5, 0.5, 0.5],
                },
            }
            for cam in CAMERAS
        ],
        "language": {
            "input": "tokens",
            "tokenizer": "vlad-pi0-wordlevel",
            "library": "tokenizers",
            "library_version": tokenizers_version,
            "file": "tokenizer.json",
            "sha256": tokenizer_sha256,
            "max_tokens": b.language_tokens,
            "padding_side": "right",
            "pad_id": 0,
            "truncation": "error",
        },
        "proprio": {
            "input": "state",
            "dim": len(joints),
            "names": [f"{j}.position" for j in joints],
            "units": units * 2,
            "frame": "joint",
            "mean": [0.0] * len(joints),
            "std": [1.0] * len(joints),
        },
        "noise": {
            "input": "noise",
            "shape": [a.chunk, a.dof],
            "dtype": "float32",
            "seeding": "philox-sequence",
            "seed": 0,
            "denoising_steps": a.steps,
        },
        "action": {
            "output": "actions",
            "chunk_length": a.chunk,
            "dim": a.dof,
            "frame": "joint",
            "scale": 1.0,
            "on_nonfinite": "hold",
            "on_bound_violation": "clamp",
            "hold_posture": "hold_position",
            "joints": [joint(j, unit) for j, unit in zip(joints, units * 2, strict=True)],
        },
        "timing": {
            "control_period_ms": opts.control_period_ms,
            "max_observation_age_ms": max(60.0, 3 * opts.control_period_ms),
            "action_validity_ms": opts.action_validity_ms,
            "e2e_deadline_ms": opts.e2e_deadline_ms,
        },
        "inputs": [{"name": n, "dtype": d, "layout": lay, "shape": shape} for n, d, lay, shape in tensors],
        "outputs": [{"name": "actions", "dtype": "float32", "layout": "NHD", "shape": [1, a.chunk, a.dof]}],
    }
    return dumps(
        data, header="Written by vlad_tools.pi0.release (docs/contract.md): a pi0-sized policy with random weights."
    )


def memory_need(spec: VLAModel, device: str) -> dict[str, Any]:
    """The planner's memory-fit figure as the manifest's ``[memory]`` table: weights, KV cache
    and the largest activation, on the device the backend runs on (host for a CPU one)."""
    from vlad_tools.planner.roofline import memory_footprint

    total = int(memory_footprint(spec)["total"])
    on_gpu = device.startswith("cuda")
    return {"host_bytes": 0 if on_gpu else total, "device_bytes": total if on_gpu else 0, "source": "planner"}


def example_inputs(contract) -> dict[str, np.ndarray]:
    """Inputs at the contract's shapes with an instruction's real token ids (padding masked)."""
    from vlad.backend import example_inputs as zeros_and_noise
    from vlad.processing import Tokenizer

    inputs = zeros_and_noise(contract)
    ids = Tokenizer.from_contract(contract).encode(INSTRUCTIONS[0])
    inputs[contract.language.input] = np.array(ids, dtype=np.int64).reshape(1, -1)
    return inputs


def build_release(
    out: Path,
    opts: Pi0Options,
    *,
    key: str | Path | None = None,
    keys_dir: str | Path | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Write the release into ``out`` (see the module); returns what was built and how long
    each step took. Signs with ``key`` and verifies against ``keys_dir`` when given."""
    import importlib.metadata

    from torch._subclasses.fake_tensor import FakeTensorMode

    from vlad.contract import load_contract
    from vlad.release.authoring import new_manifest_data, write_manifest
    from vlad.release.export import export_onnx_streamed, export_program_streamed
    from vlad.release.signing import installed_runtime
    from vlad_tools.demo.release import build_tokenizer
    from vlad_tools.pi0.model import CAMERA_INPUTS, DTYPES, Pi0Shape, empty, init_tensor, parameter_count, rope_tables

    unknown = sorted(set(opts.formats) - set(FORMATS))
    if unknown or not opts.formats:
        raise PlannerError(f"formats must be some of {', '.join(FORMATS)}, got {list(opts.formats)}")
    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    sha = build_tokenizer(INSTRUCTIONS, out / "tokenizer.json")
    from tokenizers import Tokenizer as HFTokenizer

    spec = release_model(opts, HFTokenizer.from_file(str(out / "tokenizer.json")).get_vocab_size())
    (out / "planner-model.toml").write_text(model_toml(spec))
    (out / "contract.toml").write_text(
        contract_toml(spec, opts, sha, importlib.metadata.version("tokenizers")), encoding="utf-8"
    )
    contract = load_contract(out / "contract.toml")
    assert tuple(c.input for c in contract.cameras) == CAMERA_INPUTS and contract.proprio  # contract_toml wrote them
    shape = Pi0Shape(spec, contract.proprio.dim, spec.backbone.vocab)
    params = parameter_count(shape)
    log(
        f"pi0: {spec.name}, {params['total'] / 1e9:.3f} B parameters "
        f"(vision {params['vision'] / 1e6:.1f} M, backbone {params['backbone'] / 1e6:.1f} M, "
        f"expert {params['expert'] / 1e6:.1f} M), {opts.dtype}"
    )
    dtype = DTYPES[opts.dtype]
    n_rope = spec.prefix_tokens + spec.action.chunk
    rope = dict(zip(("rope_cos", "rope_sin"), rope_tables(n_rope, spec.backbone.transformer.head_dim), strict=True))

    def values(name: str, dims: tuple[int, ...], dt_: Any) -> Any:
        if name in rope:
            return rope[name].to(dt_)
        return init_tensor(name, dims, dt_, opts.seed)

    example = example_inputs(contract)
    for fmt in opts.formats:
        with FakeTensorMode(allow_non_fake_inputs=True):
            module = empty(shape, dtype)
        t0 = time.monotonic()
        if fmt == "pt2":
            export_program_streamed(module, contract, example, out / "policy.pt2", values, log=log)
        else:
            export_onnx_streamed(module, contract, example, out / "policy.onnx", values, log=log)
        timings[f"export_{fmt}_s"] = round(time.monotonic() - t0, 2)
        log(f"pi0: {fmt} written in {timings[f'export_{fmt}_s']:.1f} s")
        del module
    backend = opts.backend or ("onnxruntime" if opts.dtype == "fp32" and "onnx" in opts.formats else "torch")
    options: dict[str, Any]
    if backend == "onnxruntime":
        # check_node_placement runs one profiled inference at load: seconds at this size, and
        # with the CPU provider alone nothing can land elsewhere. memory_map: the weights
        # stay pages of the external data file instead of packed copies (plugins'
        # vlad_onnxruntime docs).
        artifact = "policy.onnx"
        options = {"intra_op_threads": opts.threads, "check_node_placement": False, "memory_map": opts.memory_map}
    else:
        artifact, options = "policy.pt2", {"threads": opts.threads, "precision": opts.dtype}
    if not (out / artifact).is_file():
        raise PlannerError(f"backend {backend} serves {artifact}, which formats {list(opts.formats)} do not include")
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    t0 = time.monotonic()
    data = new_manifest_data(
        out,
        release_id=f"{spec.name}-{opts.dtype}-{opts.version}",
        version=opts.version,
        version_code=opts.version_code,
        description=f"{spec.name} ({params['total'] / 1e9:.2f} B parameters, {opts.dtype}, random weights)",
        backend=backend,
        artifact=artifact,
        options=options,
        roles={"planner-model.toml": "config", "policy.onnx.data": "weights"},
        not_before=now - dt.timedelta(days=1),
        expires=now + dt.timedelta(days=365),
        runtime={k: v for k, v in dataclasses.asdict(installed_runtime()).items() if v},
        lineage={"change": "retrain"},
    )
    data["memory"] = memory_need(spec, "cpu")
    manifest = write_manifest(out, data)
    timings["manifest_s"] = round(time.monotonic() - t0, 2)
    if key is not None:
        from vlad.release.signing import sign_release, verify_release

        sig = sign_release(out, key)
        log(f"pi0: signed with key {sig.key_id}")
        if keys_dir is not None:
            verify_release(out, keys_dir)
    sizes = {a.path: a.size for a in manifest.artifacts}
    return {
        "release": manifest.id,
        "folder": str(out),
        "model": spec.name,
        "parameters": params,
        "dtype": opts.dtype,
        "backend": backend,
        "bytes": sizes,
        "memory": data["memory"],
        "timings_s": timings,
    }
