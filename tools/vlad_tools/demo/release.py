"""Builds the demo release's non-weight artifacts: the tokenizer and the contract.

The contract is an output of training (its normalization statistics and tokenizer hash
come from the data and the tokenizer file), so it is rendered here from one template and
written next to the exported model.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from string import Template

import numpy as np

from vlad.processing import sha256_file

PAD, UNK = "[PAD]", "[UNK]"


def build_tokenizer(instructions: tuple[str, ...], path: Path) -> str:
    """Write a word-level ``tokenizers`` file covering ``instructions``; returns its sha256.

    A word-level vocabulary is enough for the demo's instructions and keeps the file tiny;
    the serving path loads it through the same ``tokenizers`` library a subword tokenizer
    would use. Ids: 0 = [PAD], 1 = [UNK], then words in sorted order (deterministic).
    """
    from tokenizers import Tokenizer, normalizers, pre_tokenizers
    from tokenizers.models import WordLevel

    words = sorted({w for text in instructions for w in text.lower().split()})
    vocab = {PAD: 0, UNK: 1} | {w: i + 2 for i, w in enumerate(words)}
    tok = Tokenizer(WordLevel(vocab=vocab, unk_token=UNK))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path), pretty=True)
    return sha256_file(path)


def _fmt(values) -> str:
    return "[" + ", ".join(f"{float(v):.6g}" for v in np.asarray(values).ravel()) + "]"


def write_contract(
    path: Path,
    *,
    tokenizer_sha256: str,
    proprio_mean: np.ndarray,
    proprio_std: np.ndarray,
    action_mean: np.ndarray,
    action_std: np.ndarray,
) -> None:
    """Render the demo contract with the statistics of the training data."""
    text = _TEMPLATE.substitute(
        tokenizer_sha256=tokenizer_sha256,
        tokenizers_version=importlib.metadata.version("tokenizers"),
        proprio_mean=_fmt(proprio_mean),
        proprio_std=_fmt(proprio_std),
        a0_mean=f"{float(action_mean[0]):.6g}",
        a0_std=f"{float(action_std[0]):.6g}",
        a1_mean=f"{float(action_mean[1]):.6g}",
        a1_std=f"{float(action_std[1]):.6g}",
    )
    path.write_text(text)


# ---------------------------------------------------------------------------------------
# Export, golden fixtures and closed-loop evaluation of a trained demo policy
# ---------------------------------------------------------------------------------------

GOLDEN_SEEDS = ((101, 0), (102, 1), (103, 0), (104, 1))  # (episode seed, instruction index)


def load_trained_model(out: Path):
    """The trained TinyPi0 from its weights (``weights_only`` load: tensors, no pickle)."""
    import json

    import torch

    from vlad_tools.demo.model import ModelConfig, TinyPi0

    cfg = ModelConfig(**json.loads((out / "model_config.json").read_text()))
    model = TinyPi0(cfg)
    model.load_state_dict(torch.load(out / "policy_weights.pt", weights_only=True, map_location="cpu"))
    return model.eval()


def golden_observations() -> list:
    """Raw observations from fixed simulator states: the start of seeded episodes plus a few
    expert steps (so the arm is moving and the proprio velocities are non-zero)."""
    from vlad.processing import RawObservation
    from vlad_tools.demo import sim

    task = sim.ReacherTask(render=True)
    obs_list = []
    try:
        for i, (seed, instr) in enumerate(GOLDEN_SEEDS):
            obs = task.reset(seed, sim.INSTRUCTIONS[instr])
            for _ in range(3):
                q, _ = task.state()
                obs = task.step(sim.expert_chunk(q, task.goal)[0], render=True)
            assert obs.image is not None  # rendered (render=True)
            obs_list.append(
                RawObservation(
                    images={"overhead": obs.image}, proprio=obs.proprio, instruction=obs.instruction, sequence=1000 + i
                )
            )
    finally:
        task.close()
    return obs_list


def write_golden_fixtures(model, contract, tokenizer, path: Path) -> list[dict]:
    """raw observation -> model inputs -> model outputs -> actions, saved as one ``.npz``.

    Returns the model inputs of every fixture (used for export checks).
    """
    import torch

    from vlad.processing import decode_actions, preprocess
    from vlad_tools.gates.equivalence import save_golden

    cases = []
    names = [spec.name for spec in contract.inputs]
    for obs in golden_observations():
        inputs = preprocess(contract, tokenizer, obs)
        with torch.inference_mode():
            out = model(*(torch.from_numpy(inputs[n]) for n in names)).numpy()
        actions = decode_actions(contract, {contract.action.output: out})
        cases.append({"raw": obs, "inputs": inputs, "outputs": {contract.action.output: out}, "actions": actions})
    save_golden(path, cases)
    return [case["inputs"] for case in cases]


def export_release(model, contract, tokenizer, out: Path, fixtures_path: Path, log=print) -> list:
    """Write ``policy.pt2``, ``policy.onnx`` and the golden fixtures for a trained model."""
    from vlad.release.export import export_onnx, export_program

    fixtures = write_golden_fixtures(model, contract, tokenizer, fixtures_path)
    log(f"fixtures: {len(fixtures)} golden observations -> {fixtures_path}")
    export_program(model, contract, fixtures[0], out / "policy.pt2")
    log(f"export: {out / 'policy.pt2'}")
    # The exported graph is also compared on a guided input (real-time chunking, [rtc]): the
    # golden fixtures all carry zero weights, where the inpainting is a no-op.
    checks = [*fixtures, _guided(contract, fixtures[0])] if contract.rtc is not None else fixtures
    comparisons = export_onnx(model, contract, checks, out / "policy.onnx", log=log)
    log(f"export: {out / 'policy.onnx'}")
    if contract.rtc is not None:
        export_flow_head(model, contract, fixtures[0], out)
        log(f"export: {out / ENCODER} and {out / VELOCITY} (real-time chunking by guidance)")
    return comparisons


ENCODER, VELOCITY = "policy_encoder.pt2", "policy_velocity.pt2"  # the torch backend's rtc_* options


def export_flow_head(model, contract, example: dict, out: Path) -> None:
    """The flow head as two ``torch.export`` programs (vlad_torch.guided): the encoder from the
    observation inputs, the velocity from its context, ``x`` and ``t``. Checked: the Euler
    integration of the two, unguided, computes what ``policy.pt2`` computes."""
    import torch

    from vlad.errors import ExportError
    from vlad_tools.demo.model import FlowEncoder, FlowVelocity

    names = [s.name for s in contract.inputs]
    skip = {contract.noise.input, contract.rtc.actions_input, contract.rtc.weights_input}
    observation = [torch.from_numpy(example[n]) for n in names if n not in skip]
    encoder, velocity = FlowEncoder(model).eval(), FlowVelocity(model).eval()
    with torch.no_grad():
        context = encoder(*observation)
        noise = torch.from_numpy(example[contract.noise.input])
        t = torch.zeros(noise.shape[0])
        torch.export.save(torch.export.export(encoder, tuple(observation)), str(out / ENCODER))
        torch.export.save(torch.export.export(velocity, (*context, noise, t)), str(out / VELOCITY))
        enc = torch.export.load(str(out / ENCODER)).module()
        vel = torch.export.load(str(out / VELOCITY)).module()
        ctx = enc(*observation)
        x, n = noise, contract.noise.denoising_steps
        for k in range(n):
            x = x + vel(*ctx, x, torch.full((x.shape[0],), k / n)) / n
        ref = model(*(torch.from_numpy(example[name]) for name in names))
    err = float((x - ref).abs().max())
    if err > 1e-5:
        raise ExportError(f"the flow head's programs integrate to {err:.3g} away from policy.pt2 (> 1e-5)")


def _guided(contract, inputs: dict) -> dict:
    """``inputs`` with a real-time chunking guide: the first half of the chunk pulled towards a
    fixed trajectory, with weights falling from 1 to 0."""
    rtc, h = contract.rtc, contract.action.chunk_length
    gen = np.random.default_rng(7)
    out = dict(inputs)
    out[rtc.actions_input] = gen.standard_normal(inputs[rtc.actions_input].shape).astype(np.float32)
    out[rtc.weights_input] = np.clip(1.0 - np.arange(h, dtype=np.float32) / (h / 2), 0.0, 1.0)[None]
    return out


def evaluate_release(out: Path, episodes: int, log=print) -> dict:
    """Closed-loop success of the exported ONNX policy (ONNX Runtime, one thread, through the
    serving cycle), the expert and the no-motion baseline, on the episode runner."""
    from vlad.contract import load_contract
    from vlad.plugins import get_backend
    from vlad.processing import Tokenizer
    from vlad_tools.demo import sim
    from vlad_tools.episodes import InProcessLink, NoMotionLink, contract_infer
    from vlad_tools.evaluation import EpisodeSet, success_line, summarize

    contract = load_contract(out / "contract.toml")
    tokenizer = Tokenizer.from_contract(contract)
    session = get_backend("onnxruntime").load(out / "policy.onnx", contract, {"intra_op_threads": 1})
    task = sim.ReacherTask(render=False)
    seeds = range(10_000, 10_000 + episodes)  # disjoint from the training seeds (0..)
    rows = []
    try:
        links = {
            "policy": InProcessLink.for_contract(contract, contract_infer(contract, tokenizer, session)),
            "expert": sim.expert_link(task, contract),
            "zero": NoMotionLink(contract),
        }
        for name, link in links.items():
            logs = EpisodeSet.grid(seeds, sim.INSTRUCTIONS).run(
                task,
                link,
                period_ns=link.period_ns,
                chunk_length=contract.action.chunk_length,
                label=name,
                progress=lambda line: log(f"  {line}"),
            )
            for instruction, r in summarize(logs, sim.INSTRUCTIONS)["per_instruction"].items():
                log("eval: " + success_line(name, instruction, r))
                rows.append(
                    {
                        "policy": name,
                        "instruction": instruction,
                        "episodes": r["episodes"],
                        "successes": r["successes"],
                        "success_rate": r["rate"],
                        "mean_final_distance_m": r["mean_final_distance_m"],
                    }
                )
    finally:
        task.close()
        session.close()
    return {
        "seeds": f"{seeds.start}..{seeds.stop - 1}",
        "success_radius_m": sim.SUCCESS_RADIUS,
        "episode_steps": sim.EPISODE_STEPS,
        "exec_steps": 4,
        "results": rows,
    }


_TEMPLATE = Template(
    """# vlad release contract: the frozen input/output contract of one model release.
# Written by scripts/train_demo_policy.py; documented in docs/contract.md.
format = "vlad.contract/1"

[model]
id = "vlad-demo-reacher"
version = "1.0.0"
family = "pi0-tiny"          # informational
description = "pi0-shaped flow-matching VLA trained by behaviour cloning on MuJoCo Reacher-v5"

# ---- raw observation -> model input -------------------------------------------------
[[cameras]]
name = "overhead"
input = "image_overhead"      # model input this camera feeds

[cameras.raw]                 # what the sensor sends
height = 64
width = 64
color_order = "RGB"           # RGB | BGR
layout = "HWC"                # HWC | CHW
dtype = "uint8"               # uint8 | float32

[cameras.model]               # what the network was trained on
height = 64
width = 64
color_order = "RGB"
layout = "CHW"
dtype = "float32"
resize = "bilinear"           # none | nearest | bilinear | area
crop = "none"                 # none | center (center-crop to the model aspect ratio before resize)
scale = 255.0                 # pixel / scale, then (x - mean) / std per channel
mean = [0.5, 0.5, 0.5]
std = [0.25, 0.25, 0.25]

[language]
input = "tokens"
tokenizer = "vlad-demo-wordlevel"
library = "tokenizers"
library_version = "$tokenizers_version"
file = "tokenizer.json"       # relative to the contract file
sha256 = "$tokenizer_sha256"
max_tokens = 8
padding_side = "right"        # right | left
pad_id = 0
truncation = "error"          # error | truncate

[proprio]
input = "proprio"
dim = 4
names = ["joint0.position", "joint1.position", "joint0.velocity", "joint1.velocity"]
units = ["rad", "rad", "rad/s", "rad/s"]
frame = "joint"
mean = $proprio_mean
std = $proprio_std

# Initial noise of the flow-matching head: an explicit model input so that every
# backend can be compared bit for bit on the same noise.
[noise]
input = "noise"
shape = [50, 2]               # per sample: chunk_length x action dim
dtype = "float32"
seeding = "philox-sequence"   # zeros | philox-sequence: standard normal from Philox(key=seed + observation sequence)
seed = 0
denoising_steps = 10          # baked into the exported graph; informational

# Real-time chunking inside the graph: the waypoints the new chunk continues and their
# weights (zeros: the plain chunk). vlad fills them from the chunk the robot executes.
[rtc]
method = "inpaint"
actions_input = "rtc_actions"
weights_input = "rtc_weights"

# ---- model output -> action ---------------------------------------------------------
[action]
output = "actions"
chunk_length = 50
dim = 2
frame = "joint"
scale = 1.0                   # after unnormalization: value * std + mean, then * scale
on_nonfinite = "hold"         # hold: replace the chunk by the hold posture
on_bound_violation = "clamp"  # clamp | hold
hold_posture = "hold_position"  # hold_position | zero_velocity

[[action.joints]]
name = "joint0"
semantics = "position"        # position | velocity | delta | torque
unit = "rad"
mean = $a0_mean
std = $a0_std
lower = -4.0
upper = 4.0
rate_limit = 0.25             # max change per control period, in `unit`

[[action.joints]]
name = "joint1"
semantics = "position"
unit = "rad"
mean = $a1_mean
std = $a1_std
lower = -3.0
upper = 3.0
rate_limit = 0.25

[timing]
control_period_ms = 20.0
max_observation_age_ms = 60.0
action_validity_ms = 1000.0
e2e_deadline_ms = 20.0

# ---- tensor-level model signature ----------------------------------------------------
# `shape` is the optimal (typical) shape; `dynamic` opens an axis within [min, max].
[[inputs]]
name = "image_overhead"
dtype = "float32"
layout = "NCHW"
shape = [1, 3, 64, 64]
dynamic = [{ axis = 0, name = "batch", min = 1, opt = 1, max = 8 }]

[[inputs]]
name = "tokens"
dtype = "int64"
layout = "NL"
shape = [1, 8]
dynamic = [{ axis = 0, name = "batch", min = 1, opt = 1, max = 8 }]

[[inputs]]
name = "proprio"
dtype = "float32"
layout = "ND"
shape = [1, 4]
dynamic = [{ axis = 0, name = "batch", min = 1, opt = 1, max = 8 }]

[[inputs]]
name = "noise"
dtype = "float32"
layout = "NHD"
shape = [1, 50, 2]
dynamic = [{ axis = 0, name = "batch", min = 1, opt = 1, max = 8 }]

[[inputs]]
name = "rtc_actions"
dtype = "float32"
layout = "NHD"
shape = [1, 50, 2]
dynamic = [{ axis = 0, name = "batch", min = 1, opt = 1, max = 8 }]

[[inputs]]
name = "rtc_weights"
dtype = "float32"
layout = "NH"
shape = [1, 50]
dynamic = [{ axis = 0, name = "batch", min = 1, opt = 1, max = 8 }]

[[outputs]]
name = "actions"
dtype = "float32"
layout = "NHD"
shape = [1, 50, 2]
dynamic = [{ axis = 0, name = "batch", min = 1, opt = 1, max = 8 }]
"""
)
