"""Paired tests agree with scipy / statsmodels and with hand-computed examples."""

import numpy as np
import pytest
from scipy import stats
from statsmodels.stats.contingency_tables import mcnemar as sm_mcnemar
from statsmodels.stats.multitest import multipletests

from analysis import (
    holm, mcnemar, non_inferiority, paired_proportion_difference, tango_interval, wilcoxon_signed_rank,
)
from analysis.paired import mcnemar_pvalue, signed_rank_pvalue, tango_ni_pvalue, tango_z


def pairs_from_table(both, losses, wins, neither):
    """Baseline/candidate pass vectors for a paired 2x2 table."""
    base = [1] * both + [1] * losses + [0] * wins + [0] * neither
    cand = [1] * both + [0] * losses + [1] * wins + [0] * neither
    return np.array(base, bool), np.array(cand, bool)


# ------------------------------------------------------------------------------- McNemar


@pytest.mark.parametrize("losses,wins", [(0, 0), (3, 3), (2, 8), (8, 2), (0, 7), (40, 20), (1, 30)])
def test_mcnemar_exact_matches_statsmodels(losses, wins):
    base, cand = pairs_from_table(30, losses, wins, 10)
    res = mcnemar(base, cand, variant="exact")
    sm = sm_mcnemar([[30, losses], [wins, 10]], exact=True)
    assert res.pvalue == pytest.approx(sm.pvalue, rel=1e-12, abs=1e-15)
    assert (res.losses, res.wins, res.n) == (losses, wins, 40 + losses + wins)
    assert res.statistic == pytest.approx((wins - losses) / res.n)


def test_mcnemar_mid_p_hand_computed():
    # b=2, c=8: P(X<=2) = (1+10+45)/1024, P(X=2) = 45/1024
    base, cand = pairs_from_table(5, 2, 8, 5)
    assert mcnemar(base, cand, variant="exact").pvalue == pytest.approx(112 / 1024)
    assert mcnemar(base, cand).pvalue == pytest.approx(67 / 1024)
    assert mcnemar(base, cand).variant == "mid-p"
    # b == c gives exactly 1 in both variants; no discordant pairs too
    assert mcnemar_pvalue(4, 4) == pytest.approx(1.0) and mcnemar_pvalue(0, 0) == 1.0
    # the mid-p value is never above the exact one
    b, c = np.meshgrid(np.arange(30), np.arange(30))
    assert np.all(mcnemar_pvalue(b, c) <= mcnemar_pvalue(b, c, variant="exact") + 1e-15)


def test_mcnemar_rejects_bad_input():
    with pytest.raises(ValueError, match="same length"):
        mcnemar([1, 0, 1], [1, 0])
    with pytest.raises(ValueError, match="pass/fail"):
        mcnemar([1, 0, 2], [1, 0, 1])
    with pytest.raises(ValueError, match="None"):
        mcnemar([1, None], [1, 0])
    with pytest.raises(ValueError, match="variant"):
        mcnemar([1, 0], [1, 0], variant="asymptotic")


# -------------------------------------------------------------------------- Tango interval


def test_tango_z_at_zero_is_uncorrected_mcnemar():
    for losses, wins in [(5, 12), (20, 3), (1, 1)]:
        sm = sm_mcnemar([[50, losses], [wins, 50]], exact=False, correction=False)
        z = tango_z(wins, losses, 100 + losses + wins, 0.0)
        assert z ** 2 == pytest.approx(sm.statistic) and np.sign(z) == np.sign(wins - losses)


def test_tango_interval_inverts_the_score_test():
    wins, losses, n = 20, 40, 160
    ci = tango_interval(wins, losses, n)
    zq = stats.norm.ppf(0.975)
    assert float(tango_z(wins, losses, n, ci.low)) == pytest.approx(zq, abs=1e-8)
    assert float(tango_z(wins, losses, n, ci.high)) == pytest.approx(-zq, abs=1e-8)
    # brute force: the interval is exactly the set of deltas the score test does not reject
    grid = np.linspace(-0.5, 0.3, 80001)
    keep = grid[np.abs(tango_z(wins, losses, n, grid)) <= zq]
    assert (keep.min(), keep.max()) == pytest.approx((ci.low, ci.high), abs=2e-5)


def test_tango_interval_no_discordance_closed_form():
    # with no discordant pairs the bound solves n d / (1 - d) = z^2: |d| = z^2 / (n + z^2)
    z = stats.norm.ppf(0.975)
    ci = tango_interval(0, 0, 100)
    assert ci == pytest.approx((-z**2 / (100 + z**2), z**2 / (100 + z**2)), abs=1e-9)
    assert tango_interval(0, 100, 100).low == -1.0 and tango_interval(100, 0, 100).high == 1.0


def test_paired_proportion_difference_tango_and_bootstrap():
    base, cand = pairs_from_table(120, 25, 10, 45)
    res = paired_proportion_difference(base, cand)
    assert res.statistic == pytest.approx(-15 / 200)
    assert res.pvalue == pytest.approx(sm_mcnemar([[120, 25], [10, 45]], exact=False, correction=False).pvalue)
    assert res.ci_low < res.statistic < res.ci_high < 0
    boot = paired_proportion_difference(base, cand, method="bootstrap", rng=1, n_resamples=4000)
    assert boot.confidence_interval() == pytest.approx(res.confidence_interval(), abs=0.015)
    again = paired_proportion_difference(base, cand, method="bootstrap", rng=1, n_resamples=4000)
    assert again == boot  # randomness only through rng


# ------------------------------------------------------------------------------- Wilcoxon


def test_wilcoxon_matches_scipy_and_bootstrap_is_sane():
    rng = np.random.default_rng(3)
    base = rng.lognormal(0, 0.5, 80)
    cand = base * rng.lognormal(-0.05, 0.1, 80)
    res = wilcoxon_signed_rank(base, cand, rng=7, n_resamples=3000)
    ref = stats.wilcoxon(cand, base)
    assert (res.statistic, res.pvalue) == pytest.approx((ref.statistic, ref.pvalue))
    assert res.estimate == pytest.approx(np.mean(cand - base))
    t_ci = stats.ttest_1samp(cand - base, 0).confidence_interval()
    assert res.confidence_interval() == pytest.approx((t_ci.low, t_ci.high), abs=0.01)
    assert signed_rank_pvalue(cand - base) == pytest.approx(ref.pvalue)
    assert wilcoxon_signed_rank(base, cand, rng=7, n_resamples=3000) == res


def test_wilcoxon_identical_inputs():
    x = np.arange(10.0)
    res = wilcoxon_signed_rank(x, x, n_resamples=100, rng=0)
    assert res.pvalue == 1.0 and res.confidence_interval() == (0.0, 0.0)
    rows = np.vstack([np.zeros(10), np.arange(1.0, 11.0)])
    p = signed_rank_pvalue(rows, axis=1)
    assert p[0] == 1.0 and p[1] == pytest.approx(stats.wilcoxon(np.arange(1.0, 11.0)).pvalue)


# ------------------------------------------------------------------------ non-inferiority


def test_non_inferiority_binary_consistency_everywhere():
    """passed == (p < alpha) == (lower bound > -margin) over every table with n = 40."""
    n, margin = 40, 0.05
    for wins in range(n + 1):
        for losses in range(n + 1 - wins):
            p = float(tango_ni_pvalue(wins, losses, n, margin=margin))
            low = tango_interval(wins, losses, n, confidence_level=0.95, alternative="greater",
                                 continuity_correction=0.5).low
            assert (p < 0.05) == (low > -margin), (wins, losses)


def test_non_inferiority_binary_hand_example():
    # no discordant pairs in 100: z = (n m - 1/2) / sqrt(n m (1 - m))
    base, cand = pairs_from_table(70, 0, 0, 30)
    res = non_inferiority(base, cand, margin=0.05)
    z = (100 * 0.05 - 0.5) / np.sqrt(100 * 0.05 * 0.95)
    assert res.method == "tango-score" and res.pvalue == pytest.approx(stats.norm.sf(z))
    assert res.passed and res.lower_bound > -0.05 and res.statistic == 0.0
    # a clear 10-point drop fails
    base, cand = pairs_from_table(60, 12, 2, 26)
    res = non_inferiority(base, cand, margin=0.05)
    assert not res.passed and res.pvalue > 0.05 and res.lower_bound < -0.05
    assert res.confidence_interval() == (res.lower_bound, 1.0)


def test_non_inferiority_continuous_matches_scipy_t():
    rng = np.random.default_rng(5)
    base = rng.uniform(0, 1, 150)
    cand = np.clip(base + rng.normal(-0.01, 0.1, 150), 0, 1)
    res = non_inferiority(base, cand, margin=0.03, alpha=0.05)
    ref = stats.ttest_rel(cand + 0.03, base, alternative="greater")
    assert res.method == "paired-t" and res.pvalue == pytest.approx(ref.pvalue)
    lower = stats.ttest_1samp(cand - base, 0, alternative="greater").confidence_interval(0.95).low
    assert res.lower_bound == pytest.approx(lower)
    assert res.passed == (res.pvalue < 0.05) == (lower > -0.03)


def test_non_inferiority_bad_input():
    with pytest.raises(ValueError, match="margin"):
        non_inferiority([1, 0], [1, 0], margin=0)
    with pytest.raises(ValueError, match="alpha"):
        non_inferiority([1, 0], [1, 0], margin=0.1, alpha=0.7)
    with pytest.raises(ValueError, match="method"):
        non_inferiority([1, 0], [1, 0], margin=0.1, method="wald")


# ----------------------------------------------------------------------------------- Holm


def test_holm_matches_statsmodels():
    rng = np.random.default_rng(11)
    for m in (1, 2, 5, 12):
        p = rng.uniform(0, 0.1, m) ** 2
        reject, adjusted, _, _ = multipletests(p, alpha=0.05, method="holm")
        res = holm(p, alpha=0.05)
        assert np.allclose(res.adjusted, adjusted) and list(res.reject) == list(reject)
    res = holm({"factual/passed": 0.01, "code/passed": 0.04, "refusal/passed": 0.03})
    assert res.as_dict() == {
        "factual/passed": (pytest.approx(0.03), True),
        "code/passed": (pytest.approx(0.06), False),
        "refusal/passed": (pytest.approx(0.06), False),
    }
    with pytest.raises(ValueError):
        holm([0.1, float("nan")])
    with pytest.raises(ValueError):
        holm([0.1, 0.2]).as_dict()


def test_a_constant_difference_is_decided_by_the_sign_test_not_by_p_zero():
    """Two prompts with the same score difference: no spread, and the t-test gave p = 0, so two
    prompts were 'non-inferior' (red-team finding, through the early-exit frontier)."""
    from analysis.paired import non_inferiority
    two = non_inferiority([0.5, 0.6], [0.5, 0.6], margin=0.1, method="paired-t")
    assert not two.passed and two.pvalue == pytest.approx(0.25)
    five = non_inferiority([0.5] * 5, [0.5] * 5, margin=0.1, method="paired-t")
    assert five.passed and five.pvalue == pytest.approx(1 / 32)
    at = non_inferiority([0.4] * 9, [0.3] * 9, margin=0.1, method="paired-t")   # at the margin: not past it
    assert not at.passed


def test_a_difference_constant_but_for_float_rounding_is_decided_by_the_sign_test():
    """0.55 - 0.6 and 0.35 - 0.4 are both -0.05 but for the 16th digit: the t-test divided by that
    rounding noise and gave p = 3.5e-16, so two prompts were 'non-inferior' (red-team finding)."""
    from analysis.paired import non_inferiority
    two = non_inferiority([0.6, 0.4], [0.55, 0.35], margin=0.1, method="paired-t")
    assert not two.passed and two.pvalue == pytest.approx(0.25)
    base = np.array([0.6, 0.4, 0.7, 0.9, 0.3])
    five = non_inferiority(base, base - 0.05, margin=0.1, method="paired-t")
    assert five.passed and five.pvalue == pytest.approx(1 / 32)
    at = non_inferiority([0.4, 0.7, 0.9], [0.3, 0.6, 0.8], margin=0.1, method="paired-t")  # at the margin
    assert not at.passed and at.pvalue == 1.0
    spread = non_inferiority([0.6, 0.4], [0.55, 0.36], margin=0.1, method="paired-t")   # a real spread: the t-test
    assert spread.pvalue == pytest.approx(stats.ttest_1samp([-0.05, -0.04], -0.1, alternative="greater").pvalue)


def test_a_loss_from_few_discordant_pairs_needs_the_exact_sign_test():
    """4 losses, no win: Tango's z said p < 0.05, the exact one-sided McNemar p is 0.5**4 = 0.0625."""
    from analysis.paired import loss_upper_bound, tango_loss_pvalue
    for n in (4, 100):
        p = float(tango_loss_pvalue(0, 4, n))
        assert p == pytest.approx(max(0.0625, p)) and p >= stats.binomtest(4, 4, 0.5, alternative="greater").pvalue
        assert loss_upper_bound(method="tango-score", level=0.95, n=n, wins=0, losses=4) >= 0
    assert float(tango_loss_pvalue(0, 5, 5)) < 0.05  # 0.5**5
    assert loss_upper_bound(method="tango-score", level=0.95, n=5, wins=0, losses=5) < 0
    # vectorised, and unchanged from 20 discordant pairs on
    w, l = np.array([0, 1, 5]), np.array([4, 19, 25])
    p = tango_loss_pvalue(w, l, 100)
    z = tango_z(w, l, 100, 0.0, shift=0.5)
    assert p[2] == pytest.approx(stats.norm.cdf(z[2])) and p[1] >= stats.binom.sf(18, 20, 0.5)
    # the bound is below 0 exactly when the p-value is below 1 - level
    for w in range(0, 6):
        for l in range(0, 19):
            up = loss_upper_bound(method="tango-score", level=0.95, n=60, wins=w, losses=l)
            assert (up < -1e-9) == (float(tango_loss_pvalue(w, l, 60)) < 0.05), (w, l, up)
