"""Figures for the regression report, written to files (PNG, SVG or PDF by the path's suffix).

Each function draws one figure from analysis results and returns the path written. Figures are
built with ``matplotlib.figure.Figure`` on the Agg canvas, never through pyplot, so nothing
touches global backend state or opens a window.

Scope: drawing only; every number comes from the other analysis modules.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def _new(width: float = 6.0, height: float = 4.0):
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def _save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


def acceptance_histogram(summary: Any, path: str | Path, *, title: str | None = None) -> Path:
    """Bar chart of rounds by number of accepted drafts (0..K).

    ``summary``: an ``AcceptanceSummary`` or the histogram itself (a sequence of counts).
    """
    hist = np.asarray(getattr(summary, "accepted_length_histogram", summary), dtype=float)
    fig, ax = _new()
    total = hist.sum()
    ax.bar(np.arange(hist.size), hist / total if total else hist, color="tab:blue")
    ax.set_xticks(np.arange(hist.size))
    ax.set_xlabel("drafts accepted in a round")
    ax.set_ylabel("share of rounds")
    ax.set_title(title or "Accepted length per round")
    return _save(fig, path)


def acceptance_by_position(summary: Any, path: str | Path, *, title: str | None = None) -> Path:
    """Acceptance rate at each draft position: cumulative (accepted/proposed) and conditional.

    ``summary``: an ``AcceptanceSummary`` or its ``by_position`` rows
    ``(position, accepted, proposed, accepted/proposed, accepted/tested)``.
    """
    rows = getattr(summary, "by_position", summary)
    if not rows:
        raise ValueError("no acceptance-by-position data to plot")
    pos = np.array([r[0] for r in rows]) + 1
    fig, ax = _new()
    ax.plot(pos, [r[3] for r in rows], "o-", label="accepted / proposed")
    ax.plot(pos, [r[4] for r in rows], "s--", label="accepted / tested (conditional)")
    ax.set_xticks(pos)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate")
    ax.legend()
    ax.set_title(title or "Acceptance by draft position")
    return _save(fig, path)


def exit_layer_histogram(summary: Any, path: str | Path, *, title: str | None = None) -> Path:
    """Share of tokens by number of layers run; ``summary`` is an ``ExitSummary`` or counts."""
    hist = np.asarray(getattr(summary, "histogram", summary), dtype=float)
    fig, ax = _new()
    total = hist.sum()
    ax.bar(np.arange(1, hist.size + 1), hist / total if total else hist, color="tab:green")
    ax.set_xlabel("layers run before exit")
    ax.set_ylabel("share of tokens")
    mean = getattr(summary, "mean_layers", None)
    if mean is not None:
        ax.axvline(mean, color="k", ls="--", label=f"mean {mean:.1f}")
        ax.legend()
    ax.set_title(title or "Exit layers")
    return _save(fig, path)


def latency_cdfs(
    series: Mapping[str, Sequence[float]], path: str | Path, *, xlabel: str = "seconds",
    title: str | None = None, log_x: bool = False,
) -> Path:
    """Empirical CDFs of latency samples, one line per name (e.g. baseline, candidate)."""
    if not series:
        raise ValueError("no latency series to plot")
    fig, ax = _new()
    for name, values in series.items():
        v = np.sort(np.asarray(values, dtype=float))
        if v.size:
            ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", label=f"{name} (n={v.size})")
    for q in (0.5, 0.95, 0.99):
        ax.axhline(q, color="0.8", lw=0.8, zorder=0)
    if log_x:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("cumulative share")
    ax.legend()
    ax.set_title(title or "Latency CDF")
    return _save(fig, path)


def forest_plot(
    deltas: Mapping[str, Any], path: str | Path, *, margin: float | None = None,
    title: str | None = None, xlabel: str = "candidate - baseline",
) -> Path:
    """Forest plot of quality deltas with their intervals, one row per group.

    ``deltas``: name -> a result with ``statistic`` and ``confidence_interval()`` (e.g.
    ``QualityDelta``) or an ``(estimate, low, high)`` tuple. ``margin`` draws -margin.
    """
    if not deltas:
        raise ValueError("no deltas to plot")
    names, est, low, high = [], [], [], []
    for name, d in deltas.items():
        if hasattr(d, "confidence_interval"):
            ci = d.confidence_interval()
            e, lo, hi = d.statistic, ci[0], ci[1]
        else:
            e, lo, hi = d
        names.append(name)
        est.append(e)
        low.append(lo)
        high.append(hi)
    y = np.arange(len(names))[::-1]
    est_a = np.asarray(est, dtype=float)
    err = np.vstack([est_a - np.asarray(low, float), np.asarray(high, float) - est_a])
    fig, ax = _new(6.0, 1.0 + 0.45 * len(names))
    ax.errorbar(est_a, y, xerr=err, fmt="o", color="k", capsize=3)
    ax.axvline(0, color="0.5", lw=1)
    if margin is not None:
        ax.axvline(-margin, color="tab:red", ls="--", label=f"-margin ({-margin:g})")
        ax.legend(loc="lower right")
    ax.set_yticks(y, names)
    ax.set_xlabel(xlabel)
    ax.set_title(title or "Quality deltas")
    return _save(fig, path)
