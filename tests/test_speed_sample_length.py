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
