"""Quality deltas of a candidate against the baseline, per suite or category.

For each group of pairs it picks the metric and runs the matching paired analyses from
:mod:`analysis.paired`. With ``metric="auto"``: ``passed`` where any record has one; pairs graded
on neither side (grader "none") are left out, not counted as ties (they would dilute a real loss
into non-inferiority), and a pair graded on one side only is an error. The continuous ``score``
only where no record has ``passed``.

- pass/fail, one pair per prompt: McNemar (mid-p) for the two-sided difference, Tango's interval
  for the delta, the Tango non-inferiority test against ``margin``, and the one-sided Tango test
  of a loss (H0: delta >= 0), all from the discordant counts;
- continuous scores, or several pairs per prompt (seeds, temperatures): the pairs of one prompt
  are correlated, so the unit is the prompt: each prompt's mean over its pairs, then Wilcoxon
  signed-rank, a bootstrap interval over prompts, and paired-t tests (non-inferiority, loss);
  differences without spread (every prompt changed alike) are decided by the exact sign test
  (0.5**n), never by a t-test divided by zero or by float rounding.

``n_needed`` says how many units would show non-inferiority with 80% power if there were no true
change, at the observed discordance (or spread); ``n_needed_observed`` the same if the observed
delta were the truth (None where that delta is at or past the margin). The gate turns these into
verdicts: non-inferior at alpha per suite (intersection-union, no multiplicity correction),
"worse" only from the loss test (Bonferroni across the suites, so that any "worse" holds the
family at alpha), inconclusive otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from scipy import stats

from ._common import ConfidenceInterval, as_rng, group_pairs, prompt_clusters
from .paired import (
    NonInferiorityResult, below, constant_differences, loss_upper_bound, mcnemar, ni_sample_size, non_inferiority,
    t_sample_size, tango_loss_pvalue, wilcoxon_signed_rank,
)
from .pairing import Pair

POWER = 0.8


@dataclass(frozen=True)
class QualityDelta:
    """candidate - baseline on one metric for one group of pairs.

    ``pvalue``: two-sided test of no difference (McNemar mid-p or Wilcoxon); the interval is
    two-sided at ``confidence_level``; ``non_inferiority`` is the one-sided gate test;
    ``loss_pvalue`` the one-sided test of H0: delta >= 0. ``n`` counts the units tested (pairs, or
    prompts when ``unit == "prompt"``), ``n_pairs`` the pairs; ``wins``/``losses`` (pass/fail per
    pair) or ``sd`` (of the per-unit differences) are what :meth:`loss_upper_bound` needs.
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
    loss_pvalue: float = float("nan")
    unit: str = "pair"
    n_pairs: int = 0
    wins: int | None = None
    losses: int | None = None
    sd: float | None = None
    n_needed: int | None = None
    n_needed_observed: int | None = None

    def confidence_interval(self) -> ConfidenceInterval:
        return ConfidenceInterval(self.ci_low, self.ci_high)

    def loss_upper_bound(self, level: float) -> float:
        """One-sided upper bound of delta at ``level`` (below 0: a significant loss)."""
        return loss_upper_bound(method=self.non_inferiority.method, level=level, n=self.n, wins=self.wins,
                                losses=self.losses, mean=self.statistic, sd=self.sd)


def _metric(group: str, pairs: Sequence[Pair], metric: str) -> tuple[str, list[Pair]]:
    """The metric, and the pairs it is measured on (see the module docstring)."""
    def complete(field: str) -> bool:
        return all(p.baseline.get(field) is not None and p.candidate.get(field) is not None for p in pairs)

    if metric == "auto":
        if any(r.get("passed") is not None for p in pairs for r in (p.baseline, p.candidate)):
            one_sided = [p for p in pairs if (p.baseline.get("passed") is None) != (p.candidate.get("passed") is None)]
            if one_sided:
                k = one_sided[0].key
                raise ValueError(
                    f"group {group!r}: {len(one_sided)} pair(s) graded on one side only ('passed' is None on the "
                    f"other), e.g. {k.suite}/{k.item_id} seed={k.seed} T={k.temperature:g}: an item is graded on "
                    f"both sides or on neither")
            # Ungraded on both sides: no evidence on the pass rate, not a tie.
            return "passed", [p for p in pairs if p.baseline.get("passed") is not None]
        if complete("score"):
            return "score", list(pairs)
        raise ValueError(f"group {group!r}: neither 'passed' nor 'score' is set on every record")
    if metric not in ("passed", "score"):
        raise ValueError(f"metric must be 'auto', 'passed' or 'score', not {metric!r}")
    if not complete(metric):
        raise ValueError(f"group {group!r}: some records have no {metric!r}")
    return metric, list(pairs)


def _per_prompt_means(pairs: Sequence[Pair], metric: str) -> tuple[np.ndarray, np.ndarray]:
    ids = prompt_clusters(pairs)
    m = int(ids.max()) + 1
    count = np.bincount(ids, minlength=m)
    base = np.bincount(ids, weights=[float(p.baseline[metric]) for p in pairs], minlength=m) / count
    cand = np.bincount(ids, weights=[float(p.candidate[metric]) for p in pairs], minlength=m) / count
    return base, cand


def quality_delta(
    pairs: Sequence[Pair], *, margin: float, metric: str = "auto", alpha: float = 0.05,
    confidence_level: float = 0.95, n_resamples: int = 9999,
    rng: np.random.Generator | int | None = None, group: str = "all",
) -> QualityDelta:
    """Paired quality delta of one group; see the module docstring."""
    if not pairs:
        raise ValueError(f"group {group!r} has no pairs")
    metric, pairs = _metric(group, pairs, metric)
    clustered = len(set(prompt_clusters(pairs))) < len(pairs)
    if clustered:
        base, cand = _per_prompt_means(pairs, metric)
    else:
        base = np.array([float(p.baseline[metric]) for p in pairs])
        cand = np.array([float(p.candidate[metric]) for p in pairs])
    binary = metric == "passed" and not clustered
    wins = losses = sd = None
    if binary:
        test = mcnemar(base, cand, confidence_level=confidence_level)
        name = f"mcnemar-{test.variant}"
        wins, losses = test.wins, test.losses
        ni = non_inferiority(base, cand, margin=margin, alpha=alpha, method="tango-score")
        loss_p = float(tango_loss_pvalue(wins, losses, len(base)))
        discordance = (wins + losses) / len(base)
        n_needed = ni_sample_size(discordance, margin, alpha=alpha, power=POWER)
        observed = ni.statistic
        n_needed_obs = ni_sample_size(discordance, margin, alpha=alpha, power=POWER, true_delta=observed) \
            if observed < 0 else n_needed
    else:
        if base.size < 2:
            raise ValueError(f"group {group!r}: a continuous or per-prompt comparison needs at least 2 prompts")
        test = wilcoxon_signed_rank(base, cand, confidence_level=confidence_level,
                                    n_resamples=n_resamples, rng=as_rng(rng))
        name = "wilcoxon" + (" on per-prompt means" if clustered else "")
        ni = non_inferiority(base, cand, margin=margin, alpha=alpha, method="paired-t")
        d = cand - base
        if constant_differences(d):
            # No spread beyond float rounding (every prompt lost alike): the t-test is undefined and
            # "p = 0" made two prompts "worse". The exact sign test, as in non_inferiority: all n
            # below 0 has chance 0.5**n under no change. sd = 0 tells loss_upper_bound the same.
            sd = 0.0
            loss_p = 0.5 ** len(d) if below(float(d.max()), 0.0) else 1.0
        else:
            sd = float(np.std(d, ddof=1))
            loss_p = float(stats.ttest_1samp(d, 0.0, alternative="less").pvalue)
        n_needed = t_sample_size(sd, margin, alpha=alpha, power=POWER)
        n_needed_obs = t_sample_size(sd, margin, alpha=alpha, power=POWER, true_delta=float(d.mean())) \
            if d.mean() < 0 else n_needed
    ci = test.confidence_interval()
    return QualityDelta(
        group=group, metric=metric, n=int(base.size), baseline_mean=float(base.mean()),
        candidate_mean=float(cand.mean()), statistic=float(ni.statistic),
        pvalue=float(test.pvalue), test=name, ci_low=ci.low, ci_high=ci.high,
        confidence_level=confidence_level, non_inferiority=ni, loss_pvalue=loss_p,
        unit="prompt" if clustered else "pair", n_pairs=len(pairs), wins=wins, losses=losses, sd=sd,
        n_needed=n_needed, n_needed_observed=n_needed_obs,
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

