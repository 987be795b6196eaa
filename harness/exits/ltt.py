"""Learn-then-Test (Angelopoulos, Bates, Candès, Jordan, Lei 2021), as CALM uses it to pick an
early-exit threshold with a stated guarantee. Pure functions: no model, no files.

Setting: a grid of thresholds λ_1 > λ_2 > ... (ordered from the safest to the most aggressive)
and, for each of n i.i.d. calibration samples, a loss in [0, 1] at every λ_j. The risk R(λ) is the
expected loss. For each λ_j the null hypothesis H_j: R(λ_j) > ε is tested with a p-value from the
calibration losses; fixed-sequence testing walks the grid in order and rejects H_1, H_2, ... while
p_j ≤ δ, stopping at the first p_j > δ. It controls the family-wise error at δ without any
correction, because the order is fixed before seeing the data. Every rejected λ_j then has
R(λ_j) ≤ ε simultaneously, with probability ≥ 1 − δ over the calibration draw; the most aggressive
of them is returned.

p-values:
- binary losses (e.g. "some token of the sequence differs"): the exact binomial tail
  P(Bin(n, ε) ≤ Σ losses);
- losses in [0, 1] (e.g. the fraction of a sequence's tokens that differ): Hoeffding-Bentkus,
  min(exp(−n·h(min(R̂, ε), ε)), e·P(Bin(n, ε) ≤ ⌈n·R̂⌉)), h the binary relative entropy
  (Bates et al. 2021, "Distribution-free, risk-controlling prediction sets").

The smallest n that can certify anything is the one where even zero losses give p ≤ δ:
(1 − ε)^n ≤ δ, i.e. n ≥ log δ / log(1 − ε) (`n_needed`). The samples must be independent: one per
prompt, not one per token (tokens of one sequence are not independent).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats


class CalibrationError(ValueError):
    """Bad calibration input: ε or δ outside (0, 1), losses outside [0, 1], too few samples."""


def check_level(value: float, name: str) -> float:
    x = float(value)
    if not (math.isfinite(x) and 0.0 < x < 1.0):
        raise CalibrationError(f"{name} must be in (0, 1), got {value!r}")
    return x


def n_needed(epsilon: float, delta: float) -> int:
    """The fewest samples with which zero observed losses certify risk ≤ ε at level δ."""
    epsilon, delta = check_level(epsilon, "epsilon"), check_level(delta, "delta")
    return int(math.ceil(math.log(delta) / math.log1p(-epsilon)))


def binomial_pvalue(losses: int, n: int, epsilon: float) -> float:
    """P(Bin(n, ε) ≤ losses): the p-value of H: risk > ε for binary losses."""
    return float(stats.binom.cdf(int(losses), int(n), float(epsilon)))


def _h1(a: float, b: float) -> float:
    """Binary relative entropy a log(a/b) + (1−a) log((1−a)/(1−b))."""
    def term(x, y):
        return 0.0 if x == 0 else x * math.log(x / y)
    return term(a, b) + term(1 - a, 1 - b)


def hb_pvalue(risk: float, n: int, epsilon: float) -> float:
    """Hoeffding-Bentkus p-value of H: risk > ε for losses in [0, 1] with empirical mean `risk`."""
    r = min(float(risk), epsilon)
    hoeffding = math.exp(-n * _h1(r, epsilon))
    bentkus = math.e * stats.binom.cdf(int(math.ceil(n * float(risk) - 1e-9)), n, epsilon)
    return float(min(1.0, hoeffding, bentkus))


@dataclass(frozen=True)
class LTTResult:
    """`index`: position in the grid of the chosen threshold (None: nothing certified, so never
    exit); `certified`: how many grid points were rejected in sequence (all have risk ≤ ε)."""

    grid: tuple[float, ...]
    risks: tuple[float, ...]
    pvalues: tuple[float, ...]
    index: int | None
    certified: int
    epsilon: float
    delta: float
    n: int
    binary: bool

    @property
    def threshold(self) -> float:
        """The chosen threshold; 1.0 (never exit) when nothing could be certified."""
        return 1.0 if self.index is None else self.grid[self.index]


def learn_then_test(losses, grid: Sequence[float], *, epsilon: float, delta: float,
                    binary: bool | None = None) -> LTTResult:
    """Fixed-sequence Learn-then-Test. `losses`: (n, G), losses[i, j] in [0, 1] of sample i at
    grid[j]; the grid is tested in the order given (safest first). `binary`: use exact binomial
    p-values (losses must be 0/1); None decides from the data."""
    epsilon, delta = check_level(epsilon, "epsilon"), check_level(delta, "delta")
    x = np.asarray(losses, dtype=float)
    if x.ndim != 2 or x.shape[1] != len(grid):
        raise CalibrationError(f"losses must be (n, {len(grid)}) for a grid of {len(grid)} thresholds, "
                               f"got shape {x.shape}")
    n = x.shape[0]
    if not np.all((x >= 0) & (x <= 1)):
        raise CalibrationError("losses must lie in [0, 1]")
    need = n_needed(epsilon, delta)
    if n < need:
        raise CalibrationError(f"a calibration split of n={n} samples cannot certify risk <= {epsilon:g} at "
                               f"delta={delta:g}: it needs at least n={need} (and more unless nearly every loss is 0)")
    is_binary = bool(np.all((x == 0) | (x == 1))) if binary is None else binary
    if is_binary and not np.all((x == 0) | (x == 1)):
        raise CalibrationError("binary=True but some losses are strictly between 0 and 1")
    risks = x.mean(axis=0)
    if is_binary:
        pvalues = [binomial_pvalue(int(round(r * n)), n, epsilon) for r in risks]
    else:
        pvalues = [hb_pvalue(r, n, epsilon) for r in risks]
    certified = 0
    for p in pvalues:          # fixed sequence: stop at the first hypothesis not rejected
        if p > delta:
            break
        certified += 1
    return LTTResult(tuple(float(g) for g in grid), tuple(float(r) for r in risks), tuple(float(p) for p in pvalues),
                     certified - 1 if certified else None, certified, epsilon, delta, n, is_binary)


def naive_threshold(losses, grid: Sequence[float], *, epsilon: float) -> int | None:
    """The uncorrected choice LTT replaces: the most aggressive grid point whose *empirical* risk
    is ≤ ε. No guarantee (it overfits the calibration draw); kept to show what goes wrong."""
    risks = np.asarray(losses, dtype=float).mean(axis=0)
    ok = [j for j, r in enumerate(risks) if r <= epsilon]
    return ok[-1] if ok else None


def default_grid(lo: float = 0.3, points: int = 50) -> tuple[float, ...]:
    """Thresholds from 0.999 down to `lo`, denser near 1 (where the confidence of a good exit
    sits): 1 − geometric steps from 0.001 to 1 − lo."""
    return tuple(float(1 - x) for x in np.geomspace(1e-3, 1 - lo, points))
