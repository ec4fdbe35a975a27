#!/usr/bin/env python3
"""One SmolVLA import at full size, measured: SmolVLM2-500M's dimensions, LeRobot's defaults.

Opt-in (tens of minutes on a laptop-class CPU; figures in docs/lerobot.md, "SmolVLA at full
size"). No hub and no real weights: the VLM folder is built here at SmolVLM2-500M-Video-Instruct's
dimensions (:data:`vlad_tools.testing.lerobot.SMOLVLM2_500M`, its tokenizer a small BPE trained
here) and the checkpoint is a random-weight SmolVLA with LeRobot's own settings (chunk 50, 10
flow steps, 16 of the VLM's 32 text layers, 512x512 images) for an SO-101 (two 480x640 cameras,
6 joints in degrees), written by LeRobot. Then, each stage a child process measured on its own
(wall time, CPU time, peak resident memory of its process tree):

1. ``build``: the VLM folder and the checkpoint, and the parameter count;
2. ``import``: the real ``vladctl import lerobot`` (LeRobot's reference on the check windows,
   ``policy.pt2``, three dynamo ONNX exports, every artifact against LeRobot, signing);
3. ``latency``: the imported release per chunk on this CPU through vlad's backends
   (``onnxruntime`` and ``torch``, where installed): load time, one warm-up, then p50/max;

and first the planner's prediction (``vladctl plan --model smolvla``) for an Orin and an RTX 4090.

    nice -n 19 .venv/bin/python scripts/smolvla_full.py --work runs/smolvla-full

A stage that passes ``--max-rss-gib`` (process tree) or ``--timeout-min`` is stopped and the
script says how far it got (its log, ``WORK/STAGE.log``, has every line with its time).
Progress goes to stderr; the figures, with their conditions, to stdout as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from vlad_tools.testing import REPO
from vlad_tools.testing.conditions import conditions

VLADCTL = Path(sys.executable).parent / "vladctl"
HUB = "HuggingFaceTB/SmolVLM2-500M-Video-Instruct"
PLAN_HARDWARE = "jetson-agx-orin-64gb,rtx-4090"
GIB = 2**30


def _say(text: str) -> None:
    print(f"smolvla_full: {text}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# Stages (each run in a child process of this script)
# ---------------------------------------------------------------------------------------


def stage_build(work: Path, tiny: bool) -> dict[str, Any]:
    """The VLM folder and the random-weight checkpoint; the parameter count from its file.
    ``tiny``: the tests' sizes instead (a check of this script in a minute)."""
    from safetensors import safe_open

    from vlad_tools.testing.lerobot import (
        SMOLVLM2_500M,
        SO101,
        SO101_RANGE,
        TINY_VLM,
        Robot,
        make_checkpoint,
        make_vlm_folder,
        write_dataset_meta,
    )

    robot = SO101 if tiny else Robot({"front": (480, 640), "wrist": (480, 640)}, SO101_RANGE, SO101_RANGE, SO101.names)
    t0 = time.monotonic()
    vlm = make_vlm_folder(work / "vlm", TINY_VLM if tiny else SMOLVLM2_500M)
    _say(f"build: VLM folder {vlm} ({time.monotonic() - t0:.0f} s)")
    ckpt = make_checkpoint(work / "ckpt", "smolvla", robot=robot, full_size=not tiny, vlm_model_name=vlm, hub_name=HUB)
    _say(f"build: checkpoint {ckpt} ({time.monotonic() - t0:.0f} s)")
    write_dataset_meta(work / "dataset" / "meta", robot, fps=30)  # the joints' names and the control rate
    counts: dict[str, int] = {}
    with safe_open(str(ckpt / "model.safetensors"), "pt") as f:
        for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
            shape = f.get_slice(name).get_shape()
            n = 1
            for d in shape:
                n *= d
            part = "vlm" if ".vlm." in name else "expert" if "lm_expert" in name else "other"
            counts[part] = counts.get(part, 0) + n
    return {
        "parameters": sum(counts.values()),
        "parameters_by_part": counts,
        "checkpoint_bytes": (ckpt / "model.safetensors").stat().st_size,
    }


def stage_latency(release: Path, calls: int) -> dict[str, Any]:
    """Per-chunk latency of the release through vlad's backends, on one golden window."""
    import numpy as np

    from vlad.contract import load_contract
    from vlad.plugins import get_backend
    from vlad_tools.gates.equivalence import load_golden

    contract = load_contract(release / "contract.toml")
    inputs = next(iter(load_golden(release / "golden.npz")))["inputs"]
    out: dict[str, Any] = {}
    # Every core of this machine for both (the manifest's intra_op_threads = 1 is the robot's choice).
    cores = len(os.sched_getaffinity(0))
    runs = (("onnxruntime", "policy.onnx", {"intra_op_threads": cores}), ("torch", "policy.pt2", {"threads": cores}))
    for backend, artifact, options in runs:
        try:
            plugin = get_backend(backend)
        except Exception as exc:  # a backend whose runtime is missing here is skipped, said so
            _say(f"latency: {backend}: not available ({exc})")
            continue
        t0 = time.monotonic()
        session = plugin.load(release / artifact, contract, options)
        load_s = time.monotonic() - t0
        try:
            t0 = time.monotonic()
            session.infer(inputs)
            warm_s = time.monotonic() - t0
            times = []
            for k in range(calls):
                t0 = time.monotonic()
                session.infer(inputs)
                times.append(time.monotonic() - t0)
                _say(f"latency: {backend} call {k + 1}/{calls}: {times[-1]:.2f} s")
        finally:
            session.close()
        out[backend] = {
            "artifact": artifact,
            "options": options,
            "load_s": round(load_s, 2),
            "first_call_s": round(warm_s, 2),
            "calls": calls,
            "p50_s": round(float(np.median(times)), 3),
            "max_s": round(max(times), 3),
        }
        _say(f"latency: {backend}: p50 {out[backend]['p50_s']} s, max {out[backend]['max_s']} s")
    return out


# ---------------------------------------------------------------------------------------
# The parent: children measured one at a time
# ---------------------------------------------------------------------------------------


def _tree_rss(root: int) -> int:
    """Resident bytes of ``root`` and every descendant (read from /proc, best effort)."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            parents[int(entry.name)] = int(fields[1])
            rss[int(entry.name)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            continue  # a process that ended meanwhile
    tree, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        kids = [p for p, pp in parents.items() if pp == pid and p not in tree]
        tree.update(kids)
        frontier.extend(kids)
    return sum(rss.get(p, 0) for p in tree)


class StageFailed(Exception):
    """A stage exited non-zero, ran out of time or of its memory budget."""


def _stage_command(args: argparse.Namespace, stage: str) -> list[str]:
    work = str(args.work)
    if stage == "import":
        return [
            str(VLADCTL),
            "import",
            "lerobot",
            str(args.work / "ckpt"),
            "--vlm-dir",
            str(args.work / "vlm"),
            "--dataset-meta",
            str(args.work / "dataset" / "meta" / "info.json"),
            "--release-id",
            "smolvla-full",
            "--out",
            str(args.work / "release"),
            "--force",
            "--state-units",
            "deg",
            "--action-units",
            "deg",
            "--windows",
            str(args.windows),
            "--key",
            str(args.work / "keys" / "import.key"),
        ]
    extra = ["--calls", str(args.calls)] if stage == "latency" else ["--tiny"] if args.tiny else []
    return [sys.executable, __file__, "--work", work, "--stage", stage, *extra]


def _run_stage(args: argparse.Namespace, stage: str) -> dict[str, Any]:
    """Run one stage as a child; its wall time, CPU time and peak memory (the tree's, polled
    each second, and the kernel's ``ru_maxrss`` from ``wait4``), and its JSON result."""
    cmd = _stage_command(args, stage)
    log_path = args.work / f"{stage}.log"
    _say(f"{stage}: {' '.join(cmd)} (log {log_path})")
    t0 = time.monotonic()
    child = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, bufsize=1
    )
    peak = {"tree": 0}
    stop = {"why": ""}
    lines: list[str] = []
    done = threading.Event()  # set once the child is reaped (by wait4 below, never here: its rusage)

    def watch() -> None:
        while not done.wait(1.0):
            peak["tree"] = max(peak["tree"], _tree_rss(child.pid))
            if peak["tree"] > args.max_rss_gib * GIB:
                stop["why"] = f"resident memory {peak['tree'] / GIB:.1f} GiB passed --max-rss-gib {args.max_rss_gib}"
            elif time.monotonic() - t0 > args.timeout_min * 60:
                stop["why"] = f"still running after --timeout-min {args.timeout_min}"
            if stop["why"]:
                os.killpg(child.pid, signal.SIGKILL)  # its own session: the CLI and anything it started
                return

    watcher = threading.Thread(target=watch, name=f"watch-{stage}", daemon=True)
    watcher.start()
    assert child.stdout is not None
    with log_path.open("w") as log:
        for line in child.stdout:
            if not line.strip():
                continue  # LeRobot prints empty lines
            stamped = f"[{time.monotonic() - t0:7.1f} s] {line.rstrip()}"
            lines.append(line)
            log.write(stamped + "\n")
            log.flush()
            print(f"  {stage} {stamped}", file=sys.stderr, flush=True)
    _, status, usage = os.wait4(child.pid, 0)
    done.set()
    child.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - t0
    watcher.join()
    figures = {
        "wall_s": round(wall, 1),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        "peak_rss_gib": round(usage.ru_maxrss * 1024 / GIB, 2),  # Linux: KiB, the largest process
        "peak_tree_rss_gib": round(peak["tree"] / GIB, 2),
    }
    if stop["why"] or child.returncode != 0:
        why = stop["why"] or f"exit status {child.returncode}"
        last = next((ln.strip() for ln in reversed(lines) if ln.strip()), "(no output)")
        raise StageFailed(f"{stage} stopped after {wall:.0f} s ({why}); its last line: {last}; figures {figures}")
    # build and latency print their result as the last line (the import's is its report file)
    result = json.loads(lines[-1]) if stage != "import" else None
    return {"command": " ".join(cmd), **figures, "result": result}


def _plan(work: Path) -> dict[str, Any]:
    """The planner's prediction for the built-in description, and for a copy whose ViT runs over
    the 1024 patches of an image (the built-in one counts the 64 tokens the VLM reads after the
    pixel shuffle for both, a lower bound on vision: its file says why); of that copy only the
    vision column holds (its backbone would then read 1024 tokens per image too)."""
    from vlad_tools.planner.spec import builtin_models

    text = builtin_models()["smolvla"].read_text()
    patches = work / "smolvla-vision-1024.toml"
    patches.write_text(text.replace("tokens_per_image = 64", "tokens_per_image = 1024"))
    out: dict[str, Any] = {}
    for label, model in (("smolvla", "smolvla"), ("vision over 1024 patches", str(patches))):
        cmd = [str(VLADCTL), "plan", "--model", model, "--hardware", PLAN_HARDWARE]
        _say(f"plan: {' '.join(cmd)}")
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise StageFailed(f"plan: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")
        out[label] = {"command": " ".join(cmd), "output": done.stdout}
    return out


def _import_report(release: Path) -> dict[str, Any]:
    """Each artifact against LeRobot, short: the normalized chunk's worst and mean error and the
    worst joint (the whole report is the release's import-report.json)."""
    report = json.loads((release / "import-report.json").read_text())
    short: dict[str, Any] = {"passed": report.get("passed")}
    for name, check in report.get("checks", {}).items():
        if isinstance(check, dict) and "output" in check:
            joints = check.get("joints", {})
            worst = max(joints, key=lambda j: joints[j]["max_abs"], default=None)
            short[name] = {
                **check["output"],
                "worst_joint": worst and {"name": worst, **joints[worst]},
            }
    return short


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, default=REPO / "runs" / "smolvla-full", help="work folder (~8 GB)")
    p.add_argument("--windows", type=int, default=2, help="the import's check windows (default %(default)s)")
    p.add_argument("--calls", type=int, default=5, help="timed calls per backend after one warm-up")
    p.add_argument("--max-rss-gib", type=float, default=16.0, help="stop a stage whose processes pass this")
    p.add_argument("--timeout-min", type=float, default=75.0, help="stop a stage running longer")
    p.add_argument("--tiny", action="store_true", help="the tests' sizes: a check of this script, not a figure")
    p.add_argument("--stage", choices=("build", "latency"), help=argparse.SUPPRESS)  # a child's own stage
    p.add_argument(
        "--skip-build", action="store_true", help="reuse WORK/vlm and WORK/ckpt from an earlier run (not measured)"
    )
    args = p.parse_args(argv)
    if args.stage == "build":
        print(json.dumps(stage_build(args.work, args.tiny)))
        return 0
    if args.stage == "latency":
        print(json.dumps(stage_latency(args.work / "release", args.calls)))
        return 0

    args.work.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(args.work).free
    if free < 10e9:
        _say(f"error: {free / 1e9:.1f} GB free under {args.work}; the run writes ~8 GB")
        return 1
    figures: dict[str, Any] = {
        "conditions": {**conditions("torch", "onnxruntime", "lerobot", "transformers"), "nice": os.nice(0)},
        "settings": {"windows": args.windows, "calls": args.calls, "vlm": HUB + " dimensions, random weights"},
        "tiny": args.tiny,
    }
    try:
        figures["plan"] = _plan(args.work)  # first: a prediction needs no import, and holds if one is stopped
        if not args.skip_build:
            figures["build"] = _run_stage(args, "build")
            _say(f"build: {figures['build']['result']}")
        keys = args.work / "keys"
        if not (keys / "import.key").exists():
            keys.mkdir(exist_ok=True)
            cmd = [str(VLADCTL), "keygen", "--out", str(keys), "--name", "import"]
            subprocess.run(cmd, check=True, capture_output=True)
        figures["import"] = _run_stage(args, "import")
        release = args.work / "release"
        figures["import"]["result"] = _import_report(release)
        figures["release_files"] = {p.name: p.stat().st_size for p in sorted(release.iterdir()) if p.is_file()}
        figures["latency"] = _run_stage(args, "latency")
    except StageFailed as exc:
        figures["stopped"] = str(exc)
        print(json.dumps(figures, indent=2))
        _say(f"error: {exc}")
        return 1
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
