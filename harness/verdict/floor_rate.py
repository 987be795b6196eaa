"""The A/A floor's rate rule: its exact test, the plan of what it decides, and the routes a
candidate's blocks are tested by (harness.verdict.floor measures the floor and words the verdict).

Under a correct candidate each prompt on which exactly one of (A/A run, candidate) diverged within
the noise is either's with probability 1/2, in every block whatever its rate: the exact one-sided
binomial test on the candidate-only count (`rate_test`) is exact for one block and for any union
of blocks. A candidate is judged in several greedy blocks (each suite at each concurrency level
with a floor), by two routes (`routes`), the level split between them (Bonferroni):
- all its blocks pooled, at alpha / 2: a candidate that diverges more often everywhere is caught
  from every block's prompts at once (regress-engine.toml's floor profile, 1,254 prompts, catches
  a doubling at noise 0.02 with probability >= 0.815; split at alpha / 12 per block, 0.14);
- each level's blocks pooled, at alpha / (2 x levels): an excess at one level alone (a bug under
  one batch size) is not diluted by the other levels, nor hidden by prompts where the candidate
  diverged less than the A/A run there (pooled alone, 3x the noise at concurrency 4 and half of it
  at 2 and 3 was caught 0.47 at noise 0.05; per level, 0.998).
With one level the two routes are one test at alpha. A block fails where a route that holds it
shows an excess and the block itself has more candidate-only than A/A-only prompts (the excess is
its own); a correct candidate is refused at most alpha.
"""
from __future__ import annotations

import functools

import numpy as np
from scipy import stats

PLAN_PASS = 0.95  # "the size is enough": a correct candidate passes with at least this probability
PLAN_POWER = 0.8  # ... and a candidate that doubles the noise rate fails with at least this one
PLAN_MAX_N = 5000  # prompts the plan searches up to


@functools.lru_cache(maxsize=4096)  # a pure function of counts; callers copy the dict they get
def rate_test(b: int, c: int, n: int, alpha: float) -> dict:
    """One-sided exact test that the candidate diverges (within the noise) on more prompts than
    the A/A run: b candidate-only and c A/A-only discordant prompts, Binomial(b + c, 1/2) under
    the null (a correct candidate and the A/A run are two draws of the same noise, so each
    discordant prompt is either's with probability 1/2, whatever the rate and whatever share of
    divergences the two runs share). The test is of the ratio of the two rates: a candidate
    diverging twice as often as the noise is caught more often the more prompts there are."""
    if b + c == 0:
        return {"candidate_only": b, "floor_only": c, "pvalue": 1.0, "share_lower_bound": 0.0,
                "difference_lower_bound": 0.0 if n else float("nan"), "alpha": alpha, "exceeds": False}
    t = stats.binomtest(b, b + c, 0.5, alternative="greater")
    low = float(t.proportion_ci(confidence_level=1 - alpha, method="exact").low)
    return {"candidate_only": b, "floor_only": c, "pvalue": float(t.pvalue), "share_lower_bound": low,
            # (b - c) / n with b / (b + c) at its bound, given the discordant count
            "difference_lower_bound": (b + c) * (2 * low - 1) / n, "alpha": alpha,
            "exceeds": bool(t.pvalue < alpha)}


@functools.lru_cache(maxsize=64)
def critical_counts(n: int, alpha: float) -> np.ndarray:
    """For each discordant count D = 0..n, the fewest candidate-only prompts the exact test
    (`rate_test`) calls an excess: the smallest k with P(Binomial(D, 1/2) >= k) < alpha."""
    d = np.arange(n + 1)
    k = np.nan_to_num(stats.binom.isf(alpha, d, 0.5), nan=0.0).astype(int) + 1
    k = np.where(stats.binom.sf(k - 1, d, 0.5) < alpha, k, k + 1)  # isf's boundary, where sf == alpha
    return np.minimum(k, d + 1)  # d + 1: no count of d prompts is an excess


def passes(b, c, alpha: float):
    """The floor's rate rule, vectorised: within the floor unless the exact test shows the
    candidate diverging within the noise on more prompts than the A/A run."""
    b, c = np.asarray(b), np.asarray(c)
    return ~((b + c > 0) & (stats.binom.sf(b - 1, b + c, 0.5) < alpha))


def pass_probability(aa_rate: float, cand_rate: float, n: int, alpha: float, shared: float = 0.0) -> float:
    """P(`passes`) exactly over n prompts. Per prompt, with probability shared * aa_rate both runs
    diverge from the baseline together (the baseline's own odd token: a concordant prompt); else
    the A/A run diverges with probability aa_rate - that and the candidate with cand_rate - that,
    independently. Summed over the discordant count D, binomial, and the candidate-only share."""
    both = min(shared * aa_rate, aa_rate, cand_rate)
    a, c = (aa_rate - both) / (1 - both), (cand_rate - both) / (1 - both)
    p_aa, p_cand = (1 - both) * a * (1 - c), (1 - both) * c * (1 - a)
    if p_aa + p_cand <= 0:
        return 1.0
    d = np.arange(n + 1)
    k = critical_counts(n, alpha)
    pass_given_d = stats.binom.cdf(k - 1, d, p_cand / (p_aa + p_cand))
    return float(np.sum(stats.binom.pmf(d, n, p_aa + p_cand) * pass_given_d))


@functools.lru_cache(maxsize=1024)
def plan(aa_rate: float, n: int, alpha: float, shared: float = 0.0) -> dict:
    """What the rule decides at n prompts when the engine's noise rate is aa_rate (and that share
    of divergences is the baseline's own, in both runs): P(pass) of a correct candidate, P(fail)
    of one that doubles the rate, whether the size is enough (both targets met), and the prompts
    that would catch the doubling with PLAN_POWER (None beyond PLAN_MAX_N). P(fail | doubled) is
    non-decreasing in n (CALIBRATION.md, "A/A floor"), so the search bisects."""
    correct = pass_probability(aa_rate, aa_rate, n, alpha, shared) if n else 1.0
    doubled = 1 - pass_probability(aa_rate, min(2 * aa_rate, 1.0), n, alpha, shared) if n else 0.0
    enough = correct >= PLAN_PASS and doubled >= PLAN_POWER
    needed = n if doubled >= PLAN_POWER else _needed(aa_rate, alpha, shared, max(n, 1))
    return {"noise_rate": aa_rate, "shared": shared, "n": n, "pass_correct": correct, "fail_doubled": doubled,
            "enough": enough, "needed": needed, "target": PLAN_PASS, "power_target": PLAN_POWER}


def _needed(rate: float, alpha: float, shared: float, start: int) -> int | None:
    def caught(m):
        return 1 - pass_probability(rate, min(2 * rate, 1.0), m, alpha, shared) >= PLAN_POWER
    if rate <= 0:
        return None
    lo, hi = start, max(start + 1, 2 * start)
    while not caught(hi):
        lo, hi = hi, 2 * hi
        if lo >= PLAN_MAX_N:
            return None
    while hi - lo > 1:  # caught(hi), not known for lo
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if caught(mid) else (mid, hi)
    return hi if hi <= PLAN_MAX_N else None


def routes(levels: dict, alpha: float) -> list[dict]:
    """The rate tests over one candidate's blocks: `levels` maps each level to its blocks' (candidate-
    only, A/A-only, prompts) counts. The pooled route at alpha / 2 and one per level at alpha /
    (2 x levels); one level: one test at alpha. Each route: its test and the levels it holds."""
    def route(name, members, level_alpha):
        b, c, n = (sum(x[i] for lvl in members for x in levels[lvl]) for i in range(3))
        return {"route": name, "levels": list(members), "n": n, **rate_test(b, c, n, level_alpha)}
    if len(levels) <= 1:
        return [route("all blocks", list(levels), alpha)]
    each = alpha / (2 * len(levels))
    return [route("all levels", list(levels), alpha / 2)] + [route(f"level {lvl}", [lvl], each) for lvl in levels]


def family_plan(aa_rate: float, sizes: dict, alpha: float, shared: float = 0.0) -> dict:
    """`plan` for the routes over prompts per level (`sizes`): P(pass | correct) at least one less
    each route's false-fail rate (Bonferroni; exact per route), P(fail | doubled) at least the
    larger of the pooled route's and that of some level's route (the levels independent), and the
    pooled prompts that would catch a doubling on the pooled route alone."""
    n = sum(sizes.values())
    if len(sizes) <= 1:
        return dict(plan(aa_rate, n, alpha, shared))
    pooled = plan(aa_rate, n, alpha / 2, shared)
    each = [plan(aa_rate, m, alpha / (2 * len(sizes)), shared) for m in sizes.values()]
    correct = 1 - (1 - pooled["pass_correct"]) - sum(1 - p["pass_correct"] for p in each)
    doubled = max(pooled["fail_doubled"], 1 - float(np.prod([1 - p["fail_doubled"] for p in each])))
    return {**pooled, "pass_correct": correct, "fail_doubled": doubled,
            "enough": correct >= PLAN_PASS and doubled >= PLAN_POWER,
            "needed": n if doubled >= PLAN_POWER else pooled["needed"], "levels": len(sizes)}
