"""Plots on request: latency vs denoising steps, vs model size, vs network.

matplotlib with the Agg backend (no display needed); the file type follows the suffix
(``.png`` or ``.svg``). matplotlib is an optional dependency (``vlad[plot]``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from vlad_tools.planner.predict import predict
from vlad_tools.planner.roofline import parameter_counts
from vlad_tools.planner.spec import Hardware, PlannerError, VLAModel, load_hardware, load_model, load_network_file

KINDS = ("steps", "model-size", "network")


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise PlannerError("plots need matplotlib: pip install 'vlad[plot]' (or matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, out: Path) -> Path:
    if out.suffix.lower() not in (".png", ".svg"):
        raise PlannerError(f"{out}: plots are written as .png or .svg")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    return out


def plot(
    kind: str,
    model: VLAModel | str,
    hardware: Sequence[Hardware | str],
    out: str | Path,
    *,
    steps: Sequence[int] = (1, 2, 5, 10, 20, 50),
    scales: Sequence[float] = (0.5, 1, 1.5, 2, 3),
    networks: Sequence[str] | None = None,
    period_ms: float | None = None,
) -> Path:
    """Write a ``kind`` plot for ``model`` on each of ``hardware`` to ``out``.

    ``steps``: e2e latency vs denoising steps, one line per hardware; ``model-size``: e2e vs parameters as the backbone and action
    expert widen by ``scales``; ``network``: sync vs async rate per network for the first
    hardware as an edge server. ``period_ms`` draws the control period as a line.
    """
    if kind not in KINDS:
        raise PlannerError(f"unknown plot {kind!r} (one of {', '.join(KINDS)})")
    model = load_model(model)
    hws = [load_hardware(h) for h in hardware] or [load_hardware("rtx-4090")]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    try:
        if kind == "steps":
            if model.action.kind != "flow":
                raise PlannerError(f"{model.name} has no denoising steps (autoregressive action head)")
            for hw in hws:
                preds = [predict(model, hw, steps=s) for s in steps]
                ax.plot(steps, [p.e2e_ms for p in preds], marker="o", label=f"{hw.name} e2e")
            ax.set_xlabel("denoising steps")
            ax.set_ylabel("latency (ms)")
            ax.set_title(f"{model.name}: latency vs denoising steps")
        elif kind == "model-size":
            for hw in hws:
                preds = [predict(model.scaled(s), hw) for s in scales]
                ax.plot(
                    [sum(parameter_counts(p.model).values()) / 1e9 for p in preds],
                    [p.e2e_ms for p in preds],
                    marker="o",
                    label=hw.name,
                )
            ax.set_xlabel(f"parameters (billions; backbone and action expert x{', x'.join(f'{s:g}' for s in scales)})")
            ax.set_ylabel("latency (ms)")
            ax.set_title(f"{model.name}: latency vs model size")
        else:
            nets = list(networks or load_network_file())
            hw = hws[0]
            sync = [predict(model, hw, placement="edge", network=n, mode="sync").hz for n in nets]
            asyn = [predict(model, hw, placement="edge", network=n, mode="async").hz for n in nets]
            xs = range(len(nets))
            ax.bar([x - 0.2 for x in xs], sync, 0.4, label="sync", color="#4c72b0")
            ax.bar([x + 0.2 for x in xs], asyn, 0.4, label="async", color="#55a868")
            ax.set_xticks(list(xs), nets, rotation=30, ha="right")
            ax.set_ylabel("achievable rate (Hz)")
            ax.set_title(f"{model.name} on {hw.name} as edge server: rate vs network")
            if period_ms:
                ax.axhline(
                    1000.0 / period_ms, color="red", linestyle="--", label=f"control rate {1000 / period_ms:g} Hz"
                )
                period_ms = None
        if period_ms:
            ax.axhline(period_ms, color="red", linestyle="--", label=f"control period {period_ms:g} ms")
        ax.grid(alpha=0.3)
        ax.legend()
        return _save(fig, Path(out))
    finally:
        plt.close(fig)
