"""The counter arithmetic of `decodegate watch` (analysis.drift_detector), without an engine:
counter epochs across restarts, refusals of counters that go backwards without a restart,
dispersion and windows. The detector is tested in test_lr_cusum.py."""
from __future__ import annotations

import numpy as np
import pytest

from analysis.drift_detector import CounterError, Reading, counter_delta, dispersion, dispersion_upper, wilson_interval


def test_counter_difference_and_epochs():
    a = Reading(drafted=100, accepted=40, drafts=20, others={"x:prompt_tokens_total": 500.0})
    b = Reading(drafted=160, accepted=70, drafts=30, others={"x:prompt_tokens_total": 650.0})
    d = counter_delta(a, b)
    assert (d.drafted, d.accepted, d.drafts, d.restarted) == (60, 30, 10, False)
    fresh = Reading(drafted=12, accepted=5, drafts=3, others={"x:prompt_tokens_total": 40.0})
    # A fresh process: every counter lower at once. Its counts since the restart are kept.
    d = counter_delta(b, fresh)
    assert d.restarted and (d.drafted, d.accepted) == (12, 5) and "reset" in d.why
    # A scrape that failed in between is a restart signature on its own.
    busy = Reading(drafted=12, accepted=5, drafts=3, others={"x:prompt_tokens_total": 9000.0})
    assert counter_delta(b, busy, failed_scrape_between=True).restarted
    # A fresh process whose spec counters already passed the old ones (traffic before the first
    # scrape after the restart): its other counters went down, and the engine was unreachable.
    quick = Reading(drafted=300, accepted=100, drafts=50, others={"x:prompt_tokens_total": 100.0})
    d = counter_delta(b, quick, failed_scrape_between=True)
    assert d.restarted and (d.drafted, d.accepted) == (300, 100)
    assert not counter_delta(b, Reading(300, 100, 50, {"x:prompt_tokens_total": 900.0}), failed_scrape_between=True).restarted
    # A changed process start time too (vLLM exports process_start_time_seconds).
    assert counter_delta(Reading(100, 40, start_time=1.0), Reading(5, 1, start_time=2.0)).restarted


def test_counters_backwards_without_a_restart_are_refused():
    a = Reading(drafted=100, accepted=40, others={"x:prompt_tokens_total": 500.0})
    b = Reading(drafted=90, accepted=41, others={"x:prompt_tokens_total": 600.0})
    with pytest.raises(CounterError, match=r"went backwards \(drafted: drafted 100 -> 90\).*no sign of a restart"):
        counter_delta(a, b)
    with pytest.raises(CounterError, match="not one engine's"):
        counter_delta(a, Reading(drafted=110, accepted=60, others={"x:prompt_tokens_total": 600.0}))


def test_dispersion_and_wilson():
    rng = np.random.default_rng(2)
    n = rng.integers(20, 80, size=400)
    assert dispersion(rng.binomial(n, 0.4), n) == pytest.approx(1.0, abs=0.2)
    p = rng.beta(2, 3, size=400)  # prompts that differ: overdispersed
    assert dispersion(rng.binomial(n, p), n) > 5
    # The upper bound: above the estimate, closer to it with more requests, 1 at least.
    few, many = rng.binomial(n[:12], p[:12]), rng.binomial(n, p)
    assert dispersion_upper(few, n[:12]) > 2 * dispersion(few, n[:12])
    assert dispersion(many, n) < dispersion_upper(many, n) < 1.25 * dispersion(many, n)
    assert dispersion_upper([3], [10]) == float("inf")
    low, high = wilson_interval(40, 100)
    assert low < 0.4 < high and wilson_interval(40, 100, dispersion=4) [0] < low
    assert all(np.isnan(wilson_interval(0, 0)))
