"""Quality deltas per suite/category, the metric choice, and Holm across the gate's tests."""

import numpy as np
import pytest

from analysis import holm, mcnemar, non_inferiority, pair_records, quality_deltas, wilcoxon_signed_rank
from analysis.calibration.synthetic import make_record


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
    for p in pairs[:3]:
        p.baseline["score"] = None
        p.baseline["passed"] = None
    with pytest.raises(ValueError, match="neither 'passed' nor 'score'"):
        quality_deltas(pairs, margin=0.05, by=None)
    with pytest.raises(ValueError, match="by must be"):
        quality_deltas(pairs, margin=0.05, by="decoder")
