"""The speed sample drawn by stored baseline length (harness.run.speed_sample.by_length, issue 58):
long prompts are reached, so the suite's bound is given far more often than with a random sample,
and it still covers."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from harness.run import speed_sample


def _rare_long(n=200, seed=0):
    rng = np.random.default_rng(seed)
    return list(np.exp(np.log(60) + rng.normal(0, 0.5, n)) * np.where(np.arange(n) % 33 == 5, 10, 1))


def test_by_length_reaches_the_long_prompts_keeps_the_budget_and_its_seed():
    lengths = _rare_long()
    reached = 0
    for seed in range(20):
        picked = speed_sample.by_length(lengths, 10, seed)
        assert len(picked) == len(set(picked)) == 10
        reached += max(lengths[i] for i in picked) >= 240
        assert speed_sample.by_length(lengths, 10, seed) == picked
    # one of the 6 rare long prompts timed in nearly every draw (a random 10 of 200: about 1 in 4)
    assert reached >= 16
    assert len({tuple(speed_sample.by_length(lengths, 10, s)) for s in range(20)}) > 1
    assert speed_sample.by_length(lengths, 500, 1) == list(range(200))
    assert speed_sample.by_length(lengths, 0, 1) == []


def test_choose_draws_by_stored_length_only_where_every_work_has_one():
    s = SimpleNamespace(name="a")
    works = [SimpleNamespace(suite=s, item=SimpleNamespace(id=f"i{i}", categories=["x"]), temperature=0.0, seed=0)
             for i in range(200)]
    lengths = _rare_long()
    every = {speed_sample.key(w): lengths[i] for i, w in enumerate(works)}
    picked = speed_sample.choose(works, 20, seed=7, lengths=every)
    assert len(picked) == 20 and picked == speed_sample.choose(works, 20, seed=7, lengths=every)
    assert max(every[k] for k in picked) >= 240
    # One work without a stored length: the whole suite is drawn as it is without lengths.
    some = {k: n for k, n in every.items() if k[1] != "i3"}
    assert speed_sample.choose(works, 20, seed=7, lengths=some) == speed_sample.choose(works, 20, seed=7)
    assert speed_sample.choose(works, 20, seed=7) == speed_sample.choose(works, 20, seed=7, lengths={})


def test_a_prompts_works_are_drawn_as_one_prompt():
    """The bound's unit is the prompt (its seeds and temperatures pooled), and its strata count the
    timed prompts: a prompt of three works is drawn once, one work of it, so that the run's strata
    are the bound's; with room for every prompt, each is timed and the rest fills at random."""
    s = SimpleNamespace(name="a")
    works = [SimpleNamespace(suite=s, item=SimpleNamespace(id=f"i{i}", categories=["x"]), temperature=t, seed=seed)
             for i in range(60) for t, seed in ((0.0, 0), (0.7, 0), (0.7, 1))]
    lengths = {speed_sample.key(w): 30 + 300 * (int(w.item.id[1:]) % 10 == 0) for w in works}
    picked = speed_sample.choose(works, 12, seed=3, lengths=lengths)
    assert len(picked) == 12 and len({k[1] for k in picked}) == 12
    assert sum(lengths[k] > 100 for k in picked) >= 5              # half the tokens: half the picks (a random 12: 1.2)
    more = speed_sample.choose(works, 100, seed=3, lengths=lengths)
    assert len(more) == 100 and len({k[1] for k in more}) == 60


@pytest.fixture
def random_within(monkeypatch):
    """by_length replaced by a random choice: the tests below must then fail."""
    import random
    monkeypatch.setattr(speed_sample, "by_length",
                        lambda lengths, budget, seed, tokens=None:
                        sorted(random.Random(str(seed)).sample(range(len(lengths)), budget)))


def _operating(design, m, studies=200):
    from harness.calibration import suite_speed
    r = suite_speed.operating(design, m, studies, np.random.default_rng([58, m, len(design)]))
    return r["now"], r["random"]


@pytest.mark.parametrize("design", ["bimodal", "rare-long"])
def test_by_length_gives_a_bound_far_more_often_and_it_covers(design):
    for m in (10, 20):
        (cover, none, _, _), (_, none_random, _, _) = _operating(design, m)
        assert cover.simulated >= 0.945 - 2 * cover.mc_se
        assert none <= none_random - 0.15, (design, m, none, none_random)


@pytest.mark.parametrize("design", ["bimodal", "rare-long"])
def test_the_calibration_test_fails_with_a_random_choice(design, random_within):
    with pytest.raises(AssertionError):
        test_by_length_gives_a_bound_far_more_often_and_it_covers(design)
    with pytest.raises(AssertionError):
        test_by_length_reaches_the_long_prompts_keeps_the_budget_and_its_seed()


def _record(tokens: int, wall: float) -> dict:
    return {"tokens": [0] * int(tokens), "timing": {"wall_s": float(wall), "ttft_s": 0.0}}


def _through_the_run(prompts, budget, seed, known=lambda key: True):
    """choose() on works whose stored lengths are known where `known(key)`, then
    paired_speedup(timed, suite=every pair), as a run with a baseline store: (the suite's true
    speedup, the result). `prompts`: (suite, item id, [(temperature, seed, tokens, gain), ...])."""
    from analysis.latency import paired_speedup
    from analysis.pairing import Pair, PairKey
    works = []
    for suite, item, runs in prompts:
        entry = SimpleNamespace(id=item, categories=["x"])
        for temperature, s, tokens, gain in runs:
            w = SimpleNamespace(suite=SimpleNamespace(name=suite), item=entry, temperature=temperature, seed=s)
            works.append((w, int(tokens), 0.03 * tokens, 0.03 * tokens / gain))
    picked = speed_sample.choose([w for w, *_ in works], budget, seed,
                                 lengths={speed_sample.key(w): n for w, n, *_ in works if known(speed_sample.key(w))})
    timed, every = [], []
    for w, n, b, c in works:
        k = speed_sample.key(w)
        pair = Pair(PairKey(k[0], "h", k[1], k[2], k[3]), _record(n, b), _record(n, c))
        every.append(pair)
        if k in picked:
            timed.append(pair)
    truth = sum(b for _, _, b, _ in works) / sum(c for *_, c in works)
    return truth, paired_speedup(timed, suite=every)


def _greedy(lengths, gains, suite="a"):
    return [(suite, f"{suite}{i:03d}", [(0.0, 0, n, g)]) for i, (n, g) in enumerate(zip(lengths, gains))]


def _bimodal(rng, n=200):
    return np.exp(np.where(rng.random(n) < 0.1, np.log(300), np.log(30)) + rng.normal(0, 0.2, n))


def _mean_error(make, studies, budget, known=lambda key: True):
    errors = []
    for study in range(studies):
        truth, res = _through_the_run(make(np.random.default_rng([5, study])), budget, study, known)
        errors.append(np.log(res.statistic / truth))
    return float(np.mean(errors))


def test_prompts_tied_at_the_token_cap_are_one_stratum_for_the_sample_and_the_bound():
    """A hostile review's case: 60 short prompts gaining 1.6x, 40 cut at the 400-token cap gaining
    0.9x, a candidate slower overall (0.965x). The tie was split one way for the sample and put
    whole in the top stratum by the bound, whose lower stratum then stood for capped prompts on
    short ones alone: a bound of 1.12 for a slower candidate. A tie is one stratum for both."""
    lengths = np.r_[np.linspace(40, 60, 60).round(), np.full(40, 400.0)]
    gains = np.where(lengths >= 400, 0.9, 1.6) * np.exp(0.05 * np.sin(np.arange(100)))
    for budget in (16, 32):
        truth, res = _through_the_run(_greedy(lengths, gains), budget, seed=1)
        assert res.interval == "post-stratified jackknife" and truth < 1
        assert res.lower_bound <= truth and abs(np.log(res.statistic / truth)) < 0.03, (budget, res, truth)


def _three_seeds(rng, work_sd=0.5):
    """Bimodal prompts, gain rising with length, 3 sampled works each of its own length."""
    lengths = _bimodal(rng)
    gains = 1.3 * (lengths / 60) ** 0.3 * np.exp(rng.normal(0, 0.15, 200))
    work = np.maximum(lengths[:, None] * np.exp(rng.normal(0, work_sd, (200, 3))), 2).astype(int)
    return [("a", f"i{i:03d}", [(0.7, j, work[i, j], gains[i]) for j in range(3)]) for i in range(200)]


def test_a_prompts_works_of_other_lengths_do_not_move_it_to_another_stratum():
    """A hostile review's case: 3 works (seeds) a prompt, each of its own length; the sample draws
    the prompt by its works' mean and times one. The bound placed it by that one work's length,
    in a stratum it was not drawn in: with the gain rising with length the estimate ran 5% high.
    The timed prompt is in its own prompt's stratum."""
    assert abs(_mean_error(_three_seeds, 40, 20)) < 0.02


def _greedy_stored_sampled_new(rng):
    """Every prompt greedy (gaining 2.2x) and sampled at 3 seeds (0.83x); lengths bimodal."""
    lengths = _bimodal(rng)
    gains = np.exp(rng.normal(0, 0.15, 200))
    return [("a", f"i{i:03d}", [(0.0, 0, lengths[i], 2.2 * gains[i])]
             + [(0.8, s, lengths[i], 0.83 * gains[i]) for s in range(3)]) for i in range(200)]


def test_a_suite_with_works_of_unknown_length_is_drawn_as_one_even_sample():
    """A hostile review's case: the store holds a suite's greedy rows, the run adds sampled works
    (unknown lengths) that gain less. Drawn half by length and half at random, the long strata
    were timed mostly greedy and the short ones mostly sampled: the estimate ran 14% high and a
    slower candidate was bounded above 1 in a fifth of studies. Such a suite is drawn at random."""
    greedy_only = lambda key: key[3] == 0.0
    assert abs(_mean_error(_greedy_stored_sampled_new, 30, 80, greedy_only)) < 0.03
    assert abs(_mean_error(_greedy_stored_sampled_new, 30, 80)) < 0.03        # every length known


def _works_by_temperature(rng):
    """Every prompt at T=0 (gaining 2x) and T=0.8 (0.7x), lengths bimodal, all stored."""
    lengths = _bimodal(rng)
    return [("a", f"i{i:03d}", [(0.0, 0, lengths[i], 2.0), (0.8, 0, lengths[i] * 1.1, 0.7)]) for i in range(200)]


def test_the_timed_work_of_a_prompt_is_any_of_its_works():
    """One work of each drawn prompt is timed, at random: always the first (greedy) one would make
    the estimate the greedy speedup."""
    assert abs(_mean_error(_works_by_temperature, 30, 30)) < 0.03


def _two_suites(rng):
    """Suite a: bimodal, the gain rising with length; suite b: all short, 3x."""
    lengths = _bimodal(rng)
    return (_greedy(lengths, 1.3 * (lengths / 60) ** 0.3 * np.exp(rng.normal(0, 0.15, 200)), "a")
            + _greedy(np.exp(np.log(30) + rng.normal(0, 0.2, 100)), np.full(100, 3.0), "b"))


def test_each_suite_of_a_pooled_figure_is_stratified_on_its_own_through_the_run():
    """Each suite's sample is drawn on its own, its short prompts at their own rate: strata cut
    over the pool mixed suite b's short prompts (3x) with a's, and the estimate ran 8% high."""
    assert abs(_mean_error(_two_suites, 30, 30)) < 0.03


def test_prompts_are_drawn_by_their_tokens_per_pair_weighted_by_all_their_tokens(monkeypatch):
    """The bound's strata are cut on each prompt's tokens per pair, weighted by its tokens over all
    its pairs (`analysis.latency._suite_lengths`): the sample's must be the same."""
    from analysis.latency import _suite_lengths
    seen = {}
    monkeypatch.setattr(speed_sample, "by_length",
                        lambda lengths, budget, seed, tokens=None: seen.update(lengths=list(lengths), tokens=tokens)
                        or list(range(budget)))
    prompts = [("a", "p0", [(0.0, 0, 100, 1.0)]), ("a", "p1", [(0.7, s, 30 + s, 1.0) for s in range(4)])] + \
        [("a", f"q{i}", [(0.0, 0, 50, 1.0)]) for i in range(8)]
    truth, res = _through_the_run(prompts, 3, 1)
    assert seen["lengths"][:2] == [100, 31.5] and seen["tokens"][:2] == [100, 126]
    pairs = [p for p in _pairs_of(prompts)]
    tokens, counts, keys = _suite_lengths(pairs, pairs[:1])
    assert tokens[:2].tolist() == [100, 126] and counts[:2].tolist() == [1, 4] and keys[1] == ("a", "p1")


def _pairs_of(prompts):
    from analysis.pairing import Pair, PairKey
    return [Pair(PairKey(suite, "h", item, s, t), _record(n, 1.0), _record(n, 1.0))
            for suite, item, runs in prompts for t, s, n, _ in runs]


def test_length_strata_cut_at_each_lengths_token_midpoint_and_the_rest_goes_to_the_longest():
    from analysis.latency import length_strata
    assert length_strata([1, 2, 3, 4], [10, 10, 10, 10], 2).tolist() == [0, 0, 1, 1]
    assert length_strata([1, 2, 3, 4], [10, 10, 10, 10], 4).tolist() == [0, 1, 2, 3]
    assert length_strata([5, 1, 5, 1], [10, 10, 10, 10], 2).tolist() == [1, 0, 1, 0]   # a tie, one stratum
    assert length_strata([1, 2], [30, 10], 2).tolist() == [0, 1]     # by a prompt's midpoint, not its end
    # 9 into 2 strata of 10 and 2 prompts: the short one is timed whole, the leftover to the long one
    lengths = [10] * 10 + [100] * 2
    picked = speed_sample.by_length(lengths, 9, 1)
    assert sum(lengths[i] == 100 for i in picked) == 2 and len(picked) == 9
    picked = speed_sample.by_length([10] * 20 + [200] * 20, 9, 1)   # 2 strata, 9: the odd one long
    assert sum(i >= 20 for i in picked) == 5


def test_the_sample_is_drawn_once_per_run_folder(tmp_path):
    """A resume reads the sample back (the store it was drawn from now holds the run's own rows),
    and a damaged file is one clear error, not a second draw."""
    from harness.run.store import StoreError
    from harness.run.store_take import SAMPLE_FILE, _drawn_once
    first = _drawn_once(tmp_path, lambda: {("a", "i1", 0, 0.0), ("b", "i2", 1, 0.7)})
    assert _drawn_once(tmp_path, lambda: {("c", "other", 0, 0.0)}) == first == {("a", "i1", 0, 0.0), ("b", "i2", 1, 0.7)}
    (tmp_path / SAMPLE_FILE).write_text("{not json")
    with pytest.raises(StoreError, match="speed sample is unreadable"):
        _drawn_once(tmp_path, lambda: set())
