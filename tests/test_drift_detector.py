"""The statistics of `decodegate watch` (analysis.drift_detector), without an engine: the CUSUM's
threshold against simulation, counter epochs across restarts, refusals of counters that go
backwards without a restart, and the grouping of scrapes into steps."""
from __future__ import annotations

import numpy as np
import pytest

from analysis.drift_detector import (
    CounterError, Cusum, Reading, counter_delta, cusum_run_lengths, cusum_threshold, dispersion, dispersion_upper,
    group_steps,
    mean_run_length, reference_value, replay_scrapes, siegmund_arl, simulate_run_lengths, standardized_deficit,
    wilson_interval,
)


@pytest.mark.parametrize("arl,k", [(200, 0.25), (500, 0.5), (1000, 1.0)])
def test_threshold_gives_the_arl_it_was_set_for_in_simulation(arl, k):
    """Siegmund's approximation, checked: 3,000 in-control runs of the CUSUM on N(0, 1) steps."""
    h = cusum_threshold(arl, k)
    assert siegmund_arl(h, k) == pytest.approx(arl, rel=1e-6)
    max_steps = 5 * arl
    measured = mean_run_length(simulate_run_lengths(h, k, runs=3000, max_steps=max_steps, rng=7), max_steps)
    assert 0.88 * arl <= measured <= 1.1 * arl, (arl, k, h, measured)


def test_a_shift_of_2k_is_caught_in_a_few_steps_and_siegmund_says_so():
    k = 0.5
    h = cusum_threshold(10_000, k)
    delay = simulate_run_lengths(h, k, runs=2000, max_steps=500, mean=2 * k, rng=3)
    assert np.all(delay <= 500)
    assert np.mean(delay) == pytest.approx(siegmund_arl(h, k, mean=2 * k), rel=0.15)
    assert np.mean(delay) < 25


def test_binomial_steps_at_the_boundary_keep_the_arl_and_a_drop_alarms():
    """Acceptance counts (not Gaussian) at p = p0, through the detector's own standardization."""
    p0, n, arl = 0.4, 64, 300
    k = reference_value(p0, 0.2, 1.0, n)
    det = Cusum(p0=p0, k=k, h=cusum_threshold(arl, k), phi=1.0, min_drafted=n)
    rng = np.random.default_rng(11)
    a = rng.binomial(n, p0, size=(2000, 4 * arl))
    measured = mean_run_length(cusum_run_lengths(standardized_deficit(a, n, p0, 1.0), det.k, det.h), 4 * arl)
    assert measured >= 0.85 * arl, measured
    low = rng.binomial(n, p0 * 0.8, size=(500, 200))
    delay = cusum_run_lengths(standardized_deficit(low, n, p0, 1.0), det.k, det.h)
    assert np.mean(delay) < 30 and np.all(delay <= 200)


def test_cusum_update_is_the_vectorised_recursion_and_carries_small_scrapes():
    rng = np.random.default_rng(5)
    drafted = rng.integers(0, 40, size=300).astype(float)
    accepted = rng.binomial(drafted.astype(int), 0.3).astype(float)
    det = Cusum(p0=0.45, k=0.3, h=4.0, phi=1.5, min_drafted=64)
    stats_seen = []
    for a, n in zip(accepted, drafted):
        if det.update(a, n):
            stats_seen.append(det.statistic)
    ga, gn = group_steps(accepted, drafted, 64)
    assert det.steps == len(ga) and np.all(gn >= 64)
    z = standardized_deficit(ga, gn, 0.45, 1.5)
    s, path = 0.0, []
    for zi in z:
        s = max(0.0, s + zi - 0.3)
        path.append(s)
    assert stats_seen == pytest.approx(path)
    first = int(np.argmax(np.array(path) >= 4.0)) + 1 if max(path) >= 4.0 else len(path) + 1
    assert cusum_run_lengths(z[None, :], 0.3, 4.0)[0] == first


def test_replay_groups_scrapes_into_steps_and_censors_runs():
    det = Cusum(p0=0.5, k=0.5, h=cusum_threshold(100, 0.5), min_drafted=10)
    with pytest.raises(ValueError, match="nothing to replay"):
        replay_scrapes([0], [0], det, runs=2, max_steps=5)
    lengths = replay_scrapes([4, 5], [5, 5], det, runs=50, max_steps=40, rng=1)  # always above p0
    assert np.all(lengths == 41) and mean_run_length(lengths, 40) == float("inf")
    # Acceptance 0 in scrapes of 5 tokens: every step is 2 scrapes, z = sqrt(10) each.
    z = float(standardized_deficit(0, 10, 0.5, 1.0))
    h = 3 * (z - 0.5) - 1e-9
    alarm = replay_scrapes([0], [5], Cusum(p0=0.5, k=0.5, h=h, min_drafted=10), runs=3, max_steps=10, rng=0)
    assert np.all(alarm == 3)


def test_replay_at_the_boundary_keeps_the_arl():
    """Binomial scrapes of varying size at p = p0, through the replay's grouping."""
    rng = np.random.default_rng(4)
    n = rng.integers(5, 40, size=2000)
    a = rng.binomial(n, 0.3)
    k = 0.5
    det = Cusum(p0=a.sum() / n.sum(), k=k, h=cusum_threshold(200, k), min_drafted=64)
    measured = mean_run_length(replay_scrapes(a, n, det, runs=1500, max_steps=1000, rng=2), 1000)
    assert measured >= 0.85 * 200, measured


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
