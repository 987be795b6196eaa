"""Acceptance drift: has a speculative candidate's α or τ fallen below a reference run's?

Pure functions over two sets of candidate records (the reference run's and this run's), paired
by (suite, item, seed, temperature). Not here: finding the reference (harness.verdict.acceptance_ref),
the pass/fail wording (harness.verdict.gate).

The statistic, per group (all prompts, then each category) and per quantity:
- α: accepted / tested draft tokens (tested = accepted + rejected rounds, the MLE of
  ``analysis.acceptance``), τ: emitted tokens / target forwards. Both ratios of sums.
- ``relative_change`` = candidate / reference - 1 over the paired keys of the group.
- Its interval: a paired percentile bootstrap that resamples *prompts* (the independent unit:
  one prompt's rounds, seeds and temperatures share its predictability) and recomputes both
  ratios on the same resample.
- ``regressed``: the one-sided upper bound at ``1 - alpha / m`` lies below ``-tolerance`` (the
  drop is beyond the tolerance and the interval excludes the tolerated region). ``m`` is the
  number of gated comparisons (Bonferroni), so an unchanged candidate fails with probability at
  most ``alpha`` however many categories it has. Groups with fewer than ``min_rounds`` drafting
  rounds on either side, or fewer than ``min_prompts`` (5) paired prompts, are reported but not
  gated (the gate calls the overall group inconclusive when it lacks prompts).
- Records whose per-round counters are impossible (accepted > proposed, negative counts) are
  refused (ValueError naming the record), as analysis.acceptance refuses them.

Per draft position the conditional acceptance accepted / tested at position j is compared the
same way (reported, not gated: positions past the first are thin and correlated).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._common import as_rng, check_level
from .acceptance import per_round_counts

QUANTITIES = ("alpha", "tau")
MIN_PROMPTS = 5   # paired prompts a comparison needs to be gated (a bootstrap over fewer collapses)


@dataclass(frozen=True)
class PromptAcceptance:
    """One record's acceptance counters (a row of records.jsonl reduced to what drift needs)."""

    key: tuple                  # (suite, item_id, seed, temperature)
    categories: tuple[str, ...]
    accepted: int
    tested: int
    rounds: int
    tokens: int
    forwards: int
    accepted_at: tuple[int, ...]   # per draft position j: accepted there
    tested_at: tuple[int, ...]     # per draft position j: tested there (reached, proposed)

    @property
    def cluster(self) -> tuple:
        return self.key[:2]


def prompt_acceptance(row: Mapping[str, Any]) -> PromptAcceptance | None:
    """Counters of one candidate record; None when it holds no drafting (an error, no stats)."""
    s = row.get("stats") or {}
    if row.get("error"):
        return None
    try:
        counts = per_round_counts(s)  # impossible counters are refused, not a drift
    except ValueError as e:
        acc, prop = np.asarray(s["accepted_per_round"]), np.asarray(s["proposed_per_round"])
        raise ValueError(
            f"record {row.get('suite')}/{row.get('item_id')} seed={row.get('seed', 0)} "
            f"T={row.get('temperature', 0.0)}: {e} (impossible counters: {len(acc)} accepted vs {len(prop)} "
            f"proposed rounds" + (f", e.g. accepted {_first_bad(acc, prop)}" if acc.shape == prop.shape else "") + ")"
        ) from None
    if counts is None:
        return None
    acc, prop = counts
    drafted = prop > 0
    acc, prop = acc[drafted], prop[drafted]
    k = int(prop.max()) if prop.size else 0
    j = np.arange(k)[:, None]
    return PromptAcceptance(
        key=(row["suite"], row["item_id"], row.get("seed", 0), float(row.get("temperature", 0.0))),
        categories=tuple(row.get("categories") or ()), accepted=int(acc.sum()),
        tested=int(acc.sum() + np.sum(acc < prop)), rounds=int(prop.size),
        tokens=len(row.get("tokens") or []), forwards=int(s.get("target_forwards") or 0),
        accepted_at=tuple(int(x) for x in np.sum(acc[None, :] > j, axis=1)),
        tested_at=tuple(int(x) for x in np.sum((acc[None, :] >= j) & (prop[None, :] > j), axis=1)))


def _first_bad(acc: np.ndarray, prop: np.ndarray) -> str:
    i = int(np.flatnonzero((acc > prop) | (acc < 0))[0])
    return f"{int(acc[i])} of {int(prop[i])} proposed in round {i}"


@dataclass(frozen=True)
class Comparison:
    """One quantity of one group: reference vs candidate, with the relative change's interval."""

    group: str
    quantity: str               # "alpha", "tau", or "alpha@j" (draft position j, 0-based)
    n_prompts: int
    rounds_reference: int
    rounds_candidate: int
    reference: float
    candidate: float
    relative_change: float
    ci_low: float               # two-sided interval at confidence_level
    ci_high: float
    upper_bound: float          # one-sided upper bound at 1 - alpha / m (the gate's level)
    upper_level: float
    gated: bool                 # enough rounds on both sides, and enough prompts
    regressed: bool


@dataclass(frozen=True)
class DriftResult:
    tolerance: float
    alpha: float
    min_rounds: int
    n_paired: int
    n_reference_only: int
    n_candidate_only: int
    comparisons: tuple[Comparison, ...]
    by_position: tuple[Comparison, ...] = field(default=())
    min_prompts: int = 5

    @property
    def regressions(self) -> list[Comparison]:
        return [c for c in self.comparisons if c.regressed]

    @property
    def passed(self) -> bool:
        return not self.regressions


def _side(rows: Sequence[Mapping[str, Any]], side: str) -> dict:
    """Counters of one side's records by key; impossible counters refuse the comparison, naming them."""
    out, bad = {}, []
    for row in rows:
        try:
            p = prompt_acceptance(row)
        except ValueError as e:
            bad.append(str(e))
            continue
        if p is not None:
            out[p.key] = p
    if bad:
        raise ValueError(f"{len(bad)} {side} record(s) with impossible acceptance counters; first: {bad[0]}")
    return out


def _ratio(num: float, den: float) -> float:
    return float(num / den) if den > 0 else float("nan")


def _cluster_sums(rows: Sequence[PromptAcceptance], clusters: list, attr: str) -> np.ndarray:
    index = {c: i for i, c in enumerate(clusters)}
    out = np.zeros(len(clusters))
    for r in rows:
        out[index[r.cluster]] += getattr(r, attr) if isinstance(attr, str) else attr(r)
    return out


def _compare(group: str, quantity: str, ref: list, cand: list, num, den, *, idx, level: float,
             upper_level: float, tolerance: float, min_rounds: int, min_prompts: int, gate: bool) -> Comparison:
    clusters = sorted({r.cluster for r in ref}, key=str)
    sums = [_cluster_sums(side, clusters, f) for side in (ref, cand) for f in (num, den)]
    r_num, r_den, c_num, c_den = sums
    point_r, point_c = _ratio(r_num.sum(), r_den.sum()), _ratio(c_num.sum(), c_den.sum())
    change = point_c / point_r - 1 if point_r > 0 and np.isfinite(point_c) else float("nan")
    low = high = upper = float("nan")
    if clusters and np.isfinite(change):
        pick = idx[:, : len(clusters)] % len(clusters)  # (B, C): one resample of prompts for both sides
        with np.errstate(invalid="ignore", divide="ignore"):
            boot = (c_num[pick].sum(1) / c_den[pick].sum(1)) / (r_num[pick].sum(1) / r_den[pick].sum(1)) - 1
        boot = boot[np.isfinite(boot)]
        if boot.size:
            tail = (1 - level) / 2
            low, high = (float(x) for x in np.quantile(boot, [tail, 1 - tail]))
            upper = float(np.quantile(boot, upper_level))
    rounds_r, rounds_c = sum(r.rounds for r in ref), sum(r.rounds for r in cand)
    # A bootstrap over one or two prompts has (almost) no resamples but the point estimate: its
    # "interval" is noise, and an unchanged drafter would be called regressed (or a changed one pass).
    gated = gate and min(rounds_r, rounds_c) >= min_rounds and len(clusters) >= min_prompts and np.isfinite(upper)
    return Comparison(group=group, quantity=quantity, n_prompts=len(clusters), rounds_reference=rounds_r,
                      rounds_candidate=rounds_c, reference=point_r, candidate=point_c, relative_change=change,
                      ci_low=low, ci_high=high, upper_bound=upper, upper_level=upper_level, gated=gated,
                      regressed=bool(gated and upper < -tolerance))


def _groups(rows: Sequence[PromptAcceptance]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {"all": list(range(len(rows)))}
    for i, r in enumerate(rows):
        for c in r.categories:
            groups.setdefault(f"category:{c}", []).append(i)
    return groups


def acceptance_drift(
    reference: Sequence[Mapping[str, Any]], candidate: Sequence[Mapping[str, Any]], *,
    tolerance: float = 0.05, alpha: float = 0.05, min_rounds: int = 20, min_prompts: int = MIN_PROMPTS,
    confidence_level: float = 0.95, n_resamples: int = 2000, rng: np.random.Generator | int | None = None,
) -> DriftResult:
    """Compare the candidate records with the reference records (both: rows of one candidate).

    ``tolerance``: the relative drop allowed (0.05: 5% below the reference); ``alpha``: the
    family-wise level of the one-sided tests; ``min_rounds``: drafting rounds a group needs on
    both sides to be gated; ``min_prompts``: paired prompts it needs (the bootstrap's unit).
    Records with impossible counters (accepted > proposed, negative) raise ValueError.
    """
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance!r}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    level = check_level(confidence_level)
    gen = as_rng(rng)
    ref, cand = _side(reference, "reference"), _side(candidate, "candidate")
    keys = sorted(set(ref) & set(cand), key=str)
    if not keys:
        raise ValueError(f"no record of the candidate pairs with the reference ({len(cand)} candidate and "
                         f"{len(ref)} reference records with drafting): the runs share no prompt")
    ref_rows, cand_rows = [ref[k] for k in keys], [cand[k] for k in keys]
    groups = _groups(ref_rows)
    n_clusters = len({r.cluster for r in ref_rows})
    idx = gen.integers(0, 1 << 30, size=(n_resamples, n_clusters))
    # Bonferroni over the comparisons that can be gated (both quantities of every group with enough rounds).
    m = sum(min(sum(ref_rows[i].rounds for i in ix), sum(cand_rows[i].rounds for i in ix)) >= min_rounds
            and len({ref_rows[i].cluster for i in ix}) >= min_prompts
            for ix in groups.values()) * len(QUANTITIES)
    upper_level = 1 - alpha / max(m, 1)
    kw = dict(idx=idx, level=level, upper_level=upper_level, tolerance=tolerance, min_rounds=min_rounds,
              min_prompts=min_prompts)
    comps = []
    for name, ix in groups.items():
        r, c = [ref_rows[i] for i in ix], [cand_rows[i] for i in ix]
        comps.append(_compare(name, "alpha", r, c, "accepted", "tested", gate=True, **kw))
        comps.append(_compare(name, "tau", r, c, "tokens", "forwards", gate=True, **kw))
    k = min(max((len(p.tested_at) for p in ref_rows), default=0), max((len(p.tested_at) for p in cand_rows), default=0))
    by_pos = tuple(
        _compare("all", f"alpha@{j}", ref_rows, cand_rows,
                 lambda p, j=j: p.accepted_at[j] if j < len(p.accepted_at) else 0,
                 lambda p, j=j: p.tested_at[j] if j < len(p.tested_at) else 0, gate=False, **kw)
        for j in range(k))
    return DriftResult(tolerance=tolerance, alpha=alpha, min_rounds=min_rounds, n_paired=len(keys),
                       n_reference_only=len(set(ref) - set(cand)), n_candidate_only=len(set(cand) - set(ref)),
                       comparisons=tuple(comps), by_position=by_pos, min_prompts=min_prompts)
