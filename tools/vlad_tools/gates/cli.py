"""``vladctl gate``, ``record``, ``replay`` and ``evidence``: release gates from the command line.

    vladctl gate CANDIDATE --baseline BASELINE --report DIR [--plan gates.toml] [--record]
    vladctl gate manifests/demo --baseline manifests/demo --plan etc/vlad/demo-gates.toml --report out/
    vladctl record --out REC.mcap [--seconds 60] [--max-bytes B]        # a running daemon, through its tap
    vladctl record --out REC.mcap --demo manifests/demo --episodes 4     # demo episodes, controller tap
    vladctl replay RECORDING.mcap --release CANDIDATE [--baseline BASELINE]
    vladctl evidence RELEASE                                             # what deploy would refuse

:func:`add_gate_commands` adds them to any argparse sub-parsers object and sets
``args.func`` (returning the exit code); ``vladctl`` (:mod:`vlad.cli`) runs them.
Exit status of ``gate``: 0 every gate passed, 1 a gate failed, 2 error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

EXIT_FAILED = 1


def add_gate_commands(subparsers: Any) -> None:
    """Add ``gate``, ``record``, ``replay`` and ``evidence`` to ``subparsers``."""
    p = subparsers.add_parser(
        "gate",
        help="run the release gates (contract, equivalence, performance, closed loop)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("candidate", help="release folder to judge")
    p.add_argument("--baseline", required=True, help="release folder it replaces (may be the candidate itself)")
    p.add_argument("--report", required=True, help="folder for report.json and report.html")
    p.add_argument(
        "--plan",
        help="gate plan TOML (default: the manifest's [gate_plan], else CANDIDATE/gates.toml, else built-in defaults)",
    )
    p.add_argument("--gates", help="comma-separated subset (default: every gate the plan requires)")
    p.add_argument("--all", action="store_true", help="run every gate even after one failed")
    p.add_argument(
        "--record",
        action="store_true",
        help="add the report and verdicts to CANDIDATE's manifest (then re-sign it with vladctl sign)",
    )
    p.add_argument("--keys", help="trusted keys: serve the releases verified (default: unsigned, as gated)")
    p.add_argument("--golden", help="golden fixtures .npz (overrides equivalence.golden)")
    p.add_argument(
        "--replay",
        action="append",
        metavar="MCAP",
        help="recording to replay (repeatable; overrides equivalence.recordings)",
    )
    p.add_argument("--replay-limit", type=int, help="observations per recording (0 = all)")
    p.add_argument("--rollout-episodes", type=int, help="simulator rollouts per instruction")
    p.add_argument("--aoti", action="store_true", help="compile torch-aoti (about a minute, cached) to compare it too")
    p.add_argument("--perf-calls", type=int, help="warm steady-state observations (stress scenarios get a third)")
    p.add_argument("--bursts", type=int, help="observation bursts")
    p.add_argument("--episodes", type=int, help="closed-loop episodes per instruction and policy")
    p.add_argument(
        "--max-fidelity-drop",
        type=float,
        help="closed loop: success rate through vlad at most this much below in process (0.03 = 3 points)",
    )
    p.add_argument(
        "--max-latency-drop",
        type=float,
        help="closed loop: success rate at closed_loop.latency_ms at most this much below in process",
    )
    p.add_argument(
        "--no-hog", action="store_true", help="skip the CPU-hog scenarios (performance, closed-loop fidelity)"
    )
    p.add_argument("--no-html", action="store_true", help="write report.json only")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--json", action="store_true", help="print the report's verdicts as JSON")
    p.set_defaults(func=cmd_gate)

    p = subparsers.add_parser(
        "record",
        help="record a running daemon (observations, chunks, status, events) to MCAP",
        description="Attach to the running daemon's recording tap and write what it receives and publishes "
        "to an MCAP file (vladctl replay and the equivalence gate read it). With --demo, serve a release "
        "and record demo episodes through a controller-side tap instead.",
    )
    p.add_argument("--out", required=True, help="MCAP file to write")
    p.add_argument("--seconds", type=float, default=60.0, help="stop this long after the first message")
    p.add_argument("--max-bytes", type=int, default=100 * 2**20, help="stop at this much message data")
    p.add_argument("--config", default="/etc/vlad/vlad.toml", help="daemon config, for the control endpoint")
    p.add_argument("--endpoint", help="control endpoint (overrides the config)")
    p.add_argument("--timeout-ms", type=int, default=2000)
    p.add_argument("--curve-key", help="CurveZMQ: this client's secret key file (tcp:// endpoints)")
    p.add_argument("--curve-server-key", help="CurveZMQ: the daemon's public key file (tcp:// endpoints)")
    p.add_argument("--demo", metavar="RELEASE", help="serve RELEASE and record demo episodes instead")
    p.add_argument("--episodes", type=int, default=4, help="--demo: episodes, alternating the instructions")
    p.add_argument("--seed", type=int, default=20_000, help="--demo: first episode seed")
    p.set_defaults(func=cmd_record)

    p = subparsers.add_parser("replay", help="replay a recording through a release and compare its actions")
    p.add_argument("recording", help="MCAP file made by vladctl record")
    p.add_argument("--release", required=True, help="release folder to replay through (its serving backend)")
    p.add_argument("--baseline", help="release folder to compare with as well")
    p.add_argument("--limit", type=int, default=0, help="observations to replay (0 = all)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_replay)

    p = subparsers.add_parser("evidence", help="check a release's gate evidence as deploy does")
    p.add_argument("release", help="release folder")
    p.set_defaults(func=cmd_evidence)


def _overrides(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    eq = {
        "golden": str(Path(args.golden).resolve()) if args.golden else None,
        "recordings": tuple(str(Path(r).resolve()) for r in args.replay) if args.replay else None,
        "replay_limit": args.replay_limit,
        "rollout_episodes": args.rollout_episodes,
        "compile_aoti": True if args.aoti else None,
    }
    perf = {"warm_calls": args.perf_calls, "bursts": args.bursts, "cpu_hog": False if args.no_hog else None}
    if args.perf_calls is not None:
        perf["shape_switch_calls"] = max(3, min(20, args.perf_calls // 20))
    closed = {
        "episodes": args.episodes,
        "max_fidelity_drop": args.max_fidelity_drop,
        "max_latency_drop": args.max_latency_drop,
        "fidelity_under_hog": False if args.no_hog else None,
    }
    return {"equivalence": eq, "performance": perf, "closed_loop": closed}


def cmd_gate(args: argparse.Namespace) -> int:
    """Run the gates; 0 passed, 1 failed (the report says why)."""
    from vlad_tools.gates.plan import load_plan
    from vlad_tools.gates.runner import console_progress, run_gates
    from vlad_tools.gates.subject import open_subject

    progress = console_progress(args.quiet, sys.stderr if args.json else None)  # --json: stdout is the JSON
    cand = open_subject(args.candidate)
    plan = load_plan(cand.path, args.plan, cand.document).with_overrides(**_overrides(args))
    gates = [g.strip() for g in args.gates.split(",")] if args.gates else None
    report = run_gates(
        cand.path,
        args.baseline,
        args.report,
        plan=plan,
        gates=gates,
        run_all=args.all,
        keys_dir=args.keys,
        progress=progress,
        html=not args.no_html,
    )
    if args.json:
        print(
            json.dumps(
                {
                    "passed": report["passed"],
                    "gates": [{k: g[k] for k in ("gate", "status", "reasons")} for g in report["gates"]],
                },
                indent=2,
            )
        )
    else:
        for g in report["gates"]:
            print(f"{g['gate']:<12} {g['status'].upper():<8} {g['reasons'][0] if g['reasons'] else ''}")
    if args.record:
        from vlad_tools.gates.evidence import record_evidence

        entries = record_evidence(cand.path, args.report)
        print(
            f"recorded {len(entries)} gate verdict(s) in {cand.path / 'manifest.toml'}; "
            f"sign it again: vladctl sign {cand.path} --key KEY"
        )
    return 0 if report["passed"] else EXIT_FAILED


def cmd_record(args: argparse.Namespace) -> int:
    """Record the running daemon through its tap (or, with ``--demo``, demo episodes)."""
    from vlad_tools.gates.runner import console_progress

    progress = console_progress(stream=sys.stderr)
    if args.demo:
        from vlad_tools.gates.closed_loop import record_demo
        from vlad_tools.gates.subject import open_subject

        stats = record_demo(
            open_subject(args.demo),
            Path(args.out),
            args.episodes,
            max_bytes=args.max_bytes,
            max_seconds=args.seconds,
            seed=args.seed,
            progress=progress,
        )
    else:
        from vlad_tools.gates.live import record_daemon

        stats = record_daemon(
            _control_endpoint(args),
            args.out,
            seconds=args.seconds,
            max_bytes=args.max_bytes,
            curve=_curve(args),
            timeout_ms=args.timeout_ms,
            progress=progress,
        )
    size = Path(args.out).stat().st_size
    dropped = f"{stats['dropped']} dropped" + (
        f", {stats['daemon_dropped']} dropped by the daemon" if stats.get("daemon_dropped") else ""
    )
    print(
        f"wrote {args.out}: {stats['observations']} observations, {stats['actions']} action chunks, "
        f"{stats['states']} states, {stats.get('events', 0)} events, {dropped}, {size / 1024:.0f} KiB"
        + (f"; stopped: {stats['stop_reason']}" if stats["stop_reason"] else "")
    )
    return 0


def _control_endpoint(args: argparse.Namespace) -> str:
    if args.endpoint:
        return str(args.endpoint)
    from vlad.config import load_config

    path = Path(args.config)
    return load_config(path if path.exists() else None).sockets.control


def _curve(args: argparse.Namespace) -> tuple[bytes, bytes, bytes] | None:
    if not args.curve_key:
        return None
    from vlad.client import load_curve

    return load_curve((args.curve_key, args.curve_server_key))


def cmd_replay(args: argparse.Namespace) -> int:
    """Replay a recording through a release's serving backend (and a baseline's)."""
    from vlad_tools.gates.engines import Engine, load_engine
    from vlad_tools.gates.recording import read_recording
    from vlad_tools.gates.replay import replay
    from vlad_tools.gates.subject import open_subject

    cand = open_subject(args.release)
    rec = read_recording(args.recording, limit=args.limit).usable()
    engine = load_engine(cand, Engine("candidate", cand.serving, required=True))
    base = None
    if args.baseline:
        b = open_subject(args.baseline)
        base = load_engine(b, Engine("baseline", b.serving, required=True))
    try:
        result = replay(rec, engine.session, cand.contract, cand.tokenizer(), baseline=base.session if base else None)
    finally:
        engine.close()
        if base is not None:
            base.close()
    d = result.to_dict()
    d["refused"] = rec.refused
    if args.json:
        print(json.dumps(d, indent=2))
        return 0
    print(
        f"replayed {d['observations']} observations of {args.recording} through {cand.id} "
        f"({cand.serving.backend}); {d['chunks_compared']} chunks compared with the recording"
    )
    if rec.refused:
        print(f"  skipped {rec.refused} observations the daemon refused (e.g. {rec.refusals[0]})")
    print(
        f"  guarded actions vs recorded: max abs per joint {_fmt(d['vs_recorded_max_abs_per_joint'])}; "
        f"interventions differing: {d['intervention_flips_vs_recorded']}"
    )
    for example in d["flip_examples"]:
        print(f"    {example}")
    if "vs_baseline_max_abs_per_joint" in d:
        print(f"  actions vs baseline: max abs per joint {_fmt(d['vs_baseline_max_abs_per_joint'])}")
    return 0


def cmd_evidence(args: argparse.Namespace) -> int:
    """Print what deploy would refuse; exit 1 when evidence is missing."""
    from vlad_tools.gates.evidence import check_evidence

    problems = check_evidence(Path(args.release), args.release)
    if not problems:
        print(f"{args.release}: passing evidence for every required gate")
        return 0
    for p in problems:
        print(p)
    return EXIT_FAILED


def _fmt(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.3g}" for v in values) + "]"
