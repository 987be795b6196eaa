"""Calibration by simulation (>= 1,000 studies per case; here 10,000) and by exact enumeration.

How the nominal-level checks read: the *exact* rate (every possible table enumerated, or every
signed-rank sum) must be <= 0.05; the *simulated* rate, an estimate with Monte Carlo error, must
agree with the exact one and must not be significantly above 0.05 (one-sided, z = 2.576).
Asymptotic tests whose exact rate cannot be enumerated (Wilcoxon with ties) are checked by
simulation alone the same way. Power numbers are asserted against their exact values and
written to harness/calibration/CALIBRATION.md by `python -m harness.calibration.report`.
"""

import numpy as np
import pytest
from scipy import stats

from harness.calibration import paired_tests as cal
from harness.calibration import report as calreport
from harness.calibration.common import trinomial_grid
from analysis import mcnemar, non_inferiority
from analysis.paired import mcnemar_pvalue, tango_ni_pvalue

STUDIES = 10_000
Z_MC = 2.576


def not_above(rate: cal.Rate, level: float = 0.05):
    se = np.sqrt(level * (1 - level) / rate.studies)
    assert rate.simulated <= level + Z_MC * se, rate
    if rate.exact is not None:
        assert rate.exact <= level, rate
        assert abs(rate.simulated - rate.exact) <= 4 * rate.mc_se, rate


def not_conservative(rate: cal.Rate, floor: float = 0.02):
    assert rate.simulated >= floor, rate
    if rate.exact is not None:
        assert rate.exact >= floor, rate


# ------------------------------------------------------------------------------- McNemar A/A


@pytest.mark.parametrize("n,disc", [(100, 0.2), (200, 0.1), (200, 0.4), (400, 0.05)])
def test_mcnemar_false_alarm(n, disc):
    rate = cal.mcnemar_rejection(n, disc / 2, disc / 2, studies=STUDIES, rng=n + int(100 * disc))
    not_above(rate)
    not_conservative(rate)


def test_mcnemar_mid_p_size_exact_sweep():
    """Unconditional size of mid-p McNemar over n = 10..600 and discordance 0.01..0.5, exactly."""
    d_max = 600
    cond = np.zeros(d_max + 1)
    for d in range(1, d_max + 1):
        b = np.arange(d + 1)
        cond[d] = np.sum(stats.binom.pmf(b, d, 0.5) * (mcnemar_pvalue(b, d - b) <= 0.05))
    assert cond.max() > 0.05  # conditionally mid-p can exceed the level ...
    worst = 0.0
    for n in list(range(10, 101, 5)) + [150, 200, 300, 400, 600]:
        d = np.arange(n + 1)
        for disc in np.linspace(0.01, 0.5, 50):
            worst = max(worst, float(np.sum(stats.binom.pmf(d, n, disc) * cond[: n + 1])))
    assert 0.045 < worst <= 0.05  # ... but not averaged over the discordant count


def test_mcnemar_power_5_point_drop_n200():
    # candidate 5 points below baseline; disc 0.1 (correlated decoders) and independent outcomes
    for p_loss, p_win, lo in [(0.075, 0.025, 0.55), (0.20, 0.15, 0.1)]:
        rate = cal.mcnemar_rejection(200, p_loss, p_win, studies=STUDIES, rng=7)
        assert abs(rate.simulated - rate.exact) <= 4 * rate.mc_se
        assert rate.exact > lo
    strong = cal.mcnemar_rejection(200, 0.075, 0.025, studies=STUDIES, rng=7)
    weak = cal.mcnemar_rejection(200, 0.075, 0.025, studies=STUDIES, rng=7, variant="exact")
    assert strong.exact > weak.exact  # mid-p buys power over the conditional test


def test_public_mcnemar_matches_vectorised_path():
    rng = np.random.default_rng(2)
    for _ in range(200):
        base = rng.random(60) < 0.7
        cand = np.where(rng.random(60) < 0.15, ~base, base)
        losses, wins = int(np.sum(base & ~cand)), int(np.sum(~base & cand))
        assert mcnemar(base, cand).pvalue == pytest.approx(float(mcnemar_pvalue(losses, wins)))


# ------------------------------------------------------------------------------ Wilcoxon A/A


@pytest.mark.parametrize("n", [20, 100])
def test_wilcoxon_false_alarm_continuous_exact(n):
    rate = cal.wilcoxon_rejection(n, studies=STUDIES, rng=n)
    not_above(rate)
    not_conservative(rate)


@pytest.mark.parametrize("n,kind", [(400, "continuous"), (200, "discrete")])
def test_wilcoxon_false_alarm_simulated(n, kind):
    rate = cal.wilcoxon_rejection(n, kind=kind, studies=STUDIES, rng=n + 1, exact=False)
    not_above(rate)
    not_conservative(rate)


# ------------------------------------------------------------------------ non-inferiority


@pytest.mark.parametrize("n", [100, 200, 400])
@pytest.mark.parametrize("disc", [0.05, 0.10, 0.30])
def test_non_inferiority_type_one_error_at_margin(n, disc):
    rate = cal.ni_pass_rate(n, -0.05, 0.05, disc, studies=STUDIES, rng=n + int(100 * disc))
    not_above(rate)


def test_non_inferiority_type_one_error_exact_sweep():
    worst = 0.0
    for margin in (0.02, 0.05, 0.1):
        for n in (30, 60, 100, 200, 400):
            for disc in np.linspace(margin, 0.6, 8):
                w, l, pmf = trinomial_grid(n, (disc - margin) / 2, (disc + margin) / 2)
                worst = max(worst, float(np.sum(pmf * (tango_ni_pvalue(w, l, n, margin=margin) < 0.05))))
    assert worst <= 0.05


def test_non_inferiority_power_at_zero_delta():
    powers = []
    for n in (100, 200, 400):
        rate = cal.ni_pass_rate(n, 0.0, 0.05, 0.10, studies=STUDIES, rng=n)
        assert abs(rate.simulated - rate.exact) <= 4 * rate.mc_se
        powers.append(rate.exact)
    # exact power, margin 5 points, 10% discordant pairs (also in CALIBRATION.md)
    assert powers == pytest.approx([0.378, 0.643, 0.910], abs=0.005)
    assert powers[0] < powers[1] < powers[2]


def test_non_inferiority_continuous_type_one_error():
    not_above(cal.ni_t_pass_rate(100, -0.05, 0.05, studies=STUDIES, rng=3))
    assert cal.ni_t_pass_rate(100, 0.0, 0.05, studies=STUDIES, rng=4).simulated > 0.5


def test_public_non_inferiority_matches_vectorised_path():
    rng = np.random.default_rng(9)
    for _ in range(200):
        base = rng.random(80) < 0.8
        flip = rng.random(80) < 0.1
        cand = np.where(flip, rng.random(80) < 0.4, base)
        res = non_inferiority(base, cand, margin=0.05)
        losses, wins = int(np.sum(base & ~cand)), int(np.sum(~base & cand))
        p = float(tango_ni_pvalue(wins, losses, 80, margin=0.05))
        assert res.pvalue == pytest.approx(p) and res.passed == (p < 0.05)


@pytest.mark.full
def test_calibrate_script_writes_report(tmp_path):
    """Every section of CALIBRATION.md on its small grid (seconds); `make calibrate` runs the full one."""
    out = tmp_path / "CALIBRATION.md"
    assert calreport.main(["--studies", "1000", "--grid", "small", "--out", str(out)]) == 0
    text = out.read_text()
    for heading in ("McNemar, A/A", "McNemar power", "Wilcoxon", "type I error", "power (pass rate)",
                    "Gate verdicts under A/A", "passes every suite", "Speedup lower bound",
                    "p95 at small n", "Sequential PIT test", "Sequence goodness of fit", "Group-sequential",
                    "A/A floor: false fails", "Engine seed gate", "The suite's speedup from a timed subset",
                    "More prompts only add power", "regress-engine.toml's floor profile", "Sparse and predictable deafness"):
        assert heading in text, heading
    assert "--grid small" in text  # a small-grid file says so
    # where gains fall with length the shipped speed bound covers, the jackknife it replaced does not
    row = next(line.split(" | ") for line in text.splitlines() if line.startswith("| 10 | 2-7 | log-sd 0.8 | - | -0.3"))
    shipped, old = float(row[8]), float(row[14])
    assert shipped >= 0.93 and old < 0.92, row
    with pytest.raises(SystemExit):
        calreport.main(["--studies", "10", "--out", str(out)])
    with pytest.raises(SystemExit):
        calreport.main(["--studies", "1000", "--grid", "huge", "--out", str(out)])


# --------------------------------------------------------------- the gate's verdicts (issue 16)

from harness.calibration import gates as cg  # noqa: E402


@pytest.mark.parametrize("n", [10, 100, 200])
def test_aa_any_suite_worse_holds_the_level(n):
    for disc in (0.05, 0.1, 0.3, 0.5):
        rate = cg.aa_any_worse(n, disc, studies=2000, rng=n)
        assert rate.exact <= 0.05, (n, disc, rate)
        assert abs(rate.simulated - rate.exact) <= 4 * rate.mc_se + 1e-3
    if n == 10:  # the old rule (point estimate below -margin) called a suite worse most of the time
        assert cg.aa_any_worse(n, 0.3, rule="old", studies=2000, rng=0).exact > 0.4


def _gate_quality_verdict(n, w, l):
    from harness.config import Gates
    from harness.verdict.gate import decide
    try:
        from test_gate import lossy, quality
    except ImportError:  # tests/ imported as a package
        from tests.test_gate import lossy, quality
    q = quality(n=n, wins=w, losses=l)
    detail = decide(lossy(a=q, b=quality(n=n), c=quality(n=n)), Gates(inconclusive="warn")).results[0].detail
    return cg.PASS if detail.startswith("non-inferior") else cg.WORSE if detail.startswith("worse") else cg.INCONCLUSIVE


@pytest.mark.parametrize("n,counts", [
    (40, [(0, 0), (0, 3), (1, 6), (0, 7), (2, 9)]),
    # n = 200: a significant loss within the margin (0/10) is a pass for the gate, not "worse"
    (200, [(0, 10), (2, 14), (0, 16), (5, 25), (0, 30), (10, 10), (0, 4)]),
])
def test_calibration_verdict_is_the_gates_decision(n, counts):
    """The counts-level rule of the calibration is the gate's own decision."""
    for w, l in counts:
        assert int(cg.gate_verdict(w, l, n)) == _gate_quality_verdict(n, w, l), (n, w, l)


def test_aa_any_worse_counts_what_the_gate_calls_worse():
    """The A/A table once counted the loss test alone (0.0331 at n = 200, disc 0.1): a significant
    loss within the margin is a pass for the gate. Its real rate is 0.0174. The loss test alone is
    0.0302 since it needs the exact sign test too below 20 discordant pairs (Tango's z alone: 0.0331)."""
    gate = cg.aa_any_worse(200, 0.1, studies=2000, rng=3)
    alone = cg.aa_any_worse(200, 0.1, rule="loss-alone", studies=2000, rng=3)
    assert gate.exact == pytest.approx(0.0174, abs=2e-4) and alone.exact == pytest.approx(0.0302, abs=2e-4)
    assert abs(gate.simulated - gate.exact) <= 4 * gate.mc_se
    looked = cg.aa_any_worse(200, 0.1, looks=3, studies=1000, rng=3)  # the decide profile's design
    assert looked.exact <= 0.05 and looked.exact != pytest.approx(gate.exact, abs=1e-3)
    assert abs(looked.simulated - looked.exact) <= 4 * looked.mc_se + 1e-3


def test_intersection_union_passes_more_than_holm():
    iut = cg.aa_pass_all((217, 72, 84), 0.1, studies=3000, rng=1)
    holm = cg.aa_pass_all((217, 72, 84), 0.1, holm=True, studies=3000, rng=1)
    assert iut.simulated > holm.simulated and abs(iut.simulated - iut.exact) < 4 * iut.mc_se


def test_pass_all_under_the_profiles_three_looks():
    """The decide profile runs 3 looks: its pass probability is the sequential plan's, lower than the
    fixed design's, and its simulation through the gate's look-by-look decision agrees."""
    fixed = cg.aa_pass_all((217, 72, 84), 0.2, studies=1000, rng=2)
    looked = cg.aa_pass_all((217, 72, 84), 0.2, looks=3, studies=1000, rng=2)
    assert looked.exact < fixed.exact - 0.01
    assert abs(looked.simulated - looked.exact) <= 4 * looked.mc_se


def test_p95_bias_at_small_n():
    assert cg.p95_below_truth(10, method="linear", studies=4000, rng=0).simulated > 0.7
    cov, upper = cg.p95_coverage(10, studies=300, rng=0)
    assert cov.simulated >= 0.95 and upper == 0.0  # a lower bound only, and said so
