"""The A/A floor's calibration (harness.calibration.floor) on a few hundred studies, through the
gate's own code (level_floor -> compare -> gate_detail), in seconds:
- a correct engine at the shipped sweep's sizes (regress-engine.toml: blocks of 10, 8, 10, 8
  greedy prompts) passes with probability >= 0.95 at noise rates 0.01-0.05, inconclusive counted
  as a fail (and the check has teeth: the rule before, an absolute tolerance on the excess rate
  with an inconclusive below the plan's size, refused such an engine most of the time);
- more prompts never make a doubled rate more likely to pass (the rule before let it pass more
  often the more prompts there were);
- a bug that doubles the rate is caught as often as the plan states, shared divergences included.
The full grid is in CALIBRATION.md (`make calibrate`)."""
from __future__ import annotations

import numpy as np
import pytest

from analysis.paired import tango_ni_pvalue
from harness.calibration import floor as cal
from harness.verdict import floor

STUDIES = 200
Z = 2.576


def old_rule(block: cal.Block) -> str:
    """The floor's rate rule before issue 58: pass where Tango's test shows the excess rate below
    an absolute 0.10, fail where the exact test shows "more often", else inconclusive (a fail)."""
    cand, aa, n = set(block.cand_prompts.tolist()), set(block.aa_prompts.tolist()), block.n
    b, c = len(cand - aa), len(aa - cand)
    if not len(cand) or tango_ni_pvalue(c, b, n, margin=0.1) < 0.05:
        return "pass"
    return "fail" if floor.rate_test(b, c, n, 0.05)["exceeds"] else "inconclusive"


def refused(rate: float, studies: int, rng, judge) -> float:
    return float(np.mean([any(cal.study(rng, rate, n, "correct", judge=judge) != "pass" for level in cal.SWEEP_BLOCKS for n in level)
                          for _ in range(studies)]))


@pytest.mark.parametrize("rate", [0.01, 0.05])
def test_a_correct_engine_passes_the_shipped_sweep(rate):
    ok, _ = cal.profile_plan(rate)
    assert ok >= 0.95
    now = cal.profile_fail_rate(rate, "correct", STUDIES, np.random.default_rng(1))
    assert now.simulated <= 0.05, now
    assert refused(rate, STUDIES, np.random.default_rng(1), old_rule) > 0.25  # 0.30 / 0.84 exactly


@pytest.mark.parametrize("rate", [0.02, 0.05, 0.1])
def test_the_floor_profile_catches_a_doubled_rate_and_passes_a_correct_engine(rate):
    """Issue 58's done-when at regress-engine.toml's floor profile (3 levels of 4 blocks, 1,254
    prompts): a candidate diverging twice as often as the engine's noise is caught with probability
    >= 0.8 at noise 0.02-0.10 (the plan's lower bound: 0.815 at 0.02) and through the gate's code;
    a correct engine passes >= 0.95 (split at alpha / 12 per block the doubling at 0.02 was caught
    0.14)."""
    ok, caught = cal.profile_plan(rate, cal.FLOOR_BLOCKS)
    assert caught >= 0.8 and ok >= 0.95, (ok, caught)
    studies = 60
    bug = cal.profile_fail_rate(rate, "small-margins", studies, np.random.default_rng(7), cal.FLOOR_BLOCKS)
    assert bug.simulated >= 0.8 - Z * np.sqrt(0.8 * 0.2 / studies), (bug, caught)
    blocks = [n for level in cal.FLOOR_BLOCKS for n in level]
    split = 1 - np.prod([1 - floor.plan(rate, n, 0.05 / 12)["fail_doubled"] for n in blocks])
    assert rate > 0.02 or split < 0.5, split


def test_an_excess_at_one_level_is_not_hidden_by_the_others():
    """The review of the pooled test: a candidate 3x the noise at concurrency 4 and half of it at 2
    and 3 (fewer divergences than the A/A run there, prompts that cancel the excess when every block
    is pooled) was caught 0.47 at noise 0.05 with one pooled test; each level's own route catches
    it. Through the gate's code at the floor profile's sizes."""
    rng = np.random.default_rng(9)
    sizes, studies, caught = cal.FLOOR_BLOCKS[0], 40, 0
    for _ in range(studies):
        levels = []
        for scale in (0.5, 0.5, 3.0):
            level = []
            for n in sizes:
                b = cal.draw(rng, 0.05, n, "correct")
                c_p = np.flatnonzero(rng.random(n) < 0.05 * scale)
                level.append(b._replace(cand_prompts=c_p, cand_margins=np.full(c_p.size, 2 * cal.EPS)))
            levels.append(level)
        caught += any(s != "pass" for s in cal.family_statuses(levels))
    assert caught / studies >= 0.9, caught


def test_more_prompts_never_let_a_doubled_rate_pass_more_often():
    """Exactly, through the plan (the rule summed over every outcome): P(fail | doubled) over
    50-2,000 prompts never falls; under the old rule it fell from 0.71 at 100 prompts to 0.11 at
    500 (rate 0.05)."""
    ns = np.arange(50, 2001, 50)
    for rate in (0.02, 0.05, 0.1):
        power = np.array([floor.plan(rate, int(n), 0.05)["fail_doubled"] for n in ns])
        assert np.all(np.diff(power) >= -1e-9), (rate, power)
    old = [1 - np.sum([pr * (tango_ni_pvalue(c, b, n, margin=0.1) < 0.05 or (c + b == 0)) for (b, c), pr in
                       _trinomial(0.05, 0.1, n)]) for n in (100, 500)]
    assert old[1] < old[0] - 0.5, old


def _trinomial(ra: float, rc: float, n: int):
    """(candidate-only, A/A-only) counts and their probabilities, independent runs; rounded off
    below 1e-12."""
    from scipy import stats
    pb, pc = rc * (1 - ra), ra * (1 - rc)
    for d in range(n + 1):
        pd = stats.binom.pmf(d, n, pb + pc)
        if pd < 1e-12:
            continue
        for b in range(d + 1):
            yield (b, d - b), pd * stats.binom.pmf(b, d, pb / (pb + pc))


@pytest.mark.parametrize("rate,n,shared", [(0.1, 100, 0.0), (0.05, 200, 0.5)])
def test_the_plan_states_the_power_the_gate_has(rate, n, shared):
    """Detection of the small-margin doubling bug, and the pass rate of a correct engine, match the
    plan's exact figures within Monte Carlo error, with shared divergences too."""
    p = floor.plan(rate, n, 0.05, shared)
    rng = np.random.default_rng(2)
    bug = cal.fail_rate(rate, n, "small-margins", STUDIES, rng, shared=shared)
    ok = cal.fail_rate(rate, n, "correct", STUDIES, rng, shared=shared)
    for sim, exact in ((bug.simulated, p["fail_doubled"]), (1 - ok.simulated, p["pass_correct"])):
        assert abs(sim - exact) <= Z * np.sqrt(exact * (1 - exact) / STUDIES) + 1e-9, (sim, exact, p)


def test_a_wider_noise_is_caught():
    """A bug whose own noise is twice as wide (and so flips twice as often) is caught, by a flip
    beyond the noise scale or by its rate."""
    wide = cal.fail_rate(0.05, 1000, "wider-noise", 100, np.random.default_rng(3))
    assert wide.simulated > 0.9, wide


def test_more_prompts_never_let_a_bug_at_a_fixed_margin_pass_more_often():
    """Issue 58, the review's finding: a bug diverging on 1% more prompts at margin 4 sigma (beyond
    nearly every move, within the largest of many) was caught 0.475 at 300 prompts and 0.265 at
    1,000 (rate 0.05, 200 studies): the noise scale was the largest move, and the largest of more
    moves is larger. With 2.5 x a bound on their 99th percentile it is caught more often at 1,000."""
    rng = np.random.default_rng(11)
    at = {n: cal.fail_rate(0.05, n, "fixed-margin", 200, rng).simulated for n in (300, 1000)}
    assert at[1000] >= at[300], at


@pytest.mark.parametrize("n", [1000, 2000])
def test_a_correct_engine_at_many_prompts_is_refused_at_most_alpha(n):
    """A noise scale that does not grow with the prompts must still excuse a correct engine's
    flips as their number grows (moves |N(0, sigma)|: its flips beyond 2.5 x the moves' p99
    bound are rare): refused at most alpha, through the gate's code."""
    ok = cal.fail_rate(0.05, n, "correct", 150, np.random.default_rng(12))
    assert ok.simulated <= 0.05 + Z * np.sqrt(0.05 * 0.95 / 150), ok


def test_a_correct_candidate_judged_in_several_blocks_is_refused_at_most_alpha():
    """The family: a correct candidate judged in 4 greedy blocks (2 suites x 2 levels) of 200
    prompts, at noise rate 0.25 (aa_floor_max), through apply_levels -> level_floor -> compare ->
    gate_detail. Each block at alpha refused it 0.147 exactly (0.039 per block); tested together
    (all pooled and each level's, alpha split between them): at most 0.05."""
    blocks = ((200, 200),) * 2
    ok, _ = cal.profile_plan(0.25, blocks)
    assert 1 - ok <= 0.05
    per_block_at_alpha = 1 - floor.pass_probability(0.25, 0.25, 200, 0.05) ** 4
    assert per_block_at_alpha > 0.1  # what the gate did before the blocks were judged together
    sim = cal.profile_fail_rate(0.25, "correct", 400, np.random.default_rng(5), blocks)
    assert sim.simulated <= 0.05 + Z * np.sqrt(0.05 * 0.95 / 400), sim  # 0.147 before: far above 0.078


def test_a_noisier_suite_at_the_same_level_does_not_refuse_a_correct_engine():
    """The review: the noise scale pooled over a level's suites came from the quiet one (factual,
    217 prompts), and the noisy one's correct flips (longform, 45 prompts, moves 5x as wide, twice
    the rate) lay beyond it: a correct engine refused 0.345 at alpha 0.05. Each suite's own scale."""
    def wider(b, k):
        return b._replace(aa_margins=b.aa_margins * k, aa_shifts=b.aa_shifts * k, cand_margins=b.cand_margins * k,
                          moves=b.moves * k)
    rng, studies = np.random.default_rng(13), 150
    refused = sum(any(s != "pass" for s in cal.family_statuses(
        [[cal.draw(rng, 0.05, 217, "correct"), wider(cal.draw(rng, 0.1, 45, "correct"), 5.0)]]))
        for _ in range(studies))
    assert refused / studies <= 0.05 + Z * np.sqrt(0.05 * 0.95 / studies), refused


def test_a_quiet_suite_keeps_its_own_scale_against_a_bug():
    """Each suite's own scale cuts both ways: beside a noisy suite, a quiet suite's bug at 12 sigma
    of its own noise (beyond it, within the noisy suite's) still fails as beyond the noise; a scale
    pooled over the level (or floored at the pooled one) excused it."""
    rng = np.random.default_rng(17)
    quiet = cal.draw(rng, 0.05, 217, "correct")
    bug = quiet._replace(cand_prompts=np.r_[quiet.cand_prompts, 216], cand_margins=np.r_[quiet.cand_margins, 12 * cal.SIGMA])
    noisy = cal.draw(rng, 0.1, 217, "correct")  # as many moves as the quiet one: the level's scale is the noisy one's
    noisy = noisy._replace(aa_margins=noisy.aa_margins * 8, aa_shifts=noisy.aa_shifts * 8,
                           cand_margins=noisy.cand_margins * 8, moves=noisy.moves * 8)
    summary = cal.family_statuses([[bug, noisy]])
    assert summary[0] == "fail", summary


def test_the_plan_over_several_levels_takes_every_routes_false_fails():
    """P(pass | correct) over several levels is one less each route's exact false-fail rate: the
    pooled route's and every level's (Bonferroni), below the pooled route's alone."""
    sizes = {"c2": 200, "c4": 200}
    p = floor.family_plan(0.25, sizes, 0.05)
    pooled = floor.plan(0.25, 400, 0.025)["pass_correct"]
    levels = sum(1 - floor.plan(0.25, 200, 0.0125)["pass_correct"] for _ in sizes)
    assert p["pass_correct"] == pytest.approx(pooled - levels) and levels > 0.01, (p, pooled, levels)
