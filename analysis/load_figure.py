"""figures/load.png: speedup with its band, and goodput, against the arrival rate.

Left: each candidate's paired speedup per level (E2E seconds per token, baseline over
candidate) with its 95% interval as a band, the line at 1, and the crossover (the highest rate
up to which every level paid) marked. Right: goodput (requests per second meeting every SLO;
request throughput where no SLO is set) of the baseline and each candidate, with intervals.
Drawn like analysis.figures: a `Figure` on the Agg canvas, never pyplot. Every number comes
from the load summary (harness.verdict.load.summarize over analysis.load).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator


def load_figure(load: dict[str, Any], path: str | Path) -> Path:
    fig = Figure(figsize=(10, 4), layout="constrained")
    FigureCanvasAgg(fig)
    sp_ax, gp_ax = fig.subplots(1, 2)
    decoders = list(dict.fromkeys(e["decoder"] for e in load["levels"]))
    colours = {name: f"C{i}" for i, name in enumerate(decoders)}
    has_slo = bool(load.get("slo"))
    for name in decoders:
        rows = sorted((e for e in load["levels"] if e["decoder"] == name), key=lambda e: e["rate"])
        xs = [e["rate"] for e in rows]
        if name != load["baseline"]:
            pts = [(e["rate"], e["speedup"]) for e in rows if e.get("speedup")]
            if pts:
                x = [p[0] for p in pts]
                lo = [p[1]["ci"][0] if p[1]["ci"][0] is not None else p[1]["statistic"] for p in pts]
                hi = [p[1]["ci"][1] if p[1]["ci"][1] is not None else p[1]["statistic"] for p in pts]
                sp_ax.fill_between(x, lo, hi, color=colours[name], alpha=0.2, linewidth=0)
                sp_ax.plot(x, [p[1]["statistic"] for p in pts], "o-", color=colours[name], label=name)
            c = (load.get("crossover") or {}).get(name) or {}
            if c.get("rate") is not None:
                sp_ax.axvline(c["rate"], color=colours[name], ls="--", lw=1)
                sp_ax.annotate(f"pays up to {c['rate']:g}" if c["status"] == "pays up to" else "pays at every level",
                               (c["rate"], 1.0), textcoords="offset points", xytext=(3, 6), fontsize=7,
                               color=colours[name])
            elif c.get("status") == "never pays":
                k = decoders.index(name)  # one line each, so several "never pays" do not overlap
                held = c["next"] in c.get("not_measured", ())  # max_in_flight held the lowest level back
                sp_ax.annotate(f"{name} {'not measured' if held else 'never pays'}", (xs[0], 1.0),
                               textcoords="offset points", xytext=(3, -4 - 10 * k), fontsize=7, color=colours[name])
        key = "goodput_rps" if has_slo else None
        ys, err = [], [[], []]
        for e in rows:
            m = e["metrics"]
            if key and m.get(key):
                v, (lo, hi) = m[key]["value"], m[key]["ci"]
            else:
                v, lo, hi = m.get("request_throughput_rps"), None, None
            ys.append(v if v is not None else float("nan"))
            err[0].append(max(v - lo, 0) if v is not None and lo is not None else 0)
            err[1].append(max(hi - v, 0) if v is not None and hi is not None else 0)
        gp_ax.errorbar(xs, ys, yerr=err, marker="o", capsize=2, color=colours[name], label=name)
    sp_ax.axhline(1.0, color="grey", lw=0.8)
    sp_ax.set(xscale="log", xlabel="arrival rate (requests/s)", ylabel="speedup (E2E s/token, 95% CI)",
              title="speedup vs load")
    top = max(load["rates"]) if load["rates"] else 1
    gp_ax.plot([min(load["rates"] or [1]), top], [min(load["rates"] or [1]), top], color="grey", lw=0.8, ls=":",
               label="offered load")
    gp_ax.set(xscale="log", xlabel="arrival rate (requests/s)",
              ylabel="goodput (req/s meeting every SLO)" if has_slo else "completed requests/s",
              title="goodput vs load" if has_slo else "throughput vs load (no SLO set)")
    for ax in (sp_ax, gp_ax):  # ticks at the rates tried, written plainly
        ax.set_xticks(load["rates"], [f"{r:g}" for r in load["rates"]])
        ax.xaxis.set_minor_locator(NullLocator())
    for ax in (sp_ax, gp_ax):
        if ax.get_legend_handles_labels()[0]:  # no speedup to draw (every request failed): no legend
            ax.legend(fontsize=8)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path
