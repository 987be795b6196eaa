"""Quality deltas of a candidate against the baseline, per suite or category.

For each group of pairs it picks the metric (``passed`` where every record has one, else the
continuous ``score``) and runs the matching paired analyses from :mod:`analysis.paired`:

- pass/fail: McNemar (mid-p) for the two-sided difference, Tango's interval for the delta, and
  the Tango non-inferiority test against ``margin``;
- continuous scores: Wilcoxon signed-rank, a paired bootstrap interval for the mean delta, and
  the paired-t non-inferiority test.

Each pair counts once. With several seeds per item the pairs of one item are correlated and
the tests treat them as independent; gate on one seed per item, or on per-item means.

The gate applies Holm across the returned non-inferiority p-values (``paired.holm``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ._common import ConfidenceInterval, as_rng, group_pairs
from .paired import (
    NonInferiorityResult, mcnemar, non_inferiority, wilcoxon_signed_rank,
)
from .pairing import Pair


@dataclass(frozen=True)
class QualityDelta:
    """candidate - baseline on one metric for one group of pairs.

    ``pvalue``: two-sided test of no difference (McNemar mid-p or Wilcoxon); the interval is
    two-sided at ``confidence_level``; ``non_inferiority`` is the one-sided gate test.
    """

    group: str
    metric: str
    n: int
    baseline_mean: float
    candidate_mean: float
    statistic: float
    pvalue: float
    test: str
    ci_low: float
    ci_high: float
    confidence_level: float
    non_inferiority: NonInferiorityResult

    def confidence_interval(self) -> ConfidenceInterval:
        return ConfidenceInterval(self.ci_low, self.ci_high)


def _metric(group: str, pairs: Sequence[Pair], metric: str) -> str:
    def complete(field: str) -> bool:
        return all(p.baseline.get(field) is not None and p.candidate.get(field) is not None for p in pairs)

    if metric == "auto":
        if complete("passed"):
            return "passed"
        if complete("score"):
            return "score"
        raise ValueError(f"group {group!r}: neither 'passed' nor 'score' is set on every record")
    if metric not in ("passed", "score"):
        raise ValueError(f"metric must be 'auto', 'passed' or 'score', not {metric!r}")
    if not complete(metric):
        raise ValueError(f"group {group!r}: some records have no {metric!r}")
    return metric


def quality_delta(
    pairs: Sequence[Pair], *, margin: float, metric: str = "auto", alpha: float = 0.05,
    confidence_level: float = 0.95, n_resamples: int = 9999,
    rng: np.random.Generator | int | None = None, group: str = "all",
) -> QualityDelta:
    """Paired quality delta of one group; see the module docstring."""
    if not pairs:
        raise ValueError(f"group {group!r} has no pairs")
    metric = _metric(group, pairs, metric)
    base = np.array([float(p.baseline[metric]) for p in pairs])
    cand = np.array([float(p.candidate[metric]) for p in pairs])
    if metric == "passed":
        test = mcnemar(base, cand, confidence_level=confidence_level)
        name = f"mcnemar-{test.variant}"
        ci = test.confidence_interval()
    else:
        test = wilcoxon_signed_rank(base, cand, confidence_level=confidence_level,
                                    n_resamples=n_resamples, rng=as_rng(rng))
        name = "wilcoxon"
        ci = test.confidence_interval()
    ni = non_inferiority(base, cand, margin=margin, alpha=alpha)
    return QualityDelta(
        group=group, metric=metric, n=len(pairs), baseline_mean=float(base.mean()),
        candidate_mean=float(cand.mean()), statistic=float(cand.mean() - base.mean()),
        pvalue=float(test.pvalue), test=name, ci_low=ci.low, ci_high=ci.high,
        confidence_level=confidence_level, non_inferiority=ni,
    )


def quality_deltas(
    pairs: Sequence[Pair], *, margin: float, by: str | None = "suite", metric: str = "auto",
    alpha: float = 0.05, confidence_level: float = 0.95, n_resamples: int = 9999,
    rng: np.random.Generator | int | None = None,
) -> dict[str, QualityDelta]:
    """:func:`quality_delta` per suite (``by="suite"``), per category, or overall (``None``)."""
    gen = as_rng(rng)
    return {
        name: quality_delta(group, margin=margin, metric=metric, alpha=alpha,
                            confidence_level=confidence_level, n_resamples=n_resamples, rng=gen, group=name)
        for name, group in group_pairs(pairs, by).items()
    }

