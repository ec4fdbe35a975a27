"""The self-contained HTML report: verdicts with their budgets, plots, conditions.

One file, no external resource: CSS inline, plots as PNG data URIs, so it opens offline
and can be attached to a release. A few lines of inline script count the plots the
browser decoded and say so at the top of the page (``#render-status``), which is also
what the headless-browser test reads.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Callable
from typing import Any

from vlad_tools.gates import plots

_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; padding: 0 1em; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 1.8em; }
table { border-collapse: collapse; margin: .6em 0; width: 100%; }
th, td { border: 1px solid #ddd; padding: .25em .5em; text-align: left; vertical-align: top; font-size: 13px; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.passed { color: #05750d; font-weight: bold; } .failed, .error { color: #b00020; font-weight: bold; }
.skipped { color: #777; font-weight: bold; }
.banner { padding: .7em 1em; border-radius: 6px; font-size: 1.2em; margin: 1em 0; }
.banner.passed { background: #e5f5e7; } .banner.failed { background: #fde8ea; }
img.plot { max-width: 100%; border: 1px solid #eee; margin: .5em 0; }
figure { margin: 1em 0; } figcaption { color: #555; font-size: 13px; }
pre { background: #f7f7f7; padding: .6em; overflow-x: auto; font-size: 12px; }
#render-status { color: #555; font-size: 12px; }
"""

_SCRIPT = """
window.addEventListener('load', function () {
  var imgs = document.querySelectorAll('img.plot'), ok = 0;
  imgs.forEach(function (img) {
    var good = img.complete && img.naturalWidth > 0 && img.naturalHeight > 0;
    img.setAttribute('data-rendered', good ? img.naturalWidth + 'x' + img.naturalHeight : 'failed');
    if (good) { ok++; }
  });
  var s = document.getElementById('render-status');
  s.textContent = ok + ' of ' + imgs.length + ' plots rendered';
  s.setAttribute('data-rendered', String(ok));
  s.setAttribute('data-total', String(imgs.length));
});
"""


def _e(v: Any) -> str:
    return html.escape(str(v))


def _plot(draw, *args) -> bytes | str | None:
    """A plot's PNG, or the one-line reason it could not be drawn (the report still renders)."""
    try:
        return draw(*args)
    except Exception as exc:  # a plot must never cost the report
        return f"plot not drawn: {type(exc).__name__}: {exc}"


def _img(png: bytes | str | None, caption: str) -> str:
    if png is None:
        return ""
    if isinstance(png, str):
        return f"<p class=failed>{_e(caption)}: {_e(png)}</p>"
    data = base64.b64encode(png).decode("ascii")
    return (
        f'<figure><img class="plot" alt="{_e(caption)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{_e(caption)}</figcaption></figure>"
    )


def _gate(report: dict, name: str) -> dict | None:
    return next((g for g in report["gates"] if g["gate"] == name), None)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.7g}" if 0.99 <= abs(v) < 1 else f"{v:.4g}"
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return str(v)


def _checks_table(g: dict) -> str:
    if not g["checks"]:
        return ""
    rows = "".join(
        f"<tr><td>{_e(c['name'])}</td><td class=num>{_e(_fmt(c['value']))} {_e(c['unit'])}</td>"
        f"<td class=num>{_e(c['op'])} {_e(_fmt(c['limit']))} {_e(c['unit'])}</td>"
        f"<td class={'passed' if c['passed'] else 'failed'}>{'ok' if c['passed'] else 'FAILED'}</td>"
        f"<td>{_e(c['note'])}</td></tr>"
        for c in g["checks"]
    )
    return f"<table><tr><th>check</th><th>value</th><th>budget</th><th>verdict</th><th>note</th></tr>{rows}</table>"


def _kv_table(d: dict, prefix: str = "") -> str:
    rows = []

    def walk(x: Any, key: str) -> None:
        if isinstance(x, dict) and x:
            for k, v in x.items():
                walk(v, f"{key}.{k}" if key else str(k))
        else:
            rows.append(
                f"<tr><th>{_e(key)}</th><td>{_e(x if not isinstance(x, list) else ', '.join(map(str, x)))}</td></tr>"
            )

    walk(d, prefix)
    return "<table>" + "".join(rows) + "</table>"


def _stage_table(perf: dict) -> str:
    """p50/p95/p99/max per scenario and stage, the numbers behind the CDF."""
    head = "<tr><th>scenario</th><th>stage</th><th>count</th><th>p50 ms</th><th>p95 ms</th><th>p99 ms</th><th>max ms</th></tr>"
    rows = []
    for name, sc in (perf.get("scenarios") or {}).items():
        stages = {"e2e (controller)": sc["e2e_ms"], **sc["stages_ms"]}
        for stage, p in stages.items():
            if p.get("count"):
                rows.append(
                    f"<tr><td>{_e(name)}</td><td>{_e(stage)}</td><td class=num>{p['count']}</td>"
                    + "".join(f"<td class=num>{_e(_fmt(p[k]))}</td>" for k in ("p50", "p95", "p99", "max"))
                    + "</tr>"
                )
    return f"<table>{head}{''.join(rows)}</table>" if rows else ""


def _success_table(cl: dict) -> str:
    head = "<tr><th>policy</th><th>instruction</th><th>successes</th><th>rate</th><th>95 % Wilson CI</th><th>mean final distance</th></tr>"
    rows = []
    for name in ("candidate", "baseline", "no_motion"):
        for instr, r in ((cl.get(name) or {}).get("per_instruction") or {}).items():
            lo, hi = r["wilson95"]
            rows.append(
                f"<tr><td>{_e(name.replace('_', ' '))}</td><td>{_e(instr)}</td>"
                f"<td class=num>{r['successes']}/{r['episodes']}</td><td class=num>{r['rate']:.0%}</td>"
                f"<td class=num>{lo:.0%} - {hi:.0%}</td>"
                f"<td class=num>{1000 * r['mean_final_distance_m']:.1f} mm</td></tr>"
            )
    return f"<table>{head}{''.join(rows)}</table>"


def render_html(report: dict[str, Any]) -> str:
    """The report as one self-contained HTML page."""
    cand, base = report["candidate"], report["baseline"]
    verdict = "passed" if report["passed"] else "failed"
    parts = [
        f"<!doctype html><html lang=en><head><meta charset=utf-8><title>vlad gates: {_e(cand['release_id'])}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>Release gates: {_e(cand['release_id'])}</h1>",
        "<p id=render-status>plots not checked (scripts disabled)</p>",
        f"<div class='banner {verdict}'>{verdict.upper()}"
        + (f" (stopped after the {_e(report['stopped_after'])} gate)" if report.get("stopped_after") else "")
        + f" &mdash; {report['duration_s']:.0f} s, {_e(report['started_at'])}</div>",
        "<table><tr><th></th><th>candidate</th><th>baseline</th></tr>"
        + "".join(
            f"<tr><th>{k}</th><td>{_e(cand[k])}</td><td>{_e(base[k])}</td></tr>"
            for k in ("release_id", "path", "model", "contract_sha256")
        )
        + f"<tr><th>serving</th><td>{_e(json.dumps(cand['serving']))}</td><td>{_e(json.dumps(base['serving']))}</td></tr>"
        + "</table>",
        "<h2>Verdicts</h2><table><tr><th>gate</th><th>verdict</th><th>time</th><th>reason</th></tr>",
    ]
    for g in report["gates"]:
        parts.append(
            f"<tr><td>{_e(g['gate'])}</td><td class={_e(g['status'])}>{_e(g['status'])}</td>"
            f"<td class=num>{g['duration_s']:.1f} s</td><td>{_e('; '.join(g['reasons'][:3]))}</td></tr>"
        )
    parts.append("</table>")
    parts += _sections(report)
    parts.append(
        "<h2>Conditions</h2>"
        + _kv_table(report["conditions"])
        + "<h3>At the end of the run</h3>"
        + _kv_table(report.get("conditions_after") or {})
    )
    parts.append(
        "<h2>Plan</h2><details><summary>budgets and thresholds "
        f"({_e(report['plan'].get('source'))})</summary><pre>{_e(json.dumps(report['plan'], indent=1))}</pre></details>"
    )
    parts.append(f"<script>{_SCRIPT}</script></body></html>")
    return "\n".join(parts)


def _sections(report: dict) -> list[str]:
    """One section per gate in the report: its checks and, where its details hold what
    they need (a gate stopped early has none), its tables and plots."""
    out = []
    for name, title, needs, body in _SECTIONS:
        g = _gate(report, name)
        if g:
            full = needs is None or g["details"].get(needs)
            out.append(f"<h2>{title}</h2>" + (body(g, report["plan"]) if full else _checks_table(g)))
    return out


def _contract_section(g: dict, plan: dict) -> str:
    diffs = g["details"].get("differences", [])
    rows = "".join(
        f"<tr><td>{_e(d['path'])}</td><td>{_e(d['old'])}</td><td>{_e(d['new'])}</td>"
        f"<td>{_e(d['category'])}</td><td class={'failed' if d['breaking'] else 'passed'}>"
        f"{'breaking' if d['breaking'] else 'compatible'}</td></tr>"
        for d in diffs
    )
    return _checks_table(g) + (
        f"<table><tr><th>field</th><th>baseline</th><th>candidate</th><th>category</th><th></th></tr>{rows}</table>"
        if diffs
        else "<p>The contracts are identical.</p>"
    )


def _equivalence_section(g: dict, plan: dict) -> str:
    d = g["details"]
    budgets = plan["equivalence"]["budgets"]
    joints, units = _joint_names(d)
    skipped = "".join(f"<li>{_e(k)}: {_e(v)}</li>" for k, v in d.get("skipped", {}).items())
    return (
        f"<p>Reference: {_e(d['reference']['id'])}. Candidates: {_e(', '.join(d['candidates']))}.</p>"
        + (f"<p>Skipped here:</p><ul>{skipped}</ul>" if skipped else "")
        + _checks_table(g)
        + _img(
            _plot(plots.action_errors, d, budgets, joints, units),
            "Per-joint action error against the PyTorch fp32 reference (golden fixtures and replays)",
        )
        + _img(
            _plot(plots.rollout_divergence, d, budgets, units[0] if units else ""),
            "Rollout divergence over time in the simulator, same seed and noise",
        )
    )


def _performance_section(g: dict, plan: dict) -> str:
    d = g["details"]
    return (
        _checks_table(g)
        + _img(_plot(plots.latency_cdf, d), "Latency CDF per stage (warm steady state) and end to end per scenario")
        + _stage_table(d)
        + "<h3>Setup</h3>"
        + _kv_table(
            {
                "setup": d["setup"],
                "cold_start": d["cold_start"],
                "shape_switches": d.get("shape_switches") or "not measured",
                "planner": d.get("planner") or "no target hardware in the plan",
            }
        )
    )


def _closed_loop_section(g: dict, plan: dict) -> str:
    d = g["details"]
    return (
        _checks_table(g)
        + _img(
            _plot(plots.success_rates, d, plan["closed_loop"]["min_success_rate"]),
            "Success rate per instruction with 95 % Wilson intervals",
        )
        + _success_table(d)
        + "<h3>Safety events (candidate)</h3>"
        + _kv_table(d["candidate"]["safety"])
    )


# gate, heading, the details key its full section needs (None: always full), the section
_SECTIONS: tuple[tuple[str, str, str | None, Callable[[dict, dict], str]], ...] = (
    ("contract", "Contract gate", None, _contract_section),
    ("equivalence", "Equivalence gate", "candidates", _equivalence_section),
    ("performance", "Performance gate", "scenarios", _performance_section),
    ("closed_loop", "Closed-loop gate", "candidate", _closed_loop_section),
)


def _joint_names(eq: dict) -> tuple[list[str], list[str]]:
    """Joint names and units, as the equivalence gate wrote them from the contract."""
    return list(eq.get("joints") or []), list(eq.get("units") or [])
