"""Group-sequential quality gates: a few looks at the data, the one-sided level kept overall.

A suite's items are taken in a fixed shuffled order and the quality tests are run at a few looks
(information fractions ``t_1 < ... < t_K = 1`` of its items). Two one-sided tests, each with its
own alpha-spending plan (Lan and DeMets 1983):

- non-inferiority (H0: delta <= -margin) at level ``alpha``: stop with "non-inferior" when its z
  reaches the upper boundary ``c_k``;
- a loss (H0: delta >= 0) at ``loss_alpha`` (the gate's alpha / suites): stop with "worse" when
  the loss z reaches ``d_k`` and non-inferiority is not shown.

``z`` is the test's own statistic (Tango's score z with the continuity correction for pass/fail
pairs, as in :mod:`.paired`; for per-prompt means the paired t-test's p-value turned into a normal
quantile). The boundaries come from the canonical joint distribution of the z statistics
(``corr(Z_i, Z_j) = sqrt(t_i / t_j)``, Jennison and Turnbull 2000, ch. 3), by recursive numerical
integration on a grid (Armitage, McPherson and Rowe 1969): deterministic, about 1e-7 accurate.
Spending functions:

- ``obrien-fleming`` (the Lan-DeMets form): ``alpha(t) = 2 - 2 Phi(z_{1 - alpha/2} / sqrt(t))``.
  Spends almost nothing early: a look at a third of the data stops only on an overwhelming result,
  and the final boundary is barely above the fixed design's (1.695 against 1.645 at 0.05,
  three looks), so little power is lost;
- ``pocock``: ``alpha(t) = alpha ln(1 + (e - 1) t)``, which stops earlier and costs more at the end.

The two tests are non-binding for each other (each one's boundaries ignore the other's stops),
which can only lower either error rate. The z statistics of discrete counts are not exactly
normal, so the guarantee is computed, not assumed: :func:`exact_operating` gives the exact
probability of each verdict and the expected number of items for trinomial pass/fail pairs, by
propagating the distribution of (wins, losses) from look to look (``harness/calibration/CALIBRATION.md``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import signal, stats

from .paired import NI_CONTINUITY_CORRECTION, SMALL_DISCORDANT, exact_loss_pvalue, tango_z

SPENDING = ("obrien-fleming", "pocock")
GRID = 1201          # grid points of the integration over the continuation region
GRID_SD = 8.0        # the grid spans the mean +- this many standard deviations


def spent(t, alpha: float, spending: str = "obrien-fleming"):
    """Cumulative type I error spent by information fraction ``t`` (0 < t <= 1)."""
    t = np.asarray(t, dtype=float)
    if spending == "obrien-fleming":
        return 2.0 - 2.0 * stats.norm.cdf(stats.norm.ppf(1 - alpha / 2) / np.sqrt(t))
    if spending == "pocock":
        return alpha * np.log1p((np.e - 1.0) * t)
    raise ValueError(f"spending must be one of {SPENDING}, not {spending!r}")


def fractions(looks: int) -> tuple[float, ...]:
    """Equally spaced information fractions: looks=3 -> (1/3, 2/3, 1)."""
    if not isinstance(looks, int) or looks < 1:
        raise ValueError(f"looks must be an integer >= 1, got {looks!r}")
    return tuple((k + 1) / looks for k in range(looks))


class _Walk:
    """The score process S_k = Z_k sqrt(t_k) (Brownian motion with drift ``theta`` at times t_k),
    kept as point masses on a grid over the region where no boundary was crossed yet. The grid
    ends exactly at the boundary, so the density is smooth on it and the trapezoid rule is
    second-order accurate."""

    def __init__(self, theta: float = 0.0):
        self.theta, self.t, self.x, self.w = theta, 0.0, None, None

    def cross_prob(self, t: float, c: float) -> float:
        """P(no crossing so far and Z(t) >= c)."""
        b, dt = c * np.sqrt(t), t - self.t
        if self.x is None:
            return float(stats.norm.sf((b - self.theta * t) / np.sqrt(t)))
        return float(self.w @ stats.norm.sf((b - self.x - self.theta * dt) / np.sqrt(dt)))

    def advance(self, t: float, c: float) -> float:
        """Move to look t, remove the paths that reach c there; return their probability."""
        p = self.cross_prob(t, c)
        b, dt = c * np.sqrt(t), t - self.t
        lo = min(self.theta * t - GRID_SD * np.sqrt(t), b - 1e-9)
        x = np.linspace(lo, b, GRID)
        if self.x is None:
            f = stats.norm.pdf(x, self.theta * t, np.sqrt(t))
        else:
            f = stats.norm.pdf(x[:, None] - self.x[None, :], self.theta * dt, np.sqrt(dt)) @ self.w
        h = x[1] - x[0]
        weights = np.full(GRID, h)
        weights[[0, -1]] = h / 2
        self.t, self.x, self.w = t, x, f * weights
        return p


def boundaries(fracs, alpha: float, spending: str = "obrien-fleming") -> tuple[float, ...]:
    """Upper z boundaries c_1..c_K: under H0 the chance of first reaching c_k at look k is what
    the spending function allots to it, alpha(t_k) - alpha(t_{k-1})."""
    from scipy import optimize
    fracs = tuple(float(t) for t in fracs)
    if not fracs or any(b <= a for a, b in zip(fracs, fracs[1:])) or not 0 < fracs[0] or abs(fracs[-1] - 1) > 1e-12:
        raise ValueError(f"fractions must increase strictly from > 0 to 1, got {fracs}")
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha must lie in (0, 0.5), got {alpha!r}")
    if len(fracs) == 1:
        return (float(stats.norm.ppf(1 - alpha)),)
    walk, out, before = _Walk(), [], 0.0
    for t in fracs:
        share = float(spent(t, alpha, spending)) - before
        c = optimize.brentq(lambda c: walk.cross_prob(t, c) - share, -10.0, 40.0, xtol=1e-10)
        before += walk.advance(t, c)
        out.append(float(c))
    return tuple(out)


def crossing(fracs, bounds, theta: float) -> tuple[np.ndarray, float]:
    """Per-look probabilities of first reaching the boundaries for drift theta, and their sum."""
    walk = _Walk(theta)
    p = np.array([walk.advance(t, c) for t, c in zip(fracs, bounds)])
    return p, float(p.sum())


def drift_for_power(fracs, bounds, power: float = 0.8) -> float:
    """The drift theta = (true shift) / (sd per unit) * sqrt(N) at which the plan reaches power."""
    from scipy import optimize
    return float(optimize.brentq(lambda th: crossing(fracs, bounds, th)[1] - power, -5.0, 20.0, xtol=1e-9))


def inflation(fracs, alpha: float, spending: str = "obrien-fleming", power: float = 0.8) -> float:
    """Maximum sample size of the sequential plan over the fixed design's, at the same power."""
    fixed = stats.norm.ppf(1 - alpha) + stats.norm.ppf(power)
    return (drift_for_power(fracs, boundaries(fracs, alpha, spending), power) / fixed) ** 2


def look_sizes(fracs, n: int) -> tuple[int, ...]:
    """Items at each look for a suite of n items (each look has at least one more item)."""
    if n < len(fracs):
        raise ValueError(f"{len(fracs)} looks need at least {len(fracs)} items, got {n}: use fewer looks")
    sizes, last = [], 0
    for t in fracs:
        last = max(last + 1, int(round(t * n)))
        sizes.append(min(last, n))
    return tuple(sizes)


@dataclass(frozen=True)
class Plan:
    """Looks at ``fracs`` of a suite's items; boundaries of both one-sided tests."""

    fracs: tuple[float, ...]
    alpha: float
    loss_alpha: float
    spending: str
    ni_bounds: tuple[float, ...]
    loss_bounds: tuple[float, ...]

    @classmethod
    def make(cls, looks: int, alpha: float, loss_alpha: float, spending: str = "obrien-fleming") -> "Plan":
        fr = fractions(looks)
        return cls(fr, alpha, loss_alpha, spending, boundaries(fr, alpha, spending),
                   boundaries(fr, loss_alpha, spending))

    @property
    def looks(self) -> int:
        return len(self.fracs)

    def look_sizes(self, n: int) -> tuple[int, ...]:
        return look_sizes(self.fracs, n)


def decide(plan: Plan, k: int, z_ni: float, z_loss: float) -> str | None:
    """Verdict at look k (0-based): "non-inferior", "worse", or None (go on; at the last look:
    inconclusive). ``z_loss`` is oriented so that large means a loss."""
    if z_ni >= plan.ni_bounds[k]:
        return "non-inferior"
    if z_loss >= plan.loss_bounds[k]:
        return "worse"
    return None


def binary_z(wins, losses, n, margin: float, cc: float = NI_CONTINUITY_CORRECTION):
    """(z of non-inferiority, z of a loss) of pass/fail pairs, as :mod:`.paired` computes them."""
    z_ni = tango_z(wins, losses, n, -float(margin), shift=-cc)
    z_loss = -tango_z(wins, losses, n, 0.0, shift=cc)
    # As tango_loss_pvalue: with few discordant pairs the exact sign test must agree (the smaller z).
    small = np.asarray(wins) + np.asarray(losses) < SMALL_DISCORDANT
    exact = stats.norm.isf(np.clip(exact_loss_pvalue(wins, losses), 1e-300, 1.0 - 1e-16))
    z_loss = np.where(small, np.minimum(z_loss, exact), z_loss)
    return z_ni, z_loss


def z_from_pvalue(p: float) -> float:
    """A one-sided p-value as the normal quantile it corresponds to (for the paired t-test)."""
    return float(stats.norm.isf(min(max(p, 1e-300), 1.0 - 1e-16)))


# ------------------------------------------------------------------ exact operating figures


def _trinomial(n: int, p_win: float, p_loss: float) -> np.ndarray:
    """pmf[w, l] of (wins, losses) over n pairs."""
    w = np.arange(n + 1)[:, None]
    l = np.arange(n + 1)[None, :]
    cond = p_loss / (1 - p_win) if p_win < 1 else 0.0
    pmf = stats.binom.pmf(w, n, p_win) * stats.binom.pmf(l, np.maximum(n - w, 0), cond)
    return np.where(w + l <= n, pmf, 0.0)


@dataclass(frozen=True)
class Operating:
    """Exact probabilities of each verdict and the expected items run, for one true state."""

    non_inferior: float
    worse: float
    inconclusive: float
    expected_n: float
    stop_at: tuple[float, ...]     # P(stopping at each look), the last look included


def exact_operating(plan: Plan, n: int, discordance: float, delta: float, margin: float) -> Operating:
    """The plan's verdicts on n pass/fail pairs when a share ``discordance`` of pairs disagree and
    the true change is ``delta`` (P(win) - P(loss))."""
    p_win, p_loss = (discordance + delta) / 2, (discordance - delta) / 2
    if min(p_win, p_loss) < -1e-12 or discordance > 1 + 1e-12:
        raise ValueError(f"discordance {discordance} cannot hold a change of {delta}")
    p_win, p_loss = max(p_win, 0.0), max(p_loss, 0.0)
    sizes = plan.look_sizes(n)
    ni = worse = 0.0
    stops, state, prev = [], None, 0
    for k, nk in enumerate(sizes):
        step = _trinomial(nk - prev, p_win, p_loss)
        state = step if state is None else np.clip(signal.fftconvolve(state, step)[:nk + 1, :nk + 1], 0.0, None)
        w, l = np.meshgrid(np.arange(nk + 1), np.arange(nk + 1), indexing="ij")
        z_ni, z_loss = binary_z(w, l, nk, margin)
        pass_ = z_ni >= plan.ni_bounds[k]
        fail = ~pass_ & (z_loss >= plan.loss_bounds[k])
        ni += float(state[pass_].sum())
        worse += float(state[fail].sum())
        stopped = float(state[pass_ | fail].sum())
        state = np.where(pass_ | fail, 0.0, state)
        stops.append(stopped if k < len(sizes) - 1 else stopped + float(state.sum()))
        prev = nk
    expected = float(np.dot(stops, sizes))
    return Operating(ni, worse, max(1.0 - ni - worse, 0.0), expected, tuple(stops))
