"""The gate is a pure function: each rule on hand-made summaries, and config validation."""
from __future__ import annotations

import pytest

from harness.config import ConfigError, Gates, load_config
from harness.gate import decide


def identity(divergences=(), n=10):
    near = sum(d["kind"] == "near-tie" for d in divergences)
    return {"rate": 1 - len(divergences) / n, "n": n, "identical": n - len(divergences), "near_ties": near,
            "real_divergences": len(divergences) - near, "divergences": list(divergences)}


def quality(delta, lo, hi, ni_p, margin=0.1, pvalue=1.0, n=100):
    return {"statistic": delta, "ci_low": lo, "ci_high": hi, "pvalue": pvalue, "n": n,
            "baseline_mean": 0.8, "candidate_mean": 0.8 + delta,
            "non_inferiority": {"pvalue": ni_p, "margin": margin, "passed": ni_p < 0.05}}


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


def test_sampled_identity_is_gated_only_where_outputs_can_match():
    real = {"kind": "real", "item_id": "b", "position": 0, "margin": 2.0}
    suites = {"s": {"identity": {"T=0": identity(), "T=0.7": identity([real])}}}
    assert not decide(cand(verify="coupled", suites=suites), Gates()).passed
    assert decide(cand(verify="rejection", suites=suites), Gates()).passed       # distribution, not identity
    assert decide(cand(decoder="hf", verify=None, suites=suites), Gates()).passed  # torch's own generator


def test_non_inferiority_pass_inconclusive_and_worse():
    good = decide(cand(kind="lossy", decoder="early-exit", suites={"f": {"quality": quality(0.0, -0.04, 0.04, 0.001)}}), Gates())
    assert good.passed
    unsure = cand(kind="lossy", decoder="early-exit", suites={"f": {"quality": quality(0.0, -0.3, 0.3, 0.4, n=8)}})
    assert not decide(unsure, Gates()).passed
    assert decide(unsure, Gates(inconclusive="warn")).passed  # a policy choice, made explicit
    worse = decide(cand(kind="lossy", decoder="early-exit", suites={"f": {"quality": quality(-0.3, -0.4, -0.2, 0.99)}}),
                   Gates(inconclusive="warn"))
    assert not worse.passed and "worse" in worse.failures[0].detail


def test_holm_adjusts_across_suites():
    # Each suite alone passes at 0.05; Holm over three needs the smallest below 0.05/3.
    suites = {s: {"quality": quality(0.0, -0.05, 0.05, 0.04)} for s in ("a", "b", "c")}
    d = decide(cand(kind="lossy", decoder="early-exit", suites=suites), Gates(inconclusive="fail"))
    assert not d.passed


def test_exactness_needs_a_real_pvalue():
    ok = cand(verify="rejection", exactness={"tests": [{"item_id": "x", "temperature": 0.7, "pvalue": 0.3, "n": 500}]})
    assert decide(ok, Gates()).passed
    low = cand(verify="rejection", exactness={"tests": [{"item_id": "x", "temperature": 0.7, "pvalue": 1e-6, "n": 500}]})
    assert not decide(low, Gates()).passed
    none = cand(verify="rejection", exactness={"tests": [{"item_id": "x", "temperature": 0.7, "pvalue": None, "n": 20,
                                                           "note": "too few"}]})
    assert not decide(none, Gates()).passed


def test_errors_and_empty_coverage_fail():
    errs = decide(cand(suites={"s": {"identity": {"T=0": identity()}, "baseline_errors": ["a: NaN in logits"]}}), Gates())
    assert not errs.passed and "baseline errors" in names(errs, "fail")
    nothing = decide(cand(kind="lossy", decoder="early-exit", suites={"longform": {}}), Gates())
    assert not nothing.passed and names(nothing, "fail") == {"coverage"}


def test_speed_gate():
    c = cand(suites={"s": {"identity": {"T=0": identity()}}}, min_speedup=1.2,
             speedup={"statistic": 1.05, "ci_low": 0.9, "ci_high": 1.2})
    assert names(decide(c, Gates()), "fail") == {"speed"}


@pytest.mark.parametrize("body,needle", [
    ("[[candidates]]\ndecoder = 'standard'\n[profiles.smoke]\ntemperatures = [0.0, 0]", "must not repeat"),
    ("[[candidates]]\ndecoder = 'standard'\nsuites = ['factul']\n[profiles.smoke]\nsuites = ['factual']", "did you mean 'factual'"),
    ("[[candidates]]\ndecoder = 'standard'\noptions = 'x'\n[profiles.smoke]", "must be a table"),
    ("top_p = 1.5\n[[candidates]]\ndecoder = 'standard'\n[profiles.smoke]", "top_p"),
    ("[[candidates]]\ndecoder = 'standard'\nkind = 'fast'\n[profiles.smoke]", "kind"),
    ("[[candidates]]\ndecoder = 'standard'\n[profiles.smoke]\ntemprature = [0]", "did you mean 'temperatures'"),
    ("[profiles.smoke]", "no [[candidates]]"),
])
def test_config_errors_name_the_problem(tmp_path, body, needle):
    cfg = tmp_path / "c.toml"
    cfg.write_text("target = 'tiny-llama'\n" + body + "\n")
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        load_config(cfg, "smoke")


def test_speculative_verifier_default_is_made_explicit(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("target = 'tiny-llama'\n[[candidates]]\ndecoder = 'speculative'\noptions = {draft = 'prompt-lookup'}\n"
                   "[profiles.smoke]\n")
    assert load_config(cfg).candidates[0].options["verify"] == "rejection"


def test_exact_candidate_with_identical_outputs_passes_quality_without_a_test():
    c = cand(suites={"f": {"identity": {"T=0": identity()}, "quality_identical": 10}})
    d = decide(c, Gates())
    assert d.passed and "quality f" in names(d, "pass")
