"""Closed loop of an imported Reacher release: in process and through ``vlad serve``.

The fidelity pair of the closed-loop gate, on its runner (:mod:`vlad_tools.episodes`): the same
seeded episodes with the release's serving artifact called in process and through a real
``vlad serve`` subprocess driven in real time, beside the no-motion baseline. Only on the
instruction the policy was trained on (ACT and Diffusion Policy take no language,
:mod:`.dataset`): the gate itself runs every instruction of its task.

    python -m vlad_tools.importers.lerobot.demo RELEASE [--episodes 30] [--json OUT]
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Any

from vlad_tools.importers.lerobot.dataset import INSTRUCTION


def closed_loop(
    release: Path, episodes: int, seed: int, exec_steps: int, keys_dir: str | None, progress=print
) -> dict[str, Any]:
    """The fidelity pair and the no-motion baseline on ``episodes`` seeds of ``INSTRUCTION``,
    on the closed-loop gate's runner (:mod:`vlad_tools.episodes`) and its summaries."""
    from vlad.client import Client
    from vlad.plugins import get_backend
    from vlad_tools.episodes import DaemonLink, InProcessLink, NoMotionLink, contract_infer
    from vlad_tools.evaluation import EpisodeSet, fidelity, summarize
    from vlad_tools.gates.closed_loop import make_task
    from vlad_tools.gates.launcher import serve
    from vlad_tools.gates.plan import ClosedLoopPlan
    from vlad_tools.gates.subject import open_subject

    subject = open_subject(release)
    contract = subject.contract
    only = (INSTRUCTION,)
    episodes_ = EpisodeSet.grid(range(seed, seed + episodes), only, exec_steps)
    period_ns = int(contract.timing.control_period_ms * 1e6)
    run = functools.partial(episodes_.run, period_ns=period_ns, chunk_length=contract.action.chunk_length)
    task, _ = make_task(ClosedLoopPlan().task)
    try:
        spec = subject.serving
        session = get_backend(spec.backend).load(subject.artifact_path(spec.artifact), contract, dict(spec.options))
        try:
            link = InProcessLink.for_contract(contract, contract_infer(contract, subject.tokenizer(), session))
            in_process_logs = run(task, link, label="in process", progress=progress)
        finally:
            session.close()
        no_motion = summarize(run(task, NoMotionLink(contract), label="no motion", progress=progress), only)
        with serve(subject, keys_dir=keys_dir) as daemon:
            ready_s = daemon.wait_ready()
            e = daemon.endpoints
            with Client(
                observations=e["observations"], actions=e["actions"], control=e["control"], name="lerobot-demo"
            ) as client:
                before = client.snapshot()
                served_logs = run(task, DaemonLink(client), label="vlad serve", progress=progress)
                after = client.snapshot()
    finally:
        task.close()
    in_process, served = summarize(in_process_logs, only), summarize(served_logs, only, before, after)
    pair = fidelity(in_process_logs, served_logs, only)
    for summary in (in_process, served, no_motion):  # every episode: not for the file
        summary.pop("episodes")
    return {
        "in_process": in_process,
        "through_vlad_serve": served,
        "no_motion": no_motion,
        "fidelity": pair,
        "ready_s": ready_s,
    }


def lerobot_in_process(checkpoint: Path, episodes: int, seed: int, exec_steps: int, progress=print) -> dict[str, Any]:
    """Closed loop of a LeRobot checkpoint through LeRobot's own ``preprocessor ->
    predict_action_chunk -> postprocessor`` (no import, no vlad backend): tells a policy that
    misses from an observation or action mapping that is wrong."""
    from vlad_tools.episodes import InProcessLink
    from vlad_tools.evaluation import EpisodeSet, summarize
    from vlad_tools.gates.closed_loop import make_task
    from vlad_tools.gates.plan import ClosedLoopPlan
    from vlad_tools.importers.lerobot.checkpoint import read_checkpoint
    from vlad_tools.importers.lerobot.policies import Frame, lerobot_reference, load_policy

    ckpt = read_checkpoint(checkpoint)
    if ckpt.type != "act":
        raise SystemExit(f"--checkpoint runs ACT checkpoints only; {checkpoint} is {ckpt.type}")
    policy, pre, post = load_policy(ckpt)
    period_ns = 20_000_000  # the demo dataset's 50 Hz
    chunk, dim = ckpt.chunk_length, ckpt.action.shape[0]

    def infer(frame, seq: int):
        lerobot_frame = Frame(dict(frame.images), frame.proprio)
        return lerobot_reference(policy, pre, post, ckpt, [lerobot_frame], None).actions

    only = (INSTRUCTION,)
    episodes_ = EpisodeSet.grid(range(seed, seed + episodes), only, exec_steps)
    task, _ = make_task(ClosedLoopPlan().task)
    try:
        link = InProcessLink(infer, period_ns, period_ns * ckpt.n_action_steps, chunk_length=chunk, action_dim=dim)
        logs = episodes_.run(task, link, period_ns=period_ns, chunk_length=chunk, label="lerobot", progress=progress)
    finally:
        task.close()
    summary = summarize(logs, only)
    summary.pop("episodes")
    return summary


def _line(summary: dict[str, Any]) -> str:
    row = summary["per_instruction"][INSTRUCTION]
    return (
        f"{row['successes']}/{row['episodes']} ({100 * row['rate']:.0f} %), "
        f"mean final distance {1000 * row['mean_final_distance_m']:.1f} mm"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("release", nargs="?", help="an imported release (or --checkpoint)")
    p.add_argument("--checkpoint", help="instead: a LeRobot ACT checkpoint, run in process by LeRobot itself")
    p.add_argument("--episodes", type=int, default=30)
    p.add_argument("--seed", type=int, default=10_000, help="first seed (training used 0..)")
    p.add_argument("--exec-steps", type=int, default=4)
    p.add_argument("--keys", help="trusted keys: serve the release verified")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    print(
        f"closed loop: {args.episodes} episodes of {INSTRUCTION!r}, seeds {args.seed}..{args.seed + args.episodes - 1}"
    )
    if args.checkpoint:
        summary = lerobot_in_process(Path(args.checkpoint), args.episodes, args.seed, args.exec_steps)
        print(f"closed loop in process (LeRobot's predict path): {_line(summary)}")
        if args.json:
            Path(args.json).write_text(json.dumps(summary, indent=2, default=str) + "\n")
        return 0
    if not args.release:
        p.error("give a release folder or --checkpoint")
    release = Path(args.release)
    keys = str(Path(args.keys).resolve()) if args.keys else None  # the daemon runs in its own folder
    result = closed_loop(release, args.episodes, args.seed, args.exec_steps, keys)
    result.update({"instruction": INSTRUCTION, "seeds": [args.seed, args.seed + args.episodes - 1]})
    for key in ("in_process", "through_vlad_serve", "no_motion"):
        print(f"closed loop {key.replace('_', ' ')}: {_line(result[key])}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
