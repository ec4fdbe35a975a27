#!/usr/bin/env python3
"""Train the demo VLA by behaviour cloning and write the demo release artifacts.

Reproducible from a seed in about an hour on 2 CPU cores (3,671 s for the committed release):

1. build the word-level tokenizer for the demo instructions;
2. roll out the scripted expert in MuJoCo Reacher-v5 (half of the episodes with noise on
   the executed waypoints, so the data shows how to recover from off-expert states);
3. write the release contract with the data's normalization statistics;
4. preprocess every sample with the *serving* code (vlad.processing) and train the
   flow-matching policy;
5. export the ``torch.export`` program and the ONNX graph (checked against PyTorch), the
   flow head as two programs for guided real-time chunking (``vlad_torch.guided``), and
   write the golden fixtures;
6. evaluate the policy, the expert and the no-motion baseline in closed loop.

    .venv/bin/python scripts/train_demo_policy.py [--seed 0] [--out manifests/demo]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np
import torch

from vlad.contract import load_contract
from vlad.processing import Tokenizer, normalize_actions, preprocess_image, preprocess_proprio
from vlad_tools.demo import sim
from vlad_tools.demo.model import ModelConfig, TinyPi0
from vlad_tools.demo.release import build_tokenizer, evaluate_release, export_release, write_contract

ROOT = Path(__file__).resolve().parent.parent


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def collect(episodes: int, seed: int, noise: float) -> dict[str, np.ndarray]:
    """Expert rollouts: half clean, half with executed-waypoint noise (DART)."""
    images, proprio, instr, chunks, steps = [], [], [], [], []
    halves = ((episodes // 2, seed, 0.0), (episodes - episodes // 2, seed + episodes // 2, noise))
    done = 0
    for n, seed0, action_noise in halves:
        for s in sim.collect_demonstrations(n, seed0=seed0, action_noise=action_noise):
            images.append(s.image)
            proprio.append(s.proprio)
            instr.append(sim.INSTRUCTIONS.index(s.instruction))
            chunks.append(s.chunk)
            steps.append(s.t)
            if s.t == sim.EPISODE_STEPS - 1:
                done += 1
                if done % 50 == 0:
                    log(f"collect: {done}/{episodes} expert episodes, {len(images)} samples")
    return {
        "images": np.stack(images),
        "proprio": np.stack(proprio).astype(np.float32),
        "instruction": np.asarray(instr, dtype=np.int64),
        "chunks": np.stack(chunks).astype(np.float32),
        "t": np.asarray(steps, dtype=np.int64),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--episodes", type=int, default=400, help="expert episodes for training data")
    ap.add_argument("--noise", type=float, default=0.08, help="std of executed-waypoint noise (rad)")
    ap.add_argument("--steps", type=int, default=5000, help="optimizer steps")
    ap.add_argument(
        "--early-weight",
        type=float,
        default=5.0,
        help="sampling weight of the first --early-steps control steps of each episode",
    )
    ap.add_argument("--early-steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-episodes", type=int, default=50, help="closed-loop episodes per instruction")
    ap.add_argument("--out", type=Path, default=ROOT / "manifests" / "demo")
    ap.add_argument("--fixtures", type=Path, default=ROOT / "manifests" / "demo" / "golden.npz")
    args = ap.parse_args(argv)

    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    torch.set_num_threads(args.threads)
    # Tiny gradients late in training become denormal floats, which are ~100x slower on
    # x86; flushing them to zero changes nothing numerically that matters here.
    torch.set_flush_denormal(True)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()

    # 1. tokenizer
    tok_sha = build_tokenizer(sim.INSTRUCTIONS, out / "tokenizer.json")
    log(f"tokenizer: {out / 'tokenizer.json'} sha256 {tok_sha[:16]}...")

    # 2. demonstrations
    data = collect(args.episodes, args.seed, args.noise)
    n = len(data["images"])
    log(f"collect: {n} samples from {args.episodes} episodes")

    # 3. contract with the data's statistics
    actions_flat = data["chunks"].reshape(-1, 2)
    write_contract(
        out / "contract.toml",
        tokenizer_sha256=tok_sha,
        proprio_mean=data["proprio"].mean(0),
        proprio_std=data["proprio"].std(0) + 1e-3,
        action_mean=actions_flat.mean(0),
        action_std=actions_flat.std(0) + 1e-3,
    )
    contract = load_contract(out / "contract.toml")
    tokenizer = Tokenizer.from_contract(contract)
    cam = contract.cameras[0]
    log(f"contract: {out / 'contract.toml'} ({contract.model.id} {contract.model.version})")

    # 4. preprocess with the serving code, then train
    x_img = torch.from_numpy(np.stack([preprocess_image(cam, im) for im in data["images"]]))
    tokens_by_instr = np.stack([tokenizer.encode(s) for s in sim.INSTRUCTIONS])
    x_tok = torch.from_numpy(tokens_by_instr[data["instruction"]])
    x_prop = torch.from_numpy(np.stack([preprocess_proprio(contract, p) for p in data["proprio"]]))
    y = torch.from_numpy(normalize_actions(contract, data["chunks"]))

    cfg = ModelConfig(
        image_size=cam.model.height,
        vocab_size=tokenizer._tok.get_vocab_size(),
        max_tokens=contract.language.max_tokens,
        proprio_dim=contract.proprio.dim,
        horizon=contract.action.chunk_length,
        action_dim=contract.action.dim,
        steps=contract.noise.denoising_steps,
    )
    model = TinyPi0(cfg)
    log(f"train: {sum(p.numel() for p in model.parameters()):,} parameters, {args.steps} steps, batch {args.batch}")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    warmup = 200
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, args.steps) / args.steps))
    )
    gen = torch.Generator().manual_seed(args.seed)
    # Where to go is decided in the first steps (the arm starts still); later states mostly
    # reveal the goal through the joint state itself. Weighting the start up makes the
    # policy learn the decision from camera and instruction.
    weights = torch.where(torch.from_numpy(data["t"]) < args.early_steps, args.early_weight, 1.0).double()
    model.train()
    t0, running = time.monotonic(), None
    for step in range(1, args.steps + 1):
        if args.early_weight == 1.0:
            idx = torch.randint(0, n, (args.batch,), generator=gen)
        else:
            idx = torch.multinomial(weights, args.batch, replacement=True, generator=gen)
        loss = model.flow_loss(x_img[idx], x_tok[idx], x_prop[idx], y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        running = loss.item() if running is None else 0.98 * running + 0.02 * loss.item()
        if step % 100 == 0 or step == args.steps:
            el = time.monotonic() - t0
            log(
                f"train: step {step}/{args.steps} loss {running:.4f} ({el:.0f} s, eta {el / step * (args.steps - step):.0f} s)"
            )
    model.eval()
    torch.save(model.state_dict(), out / "policy_weights.pt")
    (out / "model_config.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")

    # 5. export + golden fixtures
    export_release(model, contract, tokenizer, out, args.fixtures, log=log)

    # 6. closed-loop evaluation
    results = evaluate_release(out, args.eval_episodes, log=log)
    (out / "eval.json").write_text(json.dumps(results, indent=2) + "\n")
    log(f"done in {time.monotonic() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
