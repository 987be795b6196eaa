"""What the calibration studies share: the nominal level, a rate with its Monte Carlo error, and
the exact distribution of paired pass/fail outcomes (trinomial: wins, losses, ties)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

ALPHA = 0.05


@dataclass(frozen=True)
class Rate:
    """A rejection (or pass) rate: simulated over ``studies`` studies, and exact where known."""

    simulated: float
    studies: int
    exact: float | None

    @property
    def mc_se(self) -> float:
        """Monte Carlo standard error of the simulated rate (at the exact rate if known)."""
        p = self.exact if self.exact is not None else self.simulated
        return float(np.sqrt(max(p * (1 - p), 1e-12) / self.studies))


def trinomial_grid(n: int, p_win: float, p_loss: float):
    """All (wins, losses) with wins + losses <= n and their probabilities."""
    w = np.arange(n + 1)[:, None]
    l = np.arange(n + 1)[None, :]
    feasible = (w + l) <= n
    cond = p_loss / (1 - p_win) if p_win < 1 else 0.0
    pmf = stats.binom.pmf(w, n, p_win) * stats.binom.pmf(l, np.maximum(n - w, 0), cond)
    w, l = np.broadcast_arrays(w, l)
    return w[feasible], l[feasible], pmf[feasible]


def fmt(rate: Rate) -> str:
    exact = f"{rate.exact:.4f}" if rate.exact is not None else "-"
    return f"{exact} / {rate.simulated:.4f} ± {1.96 * rate.mc_se:.4f}"


GRIDS = ("full", "small")


def pick(full, small, grid: str):
    """A report's grid: the full one (``make calibrate``) or a small one that runs every section in
    seconds (the unit tests)."""
    if grid not in GRIDS:
        raise ValueError(f"grid must be one of {GRIDS}, not {grid!r}")
    return small if grid == "small" else full
