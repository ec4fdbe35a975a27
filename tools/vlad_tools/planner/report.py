"""Plain-text tables of predictions and measurements, for ``vladctl plan``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vlad_tools.planner.measure import COMPONENTS, Measurement
from vlad_tools.planner.predict import Prediction

_LABELS = {"vision": "vision", "backbone": "VLM / trunk prefill", "action": "action"}


def _label(p: Prediction, name: str) -> str:
    if name == "vision":
        return f"vision ({p.model.vision.cameras} camera{'s' * (p.model.vision.cameras > 1)})"
    if name == "action":
        a = p.model.action
        return f"action ({a.steps} steps x {a.chunk})" if a.kind == "flow" else f"action ({a.decode_tokens} tokens AR)"
    return _LABELS[name]


def _num(x: float) -> str:
    """Two decimals as published for ms-scale figures, three significant digits below 1."""
    return f"{x:.2f}" if abs(x) >= 1 or x == 0 else f"{x:.3g}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    fmt = lambda cells: "  ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right, strict=True))  # noqa: E731
    return [fmt(headers), fmt(["-" * w for w in widths]), *(fmt(r) for r in rows)]


def format_prediction(p: Prediction, feasibility: dict[str, Any] | None = None) -> str:
    """A prediction as a component table with its totals."""
    m, hw = p.model, p.hardware
    net = " -> ".join(n.name for n in p.path) or "none"
    lines = [f"{m.name} on {hw.name} ({p.precision}, batch {m.batch}), {p.placement}, {p.mode}, network: {net}"]
    rows = []
    for name, c in p.components.items():
        b = c.bytes(p.precision)
        rows.append(
            [
                _label(p, name),
                _num(c.ms),
                c.bound,
                _num(c.flops / 1e9),
                _num(b / 1e6),
                f"{c.flops / b:.1f}" if b else "-",
            ]
        )
    for label, ms in (
        ("host -> device", p.host["h2d"]),
        ("device -> host", p.host["d2h"]),
        ("network up", p.net.up_ms),
        ("network down", p.net.down_ms),
    ):
        if ms:
            rows.append([label, _num(ms), "link", "", "", ""])
    lines += _table(["component", "ms", "bound", "GFLOP", "MB", "FLOP/B"], rows, [False, True, False, True, True, True])
    rate = f"{p.hz:.1f} Hz {p.mode}" + ("" if p.mode == "sync" else f" (sync {p.sync_hz:.1f} Hz)")
    if p.mode == "dual":
        rate += f", System 2 (backbone) at {p.s2_hz:g} Hz"
    lines.append(
        f"compute {_num(p.compute_ms)} ms; end to end {_num(p.e2e_ms)} ms"
        + (" (System 1 loop)" if p.mode == "dual" else "")
        + f"; {rate}"
    )
    gb = hw.gb
    lines.append(
        f"memory {_num(p.memory['total'] / gb)} of {hw.memory_bytes / gb:g} GB "
        f"(weights {_num(p.memory['weights'] / gb)}, KV cache {_num(p.memory['kv_cache'] / gb)}): "
        + ("fits" if p.fits else "DOES NOT FIT")
    )
    if feasibility is not None:
        f = feasibility
        yes = lambda ok: "met" if ok else "MISSED"  # noqa: E731
        lines.append(
            f"contract {f['contract']['model_id']} {f['contract']['version']}: deadline {f['e2e_deadline_ms']:g} ms "
            f"{yes(f['meets_deadline'])}, control period {f['control_period_ms']:g} ms {yes(f['meets_period'])}, "
            f"chunk horizon {f['chunk_horizon_ms']:g} ms {yes(f['sustains_chunk_rate'])}"
            + (f"; FLAGGED: {'; '.join(f['reasons'])}" if f["flagged"] else "")
        )
    return "\n".join(lines)


def format_comparison(predictions: Sequence[Prediction]) -> str:
    """One row per prediction (e.g. per hardware): components, e2e, Hz, memory fit."""
    rows = []
    for p in predictions:
        c = p.components
        rows.append(
            [
                p.hardware.name,
                *(f"{_num(c[n].ms)} {c[n].bound[0]}" for n in COMPONENTS),
                _num(p.compute_ms),
                _num(p.e2e_ms),
                f"{p.hz:.1f}",
                "yes" if p.fits else "no",
            ]
        )
    head = predictions[0]
    net = " -> ".join(n.name for n in head.path)
    title = (
        f"{head.model.name} ({head.precision}), {head.placement}{' over ' + net if net else ''}, {head.mode}; "
        "ms (c = compute-bound, m = memory-bound; e2e adds copies and network)"
    )
    return "\n".join(
        [
            title,
            *_table(
                ["hardware", "vision", "VLM", "action", "compute", "e2e", "Hz", "fits"],
                rows,
                [False, True, True, True, True, True, True, False],
            ),
        ]
    )


def format_measurement(m: Measurement) -> str:
    """Measured vs predicted per component, with the machine's peaks and conditions."""
    pk = m.peaks
    flops = ", ".join(f"{k} {v / 1e9:.1f}" for k, v in pk.matmul_flops.items())
    c = pk.conditions
    lines = [
        f"{m.release} on this machine ({m.backend}, {m.prediction.precision}, {pk.threads} thread"
        f"{'s' * (pk.threads > 1)}), model description {m.model.name}",
        f"peaks (micro-benchmarks): matmul {flops} GFLOP/s ({c.get('matmul')}), "
        f"memory copy {pk.bandwidth / 1e9:.1f} GB/s ({c.get('copy')})",
        f"conditions: {c.get('cpu')}, {c.get('usable_cpus')}/{c.get('logical_cpus')} CPUs usable, "
        f"load average {c.get('load_avg')}, numpy {c.get('numpy')}"
        + (f", torch {c['torch']}" if c.get("torch") else ""),
    ]
    rows = []
    for name in (*COMPONENTS, "e2e"):
        predicted = m.prediction.compute_ms if name == "e2e" else m.prediction.components[name].ms
        measured = m.e2e["p50_ms"] if name == "e2e" else m.components.get(name)
        eff = m.efficiency(name)
        bound = "" if name == "e2e" else m.prediction.components[name].bound
        label = "end to end (release backend)" if name == "e2e" else _label(m.prediction, name)
        rows.append(
            [
                label,
                f"{predicted:.3f}",
                "-" if measured is None else f"{measured:.3f}",
                "-" if eff is None else f"{100 * eff:.1f} %",
                bound,
            ]
        )
    lines += _table(
        ["component", "roofline ms", "measured ms", "efficiency", "bound"], rows, [False, True, True, True, False]
    )
    e = m.e2e
    lines.append(
        f"end to end: p50 {e['p50_ms']:.3f} ms, p95 {e['p95_ms']:.3f} ms over {int(e['calls'])} calls "
        f"(Session.infer wall time; engine p50 {e['engine_p50_ms']:.3f} ms)"
    )
    if m.components:
        lines.append(
            f"components: {m.profile['method']}, p50 of {m.profile['calls']} runs each; sum "
            f"{sum(m.components.values()):.3f} ms"
        )
    x = m.execution
    if x:
        lines.append(
            f"a robot at {x['control_period_ms']:g} ms per period executing {x['chunk']}-waypoint chunks "
            f"(valid {x['action_validity_ms']:g} ms) at this latency gets policy waypoints at "
            f"{x['sync']['control_hz']:.2f} Hz synchronously, {x['async']['control_hz']:.2f} Hz "
            f"asynchronously (vlad.client.ChunkExecutor), of the {x['async']['tick_hz']:.0f} Hz it asks for"
        )
    lines += [f"note: {n}" for n in m.notes]
    return "\n".join(lines)
