"""Distribution exactness: goodness of fit against exact probabilities, two-sample homogeneity."""

import numpy as np
import pytest
from scipy import stats

from analysis import InsufficientDataError, goodness_of_fit, homogeneity

SEQS = [(1, 2), (1, 3), (2, 2), (4, 1), (5, 5), (6, 6)]
PROBS = np.array([0.4, 0.25, 0.2, 0.1, 0.003, 0.002])  # sums to 0.955: the rest is unlisted


def draw(rng, n, probs=PROBS, seqs=SEQS):
    """n sequences; the unlisted mass becomes distinct rare sequences the target also scores."""
    full = np.append(probs, 1 - probs.sum())
    idx = rng.choice(len(full), size=n, p=full)
    out = [seqs[i] if i < len(seqs) else (9, int(rng.integers(1000))) for i in idx]
    return out


def probability_table(samples):
    table = dict(zip(SEQS, PROBS))
    for s in samples:
        table.setdefault(s, (1 - PROBS.sum()) / 1000)  # each rare sequence: 1/1000 of the rest
    return table


def test_hand_computed_pooling():
    # n = 100: expected 40, 25, 20, 10, 0.3, 0.2 (+4.5 unlisted) -> the last three pool: 5.0
    samples = [SEQS[0]] * 38 + [SEQS[1]] * 27 + [SEQS[2]] * 21 + [SEQS[3]] * 9 + [SEQS[4]] * 1 + [(9, 1)] * 4
    table = probability_table(samples)
    res = goodness_of_fit(samples, table)
    ref = stats.chisquare([38, 27, 21, 9, 5], [40, 25, 20, 10, 5])
    assert (res.statistic, res.pvalue) == pytest.approx((ref.statistic, ref.pvalue))
    assert res.df == 4 and res.categories == 5 and res.pooled_mass == pytest.approx(0.05)
    g = goodness_of_fit(samples, table, method="g-test")
    ref = stats.power_divergence([38, 27, 21, 9, 5], [40, 25, 20, 10, 5], lambda_="log-likelihood")
    assert (g.statistic, g.pvalue) == pytest.approx((ref.statistic, ref.pvalue))


def test_sparse_other_bin_joins_smallest():
    # n = 50: expected 20, 12.5, 10, 5, other 2.5 -> other joins the 5 bin
    samples = [SEQS[0]] * 20 + [SEQS[1]] * 12 + [SEQS[2]] * 10 + [SEQS[3]] * 6 + [(9, 2)] * 2
    res = goodness_of_fit(samples, probability_table(samples))
    ref = stats.chisquare([20, 12, 10, 8], [20, 12.5, 10, 7.5])
    # the pooled draws also face the exact upper tail of their mass (2 of 50 at 0.05), Bonferroni
    tail = stats.binom.sf(1, 50, 0.05)
    assert res.categories == 4 and res.statistic == pytest.approx(ref.statistic)
    assert res.pvalue == pytest.approx(min(1.0, 2 * min(ref.pvalue, tail)))


def test_null_rejection_rate_and_power():
    rng = np.random.default_rng(0)
    p_null, p_alt = [], []
    shifted = np.array([0.34, 0.31, 0.2, 0.1, 0.003, 0.002])
    for _ in range(1000):
        s = draw(rng, 400)
        p_null.append(goodness_of_fit(s, probability_table(s)).pvalue)
        s = draw(rng, 400, probs=shifted)
        p_alt.append(goodness_of_fit(s, probability_table(s)).pvalue)
    assert 0.02 <= np.mean(np.array(p_null) <= 0.05) <= 0.08
    assert np.mean(np.array(p_alt) <= 0.05) > 0.5


def test_impossible_and_missing_and_insufficient():
    table = dict(zip(SEQS, PROBS))
    table[(7, 7)] = 0.0
    res = goodness_of_fit([SEQS[0]] * 50 + [(7, 7)], table)
    assert res.pvalue == 0.0 and res.impossible == 1
    with pytest.raises(ValueError, match="no target probability"):
        goodness_of_fit([(8, 8)], dict(zip(SEQS, PROBS)))
    with pytest.raises(InsufficientDataError, match="draw more samples"):
        goodness_of_fit([SEQS[0]] * 5, dict(zip(SEQS, PROBS)))
    with pytest.raises(ValueError, match="sum to at most 1"):
        goodness_of_fit([SEQS[0]], {SEQS[0]: 0.9, SEQS[1]: 0.3})


def test_homogeneity_matches_chi2_contingency():
    # rare columns (expected < 5 in the smaller row) pool into one "other" column: 6 vs 5
    a = [SEQS[0]] * 40 + [SEQS[1]] * 30 + [SEQS[2]] * 20 + [(9, 1)] * 3 + [(9, 2)] * 3
    b = [SEQS[0]] * 50 + [SEQS[1]] * 20 + [SEQS[2]] * 25 + [(9, 3)] * 5
    res = homogeneity(a, b)
    ref = stats.chi2_contingency([[40, 30, 20, 6], [50, 20, 25, 5]], correction=False)
    assert (res.statistic, res.pvalue, res.df) == pytest.approx((ref.statistic, ref.pvalue, ref.dof))
    assert res.n == 196 and res.categories == 4
    # a pooled column still too sparse joins the smallest column
    res = homogeneity(a[:-4], b[:-3])
    ref = stats.chi2_contingency([[40, 30, 22], [50, 20, 27]], correction=False)
    assert (res.statistic, res.pvalue, res.df) == pytest.approx((ref.statistic, ref.pvalue, ref.dof))


def test_homogeneity_null_rate():
    rng = np.random.default_rng(1)
    p = [homogeneity(draw(rng, 300), draw(rng, 300)).pvalue for _ in range(1000)]
    assert 0.02 <= np.mean(np.array(p) <= 0.05) <= 0.08
    with pytest.raises(InsufficientDataError):
        homogeneity([SEQS[0]] * 3, [SEQS[1]] * 3)


def test_draws_of_near_impossible_sequences_do_not_hide_in_the_smallest_bin():
    """Target A .5, B .5 - 1e-9, the rest 1e-9: 50 A and 50 draws of the rest fit with p = 1 once the
    sparse 'other' bin joined B (red-team). The exact upper tail of the pooled rare mass sees them."""
    probs = {"A": 0.5, "B": 0.5 - 1e-9, "*": 1e-9}
    res = goodness_of_fit(["A"] * 50 + ["*"] * 50, probs)
    assert res.pvalue < 1e-6 and res.categories == 2
    res = goodness_of_fit(["A"] * 50 + ["B"] * 30 + ["*"] * 20, probs)
    assert res.pvalue < 1e-6
    fine = goodness_of_fit(["A"] * 50 + ["B"] * 50, probs)
    assert fine.pvalue == pytest.approx(1.0)
