"""The A/A floor's calibration (harness.calibration.floor) on a few hundred studies, through the
gate's own code (level_floor -> compare -> gate_detail), in seconds:
- a correct engine, at a size the plan calls enough, fails no more than alpha allows (and the check
  has teeth: the rule the floor had before, an exact test of "more often" with an inconclusive for
  small counts, fails it: here it fails three correct engines in ten);
- a bug that doubles the rate is caught as often as the plan states, and the plan's pass figure is
  the simulated one.
The full grid is in CALIBRATION.md (`make calibrate`)."""
from __future__ import annotations

import numpy as np
import pytest

from harness.calibration import floor as cal
from harness.verdict import floor

STUDIES = 200
Z = 2.576


def old_rule(aa_prompts, aa_margins, cand_prompts, cand_margins, n: int) -> str:
    """The floor's rate rule before issue 49: an exact one-sided test that the candidate diverges on
    more prompts, inconclusive where even all discordant prompts on its side could not reject."""
    b, c = len(set(cand_prompts) - set(aa_prompts)), len(set(aa_prompts) - set(cand_prompts))
    if b + c == 0:
        return "pass"
    if floor.rate_test(b, c, n, 0.05)["exceeds"]:
        return "fail"
    return "inconclusive" if b > c and 0.5 ** (b + c) >= 0.05 else "pass"


def cries_wolf(rate: cal.Rate, level: float = 0.05) -> bool:
    return rate.simulated > level + Z * np.sqrt(level * (1 - level) / rate.studies)


def test_a_correct_engine_fails_at_most_alpha_where_the_plan_says_enough():
    rate, n = 0.01, 100
    assert floor.plan(rate, n, 0.1, 0.05)["enough"]
    shipped = cal.fail_rate(rate, n, "correct", STUDIES, np.random.default_rng(1))
    assert not cries_wolf(shipped), shipped
    before = cal.fail_rate(rate, n, "correct", STUDIES, np.random.default_rng(1), judge=old_rule)
    assert cries_wolf(before), before


@pytest.mark.parametrize("rate,n", [(0.1, 100), (0.05, 40)])
def test_the_plan_states_the_power_the_gate_has(rate, n):
    """Detection of the small-margin doubling bug, and the pass rate of a correct engine, match the
    plan's exact figures within Monte Carlo error (at 0.05 x 40 the size is not enough: the plan
    says so, and the figures still match)."""
    p = floor.plan(rate, n, 0.1, 0.05)
    rng = np.random.default_rng(2)
    bug = cal.fail_rate(rate, n, "small-margins", STUDIES, rng)
    ok = cal.fail_rate(rate, n, "correct", STUDIES, rng)
    for sim, exact in ((bug.simulated, p["fail_doubled"]), (1 - ok.simulated, p["pass_correct"])):
        assert abs(sim - exact) <= Z * np.sqrt(exact * (1 - exact) / STUDIES) + 1e-9, (sim, exact, p)


def test_a_wider_noise_fails_beyond_the_floor():
    """Flips beyond the A/A noise fail whatever the rate says."""
    wide = cal.fail_rate(0.05, 100, "wider-noise", 100, np.random.default_rng(3))
    assert wide.simulated > 0.9, wide
