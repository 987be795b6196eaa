"""Quality deltas per suite/category, the metric choice, and Holm across the gate's tests."""

import numpy as np
import pytest

from analysis import holm, mcnemar, non_inferiority, pair_records, quality_deltas, wilcoxon_signed_rank
from harness.calibration.synthetic import make_record


def build(rng, n=120):
    base, cand = [], []
    for i in range(n):
        suite = "factual" if i % 2 else "chat"
        cats = ["geo"] if i % 3 == 0 else ["misc"]
        b = bool(rng.random() < 0.8)
        c = b if rng.random() > 0.1 else not b
        # chat has no right answer: passed is None, a continuous score instead
        kw_b = {"passed": b} if suite == "factual" else {"score": float(rng.uniform())}
        kw_c = {"passed": c} if suite == "factual" else {"score": float(np.clip(kw_b["score"] + rng.normal(0, 0.05), 0, 1))}
        base.append(make_record(item_id=f"i{i}", suite=suite, categories=cats, **kw_b))
        cand.append(make_record(candidate="c", item_id=f"i{i}", suite=suite, categories=cats, **kw_c))
    return pair_records(base, cand)


def test_quality_deltas_per_suite():
    pairs = build(np.random.default_rng(0))
    out = quality_deltas(pairs, margin=0.05, rng=0, n_resamples=2000)
    assert list(out) == ["chat", "factual"]
    fact, chat = out["factual"], out["chat"]
    assert fact.metric == "passed" and fact.test == "mcnemar-mid-p" and fact.n == 60
    fp = [p for p in pairs if p.key.suite == "factual"]
    b = [p.baseline["passed"] for p in fp]
    c = [p.candidate["passed"] for p in fp]
    ref = mcnemar(b, c)
    assert fact.pvalue == ref.pvalue and fact.confidence_interval() == ref.confidence_interval()
    assert fact.non_inferiority == non_inferiority(b, c, margin=0.05)
    assert fact.statistic == pytest.approx(np.mean(c) - np.mean(b))
    assert chat.metric == "score" and chat.test == "wilcoxon" and chat.non_inferiority.method == "paired-t"
    cp = [p for p in pairs if p.key.suite == "chat"]
    ref = wilcoxon_signed_rank([p.baseline["score"] for p in cp], [p.candidate["score"] for p in cp],
                               n_resamples=100, rng=0)
    assert chat.pvalue == pytest.approx(ref.pvalue)
    gate = holm({k: v.non_inferiority.pvalue for k, v in out.items()})
    assert set(gate.as_dict()) == {"chat", "factual"}


def test_quality_by_category_and_overall():
    pairs = build(np.random.default_rng(1))
    by_cat = quality_deltas(pairs, margin=0.05, by="category", metric="score", rng=0, n_resamples=500)
    assert set(by_cat) == {"geo", "misc"} and by_cat["geo"].n == 40
    overall = quality_deltas(pairs, margin=0.05, by=None, metric="score", rng=0, n_resamples=500)
    assert list(overall) == ["all"] and overall["all"].n == 120


def test_quality_metric_errors():
    pairs = build(np.random.default_rng(2))
    with pytest.raises(ValueError, match="group 'chat': some records have no 'passed'"):
        quality_deltas(pairs, margin=0.05, metric="passed")
    for p in pairs[:3]:  # chat pairs: no 'passed' anywhere in that suite, and now no score either
        assert p.key.suite == "chat"
        p.baseline["score"] = None
        p.baseline["passed"] = None
    with pytest.raises(ValueError, match="group 'chat': neither 'passed' nor 'score'"):
        quality_deltas(pairs, margin=0.05)
    with pytest.raises(ValueError, match="by must be"):
        quality_deltas(pairs, margin=0.05, by="decoder")


def test_auto_metric_leaves_out_ungraded_pairs_instead_of_counting_ties():
    """metric="auto" on a group where some items are ungraded (grader "none": passed None, score
    0.0 on both sides): before, the whole group fell back to `score` and the ungraded items entered
    as ties, diluting a 20-point loss on the graded ones into a non-inferiority pass."""
    from analysis import quality_delta
    from analysis.pairing import Pair, PairKey

    def pair(i, b, c):
        return Pair(PairKey("mixed", "h", f"i{i:03d}", 0, 0.0), b, c)

    graded = [pair(i, {"passed": True, "score": 1.0}, {"passed": i >= 12, "score": float(i >= 12)})
              for i in range(60)]
    ungraded = [pair(100 + i, {"passed": None, "score": 0.0}, {"passed": None, "score": 0.0}) for i in range(240)]
    alone = quality_delta(graded, margin=0.1, rng=0, n_resamples=999)
    mixed = quality_delta(graded + ungraded, margin=0.1, rng=0, n_resamples=999)
    assert alone.metric == mixed.metric == "passed"
    assert mixed.n == mixed.n_pairs == 60 and mixed.statistic == pytest.approx(-0.2)
    assert not mixed.non_inferiority.passed and mixed.loss_pvalue < 0.01
    assert mixed.non_inferiority == alone.non_inferiority and mixed.pvalue == alone.pvalue
    # Through quality_deltas too (the API the figures and reports use).
    assert quality_deltas(graded + ungraded, margin=0.1, by=None, rng=0, n_resamples=999)["all"].n == 60
    # Graded on one side only: the pair cannot be compared; an error naming it, not a silent drop.
    lopsided = graded + [pair(999, {"passed": True, "score": 1.0}, {"passed": None, "score": 0.0})]
    with pytest.raises(ValueError, match=r"group 'all': 1 pair\(s\) graded on one side only.*mixed/i999"):
        quality_delta(lopsided, margin=0.1, rng=0, n_resamples=999)
    # No record has `passed`: the continuous score, on every pair, as before.
    scored = [pair(i, {"passed": None, "score": 0.5}, {"passed": None, "score": 0.5 + 0.01 * (i % 3)})
              for i in range(20)]
    q = quality_delta(scored, margin=0.1, rng=0, n_resamples=999)
    assert q.metric == "score" and q.n == 20


def _clustered(n_prompts, seeds=2, base=True, cand=False):
    """n prompts with `seeds` pairs each (unit: the prompt), every pair base `base`, candidate `cand`."""
    from analysis.pairing import Pair, PairKey
    return [Pair(PairKey("s", "h", f"i{i}", s, 0.0), {"passed": base}, {"passed": cand})
            for i in range(n_prompts) for s in range(seeds)]


def test_prompts_that_all_lose_alike_are_decided_by_the_sign_test_not_by_p_zero():
    """Two prompts (two seeds each) that both lost: sd = 0, and the paired-t loss test gave p = 0 and
    an upper bound at the mean, so two prompts were 'worse, loss larger than the margin' (red-team)."""
    from analysis import quality_delta
    from analysis.paired import loss_upper_bound
    two = quality_delta(_clustered(2), margin=0.1, rng=0, group="s", metric="passed")
    assert two.unit == "prompt" and two.loss_pvalue == pytest.approx(0.25)
    assert two.loss_upper_bound(0.95) == float("inf")  # no bound: the sign test cannot reject with 2
    five = quality_delta(_clustered(5), margin=0.1, rng=0, group="s", metric="passed")
    assert five.loss_pvalue == pytest.approx(1 / 32) and five.loss_upper_bound(0.95) == pytest.approx(-1.0)
    assert five.n_needed == 5  # the sign test needs 0.5**n < 0.05 (the t formula said 2)
    same = quality_delta(_clustered(5, cand=True), margin=0.1, rng=0, group="s", metric="passed")
    assert same.loss_pvalue == 1.0
    # differences equal but for float rounding (0.35 - 0.4, 0.55 - 0.6): the same
    d = np.array([0.35 - 0.4, 0.55 - 0.6])
    assert np.std(d, ddof=1) > 0
    assert loss_upper_bound(method="paired-t", level=0.95, n=2, mean=float(d.mean()),
                            sd=float(np.std(d, ddof=1))) == float("inf")
