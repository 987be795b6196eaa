"""The engine seed gate's two rates (harness.calibration.seeds) on a few hundred studies, through
the gate's own code (seed_check -> seed_gates), in seconds:
- an honest quantized engine, more peaked than its fp32 reference (top 0.999 against 0.98, 8
  prompts x 48 tokens), is not called seed-deaf; the rule before (every pair identical and the
  reference's chance below 1e-3) called it so about half the time, and this check fails that rule;
- an engine deaf on half its prompts (top 0.9) is caught at >= 0.8; the rule before almost never.
The full grid is in CALIBRATION.md (`make calibrate`)."""
from __future__ import annotations

import numpy as np
import pytest

from harness.calibration import seeds as cal
from harness.run.engine_exactness import SEED_LEVEL, combined_pvalue, raised


def test_an_honest_engine_more_peaked_than_its_reference_is_not_called_seed_deaf():
    now, before = cal.alarms(0.999, 0.98, 8, 48, 0, 300, np.random.default_rng(1))
    assert now.simulated == 0.0, now  # at SEED_LEVEL 1e-3, 300 studies expect 0.3 alarms at most
    assert before.simulated > 0.3, before  # the rule before cried wolf: this check has teeth


def test_an_engine_deaf_on_half_its_prompts_is_caught():
    now, before = cal.alarms(0.9, 0.9, 8, 48, 4, 100, np.random.default_rng(2))
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
