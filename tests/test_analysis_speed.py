"""Acceptance, exit-layer and latency statistics on synthetic records."""

import numpy as np
import pytest

from analysis import (
    acceptance_by_group, acceptance_summary, exit_by_group, exit_summary, exit_theoretical_speedup,
    expected_round_tokens, expected_tokens_per_round, latency_summary, pair_records, paired_speedup, round_speedup,
    theoretical_speedup,
)
from analysis.latency import decode_step_seconds, inter_token_latencies
from harness.calibration.synthetic import make_record, speculative_stats, token_times

# --------------------------------------------------------------------------------- theory


def test_theoretical_speedup_hand_values():
    assert theoretical_speedup(0.8, 4, 0.1) == pytest.approx((1 - 0.8**5) / (0.2 * 1.4))
    assert theoretical_speedup(1.0, 4, 0.1) == pytest.approx(5 / 1.4)  # alpha = 1: K + 1 tokens
    assert theoretical_speedup(0.0, 4, 0.1) == pytest.approx(1 / 1.4)
    assert theoretical_speedup(0.999999, 4, 0.0) == pytest.approx(5.0, rel=1e-5)
    assert theoretical_speedup(0.8, 4, 0.1, verify_cost=1.3) == pytest.approx((1 - 0.8**5) / (0.2 * 1.7))
    assert np.allclose(expected_tokens_per_round(np.array([0.5, 1.0]), 2), [1.75, 3.0])
    with pytest.raises(ValueError):
        theoretical_speedup(1.2, 4, 0.1)
    with pytest.raises(ValueError):
        theoretical_speedup(0.5, 4, -1)


# ----------------------------------------------------------------------------- acceptance


def spec_pairs(rounds_by_item, *, k=4, step=0.05, draft_step=0.005, verify=0.06, suite="factual",
               categories=("general",), ttft=0.1):
    """Baseline (one token per step) and speculative records whose wall time follows the rounds,
    each after a prefill of `ttft` seconds."""
    base, cand = [], []
    for i, acc in enumerate(rounds_by_item):
        n_tokens = 1 + sum(a + 1 for a in acc)
        item = f"{suite}-{i}"
        base.append(make_record(item_id=item, suite=suite, categories=categories,
                                tokens=list(range(n_tokens)), ttft_s=ttft, step_s=step))
        st = speculative_stats(acc, k=k, draft_time_s=draft_step * k * len(acc), verify_time_s=verify * len(acc))
        wall = ttft + len(acc) * (k * draft_step + verify)
        cand.append(make_record(candidate="spec", decoder="speculative", item_id=item, suite=suite,
                                categories=categories, tokens=list(range(n_tokens)), stats=st,
                                ttft_s=ttft, wall_s=wall, step_s=0.0))
    return pair_records(base, cand)


def test_round_speedup_is_leviathans_at_each_rounds_own_draft_length():
    # every round at K: the formula, with and without the measured verify cost
    for c, v in ((0.0, 1.0), (0.1, 1.0), (0.1, 1.3)):
        assert round_speedup(0.7, [4] * 9, c, verify_cost=v) == pytest.approx(
            float(theoretical_speedup(0.7, 4, c, verify_cost=v)))
    # two rounds of 4 drafts, one of 2, three plain steps (prompt lookup without a match)
    ks, a = [4, 4, 2, 0, 0, 0], 0.5
    tokens = 2 * (1 + a + a**2 + a**3 + a**4) + (1 + a + a**2) + 3
    assert expected_round_tokens(a, ks) == pytest.approx(tokens)
    assert round_speedup(a, ks, 0.0) == pytest.approx(tokens / 6)
    # c per draft token; a round of k drafts verifies at 1 + (v - 1) k / K steps
    cost = 2 * (1.4 + 4 * 0.1) + (1.2 + 2 * 0.1) + 3
    assert round_speedup(a, ks, 0.1, verify_cost=1.4) == pytest.approx(tokens / cost)
    assert round_speedup(a, ks, 0.0) < float(theoretical_speedup(a, 4, 0.0))
    assert round_speedup(1.0, [3, 0], 0.0) == pytest.approx(5 / 2) and round_speedup(0.0, [3, 0], 0.0) == 1.0
    assert np.isnan(round_speedup(0.5, [], 0.0)) and np.isnan(round_speedup(float("nan"), [4], 0.0))
    with pytest.raises(ValueError):
        expected_round_tokens(0.5, [-1])


def test_acceptance_theory_counts_rounds_without_a_draft_and_fallback_steps():
    """Prompt lookup records a round of 0 drafts where the context has no match, and the kill
    switch emits fallback tokens outside rounds: both are plain steps, one token for one step.
    Leviathan's formula at K (kept as theoretical_speedup_fixed_k) counted neither."""
    pairs = spec_pairs([[4, 2], [0, 4]])
    for p, extra in zip(pairs, ([0, 0], [0])):
        st = p.candidate["stats"]
        st["proposed_per_round"] = st["proposed_per_round"] + [0] * len(extra)
        st["accepted_per_round"] = st["accepted_per_round"] + extra
        st["rounds"] += len(extra)
    pairs[0].candidate["stats"]["fallback_tokens"] = 2
    s = acceptance_summary(pairs, rng=0, n_resamples=200)
    a = 10 / 12  # the plain rounds test nothing: α is unchanged
    assert s.alpha == pytest.approx(a) and s.rounds == 7
    per_k = sum(a**i for i in range(5))
    c, v = 0.1, 0.06 * 4 / 7 / 0.05  # verify_time_s is spread over all 7 rounds
    assert s.theoretical_speedup == pytest.approx((4 * per_k + 5) / (4 * 1.4 + 5))
    assert s.theoretical_speedup_fixed_k == pytest.approx(float(theoretical_speedup(a, 4, c)))
    assert s.theoretical_speedup < s.theoretical_speedup_fixed_k
    assert s.theoretical_speedup_measured_verify == pytest.approx((4 * per_k + 5) / (7 * v + 16 * c))
    assert s.achieved_over_theoretical == pytest.approx(s.achieved_decode.statistic / s.theoretical_speedup)


def test_acceptance_summary_hand_computed():
    pairs = spec_pairs([[4, 2], [0, 4]])
    s = acceptance_summary(pairs, rng=0, n_resamples=500)
    assert (s.k, s.rounds, s.proposed, s.accepted) == (4, 4, 16, 10)
    assert s.acceptance_rate == pytest.approx(10 / 16)
    assert s.alpha == pytest.approx(10 / 12)  # two rounds ended in a rejection
    assert s.alpha_method.startswith("accepted/(accepted+rejected")
    assert s.accepted_length_histogram == (1, 0, 1, 0, 2)
    # position: accepted (acc > j), proposed, tested (acc >= j)
    assert [r[1:3] for r in s.by_position] == [(3, 4), (3, 4), (2, 4), (2, 4)]
    assert [r[4] for r in s.by_position] == pytest.approx([3 / 4, 3 / 3, 2 / 3, 2 / 2])
    tokens = (1 + 5 + 3) + (1 + 1 + 5)
    assert s.tau == pytest.approx(tokens / 6)  # 2 verify rounds + 1 prefill per item
    assert s.c == pytest.approx(0.005 / 0.05) and s.verify_cost == pytest.approx(0.06 / 0.05)
    assert s.theoretical_speedup == pytest.approx(float(theoretical_speedup(10 / 12, 4, 0.1)))
    assert s.theoretical_speedup_measured_verify == pytest.approx(
        float(theoretical_speedup(10 / 12, 4, 0.1, verify_cost=1.2)))
    assert s.theoretical_speedup_fixed_k == pytest.approx(s.theoretical_speedup)  # every round drafted K
    base_t = 0.1 + 0.05 * (9 - 1) + 0.1 + 0.05 * (7 - 1)
    cand_t = 2 * (0.1 + 2 * (0.02 + 0.06))
    assert s.achieved.statistic == pytest.approx((base_t / tokens) / (cand_t / tokens))
    # the theory is of decoding steps: it is held against the decode phase, prefill left out
    base_d, cand_d = 0.05 * (9 - 1) + 0.05 * (7 - 1), 2 * 2 * (0.02 + 0.06)
    assert s.achieved_decode.statistic == pytest.approx(base_d / cand_d)
    assert s.achieved_over_theoretical == pytest.approx(base_d / cand_d / s.theoretical_speedup)
    assert s.statistic == s.alpha and s.confidence_interval()[0] <= s.alpha <= s.confidence_interval()[1]


def test_achieved_over_theory_does_not_move_with_the_prefill():
    """Leviathan's speedup is a theory of decoding steps. A prefill both sides pay alike dilutes the
    end-to-end speedup (it once counted in achieved/theory, so a longer prompt read as a less
    efficient decoder); the ratio to theory takes the decode phase alone."""
    short, long = (acceptance_summary(spec_pairs([[4, 2], [0, 4]], ttft=t), rng=0, n_resamples=200) for t in (0.1, 2.0))
    assert long.achieved.statistic < short.achieved.statistic  # end to end: diluted by the prefill
    assert long.achieved_decode.statistic == pytest.approx(short.achieved_decode.statistic)
    assert long.achieved_over_theoretical == pytest.approx(short.achieved_over_theoretical)
    assert long.theoretical_speedup == pytest.approx(short.theoretical_speedup)


def test_achieved_over_theory_without_a_ttft_is_no_figure():
    """Fail closed: where a record has no TTFT the decode phase cannot be timed, and the ratio is
    NaN (shown as missing), not the end-to-end speedup standing in for it."""
    pairs = spec_pairs([[4, 2], [0, 4]])
    del pairs[1].candidate["timing"]["ttft_s"]
    with pytest.raises(ValueError, match="ttft"):
        paired_speedup(pairs, decode_only=True)
    s = acceptance_summary(pairs, rng=0, n_resamples=200)
    assert np.isfinite(s.achieved.statistic)
    assert np.isnan(s.achieved_decode.statistic) and np.isnan(s.achieved_over_theoretical)


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), 0.0, None])
def test_a_timing_that_is_no_time_is_refused_not_a_speedup(bad):
    """One baseline wall time of inf made the lower bound 1e308, and a candidate slower on every
    prompt passed its speed gate; NaN raised a TypeError deep in the gate."""
    pairs = spec_pairs([[4, 2], [0, 4]])
    pairs[0].baseline["timing"]["wall_s"] = bad
    with pytest.raises(ValueError, match="no usable timing.wall_s"):
        paired_speedup(pairs)


def test_decode_speedup_leaves_out_pairs_without_a_decode_phase():
    pairs = spec_pairs([[4, 2], [0, 4], [0]])  # the third: one round, nothing accepted, 2 tokens
    for side in (pairs[2].baseline, pairs[2].candidate):
        side["tokens"] = side["tokens"][:1]
    d = paired_speedup(pairs, decode_only=True)
    assert d.n == 2 and d.statistic == pytest.approx((0.05 * 14) / (2 * 2 * (0.02 + 0.06)))
    with pytest.raises(ValueError, match="decode phase"):
        paired_speedup(pairs[2:], decode_only=True)


def test_alpha_estimate_is_unbiased_where_accepted_over_proposed_is_not():
    rng = np.random.default_rng(0)
    k, alpha = 4, 0.7
    items = []
    for _ in range(40):
        draws = rng.random((25, k)) < alpha
        items.append(np.argmin(np.c_[draws, np.zeros((25, 1), bool)], axis=1).tolist())
    s = acceptance_summary(spec_pairs(items, k=k), rng=1, n_resamples=500)
    assert s.alpha == pytest.approx(alpha, abs=0.03)
    assert s.confidence_interval()[0] < alpha < s.confidence_interval()[1]
    expected_rate = sum(alpha**i for i in range(1, k + 1)) / k  # E[accepted per round] / K
    assert s.acceptance_rate == pytest.approx(expected_rate, abs=0.03)


def test_rounds_without_proposals_are_not_drafting_rounds():
    pairs = spec_pairs([[4, 2], [0, 4]])
    st = pairs[0].candidate["stats"]
    st["accepted_per_round"] = st["accepted_per_round"] + [0]
    st["proposed_per_round"] = st["proposed_per_round"] + [0]  # prompt lookup found no match
    st["rounds"] += 1
    s = acceptance_summary(pairs, rng=0, n_resamples=200)
    assert s.accepted_length_histogram == (1, 0, 1, 0, 2) and s.alpha == pytest.approx(10 / 12)


def test_alpha_from_positions_without_per_round_arrays():
    pairs = spec_pairs([[4, 2], [0, 4]])
    for p in pairs:
        del p.candidate["stats"]["accepted_per_round"], p.candidate["stats"]["proposed_per_round"]
    s = acceptance_summary(pairs, rng=0, n_resamples=200)
    assert s.alpha == pytest.approx(10 / 12) and "position" in s.alpha_method
    assert s.accepted_length_histogram == (0, 0, 0, 0, 0)


def test_alpha_rests_on_the_records_that_can_show_it():
    """An engine's per-position counts missing on one record (a metrics scrape that came back
    empty), and nothing drafted on another: alpha was accepted / proposed for the whole group,
    ~half the per-token probability at K = 4, under the same name (0.345 against 0.6 in one run)."""
    pairs = spec_pairs([[4, 2], [0, 4], [1, 1], [0]])
    for p in pairs:
        del p.candidate["stats"]["accepted_per_round"], p.candidate["stats"]["proposed_per_round"]
    del pairs[2].candidate["stats"]["acceptance_by_position"]         # drafted, counts lost
    st = pairs[3].candidate["stats"]                                    # drafted nothing at all
    del st["acceptance_by_position"]
    st.update(proposed=0, accepted=0, rounds=0)
    s = acceptance_summary(pairs, rng=0, n_resamples=200)
    assert s.alpha == pytest.approx(10 / 12)                            # the two records with counts
    assert "position" in s.alpha_method and "over 3 of 4 records" in s.alpha_method
    assert s.acceptance_rate < 0.7                                      # the share kept, reported apart


@pytest.mark.parametrize("accepted, proposed", [(12, 8), (-1, 8), (3, -4)])
def test_counts_that_cannot_be_are_no_acceptance(accepted, proposed):
    """An engine reporting 12 accepted of 8 proposed was published as α 1.50, and the run passed."""
    pairs = spec_pairs([[4, 2], [0, 4]])
    for p in pairs:
        del p.candidate["stats"]["accepted_per_round"], p.candidate["stats"]["proposed_per_round"]
        del p.candidate["stats"]["acceptance_by_position"]
    pairs[0].candidate["stats"].update(accepted=accepted, proposed=proposed)
    with pytest.raises(ValueError, match="impossible counts"):
        acceptance_summary(pairs, rng=0, n_resamples=200)


def test_acceptance_by_suite_and_category():
    pairs = (spec_pairs([[4, 4], [3, 4]], suite="factual", categories=("geo", "easy"))
             + spec_pairs([[0, 1], [1, 0]], suite="code", categories=("easy",)))
    by_suite = acceptance_by_group(pairs, by="suite", rng=0, n_resamples=200)
    assert list(by_suite) == ["code", "factual"]
    assert by_suite["factual"].alpha > by_suite["code"].alpha
    by_cat = acceptance_by_group(pairs, by="category", rng=0, n_resamples=200)
    assert by_cat["easy"].n == 4 and by_cat["geo"].n == 2


def test_acceptance_needs_speculative_stats():
    pairs = pair_records([make_record()], [make_record(candidate="ee", stats={"exit_layers": [1]})])
    with pytest.raises(ValueError, match="no speculative stats"):
        acceptance_summary(pairs)


# ---------------------------------------------------------------------------------- exits


def test_exit_theoretical_speedup_hand_values():
    assert exit_theoretical_speedup(15, 30) == pytest.approx(2.0)
    # LM head 6 layers; two head evaluations per token: (30 + 6) / (15 + 12)
    assert exit_theoretical_speedup(15, 30, lm_head_evals_per_token=2, lm_head_cost=6) == pytest.approx(36 / 27)
    assert exit_theoretical_speedup(30, 30, lm_head_evals_per_token=3, lm_head_cost=6) < 1
    with pytest.raises(ValueError):
        exit_theoretical_speedup(31, 30)


def test_exit_summary():
    recs = [
        make_record(item_id="a", suite="s1", tokens=[1, 2, 3, 4],
                    stats={"exit_layers": [4, 8, 8, 2], "num_layers": 8, "lm_head_evals": 10}),
        make_record(item_id="b", suite="s2", tokens=[1, 2],
                    stats={"exit_layers": [8, 6], "num_layers": 8, "lm_head_checks": 2}),
    ]
    s = exit_summary(recs, lm_head_cost=2.0)
    assert s.histogram == (0, 1, 0, 1, 0, 1, 0, 3) and s.tokens == 6
    assert s.mean_layers == pytest.approx(36 / 6) and s.early_exit_fraction == pytest.approx(0.5)
    # 10 evaluations, then 2 checks + 2 producing heads
    assert s.lm_head_evals_per_token == pytest.approx(14 / 6) and s.lm_head_evals_known
    assert s.theoretical_speedup == pytest.approx((8 + 2) / (6 + 2 * 14 / 6))
    groups = exit_by_group(recs)
    assert list(groups) == ["s1", "s2"] and groups["s2"].mean_layers == 7
    del recs[1]["stats"]["lm_head_checks"]
    assert not exit_summary(recs).lm_head_evals_known
    recs[1]["stats"]["exit_layers"] = [0, 8]
    with pytest.raises(ValueError, match="count layers run"):
        exit_summary(recs)
    recs[1]["stats"]["num_layers"] = 12
    with pytest.raises(ValueError, match="disagree on num_layers"):
        exit_summary(recs)


# -------------------------------------------------------------------------------- latency


def test_latency_summary_and_percentiles():
    rng = np.random.default_rng(0)
    recs, itl_all = [], []
    for i in range(20):
        steps = rng.exponential(0.05, 9)
        recs.append(make_record(item_id=f"i{i}", tokens=list(range(10)), ttft_s=0.2 + 0.01 * i, step_s=steps))
        itl_all.append(steps)
    s = latency_summary(recs)
    itl = np.concatenate(itl_all)
    assert s.inter_token.n == 180
    assert (s.inter_token.p50, s.inter_token.p95, s.inter_token.p99) == pytest.approx(
        tuple(np.percentile(itl, [50, 95, 99], method="median_unbiased")))
    lo, hi = s.inter_token.p95_ci_low, s.inter_token.p95_ci_high
    assert lo < s.inter_token.p95 < hi  # 180 values: both ends of a 95% interval exist
    assert s.ttft.p50 == pytest.approx(np.median(0.2 + 0.01 * np.arange(20)))
    walls = [r["timing"]["wall_s"] for r in recs]
    assert s.tokens_per_s == pytest.approx(200 / sum(walls))
    assert s.per_token.mean == pytest.approx(np.mean(np.array(walls) / 10))


def test_inter_token_fallback_and_validation():
    rec = make_record(tokens=[1, 2, 3, 4, 5], ttft_s=0.1, wall_s=0.5)
    del rec["timing"]["token_times_s"]
    assert inter_token_latencies(rec) == pytest.approx([0.1] * 4)
    rec["timing"]["token_times_s"] = [0.1, 0.2, 0.0, 0.1, 0.1]
    assert inter_token_latencies(rec) == pytest.approx([0.2, 0.0, 0.1, 0.1])
    rec["timing"]["token_times_s"] = [0.1, 0.2, -0.1, 0.1, 0.1]
    with pytest.raises(ValueError, match="per-token"):
        inter_token_latencies(rec)
    assert token_times(3, ttft_s=0.1, step_s=0.05) == pytest.approx([0.1, 0.05, 0.05])
    assert decode_step_seconds([make_record(tokens=[1, 2, 3], ttft_s=0.1, step_s=0.05)]) == pytest.approx(0.05)


def test_paired_speedup():
    rng = np.random.default_rng(4)
    base, cand = [], []
    for i in range(60):
        n = int(rng.integers(5, 40))
        step = rng.uniform(0.04, 0.08)
        base.append(make_record(item_id=f"i{i}", tokens=list(range(n)), step_s=step))
        cand.append(make_record(candidate="c", item_id=f"i{i}", tokens=list(range(n)),
                                wall_s=base[-1]["timing"]["wall_s"] / 2))
    res = paired_speedup(pair_records(base, cand), rng=0, n_resamples=2000)
    # every prompt exactly 2x: no spread between prompts to bound the ratio by (issue 49: a zero-width
    # bound passed min_speedup on two prompts), so no interval, not (2, 2)
    assert res.statistic == pytest.approx(2.0) and np.isnan(res.ci_low) and np.isnan(res.lower_bound)
    assert res.pvalue < 1e-6
    noisy = [dict(c, timing=dict(c["timing"], wall_s=c["timing"]["wall_s"] * rng.lognormal(0, 0.2))) for c in cand]
    res = paired_speedup(pair_records(base, noisy), rng=0, n_resamples=2000)
    assert res.ci_low < res.statistic < res.ci_high and 1.6 < res.statistic < 2.4
    assert res == paired_speedup(pair_records(base, noisy), rng=0, n_resamples=2000)


def test_speedup_interval_is_the_skew_corrected_jackknife_over_prompts_by_hand():
    """Ten prompts (one with two seeds): the bound from leave-one-prompt-out ratios, computed here
    with plain loops; Student's t at the Satterthwaite df of the prompts' time shares, its quantile
    moved down by the Cornish-Fisher term of the pseudo-values' left skew (analysis.latency)."""
    from scipy import stats
    from analysis.latency import SKEW_FACTOR
    base, cand = [], []
    timings = {"a": [(10, 1.0, 0.5), (12, 1.2, 0.5)], "b": [(30, 3.3, 2.9)], "c": [(5, 0.4, 0.3)]}
    timings |= {f"p{i}": [(8 + i, 0.1 * (8 + i), 0.1 * (8 + i) / (1.2 + 0.1 * i))] for i in range(7)}
    for item, rows in timings.items():
        for seed, (n, bw, cw) in enumerate(rows):
            base.append(make_record(item_id=item, seed=seed, tokens=list(range(n)), wall_s=bw))
            cand.append(make_record(candidate="c", item_id=item, seed=seed, tokens=list(range(n)), wall_s=cw))
    res = paired_speedup(pair_records(base, cand))
    sums = {k: [sum(r[i] for r in rows) for i in range(3)] for k, rows in timings.items()}  # tokens, bw, cw
    def ratio(keys):
        n = sum(sums[k][0] for k in keys)
        return (sum(sums[k][1] for k in keys) / n) / (sum(sums[k][2] for k in keys) / n)
    keys, m = list(sums), len(sums)
    r = ratio(keys)
    pseudo = [m * r - (m - 1) * ratio([k for k in keys if k != out]) for out in keys]
    estimate = sum(pseudo) / m
    var = sum((x - estimate) ** 2 for x in pseudo) / m
    se = (var / (m - 1)) ** 0.5
    skew = sum((x - estimate) ** 3 for x in pseudo) / m / var ** 1.5
    tb, tc = sum(v[1] for v in sums.values()), sum(v[2] for v in sums.values())
    share = [0.5 * (v[1] / tb + v[2] / tc) for v in sums.values()]
    df = sum(a * a for a in share) ** 2 / sum(a ** 4 for a in share) * (m - 1) / m
    term = max(0.0, -skew) * SKEW_FACTOR / (6 * m ** 0.5)
    assert skew < 0  # prompt b: long and hardly faster
    q = stats.t.ppf(0.95, df) + term * (2 * stats.norm.ppf(0.95) ** 2 + 1)
    q_low = stats.t.ppf(0.975, df) + term * (2 * stats.norm.ppf(0.975) ** 2 + 1)
    assert res.interval == "jackknife" and res.n_prompts == m and res.statistic == pytest.approx(r)
    assert res.lower_bound == pytest.approx(max(estimate - q * se, 0.0))
    assert (res.ci_low, res.ci_high) == pytest.approx((max(estimate - q_low * se, 0.0),
                                                       estimate + stats.t.ppf(0.975, df) * se))
    assert res.ci_low <= res.lower_bound  # the one-sided bound is the tighter one
    old = paired_speedup(pair_records(base, cand), method="studentized", rng=0, n_resamples=999)
    assert old.interval == "studentized" and old.lower_bound != pytest.approx(res.lower_bound)
