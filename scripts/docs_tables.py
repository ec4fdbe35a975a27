#!/usr/bin/env python3
"""Write the figures in README.md and docs/benchmarks.md from the demo release's gate evidence.

    .venv/bin/python scripts/docs_tables.py            # rewrite the generated blocks
    .venv/bin/python scripts/docs_tables.py --check    # exit 1 if a block differs (tests run this)

Each generated block sits between ``<!-- generated: NAME ... -->`` and ``<!-- end generated -->``
and is rebuilt from ``manifests/demo/gate-report.json`` (the signed evidence of the demo
release, made by ``vladctl gate ... --record``): no figure in those blocks is typed by hand,
and each says when and on what machine it was measured.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "manifests" / "demo" / "gate-report.json"
EVAL = ROOT / "manifests" / "demo" / "eval.json"  # written by scripts/train_demo_policy.py
TARGETS = (ROOT / "README.md", ROOT / "docs" / "benchmarks.md")
BLOCK = re.compile(r"(<!-- generated: (\S+)[^\n]*-->\n)(.*?)(<!-- end generated -->)", re.S)


def _gate(report: dict[str, Any], name: str) -> dict[str, Any]:
    for g in report["gates"]:
        if g["gate"] == name:
            return g
    raise SystemExit(f"docs_tables: {REPORT} has no {name} gate; run the demo's gates with --record first")


def _rate(r: dict[str, Any]) -> str:
    n, ok = r["episodes"], r["successes"]
    return f"{ok}/{n} ({100 * ok / n:.0f} %)" if n else "-"


def _conditions(report: dict[str, Any]) -> str:
    c = report["conditions"]
    load = ", ".join(f"{x:.2f}" for x in c.get("loadavg_1_5_15", []))
    versions = c.get("versions", {})
    ort = versions.get("onnxruntime", "?")
    after = report.get("conditions_after", {})
    n = after.get("neighbours_during_run") or {}
    busy = ""
    if n.get("share_with_busy_neighbour"):
        names = ", ".join(f"`{k}`" for k in n.get("peak_cpu_percent", {}))
        busy = f" Another process was busy during {100 * n['share_with_busy_neighbour']:.0f} % of the run ({names})."
    end = ", ".join(f"{x:.2f}" for x in after.get("loadavg_1_5_15", []))
    return (
        f"Measured {report['started_at'][:10]} by `vladctl gate` ({report['duration_s'] / 60:.0f} min): "
        f"{c.get('cpu', '?')}, {c.get('usable_cores', '?')} cores, load average {load} at the start"
        + (f" and {end} at the end" if end else "")
        + f", Python {c.get('python', '?')}, ONNX Runtime {ort}.{busy}"
    )


def closed_loop(report: dict[str, Any]) -> str:
    """The closed-loop table: through vlad (quiet, CPU hog), in process, no motion; the pairs."""
    d = _gate(report, "closed_loop")["details"]
    instructions = list(d["candidate"]["per_instruction"])
    rows = [("through vlad (`vlad serve`, ONNX Runtime)", d["candidate"])]
    if d.get("candidate_under_hog"):
        rows.append(("through vlad, beside a process spinning one core", d["candidate_under_hog"]))
    late = d.get("candidate_at_latency")
    if late:
        label = f"through vlad at {d['latency_ms']:g} ms inference latency (real-time chunking)"
        rows.append((label, late))
    rows.append(("the same artifact in process (no daemon)", d["in_process"]))
    rows.append(("no motion (hold the starting pose)", d["no_motion"]))
    head = "| policy | " + " | ".join(f"`{i}`" for i in instructions) + " |"
    lines = [head, "|---|" + "---|" * len(instructions)]
    for label, run in rows:
        cells = []
        for i in instructions:
            r = run["per_instruction"][i]
            cells.append(f"{_rate(r)}, mean final distance {1000 * r['mean_final_distance_m']:.1f} mm")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    seeds = d["seeds"]
    out = [
        *lines,
        "",
        f"Seeds {seeds[0]}–{seeds[1]} per instruction (unseen in training), success = fingertip within "
        f"20 mm of the goal after 50 periods, each chunk executed for {d['exec_steps']} periods.",
    ]
    if late:
        seams = late["seams"]
        out.append(
            f"At {d['latency_ms']:g} ms (± {100 * report['plan']['closed_loop'].get('latency_jitter', 0.0):.0f} %, a streaming controller "
            f"executing the newest chunk): {late['held_periods']} of {late['ticks']} periods without a valid "
            f"waypoint; {seams['count']} seams, largest {seams['max_rad']:.3f} rad, p99 {seams['p99_rad']:.3f} rad, "
            f"{seams['over_rate_limit']} beyond the rate limit; sensor-to-chunk latency p50 "
            f"{late['latency_ms']['p50']:.0f} ms, p99 {late['latency_ms']['p99']:.0f} ms."
        )
    for name, key in (("quiet", "fidelity"), ("beside the CPU hog", "fidelity_under_hog")):
        f = d.get(key)
        if not f:
            continue
        drops = ", ".join(
            f"`{i}` {100 * v['drop']:+.0f} points ({v['lost']} lost, {v['gained']} gained)"
            for i, v in f["per_instruction"].items()
        )
        causes = ", ".join(f"{k} {v}" for k, v in sorted(f["divergence_causes"].items())) or "none"
        out.append(
            f"Fidelity ({name}): in process minus through vlad: {drops}; {f['identical_episodes']} of "
            f"{f['episodes']} paired episodes identical tick for tick; first differences: {causes}."
        )
    out.append(_conditions(report))
    return "\n".join(out) + "\n"


def latency(report: dict[str, Any]) -> str:
    """Sensor-to-command latency as the performance gate measured it, per scenario."""
    d = _gate(report, "performance")["details"]
    lines = ["| scenario | e2e p50 | p95 | p99 | max | deadline misses |", "|---|---:|---:|---:|---:|---:|"]
    for name, sc in d["scenarios"].items():
        e2e = sc.get("e2e_ms") or sc.get("stages_ms", {}).get("e2e", {})
        if not e2e:
            continue
        miss = sc.get("deadline_miss_rate")
        lines.append(
            f"| {name.replace('_', ' ')} | {e2e.get('p50', float('nan')):.2f} ms | {e2e.get('p95', float('nan')):.2f} ms"
            f" | {e2e.get('p99', float('nan')):.2f} ms | {e2e.get('max', float('nan')):.2f} ms | "
            + (f"{100 * miss:.1f} %" if miss is not None else "-")
            + " |"
        )
    return "\n".join(lines) + "\n\n" + _conditions(report) + "\n"


def training_eval(report: dict[str, Any]) -> str:
    """The in-process evaluation the training script wrote: trained policy, expert, no motion."""
    ev = json.loads(EVAL.read_text())
    labels = {"policy": "trained policy (ONNX Runtime, in process)", "expert": "scripted expert", "zero": "no motion"}
    instructions = list(dict.fromkeys(r["instruction"] for r in ev["results"]))
    lines = ["| policy | " + " | ".join(f"`{i}`" for i in instructions) + " |", "|---|" + "---|" * len(instructions)]
    for key, label in labels.items():
        rows = {r["instruction"]: r for r in ev["results"] if r["policy"] == key}
        if rows:
            cells = [
                f"{_rate(rows[i])}, mean final distance {1000 * rows[i]['mean_final_distance_m']:.1f} mm"
                for i in instructions
            ]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return (
        "\n".join(lines) + f"\n\nSeeds {ev['seeds'].replace('..', '–')} per instruction, success = fingertip within "
        f"{1000 * ev['success_radius_m']:.0f} mm of the goal after {ev['episode_steps']} periods, each chunk "
        f"executed for {ev['exec_steps']} periods.\n"
    )


GENERATORS = {"closed-loop": closed_loop, "latency": latency, "training-eval": training_eval}


def render(text: str, report: dict[str, Any]) -> str:
    def block(m: re.Match[str]) -> str:
        name = m.group(2)
        if name not in GENERATORS:
            raise SystemExit(f"docs_tables: unknown generated block {name!r} (known: {', '.join(GENERATORS)})")
        return m.group(1) + GENERATORS[name](report) + m.group(4)

    return BLOCK.sub(block, text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only check; exit 1 when a generated block is out of date")
    ap.add_argument("--report", type=Path, default=REPORT)
    args = ap.parse_args(argv)
    report = json.loads(args.report.read_text())
    stale = []
    for path in TARGETS:
        text = path.read_text()
        new = render(text, report)
        if new != text:
            stale.append(path.relative_to(ROOT))
            if not args.check:
                path.write_text(new)
    if args.check and stale:
        print(f"docs_tables: out of date: {', '.join(map(str, stale))}; run scripts/docs_tables.py", file=sys.stderr)
        return 1
    if not args.check:
        print(f"docs_tables: {'rewrote ' + ', '.join(map(str, stale)) if stale else 'nothing to change'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
