"""The gate is a pure function: each rule on summaries as the analysis writes them, and config validation."""
from __future__ import annotations

import pytest

from harness.config import ConfigError, Gates, load_config
from harness.verdict.gate import decide


def identity(divergences=(), n=10):
    near = sum(d["kind"] == "near-tie" for d in divergences)
    return {"rate": 1 - len(divergences) / n, "n": n, "identical": n - len(divergences), "near_ties": near,
            "real_divergences": len(divergences) - near, "divergences": list(divergences)}


def quality(n=100, wins=0, losses=0, margin=0.1, base_pass=None, seeds=1):
    """A suite's quality summary, as the analysis writes it, from discordant counts."""
    from analysis import pair_records, quality_delta
    from harness.calibration.synthetic import make_record
    from harness.verdict.plain import plain as _plain
    base_pass = n - losses - 1 if base_pass is None else base_pass
    base, cand_ = [], []
    for i in range(n):
        b = i < base_pass
        c = (not b) if (i < losses or n - wins <= i) else b  # the first items lose, the last win
        for seed in range(seeds):
            base.append(make_record(item_id=f"i{i}", seed=seed, temperature=0.7 if seeds > 1 else 0.0, passed=b))
            cand_.append(make_record(candidate="c", item_id=f"i{i}", seed=seed,
                                     temperature=0.7 if seeds > 1 else 0.0, passed=c))
    return _plain(quality_delta(pair_records(base, cand_), margin=margin, rng=0, n_resamples=500))


def cand(kind="exact", decoder="speculative", verify="coupled", suites=None, **extra):
    return {"kind": kind, "decoder": decoder, "options": {"verify": verify}, "suites": suites or {}, **extra}


def names(decision, status):
    return {r.name for r in decision.results if r.status == status}


def test_near_ties_pass_real_divergences_fail():
    tie = {"kind": "near-tie", "item_id": "a", "position": 3, "margin": 1e-5}
    real = {"kind": "real", "item_id": "b", "position": 7, "margin": 2.5}
    ok = decide(cand(suites={"s": {"identity": {"T=0": identity([tie])}}}), Gates())
    assert ok.passed
    bad = decide(cand(suites={"s": {"identity": {"T=0": identity([tie, real])}}}), Gates())
    assert not bad.passed and names(bad, "fail") == {"identity s T=0"}
    assert "item b at token 7" in bad.failures[0].detail


def test_pairs_that_errored_show_nothing_about_identity():
    """Two failed generations are two empty outputs, and were counted "identical": a suite whose
    every prompt failed on both sides read 7/7 identical, and its identity gate passed."""
    from analysis.pairing import Pair, PairKey
    from harness.verdict.summary import _identity

    def pair(i, err):
        rec = {"tokens": [] if err else [1, 2, 3], "margins": [] if err else [1.0, 1.0, 1.0],
               **({"error": "prompt of 3233 tokens does not fit the context of 256"} if err else {})}
        return Pair(PairKey("s", "h", f"i{i}", 0, 0.0), rec, dict(rec))

    mixed = _identity([pair(0, False), pair(1, True), pair(2, False)], 1e-3)
    assert (mixed["n"], mixed["identical"], mixed["errored"]) == (2, 2, 1)
    d = decide(cand(suites={"s": {"identity": {"T=0": mixed}}}), Gates())
    assert "1 errored pair(s) left out" in next(r.detail for r in d.results if r.name == "identity s T=0")
    none = _identity([pair(0, True), pair(1, True)], 1e-3)
    assert (none["n"], none["identical"], none["rate"]) == (0, 0, None)
    d = decide(cand(suites={"s": {"identity": {"T=0": none}}}), Gates())
    assert not d.passed and "identity s T=0" in names(d, "fail")
    assert "all 2 pair(s) errored" in next(r.detail for r in d.results if r.name == "identity s T=0")


def test_sampled_identity_is_gated_only_where_outputs_can_match():
    real = {"kind": "real", "item_id": "b", "position": 0, "margin": 2.0}
    suites = {"s": {"identity": {"T=0": identity(), "T=0.7": identity([real])}}}
    assert not decide(cand(verify="coupled", suites=suites), Gates()).passed
    assert decide(cand(verify="rejection", suites=suites), Gates()).passed       # distribution, not identity
    assert decide(cand(decoder="hf", verify=None, suites=suites), Gates()).passed  # torch's own generator


def lossy(**suites):
    return cand(kind="lossy", decoder="early-exit", suites={k: {"quality": v} for k, v in suites.items()})


def test_non_inferiority_pass_inconclusive_and_worse():
    good = decide(lossy(f=quality(n=400, wins=4, losses=4)), Gates())
    assert good.passed and "non-inferior: one-sided 95% lower bound" in good.results[0].detail
    unsure = lossy(f=quality(n=10, wins=0, losses=1))
    d = decide(unsure, Gates())
    assert not d.passed and d.results[0].detail.startswith("inconclusive")
    assert "would show non-inferiority with 80% power" in d.results[0].detail
    assert decide(unsure, Gates(inconclusive="warn")).passed  # a policy choice, made explicit
    worse = decide(lossy(f=quality(n=100, wins=0, losses=30)), Gates(inconclusive="warn"))
    assert not worse.passed and "loss larger than the margin" in worse.failures[0].detail


def test_worse_needs_a_test_not_a_point_estimate():
    # 4/10 -> 3/10: the point estimate is at -margin (-0.10000000000000003 in floats), but one
    # loss in ten pairs shows nothing: inconclusive, never "worse"
    r = decide(lossy(f=quality(n=10, wins=0, losses=1, base_pass=4)), Gates()).results[0]
    assert r.detail.startswith("inconclusive") and "worse" not in r.detail.split(";")[0].replace("nor worse", "")
    # 6/10 -> 5/10 reads the same way: both are exactly at the margin
    r2 = decide(lossy(f=quality(n=10, wins=0, losses=1, base_pass=6)), Gates()).results[0]
    assert r2.status == r.status and r2.detail.split(";")[0] == r.detail.split(";")[0]


def test_the_printed_bound_is_the_one_decided_on():
    import re
    for n, w, l in [(400, 4, 4), (60, 0, 3), (100, 0, 30), (30, 2, 6), (200, 0, 12)]:
        res = decide(lossy(a=quality(n=n, wins=w, losses=l)), Gates(inconclusive="warn")).results[0]
        lower = float(re.search(r"95% lower bound ([-+.\d]+)", res.detail).group(1))
        upper = re.search(r"upper bound ([-+.\d]+)", res.detail)
        if res.status == "pass":
            assert lower > -0.1
        elif res.detail.startswith("worse"):
            assert float(upper.group(1)) < 0 and lower <= -0.1
        else:
            assert lower <= -0.1 + 1e-3 and float(upper.group(1)) >= -1e-3


def test_intersection_union_needs_no_holm():
    # Each suite alone passes at 0.05: with every suite required, the candidate passes (Holm
    # across three would have failed some).
    q = quality(n=200, wins=10, losses=10, margin=0.05)
    assert 0.01 < q["non_inferiority"]["pvalue"] < 0.05
    assert decide(lossy(a=q, b=q, c=q), Gates()).passed


def test_worse_is_bonferroni_across_suites():
    q = quality(n=200, wins=2, losses=9, margin=0.02)  # a loss significant at 0.05 one-sided, not at 0.05/3
    assert q["loss_pvalue"] < 0.05 / 1 and q["loss_pvalue"] > 0.05 / 3
    one = decide(lossy(a=q), Gates(inconclusive="warn"))
    three = decide(lossy(a=q, b=quality(n=200, margin=0.02), c=quality(n=200, margin=0.02)),
                   Gates(inconclusive="warn"))
    assert not one.passed and "significant loss" in one.failures[0].detail
    assert "98.3% upper bound" in three.results[0].detail and three.results[0].status == "warn"


def test_several_seeds_per_prompt_test_prompts():
    q = quality(n=40, wins=0, losses=2, seeds=3)
    assert q["unit"] == "prompt" and q["n"] == 40 and q["n_pairs"] == 120
    assert q["non_inferiority"]["method"] == "paired-t"
    assert "n=40 prompts" in decide(lossy(a=q), Gates(inconclusive="warn")).results[0].detail


def test_seed_warning_for_sampled_identity():
    one = cand(suites={"s": {"identity": {"T=0": identity(), "T=0.7": {**identity(), "seeds": [0]}}}})
    d = decide(one, Gates())
    assert d.passed and "seeds" in names(d, "warn")
    two = cand(suites={"s": {"identity": {"T=0": identity(), "T=0.7": {**identity(), "seeds": [0, 1]}}}})
    assert "seeds" not in names(decide(two, Gates()), "warn")


def pit(pvalue, n=1000, rejected=50, impossible=0, detectable=0.04):
    return {"pvalue": pvalue, "n": n, "proposed": 200, "rejected": rejected, "impossible": impossible,
            "detectable_tv": detectable}


def window(pvalue, rejected=10, proposed=30):
    return {"item_id": "x", "offset": 4, "temperature": 0.7, "pvalue": pvalue, "n": 200, "proposed": proposed,
            "rejected": rejected, "detectable_tv": 0.1}


def rej(subsets=None, tests=(), control=None):
    ex = {"tests": list(tests), "pit": {"subsets": subsets or {}, "control": control}}
    return cand(verify="rejection", exactness=ex, suites={"s": {"identity": {"T=0": identity()}}})


def test_exactness_gates():
    ok = decide(rej({"all": pit(0.3), "drafted": pit(0.5)}, [window(0.2)]), Gates())
    assert ok.passed and {"exactness PIT all", "exactness PIT drafted", "exactness x@4 T=0.7"} <= names(ok, "pass")
    # Bonferroni at exactness_pvalue over the three checks: 0.003 < 0.01/3 < 0.004
    low = decide(rej({"all": pit(0.003), "drafted": pit(0.5)}, [window(0.2)]), Gates())
    assert names(low, "fail") == {"exactness PIT all"} and "0.00333" in low.failures[0].detail
    assert decide(rej({"all": pit(0.004), "drafted": pit(0.5)}, [window(0.2)]), Gates()).passed
    zero = decide(rej({"rejected": pit(0.0, impossible=3)}), Gates())
    assert not zero.passed and "probability 0" in zero.failures[0].detail


def test_exactness_without_rejections_shows_nothing():
    none = rej({"all": pit(0.6, rejected=0)}, [window(0.4, rejected=0, proposed=0)])
    d = decide(none, Gates())
    assert not d.passed and "exactness" in names(d, "fail")
    assert decide(none, Gates(inconclusive="warn")).passed
    # a window without drafts is only a warning where the PIT tests did exercise the verifier
    mixed = decide(rej({"all": pit(0.6)}, [window(None, rejected=0, proposed=0)]), Gates())
    assert mixed.passed and "exactness x@4 T=0.7" in names(mixed, "warn")


def test_exactness_checks_that_could_not_have_failed_do_not_pass():
    """Checks that fit but could detect no distortion at all (detectable_tv None) decide nothing."""
    blind = decide(rej({"all": pit(0.4, detectable=None) | {"tokens_needed": 900}},
                       [window(0.2) | {"detectable_tv": None, "samples_needed": 640}]), Gates())
    assert not blind.passed and names(blind, "fail") == {"exactness"}
    assert {"exactness PIT all", "exactness x@4 T=0.7"} <= names(blind, "warn")
    detail = next(r.detail for r in blind.results if r.name == "exactness")
    assert "large enough to detect" in detail and "about 900 tokens like these would detect a TV of 0.1" in detail
    assert "about 640 samples" in next(r.detail for r in blind.results if r.name == "exactness x@4 T=0.7")
    # one check with the power to fail is enough: the blind ones are named, not gated
    one = decide(rej({"all": pit(0.4, detectable=None)}, [window(0.2)]), Gates())
    assert one.passed and "exactness PIT all" in names(one, "warn")


def test_exactness_control_failure_is_not_the_candidate():
    d = decide(rej({"all": pit(1e-6)}, control=pit(1e-7)), Gates())
    assert not d.passed and "baseline's own samples fail" in d.failures[0].detail
    # a failing control fails closed, whatever `inconclusive` says (tests/test_exactness_reference.py)
    assert not decide(rej({"all": pit(1e-6)}, control=pit(1e-7)), Gates(inconclusive="warn")).passed
    assert "not the target's distribution" in decide(rej({"all": pit(1e-6)}, control=pit(0.4)), Gates()).failures[0].detail


def test_exactness_not_run_warns():
    d = decide(cand(verify="rejection", suites={"s": {"identity": {"T=0": identity()}}}, exactness_expected=True), Gates())
    assert d.passed and "exactness" in names(d, "warn")


def test_errors_and_empty_coverage_fail():
    errs = decide(cand(suites={"s": {"identity": {"T=0": identity()}, "baseline_errors": ["a: NaN in logits"]}}), Gates())
    assert not errs.passed and "baseline errors" in names(errs, "fail")
    nothing = decide(cand(kind="lossy", decoder="early-exit", suites={"longform": {}}), Gates())
    assert not nothing.passed and names(nothing, "fail") == {"coverage"}


def test_speed_gate_uses_the_lower_bound():
    sp = {"statistic": 1.25, "ci_low": 1.1, "ci_high": 1.4, "lower_bound": 1.15, "lower_bound_level": 0.95,
          "median_prompt_speedup": 0.9, "share_prompts_slower": 0.6, "n_prompts": 20}
    ok = cand(suites={"s": {"identity": {"T=0": identity()}}}, min_speedup=1.1, speedup=sp)
    r = next(g for g in decide(ok, Gates()).results if g.name == "speed")
    assert r.status == "pass" and "95% lower bound 1.15x" in r.detail and "60% of 20 prompts slower" in r.detail
    at = cand(suites={"s": {"identity": {"T=0": identity()}}}, min_speedup=1.2, speedup=sp)
    assert names(decide(at, Gates()), "fail") == {"speed"}  # point estimate above, bound below


@pytest.mark.parametrize("body,needle", [
    ("[[candidates]]\ndecoder = 'standard'\n[profiles.smoke]\ntemperatures = [0.0, 0]", "must not repeat"),
    ("[[candidates]]\ndecoder = 'standard'\nsuites = ['factul']\n[profiles.smoke]\nsuites = ['factual']", "did you mean 'factual'"),
    ("[[candidates]]\ndecoder = 'standard'\noptions = 'x'\n[profiles.smoke]", "must be a table"),
    ("top_p = 1.5\n[[candidates]]\ndecoder = 'standard'\n[profiles.smoke]", "top_p"),
    ("[[candidates]]\ndecoder = 'standard'\nkind = 'fast'\n[profiles.smoke]", "kind"),
    ("[[candidates]]\ndecoder = 'standard'\n[profiles.smoke]\ntemprature = [0]", "did you mean 'temperatures'"),
    ("[profiles.smoke]", "no [[candidates]]"),
    ("[[candidates]]\ndecoder = 'standard'\n[profiles.smoke]\n[gates]\nalpha = 0.7", "alpha"),
    ("[[candidates]]\ndecoder = 'standard'\n[profiles.smoke]\n[gates]\nnear_tie_epsilon = 'big'", "near_tie_epsilon"),
    ("[[candidates]]\ndecoder = 'standard'\n[profiles.smoke]\n[gates]\nexactness_pvalue = 0", "exactness_pvalue"),
])
def test_config_errors_name_the_problem(tmp_path, body, needle):
    cfg = tmp_path / "c.toml"
    cfg.write_text("target = 'tiny-llama'\n" + body + "\n")
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        load_config(cfg, "smoke")


def test_one_sampling_seed_warns(tmp_path):
    from harness.config import ConfigWarning
    cfg = tmp_path / "c.toml"
    cfg.write_text("target = 'tiny-llama'\n[[candidates]]\ndecoder = 'standard'\n[profiles.smoke]\n"
                   "suites = ['factual']\ntemperatures = [0.0, 0.7]\nseeds = [0]\n[gates]\nnear_tie_epsilon = 'auto'\n")
    with pytest.warns(ConfigWarning, match="two seeds"):
        c = load_config(cfg, "smoke")
    assert c.gates.near_tie_epsilon is None


def test_shipped_profiles_sample_two_seeds():
    import warnings
    from pathlib import Path
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for profile in ("smoke", "full"):
            seeds = load_config(Path(__file__).parent.parent / "regress.toml", profile).profile.seeds
            assert len(seeds) >= 2 and any(s != 0 for s in seeds)


def test_speculative_verifier_default_is_made_explicit(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("target = 'tiny-llama'\n[[candidates]]\ndecoder = 'speculative'\noptions = {draft = 'prompt-lookup'}\n"
                   "[profiles.smoke]\nsuites = ['factual']\n")
    assert load_config(cfg).candidates[0].options["verify"] == "rejection"


def test_exact_candidate_with_identical_outputs_passes_quality_without_a_test():
    c = cand(suites={"f": {"identity": {"T=0": identity()}, "quality_identical": 10}})
    d = decide(c, Gates())
    assert d.passed and "quality f" in names(d, "pass")


# --------------------------------------------------------------- no evidence, no pass (issue 21)

FAST = {"statistic": 2.0, "ci_low": 1.8, "ci_high": 2.2, "lower_bound": 1.85, "lower_bound_level": 0.95,
        "median_prompt_speedup": 2.0, "share_prompts_slower": 0.0, "n_prompts": 20}


def test_lossy_candidate_without_a_quality_test_fails_even_when_fast():
    """A lossy decoder changes outputs by design: speed alone shows nothing of its quality."""
    fast = cand(kind="lossy", decoder="early-exit", suites={"longform": {"n_pairs": 20}}, min_speedup=1.2,
                speedup=FAST)
    d = decide(fast, Gates())
    assert "speed" in names(d, "pass")
    assert not d.passed and "quality" in names(d, "fail")
    assert "no quality test" in next(r.detail for r in d.failures if r.name == "quality")
    # With a quality test that passes, the same speed passes.
    tested = dict(fast, suites={"f": {"quality": quality(n=400, wins=4, losses=4)}})
    assert decide(tested, Gates()).passed


def test_gated_suite_with_no_items_fails():
    suites = {"f": {"identity": {"T=0": identity()}, "quality_identical": 10},
              "code": {"n_pairs": 0, "no_items": "suite 'code' has no items: 0 pairs"}}
    d = decide(cand(suites=suites), Gates())
    assert not d.passed and names(d, "fail") == {"quality code"}
    assert "no items" in d.failures[0].detail


@pytest.mark.parametrize("where", ["candidate", "suite"])
@pytest.mark.parametrize("step", ["exits", "latency", "speedup", "acceptance"])
def test_a_summary_step_without_data_is_a_failed_gate(where, step):
    err = {"error": "no exit layers recorded (no tokens)"}
    c = cand(suites={"f": {"identity": {"T=0": identity()}, "quality_identical": 10}})
    assert decide(c, Gates()).passed
    if where == "candidate":
        c[step] = err
    else:
        c["suites"]["f"][step] = err
    d = decide(c, Gates())
    assert not d.passed and names(d, "fail") == {f"analysis {step}"}
    assert "no exit layers recorded" in d.failures[0].detail


def test_two_prompts_that_lost_alike_are_not_worse():
    """Clustered pairs (two seeds per prompt), every prompt lost: sd = 0 made the paired-t bound the
    mean itself, and two prompts were "worse, loss larger than the margin" (red-team); the exact sign
    test needs 5 (0.5**5 < 0.05)."""
    from analysis import quality_delta
    from analysis.pairing import Pair, PairKey
    from harness.verdict.plain import plain

    def suite(n):
        pairs = [Pair(PairKey("s", "h", f"i{i}", s, 0.0), {"passed": True}, {"passed": False})
                 for i in range(n) for s in range(2)]
        return plain(quality_delta(pairs, margin=0.1, rng=0, group="s", metric="passed"))
    d = decide(lossy(s=suite(2)), Gates(inconclusive="warn"))
    detail = d.results[0].detail
    assert d.passed and detail.startswith("inconclusive") and "worse," not in detail
    assert "no one-sided 95% upper bound: 2 prompts" in detail and "needs 5" in detail
    d = decide(lossy(s=suite(5)), Gates(inconclusive="warn"))
    assert not d.passed and "worse, loss larger than the margin" in d.results[0].detail


def test_four_discordant_losses_are_not_worse_before_the_exact_sign_test():
    """n = 4, all lost: Tango's z gave a loss at 0.05 where the exact sign test gives 0.0625."""
    d = decide(lossy(f=quality(n=4, losses=4, base_pass=4)), Gates(inconclusive="warn"))
    assert d.passed and d.results[0].detail.startswith("inconclusive")
    d = decide(lossy(f=quality(n=5, losses=5, base_pass=5)), Gates(inconclusive="warn"))
    assert not d.passed and d.results[0].detail.startswith("worse")


def test_a_check_without_a_p_value_says_what_would_decide():
    """Too few tokens for the PIT test at all (5, with drafts rejected): inconclusive, and with the
    size that would decide, not only the note that a test needs 10 tokens."""
    few = pit(None, n=5) | {"note": "5 token(s): too few for a test (at least 10)", "tokens_needed": 200}
    d = decide(rej({"all": few}), Gates())
    r = next(r for r in d.results if r.name == "exactness PIT all")
    assert not d.passed and r.status == "fail" and r.detail.startswith("inconclusive: no p-value")
    assert "about 200 tokens like these would detect a TV of 0.1" in r.detail


def test_exactness_counts_each_rejection_once():
    """Issue 49 (5): every PIT subset carries the run's total (records and window samples), and the
    windows' rejections are inside it: the message summed them, 5 real rejections read 17."""
    blind = {"detectable": None}
    subsets = {k: pit(0.4, rejected=5, **blind) for k in ("all", "drafted", "rejected")}
    d = decide(rej(subsets, [window(0.3, rejected=2) | {"detectable_tv": None}]), Gates())
    detail = next(r.detail for r in d.results if r.name == "exactness")
    assert "5 draft token(s) rejected" in detail and "17" not in detail
    # without a PIT subset the windows' counts add up
    none_left = decide(rej({}, [window(None, rejected=2), window(None, rejected=3)]), Gates())
    assert "rejected 5 draft token(s)" in next(r.detail for r in none_left.results if r.name == "exactness")


def test_two_prompts_with_equal_speedups_give_no_bound():
    """Issue 49 (2): two prompts with exactly equal speedups gave a bound equal to the ratio (a
    jackknife standard error of 0), and passed min_speedup on two prompts."""
    from analysis import pair_records
    from harness.calibration.synthetic import make_record
    from analysis.latency import paired_speedup
    from harness.verdict.plain import plain
    base = [make_record(item_id=f"p{i}", tokens=[1] * 10, wall_s=2.0 * (i + 1)) for i in range(2)]
    fast = [make_record(candidate="c", item_id=f"p{i}", tokens=[1] * 10, wall_s=1.0 * (i + 1)) for i in range(2)]
    sp = plain(paired_speedup(pair_records(base, fast)))
    assert sp["statistic"] == pytest.approx(2.0) and sp["lower_bound"] is None
    d = decide(cand(suites={"s": {"identity": {"T=0": identity()}}}, min_speedup=1.5, speedup=sp), Gates())
    r = next(g for g in d.results if g.name == "speed")
    assert r.status == "fail" and "inconclusive" in r.detail and "2 prompt(s), fewer than the 8" in r.detail
    # enough prompts, every one exactly 2x: no spread to bound the ratio by, still no bound
    base = [make_record(item_id=f"p{i}", tokens=[1] * 10, wall_s=2.0 * (i + 1)) for i in range(8)]
    fast = [make_record(candidate="c", item_id=f"p{i}", tokens=[1] * 10, wall_s=1.0 * (i + 1)) for i in range(8)]
    sp = plain(paired_speedup(pair_records(base, fast)))
    d = decide(cand(suites={"s": {"identity": {"T=0": identity()}}}, min_speedup=1.5, speedup=sp), Gates())
    r = next(g for g in d.results if g.name == "speed")
    assert r.status == "fail" and "no spread" in r.detail
