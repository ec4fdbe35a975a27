"""Runs the gates in order, shows progress, and writes the report.

    report = run_gates("candidate/", "baseline/", "out/", plan_file=None, run_all=False)
    report["passed"], report["gates"][i]["status"]

Order: contract, equivalence, performance, closed loop (cheap and decisive first). The run
stops at the first failing gate unless ``run_all``: a release that feeds the model
differently needs no closed-loop evidence to be refused. Gates after a stop are listed as
skipped with the reason. The report (``report.json`` and the self-contained
``report.html``) holds every check with its budget, the details behind them and the
measurement conditions.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from vlad.errors import VladError, missing_extra
from vlad_tools.gates import conditions
from vlad_tools.gates.plan import GatePlan, load_plan
from vlad_tools.gates.results import GATE_ORDER, REPORT_FORMAT, GateError, GateResult, Timer
from vlad_tools.gates.subject import Subject, open_subject

Progress = Callable[[str], None]


def console_progress(quiet: bool = False, stream: Any = None) -> Progress:
    """Progress lines with the elapsed time, flushed at once (long steps must show life);
    to ``stream`` (default stdout)."""
    t0 = time.monotonic()

    def progress(message: str) -> None:
        if not quiet:
            print(f"[{time.monotonic() - t0:7.1f} s] {message}", file=stream or sys.stdout, flush=True)

    return progress


def _run_one(
    gate: str, candidate: Subject, baseline: Subject, plan: GatePlan, progress: Progress, keys_dir: str | None
) -> GateResult:
    if gate == "contract":
        from vlad_tools.gates.contract_gate import run_contract_gate

        return run_contract_gate(candidate, baseline, progress)
    if gate == "equivalence":
        from vlad_tools.gates.equivalence import run_equivalence_gate

        return run_equivalence_gate(candidate, baseline, plan, progress)
    if gate == "performance":
        from vlad_tools.gates.performance import run_performance_gate

        return run_performance_gate(candidate, plan, progress, keys_dir)
    from vlad_tools.gates.closed_loop import run_closed_loop_gate

    return run_closed_loop_gate(candidate, baseline, plan, progress, keys_dir)


def run_gates(
    candidate: str | Path,
    baseline: str | Path,
    report_dir: str | Path,
    *,
    plan: GatePlan | None = None,
    plan_file: str | Path | None = None,
    gates: Sequence[str] | None = None,
    run_all: bool = False,
    keys_dir: str | None = None,
    progress: Progress | None = None,
    html: bool = True,
) -> dict[str, Any]:
    """Run ``gates`` (default: every gate the plan requires) on ``candidate`` against
    ``baseline``; write ``report.json`` and ``report.html`` into ``report_dir``."""
    progress = progress or console_progress()
    cand, base = open_subject(candidate), open_subject(baseline)
    plan = plan or load_plan(cand.path, plan_file, cand.document)
    selected = list(gates or plan.required)
    unknown = [g for g in selected if g not in GATE_ORDER]
    if unknown:
        raise GateError(f"unknown gate(s) {', '.join(unknown)}; the gates are {', '.join(GATE_ORDER)}")
    order = [g for g in GATE_ORDER if g in selected]
    started = dt.datetime.now(dt.UTC)
    progress(f"gates for {cand.id} ({cand.path}) against {base.id} ({base.path}); plan: {plan.source}")
    cond = conditions.capture()
    progress(
        f"conditions: {cond['cpu']}, {cond['usable_cores']} cores, governor {cond['governor']}, "
        f"load {cond['loadavg_1_5_15']}"
    )
    results: list[GateResult] = []
    stopped: str | None = None
    with conditions.NeighbourWatch() as watch:
        for i, gate in enumerate(order, 1):
            if stopped is not None:
                results.append(
                    GateResult(
                        gate, "skipped", reasons=[f"not run: the {stopped} gate failed first (--all runs every gate)"]
                    )
                )
                continue
            progress(f"[{i}/{len(order)}] {gate} gate")
            with Timer() as timer:
                try:
                    result = _run_one(gate, cand, base, plan, progress, keys_dir)
                except VladError as exc:
                    result = GateResult(gate, "error", reasons=[str(exc)])
                except ModuleNotFoundError as exc:
                    line = missing_extra(exc, "gates")
                    reason = f"{gate}: {line}" if line else f"{type(exc).__name__}: {exc}"
                    result = GateResult(gate, "error", reasons=[reason], details={"traceback": traceback.format_exc()})
                except Exception as exc:  # a bug in a gate must still leave a report behind
                    result = GateResult(
                        gate,
                        "error",
                        reasons=[f"{type(exc).__name__}: {exc}"],
                        details={"traceback": traceback.format_exc()},
                    )
            result.duration_s = timer.s
            results.append(result)
            progress(f"[{i}/{len(order)}] {result.summary()} ({timer.s:.1f} s)")
            if not result.passed and not run_all:
                stopped = gate
    after = {**conditions.capture_after(), "neighbours_during_run": watch.summary()}
    if watch.busy_samples:
        share = 100 * after["neighbours_during_run"]["share_with_busy_neighbour"]
        progress(
            f"conditions: other processes were busy during {share:.0f} % of the run "
            f"({', '.join(list(watch.peaks)[:3])}): latency figures are not this release's alone"
        )
    finished = dt.datetime.now(dt.UTC)
    report = {
        "format": REPORT_FORMAT,
        "candidate": cand.identity(),
        "baseline": base.identity(),
        "plan": plan.to_dict(),
        "gates_run": order,
        "gates": [r.to_dict() for r in results],
        "passed": all(r.passed for r in results) and bool(results),
        "stopped_after": stopped,
        "started_at": started.isoformat(timespec="seconds"),
        "finished_at": finished.isoformat(timespec="seconds"),
        "duration_s": round((finished - started).total_seconds(), 1),
        "conditions": cond,
        "conditions_after": after,
    }
    write_report(report, Path(report_dir), html=html)
    verdicts = ", ".join(f"{r.gate} {r.status}" for r in results)
    progress(
        f"{'PASSED' if report['passed'] else 'FAILED'}: {verdicts}; report in {report_dir} "
        f"({report['duration_s']:.0f} s)"
    )
    return report


def write_report(report: dict[str, Any], out: Path, html: bool = True) -> list[Path]:
    """``report.json`` and (with ``html``) the self-contained ``report.html`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "report.json"]
    paths[0].write_text(json.dumps(report, indent=1, default=str, allow_nan=False, cls=_Encoder) + "\n")
    if html:
        from vlad_tools.gates.report import render_html

        paths.append(out / "report.html")
        paths[1].write_text(render_html(report), encoding="utf-8")
    return paths


class _Encoder(json.JSONEncoder):
    """NaN and infinities as strings (JSON has neither), numpy scalars as numbers."""

    def iterencode(self, o: Any, _one_shot: bool = False):
        return super().iterencode(_finite(o), _one_shot)


def _finite(o: Any) -> Any:
    import math

    import numpy as np

    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    if isinstance(o, np.generic):
        o = o.item()
    if isinstance(o, float) and not math.isfinite(o):
        return str(o)
    return o
