"""The sequential randomized PIT test: features by hand, size and power (seeded, small), the
verifier's positions from speculative stats, and the goodness-of-fit window's reach."""

import numpy as np
import pytest

from harness.calibration import gates as cg
from analysis import pit
from analysis.exactness import detectable_tv


def test_features_by_hand():
    p = np.array([[0.1, 0.5, 0.4, 0.0], [0.25, 0.25, 0.25, 0.25]])
    f = pit.features(p, [2, 1])
    # row 0: order 1 (0.5), 2 (0.4), 0 (0.1): token 2 has 0.5 before it; in id order 0.1
    assert f.mass_before.tolist() == pytest.approx([0.5, 0.25])  # ties broken by id: token 0 before 1
    assert f.mass_before_id.tolist() == pytest.approx([0.6, 0.25])
    assert f.p_token.tolist() == pytest.approx([0.4, 0.25])
    assert f.token_class.tolist() == [1, 1]                      # rank 2 both times
    assert f.class_probs[0].tolist() == pytest.approx([0.5, 0.4, 0.1, 0.0])
    assert pit.features(np.array([[2.0, 2.0]]), [0]).p_token[0] == pytest.approx(0.5)  # residual rows normalised
    with pytest.raises(ValueError):
        pit.features(p, [4, 0])


def test_pit_values_are_uniform_under_exact_sampling():
    rng = np.random.default_rng(0)
    p = cg.lm_rows(20_000, 50, rng)
    u = pit.pit_values(pit.features(p, cg._draw(p, rng)), rng=rng)
    assert abs(u.mean() - 0.5) < 0.01 and abs(np.mean(u < 0.1) - 0.1) < 0.01


def test_size_holds_and_power_is_there():
    size = cg.pit_rejection(300, level=0.05, studies=300, rng=1)
    assert size.simulated <= 0.05 + 2.576 * np.sqrt(0.05 * 0.95 / 300)
    for shape in ("top-two", "spread", "sharpen", "id-shift"):
        power = cg.pit_rejection(1200, 0.1, shape, level=0.0025, studies=20, rng=2)
        assert power.simulated >= 0.8, (shape, power)
    weak = cg.pit_rejection(300, 0.01, "top-two", level=0.0025, studies=40, rng=3)
    assert weak.simulated < 0.5  # TV 0.01 at 300 tokens is out of reach, and the report says so


def test_impossible_tokens_and_small_samples():
    p = np.tile([0.5, 0.5, 0.0], (20, 1))
    res = pit.pit_test(pit.features(p, [2] + [0] * 19), rng=0)
    assert res.pvalue == 0.0 and res.impossible == 1
    few = pit.pit_test(pit.features(p[:5], [0] * 5), rng=0)
    assert few.pvalue is None and "too few" in few.note


def test_detectable_distortion_shrinks_with_n():
    rng = np.random.default_rng(4)
    tv = []
    for n in (200, 800, 3200):
        p = cg.lm_rows(n, 64, rng)
        tv.append(pit.detectable_tv(pit.features(p, cg._draw(p, rng)), level=0.0025))
    assert tv[0] > tv[1] > tv[2] and tv[2] < 0.05
    assert detectable_tv([0.5, 0.3, 0.2], 200, level=0.0025) > detectable_tv([0.5, 0.3, 0.2], 1000, level=0.0025)
    assert detectable_tv([1.0], 200, level=0.01) is None


def test_verifier_positions_from_round_stats():
    # rounds: 4 proposed, 2 accepted at offset 1 (tokens 1, 2 accepted, 3 the correction);
    # 4 proposed, 4 accepted at offset 4 (bonus at 8, untested); no proposal at offset 9
    stats = {"round_offsets": [1, 4, 9], "proposed_per_round": [4, 4, 0], "accepted_per_round": [2, 4, 0],
             "rejected_draft_tokens": [77, -1, -1]}
    tested, rejected, drafted = pit.verifier_positions(stats, 10)
    assert np.flatnonzero(tested).tolist() == [1, 2, 3, 4, 5, 6, 7]
    assert np.flatnonzero(rejected).tolist() == [3] and drafted[3] == 77
    assert pit.verifier_counts(stats) == (8, 1)
    with pytest.raises(KeyError):
        pit.verifier_positions({"proposed": 3}, 10)


def test_deviation_measures_distance_and_compares_across_sizes():
    """`deviation`: near 0 for exact draws, about the moved mass for a top-two exchange, whatever
    n; the share of impossible tokens when that is larger (the gate compares a candidate's with
    the baseline control's)."""
    rng = np.random.default_rng(5)
    p = cg.lm_rows(8000, 64, rng)
    exact = pit.features(p, cg._draw(p, rng))
    assert pit.deviation(exact) < 0.01
    top = np.argsort(-p, axis=1)[:, :2]
    q = p.copy()
    rows = np.arange(len(p))
    moved = np.minimum(0.05, p[rows, top[:, 0]])
    q[rows, top[:, 0]] -= moved
    q[rows, top[:, 1]] += moved
    small, large = (pit.features(p[:n], cg._draw(q[:n], rng)) for n in (2000, 8000))
    for f in (small, large):
        assert 0.03 < pit.deviation(f) < 0.07
    res = pit.pit_test(pit.features(np.tile([0.5, 0.5, 0.0], (20, 1)), [2] * 4 + [0, 1] * 8), rng=0)
    assert res.deviation == pytest.approx(0.2) and pit.deviation(pit.empty_features()) is None


def test_an_undecided_test_says_how_many_tokens_would_decide():
    """Where no distortion up to TV 0.5 is detectable, the result says how many tokens like these
    would detect TV 0.1 (the words of an inconclusive verdict): the fewest repeats that do."""
    rng = np.random.default_rng(5)
    p = cg.lm_rows(12, 64, rng)
    feat = pit.features(p, cg._draw(p, rng))
    res = pit.pit_test(feat, level=0.005, rng=0)
    assert res.detectable_tv is None and res.tokens_needed is not None and res.tokens_needed % 12 == 0

    def repeated(n):
        return pit.PitFeatures(*(np.concatenate([getattr(feat, f)] * (n // 12)) for f in pit.PitFeatures.FIELDS))
    assert pit.detectable_tv(repeated(res.tokens_needed), level=0.005 / 3) <= 0.1
    fewer = pit.detectable_tv(repeated(res.tokens_needed - 12), level=0.005 / 3)
    assert fewer is None or fewer > 0.1
    assert pit.pit_test(repeated(3600), level=0.005, rng=0).tokens_needed is None  # decided: nothing to say


def test_samples_needed_is_the_goodness_of_fit_power_solved_for_n():
    from analysis.exactness import samples_needed
    bins = [0.6, 0.25, 0.15]
    n = samples_needed(bins, level=0.0025)
    assert detectable_tv(bins, n, level=0.0025) <= 0.1 < detectable_tv(bins, n - 1, level=0.0025)
    assert samples_needed([1.0], level=0.01) is None


def test_too_few_tokens_for_a_test_still_say_how_many_would_decide():
    """Below MIN_TOKENS no p-value is computed; the inconclusive verdict must still name the size
    that would decide (it said only "at least 10", the size at which a test runs at all)."""
    rng = np.random.default_rng(6)
    p = cg.lm_rows(5, 64, rng)
    feat = pit.features(p, cg._draw(p, rng))
    res = pit.pit_test(feat, level=0.005, rng=0)
    assert res.pvalue is None and res.tokens_needed is not None and res.tokens_needed % 5 == 0
    repeated = pit.PitFeatures(*(np.concatenate([getattr(feat, f)] * (res.tokens_needed // 5))
                                 for f in pit.PitFeatures.FIELDS))
    assert pit.detectable_tv(repeated, level=0.005 / 3) <= 0.1
    assert pit.pit_test(pit.empty_features(), level=0.005, rng=0).tokens_needed is None  # nothing to repeat
