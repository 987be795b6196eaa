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


def test_choose_draws_by_stored_length_and_the_rest_as_before():
    s = SimpleNamespace(name="a")
    works = [SimpleNamespace(suite=s, item=SimpleNamespace(id=f"i{i}", categories=["x"]), temperature=0.0, seed=0)
             for i in range(200)]
    lengths = _rare_long()
    known = {speed_sample.key(w): lengths[i] for i, w in enumerate(works) if i < 150}
    picked = speed_sample.choose(works, 20, seed=7, lengths=known)
    assert len(picked) == 20 and picked == speed_sample.choose(works, 20, seed=7, lengths=known)
    assert sum(1 for k in picked if k not in known) == 5                # the unknown share, at random
    assert max(known.get(k, 0) for k in picked) >= 240
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


def _through_the_run(lengths, gains, budget, seed, work_lengths=None, works_per_prompt=1):
    """choose() on works with stored lengths, then paired_speedup(timed, suite=every pair), as a run
    with a baseline store: (the suite's true speedup, the result). `work_lengths[i][j]`: work j of
    prompt i's length (default: the prompt's)."""
    from analysis.latency import paired_speedup
    from analysis.pairing import Pair, PairKey
    suite = SimpleNamespace(name="a")
    works, walls = [], {}
    for i, n in enumerate(lengths):
        item = SimpleNamespace(id=f"i{i:03d}", categories=["x"])
        for j in range(works_per_prompt):
            w = SimpleNamespace(suite=suite, item=item, temperature=0.7 if works_per_prompt > 1 else 0.0, seed=j)
            tokens = int(n if work_lengths is None else work_lengths[i][j])
            works.append((w, tokens, 0.03 * tokens, 0.03 * tokens / gains[i]))
    picked = speed_sample.choose([w for w, *_ in works], budget, seed,
                                 lengths={speed_sample.key(w): n for w, n, *_ in works})
    timed, every = [], []
    for w, n, b, c in works:
        k = speed_sample.key(w)
        pair = Pair(PairKey(k[0], "h", k[1], k[2], k[3]), _record(n, b), _record(n, c))
        every.append(pair)
        if k in picked:
            timed.append(pair)
    truth = sum(b for _, _, b, _ in works) / sum(c for *_, c in works)
    return truth, paired_speedup(timed, suite=every)


def test_prompts_tied_at_the_token_cap_are_one_stratum_for_the_sample_and_the_bound():
    """A hostile review's case: 60 short prompts gaining 1.6x, 40 cut at the 400-token cap gaining
    0.9x, a candidate slower overall (0.965x). The tie was split one way for the sample and put
    whole in the top stratum by the bound, whose lower stratum then stood for capped prompts on
    short ones alone: a bound of 1.12 for a slower candidate. A tie is one stratum for both."""
    lengths = np.r_[np.linspace(40, 60, 60).round(), np.full(40, 400.0)]
    gains = np.where(lengths >= 400, 0.9, 1.6) * np.exp(0.05 * np.sin(np.arange(100)))
    for budget in (16, 32):
        truth, res = _through_the_run(lengths, gains, budget, seed=1)
        assert res.interval == "post-stratified jackknife" and truth < 1
        assert res.lower_bound <= truth and abs(np.log(res.statistic / truth)) < 0.03, (budget, res, truth)


def test_a_prompts_works_of_other_lengths_do_not_move_it_to_another_stratum():
    """A hostile review's case: 3 works (seeds) a prompt, each of its own length; the sample draws
    the prompt by its works' mean and times one. The bound placed it by that one work's length,
    in a stratum it was not drawn in: with the gain rising with length the estimate ran 5% high.
    The timed prompt is in its own prompt's stratum."""
    rng = np.random.default_rng(11)
    errors = []
    for study in range(40):
        lengths = np.exp(np.where(rng.random(200) < 0.1, np.log(300), np.log(30)) + rng.normal(0, 0.2, 200))
        gains = 1.3 * (lengths / 60) ** 0.3 * np.exp(rng.normal(0, 0.15, 200))
        work = np.maximum(lengths[:, None] * np.exp(rng.normal(0, 0.5, (200, 3))), 2).astype(int)
        truth, res = _through_the_run(lengths, gains, 20, seed=study, work_lengths=work, works_per_prompt=3)
        errors.append(np.log(res.statistic / truth))
    assert abs(np.mean(errors)) < 0.02, np.mean(errors)
