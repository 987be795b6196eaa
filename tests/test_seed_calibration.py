"""The engine seed gate's two rates (harness.calibration.seeds) on a few hundred studies, through
the gate's own code (seed_check -> seed_gates), in seconds:
- an honest quantized engine, more peaked than its fp32 reference (top 0.999 against 0.98, 8
  prompts x 48 tokens), is not called seed-deaf; the rule before (every pair identical and the
  reference's chance below 1e-3) called it so about half the time, and this check fails that rule;
- an engine deaf on half its prompts (top 0.9) is caught at >= 0.8; the rule before almost never;
- issue 58's shapes: a few deaf prompts among many (1 of 16, 2 of 40, 4 of 100), a fully deaf
  engine with predictable outputs, repeats holding a token outside the nucleus; and no warning
  that names a probability below the level.
The full grid is in CALIBRATION.md (`make calibrate`)."""
from __future__ import annotations

import numpy as np
import pytest

from harness.calibration import seeds as cal
from harness.run.engine_exactness import SEED_LEVEL, combined_pvalue, raised


def test_an_honest_engine_more_peaked_than_its_reference_is_not_called_seed_deaf():
    now, before = cal.alarms(0.999, 0.98, 8, 48, 0, 300, np.random.default_rng(1), before=cal.all_identical)
    assert now.simulated == 0.0, now  # at SEED_LEVEL 1e-3, 300 studies expect 0.3 alarms at most
    assert before.simulated > 0.3, before  # the rule before cried wolf: this check has teeth


def test_an_engine_deaf_on_half_its_prompts_is_caught():
    now, before = cal.alarms(0.9, 0.9, 8, 48, 4, 100, np.random.default_rng(2), before=cal.all_identical)
    assert now.simulated >= 0.8, now
    assert before.simulated < 0.1, before


def test_at_a_real_engines_noise_both_rates_hold():
    """At 1 logit of engine-reference noise (llama.cpp's Q4_1 server read 0.48 against its own
    prompt logprobs), each in its hard direction: an honest engine 1 logit more peaked than the
    reference is not called seed-deaf, and one deaf on half its prompts whose reference is 1 logit
    more peaked than it is still caught at >= 0.8 (top 0.9, 8 prompts x 48 tokens)."""
    rng = np.random.default_rng(3)
    honest, _ = cal.alarms(cal.shifted(0.9, 1.0), 0.9, 8, 48, 0, 300, rng)
    assert honest.simulated == 0.0, honest
    deaf, _ = cal.alarms(0.9, cal.shifted(0.9, 1.0), 8, 48, 4, 100, rng)
    assert deaf.simulated >= 0.8, deaf


def test_the_noise_raises_each_token_and_fisher_combines_prompts():
    """0.98 raised by the 3.02 logits between 0.999 and 0.98 is 0.999; with no noise it stays; a
    prompt whose pairs differ (log p 0) only adds degrees of freedom."""
    assert np.exp(raised([0.98], cal.noise_between(0.999, 0.98)))[0] == pytest.approx(0.999, abs=1e-12)
    assert np.exp(raised([0.98, 1.0], 0.0)) == pytest.approx([0.98, 1.0], abs=1e-12)
    assert combined_pvalue([]) is None
    one = combined_pvalue([np.log(1e-4)])
    assert one < SEED_LEVEL and combined_pvalue([np.log(1e-4), 0.0, 0.0]) > one


@pytest.mark.parametrize("prompts,deaf", [(16, 1), (40, 2), (100, 4)])
def test_a_few_deaf_prompts_among_many_are_caught(prompts, deaf):
    """Issue 58: Fisher's sum dilutes one deaf prompt among many (the rule before caught 1 of 16 at
    0.003); the smallest prompt's p-value times the prompts (its share of the level) sees it."""
    now, before = cal.alarms(0.9, 0.9, prompts, 48, deaf, 200, np.random.default_rng(prompts))
    assert now.simulated >= 0.8, now
    assert before.simulated < 0.05, before


def test_a_fully_deaf_engine_with_predictable_outputs_is_caught_and_an_honest_one_is_not():
    """18 pairs of samples with one uncertain token at 0.7 each (the product of the repeats' chances
    ~1.9e-5): every per-prompt p-value is large, so Fisher's sum never fires (the rule before: 0),
    and the gate said "warn ... probability 1.9e-05", below its own level. The product route
    catches it; an honest engine with the same outputs repeats all 18 with probability 5e-5."""
    rng = np.random.default_rng(4)
    now, before = cal.alarms(cal.PREDICTABLE, cal.PREDICTABLE, 18, 48, 18, 200, rng, noise=0.0)
    assert now.simulated >= 0.95 and before.simulated < 0.05, (now, before)
    honest, _ = cal.alarms(cal.PREDICTABLE, cal.PREDICTABLE, 18, 48, 0, 300, rng, noise=0.0)
    assert honest.simulated == 0.0, honest


def test_no_warning_names_a_probability_below_the_level():
    """Every pair identical, no route below its share, the product below the level: inconclusive
    with its reason (a fail by default), never "warn ... probability 2e-04"."""
    from harness.verdict.engine_exactness import seed_gates
    seeds = {"pairs": 6, "identical": 6, "chance": 2e-4, "left_out": 0, "off_reference": 0, "pvalue": 0.3,
             "prompts": 6, "repeated_prompts": 6, "ignored": False, "level": SEED_LEVEL,
             "routes": {"fisher": 0.3, "min-p": 0.9, "product": 5e-4, "control": None},
             "route_levels": {"fisher": 1.5e-4, "min-p": 4e-4, "product": 3.5e-4, "control": 1e-4}}
    [g] = seed_gates(seeds)
    assert g.status == "fail" and g.detail.startswith("inconclusive") and "at most 0.0005, below the level 0.001" in g.detail, g
    [g] = seed_gates(dict(seeds, routes=dict(seeds["routes"], product=0.02)))
    assert g.status == "warn" and "0.02" in g.detail, g


def test_a_deaf_engine_whose_repeats_leave_the_nucleus_is_never_silent():
    """Deaf on 4 of 8 prompts, each repeat holding one token the reference gives probability 0: the
    rule before dropped such a repeat whole (combined p = 1, no seed result); the token is now left
    out, not the pair, and the other 47 tokens still score the repeat."""
    out = cal.outcomes(0.9, 0.9, 8, 48, 4, 100, np.random.default_rng(5), off_reference=True)
    assert out["silent"] == 0.0 and out["warn"] == 0.0, out


def test_the_routes_split_the_level_and_each_sees_its_shape():
    """The shares of SEED_LEVEL sum to at most 1 (the union's false-alarm rate stays <= 1e-3); one
    strong prompt among 16 fires min-p (16 x 1e-5) and not Fisher; the product route exists only
    where every pair repeated, and the control route with it (issue-58 review, mutation pass)."""
    import math
    from harness.run.engine_exactness import SEED_ROUTES, route_pvalues
    assert sum(SEED_ROUTES.values()) <= 1.0 + 1e-12 and min(SEED_ROUTES.values()) > 0
    one = [{"pairs": 1, "repeats": [{"raised": math.log(1e-5)}], "log_p": math.log(1e-5)}]
    honest = [{"pairs": 1, "repeats": [], "log_p": 0.0}] * 15
    out = route_pvalues(one + honest, control_p=1e-9)
    assert out["routes"]["min-p"] == pytest.approx(16e-5) and out["ignored"]
    assert out["routes"]["fisher"] > out["route_levels"]["fisher"]
    assert out["routes"]["product"] is None and out["routes"]["control"] is None
    assert sum(out["route_levels"].values()) <= SEED_LEVEL * (1 + 1e-12)
    every = route_pvalues([{"pairs": 1, "repeats": [{"raised": math.log(0.5)}], "log_p": math.log(0.5)}] * 18)
    assert every["routes"]["product"] == pytest.approx(0.5 ** 18) and every["ignored"]
    weak = route_pvalues([{"pairs": 1, "repeats": [{"raised": math.log(0.9)}], "log_p": math.log(0.9)}] * 18)
    assert weak["routes"]["product"] == pytest.approx(0.9 ** 18) and not weak["ignored"]
