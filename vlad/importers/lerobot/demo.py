"""Closed loop of an imported Reacher release: in process and through ``vlad serve``.

The fidelity pair of the serving work: the same seeded episodes with the release's ONNX
model called in process (the contract's preprocessing and decoding, no daemon) and through
a real ``vlad serve`` subprocess driven in real time by the gates' wire-protocol
controller. Both on the instruction the policy was trained on (ACT and Diffusion Policy
take no language, :mod:`.dataset`), beside the no-motion baseline.

    python -m vlad.importers.lerobot.demo RELEASE [--episodes 30] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from vlad.importers.lerobot.dataset import INSTRUCTION


def in_process(release: Path, episodes: int, seed: int, exec_steps: int, progress=print) -> dict[str, Any]:
    """Success of the release's ONNX model called in process, and of no motion."""
    import onnxruntime as ort

    from vlad.contract import load_contract
    from vlad.demo import sim
    from vlad.demo.evaluate import contract_policy, evaluate

    contract = load_contract(release / "contract.toml")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(release / "policy.onnx"), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]

    def infer(inputs):
        return dict(zip(names, sess.run(names, dict(inputs)), strict=True))

    task = sim.ReacherTask(render=True)
    seeds = range(seed, seed + episodes)
    # No [language] in the contract: preprocess() takes no tokenizer (contract_policy's
    # annotation asks for one because the demo's own contract has language).
    no_tokenizer: Any = None
    try:
        policy = evaluate(
            task,
            lambda: contract_policy(contract, no_tokenizer, infer),
            "policy",
            INSTRUCTION,
            seeds,
            exec_steps,
            progress,
        )
        zero = evaluate(task, lambda: sim.zero_policy(task), "zero", INSTRUCTION, seeds, exec_steps)
    finally:
        task.close()
    return {
        "policy": {
            "successes": policy.successes,
            "episodes": policy.episodes,
            "mean_final_distance_m": policy.mean_final_distance,
        },
        "no_motion": {
            "successes": zero.successes,
            "episodes": zero.episodes,
            "mean_final_distance_m": zero.mean_final_distance,
        },
    }


def through_daemon(
    release: Path, episodes: int, seed: int, exec_steps: int, keys_dir: str | None, progress=print
) -> dict[str, Any]:
    """The same episodes through a real ``vlad serve`` on the release, in real time."""
    from vlad.demo import sim
    from vlad.gates.controller import Controller, run_episode
    from vlad.gates.launcher import RunningDaemon
    from vlad.gates.subject import open_subject

    subject = open_subject(release)
    task = sim.ReacherTask(render=True)
    logs = []
    try:
        with RunningDaemon(subject, keys_dir=keys_dir) as daemon:
            ready_s = daemon.wait_ready()
            with Controller(daemon.endpoints, name="lerobot-demo") as ctl:
                period_ns = int(ctl.status()["control_period_ms"] * 1e6)
                for i, s in enumerate(range(seed, seed + episodes)):
                    logs.append(run_episode(ctl, task, s, INSTRUCTION, period_ns, exec_steps))
                    if (i + 1) % 10 == 0 or i + 1 == episodes:
                        progress(
                            f"  through vlad serve: {i + 1}/{episodes} episodes, {sum(x.success for x in logs)} successes"
                        )
                status = ctl.status()
    finally:
        task.close()
    latencies = np.concatenate([np.asarray(x.latencies_ms) for x in logs if x.latencies_ms] or [np.zeros(0)])
    return {
        "successes": sum(x.success for x in logs),
        "episodes": len(logs),
        "mean_final_distance_m": float(np.mean([x.final_distance for x in logs])),
        "held_periods": sum(x.held_periods for x in logs),
        "hold_chunks": sum(sum(x.holds.values()) for x in logs),
        "interventions": sum(sum(x.interventions.values()) for x in logs),
        "latency_ms_p50_p99": [float(np.percentile(latencies, q)) for q in (50, 99)] if latencies.size else None,
        "ready_s": ready_s,
        "release": status.get("release"),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("release")
    p.add_argument("--episodes", type=int, default=30)
    p.add_argument("--seed", type=int, default=10_000, help="first seed (training used 0..)")
    p.add_argument("--exec-steps", type=int, default=4)
    p.add_argument("--keys", help="trusted keys: serve the release verified")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    release = Path(args.release)
    print(
        f"closed loop: {args.episodes} episodes of {INSTRUCTION!r}, seeds {args.seed}..{args.seed + args.episodes - 1}"
    )
    result: dict[str, Any] = {
        "instruction": INSTRUCTION,
        "seeds": [args.seed, args.seed + args.episodes - 1],
        "exec_steps": args.exec_steps,
    }
    result["in_process"] = in_process(release, args.episodes, args.seed, args.exec_steps)
    ip = result["in_process"]
    print(
        f"closed loop in process (ONNX Runtime): {ip['policy']['successes']}/{args.episodes}; no motion {ip['no_motion']['successes']}/{args.episodes}"
    )
    result["through_vlad_serve"] = through_daemon(release, args.episodes, args.seed, args.exec_steps, args.keys)
    d = result["through_vlad_serve"]
    print(
        f"closed loop through vlad serve: {d['successes']}/{d['episodes']}, mean final distance {1000 * d['mean_final_distance_m']:.1f} mm"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
