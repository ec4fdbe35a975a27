"""The report's plots, drawn with matplotlib (Agg, no display) and returned as PNG bytes.

matplotlib because it is already the project's plotting library (``vladctl plan --plot``)
and renders static images that embed into a single offline HTML file; an interactive
library would need its JavaScript inlined (megabytes) for the report to work offline.
Each function takes the report's JSON-able details and returns None when there is
nothing to draw.
"""

from __future__ import annotations

import io
import math
from typing import Any

import numpy as np

# Pipeline order; e2e (controller) last.
STAGE_ORDER = ("transport", "queue", "preprocess", "engine", "decode", "guard", "e2e")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    _pyplot().close(fig)
    return buf.getvalue()


def _finite(values) -> np.ndarray:
    a = np.asarray([v for v in values if isinstance(v, (int, float))], dtype=np.float64)
    return a[np.isfinite(a)]


def _cdf(ax, values, label: str) -> None:
    a = np.sort(_finite(values))
    if a.size:
        ax.step(np.maximum(a, 1e-3), np.arange(1, a.size + 1) / a.size, where="post", label=label)


def latency_cdf(perf: dict[str, Any]) -> bytes | None:
    """Latency CDF per stage (warm steady state) and end to end per scenario."""
    scenarios = perf.get("scenarios") or {}
    warm = scenarios.get("warm")
    if not warm:
        return None
    plt = _pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.2))
    for stage in STAGE_ORDER:
        _cdf(a1, warm["samples"].get(stage, ()), "e2e (controller)" if stage == "e2e" else stage)
    a1.set_title("warm steady state: latency per stage")
    for name, sc in scenarios.items():
        _cdf(a2, sc["samples"].get("e2e", ()), name.replace("_", " "))
    a2.set_title("end to end (sensor -> chunk received) per scenario")
    for ax in (a1, a2):
        ax.axvline(perf["deadline_ms"], color="red", linestyle="--", label=f"deadline {perf['deadline_ms']:g} ms")
        ax.set_xscale("log")
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of chunks")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    return _png(fig)


def action_errors(eq: dict[str, Any], budgets: dict[str, Any], joints: list[str], units: list[str]) -> bytes | None:
    """Histograms of per-joint action errors (contract units) of every candidate and stage."""
    series = []
    for cid, cand in (eq.get("candidates") or {}).items():
        stages = [("golden", cand.get("golden"))] + [(f"replay {k}", v) for k, v in (cand.get("replay") or {}).items()]
        for stage, data in stages:
            if data and data.get("action_errors"):
                series.append(
                    (
                        f"{cid} / {stage}",
                        np.asarray(data["action_errors"], dtype=np.float64),
                        budgets.get(cand["precision"], {}).get("action_max_abs"),
                    )
                )
    if not series:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(joints), figsize=(6 * len(joints), 3.8), squeeze=False)
    for j, ax in enumerate(axes[0]):
        for label, errs, _ in series:
            e = errs[:, j] if errs.ndim == 2 and errs.shape[1] > j else np.zeros(0)
            e = e[np.isfinite(e)]
            if e.size:
                ax.hist(np.log10(np.maximum(e, 1e-12)), bins=40, alpha=0.55, label=label)
        limits = {b for _, _, b in series if b}
        for b in limits:
            ax.axvline(math.log10(b), color="red", linestyle="--", label=f"budget {b:g} {units[j]}")
        ax.set_title(f"{joints[j]}: |candidate - reference| action error")
        ax.set_xlabel(f"log10 error ({units[j]}; 1e-12 = exact)")
        ax.set_ylabel("waypoints")
        ax.legend(fontsize=7)
    return _png(fig)


def rollout_divergence(eq: dict[str, Any], budgets: dict[str, Any], unit: str) -> bytes | None:
    """Joint-trajectory divergence from the reference over time, per rollout episode."""
    cands = [(cid, c) for cid, c in (eq.get("candidates") or {}).items() if c.get("rollouts")]
    if not cands:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(12, 3.8))
    for k, (cid, c) in enumerate(cands):
        r = c["rollouts"]
        t = None
        for i, div in enumerate(r["divergence"]):
            t = np.arange(len(div)) * r["period_ms"]
            ax.plot(
                t,
                np.maximum(np.asarray(div, dtype=np.float64), 1e-12),
                color=f"C{k}",
                alpha=0.7,
                label=cid if i == 0 else None,
            )
        b = budgets.get(c["precision"], {}).get("rollout_max_divergence")
        if b:
            ax.axhline(b, color="red", linestyle="--", label=f"budget {b:g} {unit}")
    ax.set_yscale("log")
    ax.set_xlabel("time in episode (ms)")
    ax.set_ylabel(f"max |q_candidate - q_reference| ({unit})")
    ax.set_title("rollout divergence: same seed, same noise")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return _png(fig)


def success_rates(cl: dict[str, Any], threshold: float | None) -> bytes | None:
    """Success rate per instruction with 95 % Wilson intervals: candidate, baseline, no motion."""
    rows: list[tuple[str, Any]] = [
        ("candidate", cl.get("candidate")),
        ("baseline", cl.get("baseline")),
        ("no motion", cl.get("no_motion")),
    ]
    rows = [(name, r["per_instruction"]) for name, r in rows if r]
    if not rows:
        return None
    instructions = list(rows[0][1])
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 3.8))
    width = 0.8 / len(rows)
    x = np.arange(len(instructions))
    for k, (name, per) in enumerate(rows):
        rates = np.asarray([per[i]["rate"] for i in instructions])
        lo = np.asarray([per[i]["wilson95"][0] for i in instructions])
        hi = np.asarray([per[i]["wilson95"][1] for i in instructions])
        err = np.clip([rates - lo, hi - rates], 0.0, None)  # rounding can put a bound a hair past the rate
        ax.bar(x + k * width, rates, width, label=name, yerr=err, capsize=4)
    if threshold is not None:
        ax.axhline(threshold, color="red", linestyle="--", label=f"threshold {threshold:.0%}")
    ax.set_xticks(x + width * (len(rows) - 1) / 2, [i if len(i) < 30 else i[:27] + "..." for i in instructions])
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("success rate (95 % Wilson CI)")
    ax.set_title("closed loop: success per instruction")
    ax.legend(fontsize=7)
    return _png(fig)
