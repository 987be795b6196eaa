"""Paired tests on quality: candidate against baseline, prompt by prompt.

Orientation everywhere: ``delta = candidate - baseline``; for pass/fail data the discordant pairs
are *losses* (baseline passed, candidate failed) and *wins* (baseline failed, candidate passed),
so ``delta = (wins - losses) / n``.

- :func:`mcnemar` -- McNemar's test, exact binomial on the discordant pairs, **mid-p** variant by
  default. Why mid-p: the exact conditional test (p = 2 P[X <= min(b, c)], X ~ Bin(b + c, 1/2),
  statsmodels' ``mcnemar(exact=True)``) never exceeds the nominal level but is needlessly
  conservative; with 10-20 discordant pairs its real false-alarm rate at 0.05 is 0.02-0.04, and
  with fewer it cannot reject at all. The mid-p version (subtract half the probability of the
  observed table) has a false-alarm rate close to the nominal level and, for discordance up to
  0.5, not above it: exactly computed over n = 10..1000 pairs and discordance rates up to 0.5
  (same-prompt decoders are positively correlated; 0.5 is independence at a 50% pass rate) its
  unconditional size peaks at 0.04995 (see ``harness/calibration/CALIBRATION.md``). Fagerland, Lydersen and
  Laake (BMC Med Res Methodol 2013, 13:91) reach the same recommendation. Above a discordance of
  ~0.7 (decoders disagreeing on most prompts) it can exceed the level slightly (0.0510 at 0.8,
  0.077 at 1.0); there a difference is plain anyway. ``variant="exact"`` gives the conditional test.
- :func:`paired_proportion_difference` -- the difference in pass rates with Tango's score
  interval (Tango 1998) or a paired bootstrap interval.
- :func:`wilcoxon_signed_rank` -- ``scipy.stats.wilcoxon`` on continuous scores or latencies,
  with a paired bootstrap interval for the mean difference.
- :func:`non_inferiority` -- one-sided test of H0: delta <= -margin. Pass/fail data use Tango's
  score test with a continuity correction of 1/2 (without it the exact type I error at the
  margin reaches 0.055-0.07 for some n and discordance; with it, <= 0.05 wherever discordance
  <= 0.95, see CALIBRATION.md); continuous scores use the one-sided paired t-test. ``passed`` is
  true exactly when the one-sided lower confidence bound of delta lies above -margin.
  "p > 0.05, so no difference" is never a pass.
- :func:`holm` -- Holm's step-down adjustment across the tests a gate looks at.

Every function is pure; bootstrap randomness comes from ``rng``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

from ._common import (
    ConfidenceInterval, as_rng, binary_array, bootstrap_ci, check_level, float_array, paired_arrays,
)

MCNEMAR_VARIANTS = ("mid-p", "exact")
NI_CONTINUITY_CORRECTION = 0.5


# --------------------------------------------------------------------------- counts and scores


def discordant_counts(baseline, candidate) -> tuple[int, int, int]:
    """(losses, wins, n) of paired pass/fail outcomes."""
    base, cand = paired_arrays(baseline, candidate, binary_array)
    losses = int(np.sum((base == 1) & (cand == 0)))
    wins = int(np.sum((base == 0) & (cand == 1)))
    return losses, wins, int(base.size)


def tango_z(wins, losses, n, delta0, *, shift: float = 0.0):
    """Tango's score statistic for H0: delta = delta0 (vectorised over counts).

    ``z = (wins - losses - n*delta0 + shift) / sqrt(n * (2*p21 + delta0*(1 - delta0)))`` with
    ``p21`` the restricted MLE of the loss probability under delta0 (Tango 1998, eq. 3-5).
    ``shift`` applies a continuity correction (negative for an upper-tail test).
    """
    w, l = np.asarray(wins, dtype=float), np.asarray(losses, dtype=float)
    n = float(n)
    a = 2.0 * n
    b = -w - l + (2.0 * n - w + l) * delta0
    c = -l * delta0 * (1.0 - delta0)
    p21 = (np.sqrt(np.maximum(b * b - 4.0 * a * c, 0.0)) - b) / (2.0 * a)
    var = n * (2.0 * p21 + delta0 * (1.0 - delta0))
    num = w - l - n * delta0 + shift
    with np.errstate(divide="ignore", invalid="ignore"):
        z = num / np.sqrt(np.maximum(var, 0.0))
    degenerate = var <= 1e-12 * max(n, 1.0)
    return np.where(degenerate, np.sign(num) * np.where(num == 0, 0.0, np.inf), z)


def _tango_bound(wins: int, losses: int, n: int, zq: float, side: str, cc: float) -> float:
    """Lower (side="low") or upper bound of delta where Tango's z crosses +-zq."""
    tiny = 1e-10
    if side == "low":
        f = lambda d: float(tango_z(wins, losses, n, d, shift=-cc)) - zq  # noqa: E731
        lo, hi = -1.0 + tiny, (wins - losses) / n
        if f(lo) <= 0:
            return -1.0
        if f(hi) > 0:  # only possible for zq <= 0 (confidence below 1/2)
            hi = 1.0 - tiny
        return float(optimize.brentq(f, lo, hi, xtol=1e-12))
    f = lambda d: float(tango_z(wins, losses, n, d, shift=cc)) + zq  # noqa: E731
    lo, hi = (wins - losses) / n, 1.0 - tiny
    if f(hi) >= 0:
        return 1.0
    if f(lo) < 0:
        lo = -1.0 + tiny
    return float(optimize.brentq(f, lo, hi, xtol=1e-12))


def tango_interval(
    wins: int, losses: int, n: int, *, confidence_level: float = 0.95,
    alternative: str = "two-sided", continuity_correction: float = 0.0,
) -> ConfidenceInterval:
    """Tango's score interval for a paired difference in proportions, (wins - losses) / n.

    ``alternative="greater"`` gives the one-sided lower bound (upper end 1.0), ``"less"`` the
    one-sided upper bound (lower end -1.0).
    """
    level = check_level(confidence_level)
    if n <= 0 or wins < 0 or losses < 0 or wins + losses > n:
        raise ValueError(f"need 0 <= wins + losses <= n and n > 0; got wins={wins}, losses={losses}, n={n}")
    if alternative == "two-sided":
        zq = stats.norm.ppf(1 - (1 - level) / 2)
        return ConfidenceInterval(
            _tango_bound(wins, losses, n, zq, "low", continuity_correction),
            _tango_bound(wins, losses, n, zq, "high", continuity_correction),
        )
    zq = stats.norm.ppf(level)
    if alternative == "greater":
        return ConfidenceInterval(_tango_bound(wins, losses, n, zq, "low", continuity_correction), 1.0)
    if alternative == "less":
        return ConfidenceInterval(-1.0, _tango_bound(wins, losses, n, zq, "high", continuity_correction))
    raise ValueError(f"alternative must be 'two-sided', 'greater' or 'less', not {alternative!r}")


# --------------------------------------------------------------------------------- McNemar


def mcnemar_pvalue(losses, wins, *, variant: str = "mid-p"):
    """Two-sided exact McNemar p-value from the discordant counts (vectorised).

    ``"exact"``: 2 P[X <= k], X ~ Bin(losses + wins, 1/2), k = min(losses, wins), capped at 1.
    ``"mid-p"``: the same minus P[X = k] (half the probability of the observed table, twice).
    """
    if variant not in MCNEMAR_VARIANTS:
        raise ValueError(f"variant must be one of {MCNEMAR_VARIANTS}, not {variant!r}")
    b, c = np.asarray(losses), np.asarray(wins)
    d, k = b + c, np.minimum(b, c)
    p = 2.0 * stats.binom.cdf(k, d, 0.5)
    if variant == "mid-p":
        p = p - stats.binom.pmf(k, d, 0.5)
    return np.minimum(p, 1.0)


@dataclass(frozen=True)
class McNemarResult:
    """McNemar's test. ``statistic`` is delta = candidate - baseline pass rate = (wins - losses)/n;
    ``confidence_interval()`` is Tango's score interval for it."""

    statistic: float
    pvalue: float
    n: int
    losses: int
    wins: int
    variant: str
    ci_low: float
    ci_high: float
    confidence_level: float

    def confidence_interval(self) -> ConfidenceInterval:
        return ConfidenceInterval(self.ci_low, self.ci_high)


def mcnemar(baseline, candidate, *, variant: str = "mid-p", confidence_level: float = 0.95) -> McNemarResult:
    """Exact McNemar test on paired pass/fail outcomes (see the module docstring for the variant)."""
    losses, wins, n = discordant_counts(baseline, candidate)
    ci = tango_interval(wins, losses, n, confidence_level=confidence_level)
    return McNemarResult(
        statistic=(wins - losses) / n, pvalue=float(mcnemar_pvalue(losses, wins, variant=variant)),
        n=n, losses=losses, wins=wins, variant=variant,
        ci_low=ci.low, ci_high=ci.high, confidence_level=check_level(confidence_level),
    )


# ---------------------------------------------------------------- difference in proportions


@dataclass(frozen=True)
class DifferenceResult:
    """A paired difference (candidate - baseline) with an interval.

    ``pvalue`` tests delta = 0, two-sided (Tango's score test for proportions, i.e. the
    asymptotic McNemar test without correction, consistent with the score interval).
    """

    statistic: float
    pvalue: float
    n: int
    baseline_mean: float
    candidate_mean: float
    ci_low: float
    ci_high: float
    confidence_level: float
    method: str

    def confidence_interval(self) -> ConfidenceInterval:
        return ConfidenceInterval(self.ci_low, self.ci_high)


def _mean_diff(base, cand, axis=-1):
    return np.mean(cand, axis=axis) - np.mean(base, axis=axis)


def paired_proportion_difference(
    baseline, candidate, *, confidence_level: float = 0.95, method: str = "tango",
    n_resamples: int = 9999, rng: np.random.Generator | int | None = None,
) -> DifferenceResult:
    """Difference in pass rates with Tango's score interval (``"tango"``) or a paired
    bootstrap interval (``"bootstrap"``, BCa over pairs)."""
    level = check_level(confidence_level)
    base, cand = paired_arrays(baseline, candidate, binary_array)
    losses, wins, n = discordant_counts(base, cand)
    z0 = float(tango_z(wins, losses, n, 0.0))
    pvalue = float(2 * stats.norm.sf(abs(z0)))
    if method == "tango":
        ci = tango_interval(wins, losses, n, confidence_level=level)
    elif method == "bootstrap":
        ci = bootstrap_ci((base.astype(float), cand.astype(float)), _mean_diff,
                          confidence_level=level, n_resamples=n_resamples, rng=as_rng(rng))
    else:
        raise ValueError(f"method must be 'tango' or 'bootstrap', not {method!r}")
    return DifferenceResult(
        statistic=(wins - losses) / n, pvalue=pvalue, n=n,
        baseline_mean=float(base.mean()), candidate_mean=float(cand.mean()),
        ci_low=ci.low, ci_high=ci.high, confidence_level=level, method=method,
    )


# ------------------------------------------------------------------------------- Wilcoxon


def signed_rank_pvalue(differences, *, axis: int = -1, zero_method: str = "wilcox"):
    """Two-sided ``scipy.stats.wilcoxon`` p-value(s) of paired differences along ``axis``.

    scipy's method="auto": the exact null distribution for n <= 50 without ties or zeros, the
    normal approximation (tie-corrected) otherwise. Differences that are all zero give p = 1.
    """
    d = np.asarray(differences, dtype=float)
    nonzero = np.any(d != 0, axis=axis)
    if not np.any(nonzero):
        return np.ones(nonzero.shape) if nonzero.ndim else 1.0
    safe = np.where(np.expand_dims(nonzero, axis), d, 1.0)  # all-zero rows: dummy, set to 1 below
    p = stats.wilcoxon(safe, zero_method=zero_method, axis=axis).pvalue
    return np.where(nonzero, p, 1.0) if np.ndim(p) else (float(p) if nonzero else 1.0)


@dataclass(frozen=True)
class WilcoxonResult:
    """Wilcoxon signed-rank test on candidate - baseline.

    ``statistic`` is scipy's (the smaller signed-rank sum for two-sided tests); ``estimate`` the
    mean difference and ``confidence_interval()`` its paired bootstrap interval.
    """

    statistic: float
    pvalue: float
    n: int
    estimate: float
    median_difference: float
    ci_low: float
    ci_high: float
    confidence_level: float

    def confidence_interval(self) -> ConfidenceInterval:
        return ConfidenceInterval(self.ci_low, self.ci_high)


def wilcoxon_signed_rank(
    baseline, candidate, *, zero_method: str = "wilcox", confidence_level: float = 0.95,
    n_resamples: int = 9999, rng: np.random.Generator | int | None = None,
) -> WilcoxonResult:
    """Paired Wilcoxon signed-rank test (``scipy.stats.wilcoxon``) plus a paired bootstrap
    BCa interval for the mean difference."""
    level = check_level(confidence_level)
    base, cand = paired_arrays(baseline, candidate, float_array)
    d = cand - base
    if np.any(d != 0):
        res = stats.wilcoxon(d, zero_method=zero_method)
        statistic, pvalue = float(res.statistic), float(res.pvalue)
    else:
        statistic, pvalue = 0.0, 1.0
    ci = bootstrap_ci((d,), lambda x, axis: np.mean(x, axis=axis), confidence_level=level,
                      n_resamples=n_resamples, rng=as_rng(rng))
    return WilcoxonResult(
        statistic=statistic, pvalue=pvalue, n=int(d.size), estimate=float(d.mean()),
        median_difference=float(np.median(d)), ci_low=ci.low, ci_high=ci.high,
        confidence_level=level,
    )


# ------------------------------------------------------------------------- non-inferiority


def tango_ni_pvalue(wins, losses, n, *, margin: float,
                    continuity_correction: float = NI_CONTINUITY_CORRECTION):
    """One-sided p-value of H0: delta <= -margin (Tango score test, vectorised over counts)."""
    z = tango_z(wins, losses, n, -float(margin), shift=-continuity_correction)
    return stats.norm.sf(z)


@dataclass(frozen=True)
class NonInferiorityResult:
    """Non-inferiority of the candidate: H0 delta <= -margin against H1 delta > -margin.

    ``statistic`` is the observed delta; ``lower_bound`` the one-sided (1 - alpha) lower
    confidence bound; ``passed`` is ``lower_bound > -margin`` (equivalently ``pvalue < alpha``).
    """

    statistic: float
    pvalue: float
    n: int
    margin: float
    alpha: float
    lower_bound: float
    passed: bool
    method: str

    def confidence_interval(self) -> ConfidenceInterval:
        """The one-sided interval (lower_bound, upper limit of the metric)."""
        return ConfidenceInterval(self.lower_bound, 1.0 if self.method == "tango-score" else np.inf)


def _is_binary(a: np.ndarray) -> bool:
    return bool(np.all((a == 0) | (a == 1)))


def non_inferiority(
    baseline, candidate, *, margin: float, alpha: float = 0.05, method: str = "auto",
    continuity_correction: float = NI_CONTINUITY_CORRECTION,
) -> NonInferiorityResult:
    """One-sided non-inferiority test of candidate against baseline at level ``alpha``.

    ``margin`` (> 0, in the metric's units, e.g. 0.02 = two points of pass rate) comes from the
    gate's config. ``method``: ``"tango-score"`` for pass/fail outcomes, ``"paired-t"`` for
    continuous scores, ``"auto"`` picks by the data.
    """
    if not margin > 0:
        raise ValueError(f"margin must be > 0, got {margin!r}")
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha must lie in (0, 0.5), got {alpha!r}")
    base, cand = paired_arrays(baseline, candidate, float_array)
    if method == "auto":
        method = "tango-score" if _is_binary(base) and _is_binary(cand) else "paired-t"
    n = int(base.size)
    delta = float(cand.mean() - base.mean())
    if method == "tango-score":
        losses, wins, _ = discordant_counts(base, cand)
        delta = (wins - losses) / n  # from counts: no rounding in the mean of each side
        pvalue = float(tango_ni_pvalue(wins, losses, n, margin=margin,
                                       continuity_correction=continuity_correction))
        lower = tango_interval(wins, losses, n, confidence_level=1 - alpha, alternative="greater",
                               continuity_correction=continuity_correction).low
        passed = pvalue < alpha  # the test itself; the bound is its inversion, for display
    elif method == "paired-t":
        if n < 2:
            raise ValueError("the paired t-test needs at least 2 pairs")
        d = cand - base
        # A spread within float rounding of the differences' scale is no spread: 0.55 - 0.6 and
        # 0.35 - 0.4 differ in the 16th digit, and the t statistic divided by that noise (p ~ 1e-16).
        if constant_differences(d):
            # No spread to estimate a variance from: the t-test is undefined, and "p = 0" would
            # pass two prompts. The exact sign test still holds: every difference above the
            # margin has chance 0.5**n under a median at it. A constant difference at the margin
            # (0.3 - 0.4 = -0.10000000000000003) is at it, not past it.
            lower = float(d.min())
            pvalue = 1.0 if at_or_below(lower, -margin) else 0.5 ** n
            passed = pvalue < alpha
        else:
            res = stats.ttest_1samp(d, -margin, alternative="greater")
            pvalue = float(res.pvalue)
            lower = float(res.confidence_interval(confidence_level=1 - alpha).low)
            passed = pvalue < alpha
    else:
        raise ValueError(f"method must be 'auto', 'tango-score' or 'paired-t', not {method!r}")
    return NonInferiorityResult(
        statistic=delta, pvalue=pvalue, n=n, margin=float(margin), alpha=float(alpha),
        lower_bound=lower, passed=bool(passed), method=method,
    )


# ------------------------------------------------------------- losses, margins and sample size

# Two numbers closer than this (relative to the margin's scale) are equal: 4/10 -> 3/10 is a
# change of exactly -0.10, though float arithmetic gives -0.10000000000000003.
MARGIN_TOL = 1e-9


def at_or_below(x: float, threshold: float, *, tol: float = MARGIN_TOL) -> bool:
    """x <= threshold, with floating-point noise at the threshold counted as equality."""
    return bool(x <= threshold + tol * max(1.0, abs(threshold)))


def below(x: float, threshold: float, *, tol: float = MARGIN_TOL) -> bool:
    """x < threshold beyond floating-point noise."""
    return bool(x < threshold - tol * max(1.0, abs(threshold)))


# Below this many discordant pairs the loss test also needs the exact sign test (McNemar exact,
# one-sided): with 4 losses and no win Tango's z says p = 0.03, the exact chance is 0.5**4 = 0.0625.
SMALL_DISCORDANT = 20


def exact_loss_pvalue(wins, losses):
    """One-sided exact McNemar p-value of a loss, P(X >= losses), X ~ Bin(wins + losses, 1/2)
    (``scipy.stats.binomtest(losses, wins + losses, 0.5, alternative="greater")``; vectorised;
    1 without discordant pairs)."""
    w, l = np.asarray(wins), np.asarray(losses)
    return stats.binom.sf(l - 1, w + l, 0.5)


def tango_loss_pvalue(wins, losses, n, *, continuity_correction: float = NI_CONTINUITY_CORRECTION):
    """One-sided p-value of H0: delta >= 0 against a loss, delta < 0 (Tango score test with the
    same continuity correction as the non-inferiority test; vectorised over counts). With fewer
    than ``SMALL_DISCORDANT`` discordant pairs the exact sign test must agree: the larger of the
    two p-values."""
    z = tango_z(wins, losses, n, 0.0, shift=continuity_correction)
    p = stats.norm.cdf(z)
    small = np.asarray(wins) + np.asarray(losses) < SMALL_DISCORDANT
    return np.where(small, np.maximum(p, exact_loss_pvalue(wins, losses)), p)


def _exact_loss_bound(wins: int, losses: int, n: int, level: float) -> float:
    """Upper bound of delta from the exact sign test on the discordant pairs: the one-sided
    Clopper-Pearson bound of P(win | discordant), as delta = (d / n) (2 q - 1). Below 0 exactly
    when :func:`exact_loss_pvalue` is below 1 - level."""
    d = wins + losses
    if d == 0:
        return 0.0
    q = 1.0 if wins == d else float(stats.beta.ppf(level, wins + 1, d - wins))
    return d / n * (2.0 * q - 1.0)


def sign_sample_size(level: float) -> int:
    """Units an exact sign test needs before it can reject at ``level``: the least n with
    0.5**n < level (5 at 0.05)."""
    return int(np.floor(np.log2(1.0 / float(level)))) + 1


def constant_differences(d) -> bool:
    """Paired differences without spread beyond float rounding of their scale (no variance to
    estimate: the t-test is undefined and only the sign test holds)."""
    d = np.asarray(d, dtype=float)
    return bool(np.ptp(d) <= MARGIN_TOL * max(1.0, float(np.max(np.abs(d)))))


def loss_upper_bound(
    *, method: str, level: float, n: int, wins: int | None = None, losses: int | None = None,
    mean: float | None = None, sd: float | None = None,
    continuity_correction: float = NI_CONTINUITY_CORRECTION,
) -> float:
    """The one-sided upper confidence bound of delta at ``level``: ``"tango-score"`` from the
    discordant counts (inverting :func:`tango_loss_pvalue`'s test; with fewer than
    ``SMALL_DISCORDANT`` discordant pairs no lower than the exact sign test's bound), ``"paired-t"``
    from the mean and standard deviation of the paired differences (without spread, the sign test's:
    the mean where 0.5**n < 1 - level, else +inf, no bound). A bound below 0 is a significant loss
    at 1 - level; below -margin, a loss larger than the margin allows."""
    level = check_level(level, "level")
    if method == "tango-score":
        bound = tango_interval(int(wins), int(losses), int(n), confidence_level=level, alternative="less",
                               continuity_correction=continuity_correction).high
        if int(wins) + int(losses) < SMALL_DISCORDANT:  # as tango_loss_pvalue: the exact sign test must agree
            bound = max(bound, _exact_loss_bound(int(wins), int(losses), int(n), level))
        return float(bound)
    if method == "paired-t":
        if sd is None or n < 2 or sd <= MARGIN_TOL * max(1.0, abs(float(mean))):
            # No spread (or only float rounding of it): the t bound would be the mean itself, and
            # two prompts that lose alike would be "worse". The exact sign test decides: n equal
            # differences have chance 0.5**n of all falling on one side of the median; below
            # 1 - level the bound is their value, otherwise there is no bound.
            return float(mean) if n >= 1 and 0.5 ** n < 1.0 - level else float("inf")
        return float(mean + stats.t.ppf(level, n - 1) * sd / np.sqrt(n))
    raise ValueError(f"method must be 'tango-score' or 'paired-t', not {method!r}")


def ni_sample_size(
    discordance: float, margin: float, *, alpha: float = 0.05, power: float = 0.8, true_delta: float = 0.0,
    continuity_correction: float = NI_CONTINUITY_CORRECTION,
) -> int | None:
    """Pairs the Tango non-inferiority test needs to pass with probability ``power`` when the
    true change is ``true_delta`` and a share ``discordance`` of pairs disagree (normal
    approximation of the score test, continuity correction included). None when no n can
    (true_delta at or below -margin, or discordance too small for true_delta)."""
    m, d1 = float(margin), float(true_delta)
    psi = max(float(discordance), abs(d1))
    if not m > 0 or at_or_below(d1, -m) or psi > 1:
        return None
    d0 = -m
    # Tango's restricted MLE of the loss probability under delta0 for the expected table.
    b = -psi + (2.0 - d1) * d0
    c = -((psi - d1) / 2.0) * d0 * (1.0 - d0)
    p21 = (np.sqrt(max(b * b - 8.0 * c, 0.0)) - b) / 4.0
    sigma0 = np.sqrt(max(2.0 * p21 + d0 * (1.0 - d0), 1e-12))
    sigma1 = np.sqrt(max(psi - d1 * d1, 0.0))
    za, zb = stats.norm.ppf(1 - alpha), stats.norm.ppf(power)
    k = za * sigma0 + zb * sigma1
    shift = d1 + m
    root = (k + np.sqrt(k * k + 4.0 * shift * continuity_correction)) / (2.0 * shift)
    return int(np.ceil(root * root))


def t_sample_size(sd: float, margin: float, *, alpha: float = 0.05, power: float = 0.8,
                  true_delta: float = 0.0) -> int | None:
    """Units the paired-t non-inferiority test needs (t quantiles, iterated), for paired
    differences of standard deviation ``sd``; None where true_delta is at or below -margin."""
    shift = float(true_delta) + float(margin)
    if not shift > 0 or at_or_below(true_delta, -margin):
        return None
    if not sd > 0:  # no spread: only the exact sign test decides, and it needs 0.5**n < alpha
        return sign_sample_size(alpha)
    n = 2.0
    for _ in range(50):
        nxt = ((stats.t.ppf(1 - alpha, n - 1) + stats.t.ppf(power, n - 1)) * sd / shift) ** 2
        if abs(nxt - n) < 0.5:
            break
        n = max(nxt, 2.0)
    return int(np.ceil(max(nxt, 2.0)))


# ------------------------------------------------------------------------------------ Holm


@dataclass(frozen=True)
class HolmResult:
    """Holm-adjusted p-values (input order) and rejections at ``alpha``.

    For non-inferiority gates, pass each test's one-sided p-value: a rejection is a pass.
    """

    pvalues: tuple[float, ...]
    adjusted: tuple[float, ...]
    reject: tuple[bool, ...]
    alpha: float
    names: tuple[str, ...] | None = None

    def as_dict(self) -> dict[str, tuple[float, bool]]:
        """name -> (adjusted p-value, rejected); needs named input."""
        if self.names is None:
            raise ValueError("holm() was given a sequence, not a mapping: no names")
        return {k: (p, r) for k, p, r in zip(self.names, self.adjusted, self.reject)}


def holm(pvalues: Sequence[float] | Mapping[str, float], *, alpha: float = 0.05) -> HolmResult:
    """Holm's step-down correction: adjusted p_(i) = max_{j<=i} min(1, (m - j + 1) p_(j))."""
    names = tuple(pvalues.keys()) if isinstance(pvalues, Mapping) else None
    p = np.asarray(list(pvalues.values()) if names is not None else list(pvalues), dtype=float)
    if p.ndim != 1:
        raise ValueError("pvalues must be a flat sequence or mapping")
    if np.any(~np.isfinite(p)) or np.any((p < 0) | (p > 1)):
        raise ValueError("pvalues must be finite numbers in [0, 1]")
    m = p.size
    order = np.argsort(p, kind="stable")
    adjusted_sorted = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    adjusted = np.empty(m)
    adjusted[order] = adjusted_sorted
    return HolmResult(
        pvalues=tuple(map(float, p)), adjusted=tuple(map(float, adjusted)),
        reject=tuple(bool(a <= alpha) for a in adjusted), alpha=float(alpha), names=names,
    )
