"""Distribution exactness of sampling decoders (speculative sampling with the rejection verifier).

Such a decoder need not reproduce the baseline token for token, only its distribution. For one
prompt the harness draws N sequences from the candidate and, by teacher forcing, the target's
exact probability of each sequence (and of any others it enumerates); then:

- :func:`goodness_of_fit`: Pearson chi-square (``scipy.stats.chisquare``) or G-test
  (``scipy.stats.power_divergence``, log-likelihood) of the sampled sequences against those
  probabilities. Sequences whose expected count is below ``min_expected`` (5) are pooled with all
  unlisted sequences into one "other" bin, expected N * (1 - listed mass); if that bin is still
  below ``min_expected`` it joins the smallest category, and the exact upper tail of its draws,
  P(Bin(N, pooled mass) >= drawn there), is tested too (p = min(1, 2 min(p_chi2, p_tail)),
  Bonferroni): otherwise draws of near-impossible sequences would hide in that category. A sampled
  sequence of target probability exactly 0 is an impossible draw and gives p = 0.
- :func:`homogeneity`: when exact probabilities are not available, a two-sample test of the
  candidate's samples against the baseline's (``scipy.stats.chi2_contingency`` on the 2 x k
  table, sparse columns pooled the same way, no Yates correction).

Keep generations short (a few tokens) and N large (hundreds or more): the test can only see
sequences common enough to expect five draws. The categories should come from the target's
probabilities (enumeration or the baseline's samples), not be picked after looking at which
sequences the candidate drew; pooling by expected count keeps that so for listed sequences.

Results carry ``statistic``, ``pvalue``, ``n``, ``df``; there is no natural interval, so they
have no ``confidence_interval``. :func:`detectable_tv` states what a test of this size could have
seen. The far stronger check over every sampled token is :mod:`analysis.pit`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import optimize, stats

_METHODS = {"pearson": "pearson", "g-test": "log-likelihood"}


class InsufficientDataError(ValueError):
    """Fewer than two categories survive pooling: draw more samples or shorter sequences."""


@dataclass(frozen=True)
class GoodnessOfFitResult:
    """Goodness of fit of sampled sequences to the target's exact probabilities.

    ``categories``: bins tested after pooling; ``pooled_mass``: target probability in the
    "other" bin; ``impossible``: draws the target gives probability 0.
    """

    statistic: float
    pvalue: float
    n: int
    df: int
    categories: int
    pooled_mass: float
    impossible: int
    method: str
    bin_probabilities: tuple[float, ...] = ()


@dataclass(frozen=True)
class HomogeneityResult:
    """Two-sample chi-square (or G) test that two samplers share one distribution."""

    statistic: float
    pvalue: float
    n: int
    df: int
    categories: int
    method: str


def _key(seq: Any) -> Hashable:
    return tuple(int(t) for t in seq) if isinstance(seq, (list, tuple, np.ndarray)) else seq


def _merge_small_other(observed: list[float], expected: list[float], min_expected: float):
    """Fold a last ("other") bin that is still sparse into the smallest other bin."""
    if len(expected) >= 2 and expected[-1] < min_expected:
        smallest = int(np.argmin(expected[:-1]))
        expected[smallest] += expected.pop()
        observed[smallest] += observed.pop()
    return observed, expected


def goodness_of_fit(
    samples: Sequence[Sequence[int]], probabilities: Mapping[Any, float], *,
    min_expected: float = 5.0, method: str = "pearson",
) -> GoodnessOfFitResult:
    """Test sampled sequences against the target's exact sequence probabilities.

    ``probabilities`` maps a sequence (tuple of token ids) to its target probability and must
    cover every sampled sequence; its total may be below 1 (the rest is "other").
    """
    if method not in _METHODS:
        raise ValueError(f"method must be one of {sorted(_METHODS)}, not {method!r}")
    n = len(samples)
    if n == 0:
        raise ValueError("goodness_of_fit needs samples")
    probs = {_key(k): float(v) for k, v in probabilities.items()}
    values = np.fromiter(probs.values(), dtype=float, count=len(probs))
    if np.any((values < 0) | (values > 1) | ~np.isfinite(values)) or values.sum() > 1 + 1e-6:
        raise ValueError("probabilities must lie in [0, 1] and sum to at most 1")
    counts = Counter(_key(s) for s in samples)
    missing = [k for k in counts if k not in probs]
    if missing:
        raise ValueError(f"{len(missing)} sampled sequence(s) have no target probability, e.g. {missing[0]}")
    impossible = sum(c for k, c in counts.items() if probs[k] == 0.0)
    if impossible:
        return GoodnessOfFitResult(np.inf, 0.0, n, 0, 0, 0.0, impossible, method)

    big = sorted((k for k, p in probs.items() if n * p >= min_expected), key=lambda k: -probs[k])
    observed = [float(counts.get(k, 0)) for k in big]
    expected = [n * probs[k] for k in big]
    other_exp = max(n - sum(expected), 0.0)
    other_obs = n - sum(observed)
    pooled_mass = other_exp / n
    rare_p = None
    if other_exp > 1e-9 * n or other_obs > 0:
        observed.append(other_obs)
        expected.append(other_exp)
        if len(expected) >= 2 and other_exp < min_expected:
            # The sparse "other" bin joins the smallest big bin, and the chi-square no longer sees
            # where those draws landed: a sampler moving that bin's mass onto near-impossible
            # sequences would fit. The exact upper tail of the pooled rare mass, P(Bin(n, mass) >=
            # observed), keeps it in view (Bonferroni with the chi-square below).
            rare_p = float(stats.binom.sf(other_obs - 1, n, min(max(pooled_mass, 0.0), 1.0)))
        observed, expected = _merge_small_other(observed, expected, min_expected)
    if len(expected) < 2:
        raise InsufficientDataError(
            f"only {len(expected)} category has an expected count >= {min_expected} among {n} "
            "samples: draw more samples or test shorter sequences"
        )
    exp = np.asarray(expected)
    exp *= n / exp.sum()  # absorb rounding so scipy's sum check passes
    res = stats.power_divergence(np.asarray(observed), exp, lambda_=_METHODS[method])
    pvalue = float(res.pvalue)
    if rare_p is not None:
        pvalue = min(1.0, 2.0 * min(pvalue, rare_p))
    return GoodnessOfFitResult(
        statistic=float(res.statistic), pvalue=pvalue, n=n, df=len(exp) - 1,
        categories=len(exp), pooled_mass=float(pooled_mass), impossible=0, method=method,
        bin_probabilities=tuple(float(e) / n for e in exp),
    )


def detectable_tv(bin_probabilities: Sequence[float], n: int, *, level: float, power: float = 0.8) -> float | None:
    """Smallest total-variation distortion the chi-square test over these bins detects with
    ``power`` at ``level`` from ``n`` samples, for mass moved between the two likeliest bins
    (noncentrality n delta^2 (1/p1 + 1/p2)); None when no distortion that fits the bins would.
    Mass spread over many bins needs far more (see CALIBRATION.md)."""
    p = np.sort(np.asarray(bin_probabilities, dtype=float))[::-1]
    if p.size < 2 or n <= 0:
        return None
    df = p.size - 1
    crit = stats.chi2.ppf(1 - level, df)
    scale = 1.0 / p[0] + 1.0 / p[1]
    cap = float(min(p[0], 1.0 - p[1]))

    def gap(delta: float) -> float:
        return float(stats.ncx2.sf(crit, df, n * delta * delta * scale)) - power

    if gap(cap) < 0:
        return None
    return float(optimize.brentq(gap, 1e-9, cap, xtol=1e-6))


def samples_needed(bin_probabilities: Sequence[float], *, level: float, tv: float = 0.1,
                   power: float = 0.8) -> int | None:
    """Samples the chi-square test over these bins needs to detect ``tv`` moved between the two
    likeliest bins with ``power`` at ``level`` (the noncentrality of :func:`detectable_tv` solved
    for n); None when no such move fits the bins."""
    p = np.sort(np.asarray(bin_probabilities, dtype=float))[::-1]
    if p.size < 2 or tv > min(p[0], 1.0 - p[1]):
        return None
    df = p.size - 1
    crit = stats.chi2.ppf(1 - level, df)
    lam = optimize.brentq(lambda x: float(stats.ncx2.sf(crit, df, x)) - power, 1e-6, 1e6)
    return int(np.ceil(lam / (tv * tv * (1.0 / p[0] + 1.0 / p[1]))))


def homogeneity(
    samples_a: Sequence[Sequence[int]], samples_b: Sequence[Sequence[int]], *,
    min_expected: float = 5.0, method: str = "pearson",
) -> HomogeneityResult:
    """Chi-square test of homogeneity between two sets of sampled sequences."""
    if method not in _METHODS:
        raise ValueError(f"method must be one of {sorted(_METHODS)}, not {method!r}")
    ca, cb = Counter(map(_key, samples_a)), Counter(map(_key, samples_b))
    na, nb = sum(ca.values()), sum(cb.values())
    if na == 0 or nb == 0:
        raise ValueError("homogeneity needs samples on both sides")
    total = na + nb
    keys = sorted(ca.keys() | cb.keys(), key=lambda k: -(ca[k] + cb[k]))
    # expected count of a column in the smaller row; pool columns where it is sparse
    min_row = min(na, nb)
    big = [k for k in keys if min_row * (ca[k] + cb[k]) / total >= min_expected]
    cols = [[float(ca[k]), float(cb[k])] for k in big]
    rest = [float(na - sum(c[0] for c in cols)), float(nb - sum(c[1] for c in cols))]
    if sum(rest) > 0:
        cols.append(rest)
        if len(cols) >= 2 and min_row * sum(rest) / total < min_expected:
            sizes = [sum(c) for c in cols[:-1]]
            smallest = int(np.argmin(sizes))
            cols[smallest] = [cols[smallest][0] + rest[0], cols[smallest][1] + rest[1]]
            cols.pop()
    if len(cols) < 2:
        raise InsufficientDataError(
            f"only {len(cols)} category is common enough (expected >= {min_expected}): draw more samples"
        )
    table = np.asarray(cols).T  # (2, k)
    res = stats.chi2_contingency(table, correction=False, lambda_=_METHODS[method])
    return HomogeneityResult(
        statistic=float(res.statistic), pvalue=float(res.pvalue), n=int(total), df=int(res.dof),
        categories=table.shape[1], method=method,
    )
