"""Latency: time to first token, per-token latency, percentiles, throughput, paired speedup.

Timing convention (the decoders' ``Timing``): ``wall_s`` is the whole request, prefill included;
``ttft_s`` the time from the request's start to the first new token; ``token_times_s[i]`` the
time from token ``i - 1`` to token ``i`` (``token_times_s[0]`` is the TTFT). Inter-token latencies
are ``token_times_s[1:]``; a speculative decoder emits several tokens per round, so many are
near zero and a few are a whole round. Records without ``token_times_s`` fall back to the mean
decode time per token, ``(wall_s - ttft_s) / (n - 1)``.

The paired speedup is (baseline seconds per token) / (candidate seconds per token) over all
pairs, i.e. the candidate's tokens/s over the baseline's: a ratio of totals, whose population
value (E[baseline wall] / E[candidate wall] per pair) is the estimand. Its interval treats prompts,
not pairs, as the independent units: the pairs of one prompt (several seeds, temperatures) share
its length and difficulty, and resampling them as if independent gave 95% intervals that covered
the truth about half the time. The interval (:func:`speed_bounds`) is the jackknife over prompts
of the ratio of totals (Quenouille's bias-corrected estimate with its jackknife standard error, on
the ratio scale), with Student's t at a Satterthwaite number of degrees of freedom,
``(sum a_i^2)^2 / sum a_i^4 * (m - 1) / m`` for prompt time shares ``a_i`` (a total carried by a
few long prompts rests on fewer independent units than it has prompts), and its lower quantiles
moved down by a Cornish-Fisher term, ``SKEW_FACTOR * max(0, -g) / (6 sqrt(m)) * (2 z^2 + 1)``, for
the skewness ``g`` of the pseudo-values, never up. Where the gain depends on output length (long
outputs gaining less: the long prompts that carry the total are rare, and a sample that misses
them overstates the ratio), the plain jackknife's one-sided 95% bound covered 0.90 with lengths
log-normal (log-sd 0.8), 0.94 with lengths capped at 256 tokens; the corrected bound covers 0.947
or more over the calibration grid's slopes (-0.3 to +0.3 per log token), capped budgets,
stragglers and 8-45 prompts of 2-7 pairs, at a wider bound where the skew calls for it.
Fewer than ``MIN_PROMPTS`` (8) prompts give no bound (NaN: the gate reads it as inconclusive);
below that no rule on the grid covered. Lengths log-normal with log-sd 1.5 and no cap, with gains
falling with length, are beyond any bound from 45 prompts: half the candidate's time comes from
prompts rarer than 1 in 39, absent from most samples. Their spread shows in the sample, so output
lengths spread wider than :func:`length_log_sd_limit` (the sample sd of log tokens per pair over
prompts) give no bound either, and the gate says why; counting that as no pass, every family of the
grid covers 0.947 or more (CALIBRATION.md, "Speedup lower bound", with what it costs in
inconclusive gates where lengths are capped). Beside the total ratio: the
median of the per-prompt speedups and the share of prompts that got slower (a total can be
carried by a few long prompts while most got slower), and a Wilcoxon signed-rank p-value on
per-prompt log ratios. The speed gate uses the one-sided lower bound ``lower_bound`` (at
``lower_bound_level``). Where only a sample of a suite's prompts is timed (``paired_speedup``'s
``suite``), the estimate and bound are the suite's, post-stratified on the baseline's lengths,
known for every prompt (:func:`suite_bounds`): a sample that missed the long prompts is set
right by the suite's own mix, or given no bound where the suite's prompts beyond the timed
lengths carry too much of it.

Percentiles use the median-unbiased estimator (Hyndman and Fan type 8): numpy's default (linear)
p95 of 10 values falls below the true p95 about three times in four. ``p95_ci_low/high`` is the
distribution-free order-statistic interval (``scipy.stats.quantile_test``); below n = 59 a
sample cannot give a 95% upper bound for a p95, and the high end is NaN (reported as unknown).

Scope: numbers only; plots are in ``figures``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from scipy import stats

from ._common import ConfidenceInterval, as_rng, bootstrap_bounds, check_level, cluster_sums, prompt_clusters
from .paired import signed_rank_pvalue
from .pairing import Pair


PERCENTILE_METHOD = "median_unbiased"


@dataclass(frozen=True)
class Percentiles:
    """Mean and p50/p95/p99 of a latency sample (seconds), with its size, and a 95% interval
    for the p95 (order statistics; NaN where n is too small for that end)."""

    n: int
    mean: float
    p50: float
    p95: float
    p99: float
    p95_ci_low: float = float("nan")
    p95_ci_high: float = float("nan")


def quantile_interval(values, q: float, *, confidence_level: float = 0.95) -> ConfidenceInterval:
    """Distribution-free interval for the q-quantile from order statistics (NaN ends where the
    sample is too small)."""
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return ConfidenceInterval(float("nan"), float("nan"))
    ci = stats.quantile_test(v, q=float(np.quantile(v, q)), p=q).confidence_interval(confidence_level)
    return ConfidenceInterval(float(ci.low), float(ci.high))


def percentiles(values: Sequence[float]) -> Percentiles:
    """Mean, p50, p95, p99 (median-unbiased, see the module docstring); NaNs for an empty sample."""
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return Percentiles(0, *(float("nan"),) * 6)
    p50, p95, p99 = np.percentile(v, [50, 95, 99], method=PERCENTILE_METHOD)
    ci = quantile_interval(v, 0.95)
    return Percentiles(int(v.size), float(v.mean()), float(p50), float(p95), float(p99), ci.low, ci.high)


def _timing(record: Mapping[str, Any]) -> tuple[float, float, int]:
    timing = record.get("timing") or {}
    tokens = record.get("tokens") or []
    if "wall_s" not in timing:
        raise ValueError(f"record {record.get('item_id')!r} has no timing.wall_s")
    wall = float(timing["wall_s"]) if isinstance(timing["wall_s"], (int, float)) else float("nan")
    if not (np.isfinite(wall) and wall > 0):   # an inf baseline made a slower candidate "faster"
        raise ValueError(f"record {record.get('item_id')!r} has no usable timing.wall_s ({timing['wall_s']!r})")
    return wall, float(timing.get("ttft_s", np.nan)), len(tokens)


def _decode_timing(record: Mapping[str, Any], key) -> tuple[float, int]:
    """(seconds after the first token, tokens after the first) of one record."""
    wall, ttft, n = _timing(record)
    if not np.isfinite(ttft) or not 0 <= ttft <= wall:
        raise ValueError(f"{key}: record {record.get('item_id')!r} has no usable timing.ttft_s "
                         f"({ttft!r} of a {wall!r} s wall): cannot time its decode phase")
    return wall - ttft, max(n - 1, 0)


def inter_token_latencies(record: Mapping[str, Any]) -> np.ndarray:
    """Seconds between successive tokens of one record (length n - 1)."""
    times = (record.get("timing") or {}).get("token_times_s")
    if times is not None:
        t = np.asarray(times, dtype=float)
        if np.any(t < 0) or not np.all(np.isfinite(t)):
            raise ValueError(
                f"record {record.get('item_id')!r}: timing.token_times_s must hold per-token "
                "durations (seconds since the previous token, first = TTFT), finite and >= 0"
            )
        return t[1:]
    wall, ttft, n = _timing(record)
    if n < 2 or not np.isfinite(ttft):
        return np.empty(0)
    return np.full(n - 1, (wall - ttft) / (n - 1))


@dataclass(frozen=True)
class LatencySummary:
    """Latency of one decoder over a set of records.

    ``ttft``: time to first token per request; ``inter_token``: pooled inter-token latencies;
    ``per_token``: per-request wall time / tokens; ``tokens_per_s``: total tokens / total wall.
    """

    n: int
    tokens: int
    ttft: Percentiles
    inter_token: Percentiles
    per_token: Percentiles
    tokens_per_s: float


def latency_summary(records: Sequence[Mapping[str, Any]]) -> LatencySummary:
    """TTFT, inter-token and per-request per-token latency percentiles, and throughput."""
    if not records:
        raise ValueError("latency_summary needs at least one record")
    walls, ttfts, counts, itl = [], [], [], []
    for rec in records:
        wall, ttft, n = _timing(rec)
        walls.append(wall)
        counts.append(n)
        if np.isfinite(ttft):
            ttfts.append(ttft)
        itl.append(inter_token_latencies(rec))
    walls_a, counts_a = np.asarray(walls), np.asarray(counts)
    has_tokens = counts_a > 0
    return LatencySummary(
        n=len(records), tokens=int(counts_a.sum()), ttft=percentiles(ttfts),
        inter_token=percentiles(np.concatenate(itl) if itl else []),
        per_token=percentiles(walls_a[has_tokens] / counts_a[has_tokens]),
        tokens_per_s=float(counts_a.sum() / walls_a.sum()) if walls_a.sum() > 0 else float("nan"),
    )


@dataclass(frozen=True)
class SpeedupResult:
    """Paired speedup: baseline s/token over candidate s/token (> 1: the candidate is faster).

    ``statistic``: the ratio of totals; ``confidence_interval()``: its interval over prompts
    (``n_prompts`` of them, ``n`` pairs; ``interval`` names the method, the jackknife by default);
    ``lower_bound``: the one-sided lower bound at ``lower_bound_level`` from the same statistic,
    what a speed gate should use.
    ``median_prompt_speedup`` and ``share_prompts_slower`` describe the per-prompt speedups;
    ``pvalue``: two-sided Wilcoxon signed-rank test of their logs against 0.
    ``suite_prompts``: where only a subset of a suite's prompts was timed, the suite's prompt
    count; ``statistic`` and the bounds are then the suite's speedup post-stratified on the
    baseline's lengths (:func:`suite_bounds`), and ``no_bound`` says why there is none.
    """

    statistic: float
    pvalue: float
    n: int
    baseline_s_per_token: float
    candidate_s_per_token: float
    ci_low: float
    ci_high: float
    confidence_level: float
    n_prompts: int = 0
    lower_bound: float = float("nan")
    lower_bound_level: float = float("nan")
    median_prompt_speedup: float = float("nan")
    share_prompts_slower: float = float("nan")
    resampled: str = "prompts"
    interval: str = "jackknife"
    length_log_sd: float = float("nan")
    length_log_sd_limit: float = float("nan")
    suite_prompts: int = 0
    no_bound: str = ""

    def confidence_interval(self) -> ConfidenceInterval:
        return ConfidenceInterval(self.ci_low, self.ci_high)


def _ratio_of_rates(bw, bn, cw, cn, axis=-1):
    return (np.sum(bw, axis=axis) / np.sum(bn, axis=axis)) / (np.sum(cw, axis=axis) / np.sum(cn, axis=axis))


def _log_ratio_se(bw, bn, cw, cn):
    """log of the ratio of totals and its linearization (delta-method) standard error, over the
    last axis (rows: independent prompts' sums)."""
    tot = [np.sum(x, axis=-1, keepdims=True) for x in (bw, bn, cw, cn)]
    log_ratio = (np.log(tot[0]) - np.log(tot[1]) - np.log(tot[2]) + np.log(tot[3]))[..., 0]
    infl = bw / tot[0] - bn / tot[1] - cw / tot[2] + cn / tot[3]  # each prompt's share of d log ratio
    m = bw.shape[-1]
    dev = infl - infl.mean(axis=-1, keepdims=True)
    return log_ratio, np.sqrt(m / (m - 1) * np.sum(dev * dev, axis=-1))


def studentized_bounds(sums, *, confidence_level: float, bound_level: float, n_resamples: int,
                       rng) -> tuple[ConfidenceInterval, float]:
    """Bootstrap-t interval and one-sided lower bound of the ratio of totals from per-prompt sums
    (bw, bn, cw, cn), resampling prompts."""
    sums = [np.asarray(x, dtype=float) for x in sums]
    lr, se = _log_ratio_se(*sums)
    if not se > 0:
        r = float(np.exp(lr))
        return ConfidenceInterval(r, r), r
    m, t = sums[0].size, []
    for start in range(0, n_resamples, 1000):  # chunks: resamples x prompts stays small
        idx = rng.integers(0, m, size=(min(1000, n_resamples - start), m))
        blr, bse = _log_ratio_se(*(x[idx] for x in sums))
        with np.errstate(divide="ignore", invalid="ignore"):
            t.append(np.where(bse > 0, (blr - lr) / bse, 0.0))
    t = np.concatenate(t)
    tail = (1 - confidence_level) / 2
    q_lo, q_hi, q_bound = np.quantile(t, [tail, 1 - tail, bound_level])
    return (ConfidenceInterval(float(np.exp(lr - q_hi * se)), float(np.exp(lr - q_lo * se))),
            float(np.exp(lr - q_bound * se)))


def jackknife_bounds(sums, *, confidence_level: float, bound_level: float):
    """The plain jackknife of the ratio of totals (the interval shipped before :func:`speed_bounds`;
    kept for the calibration's comparison): arrays of (low, high, bound) over the last axis.

    The bias-corrected estimate (the mean of the leave-one-prompt-out pseudo-values) over its
    jackknife standard error, on the ratio scale, against Student's t at the Satterthwaite degrees
    of freedom of the prompts' time shares; bounds below 0 are clipped to 0; with no spread between
    prompts (standard error 0) all three are NaN."""
    estimate, se, df, _ = _jackknife(sums)
    return _t_bounds(estimate, se, df, 0.0, confidence_level, bound_level)


# Below this many prompts the bound is NaN (inconclusive): at 5 prompts it covered 0.939-0.943
# where gains fall with length, from 8 on 0.947 or more (CALIBRATION.md, "no minimum").
MIN_PROMPTS = 8
# The Cornish-Fisher term for left-skewed pseudo-values is scaled by this, calibrated on the grid
# (CALIBRATION.md): where gains fall with length, the bound at 10 prompts covered 0.927 at 1
# (Hall's second-order term), 0.938 at 3, 0.944 at 5.
SKEW_FACTOR = 6.0
# Above length_log_sd_limit(m) the bound is NaN (inconclusive). Where the gain falls with length
# and lengths are log-normal with log-sd 1.5 uncapped, half the candidate's time comes from prompts
# rarer than 1 in 39, absent from most samples: the bound covered 0.90-0.95 at 8-45 prompts. The
# spread itself shows in the sample, and its estimate firms up with the prompts, so the limit rises
# with them: 1.17 at 8 prompts, 1.49 at 45 (CALIBRATION.md, "Speedup lower bound": with it that
# family covers 0.95 or more counting no bound as no pass; L 1.75, c 1.5 left 0.949).
LENGTH_LOG_SD_LIMIT, LENGTH_LOG_SD_SLACK = 1.7, 1.4


def length_log_sd_limit(m):
    """The largest sample log-sd of output lengths over ``m`` prompts that still gets a bound."""
    return LENGTH_LOG_SD_LIMIT - LENGTH_LOG_SD_SLACK / np.sqrt(np.maximum(np.asarray(m, dtype=float) - 1, 1))


def length_log_sd(tokens, pairs=None):
    """The sample sd (ddof 1) of log tokens per pair over prompts, over the last axis of the
    per-prompt token sums ``tokens`` and their pair counts ``pairs`` (default: one pair each)."""
    per_pair = np.asarray(tokens, dtype=float) / (1.0 if pairs is None else np.asarray(pairs, dtype=float))
    return np.log(per_pair).std(axis=-1, ddof=1)


def _jackknife(sums):
    """(bias-corrected estimate, jackknife standard error, Satterthwaite df, skewness of the
    pseudo-values) of the ratio of totals, over the last axis of per-prompt sums (bw, bn, cw, cn)."""
    bw, bn, cw, cn = (np.asarray(x, dtype=float) for x in sums)
    m = bw.shape[-1]
    tot = [np.sum(x, axis=-1, keepdims=True) for x in (bw, bn, cw, cn)]
    ratio = (tot[0] / tot[1]) / (tot[2] / tot[3])
    loo = ((tot[0] - bw) / (tot[1] - bn)) / ((tot[2] - cw) / (tot[3] - cn))
    pseudo = m * ratio - (m - 1) * loo
    estimate = pseudo.mean(axis=-1)
    dev = pseudo - estimate[..., None]
    var = np.mean(dev * dev, axis=-1)
    se = np.sqrt(var / (m - 1))  # = sqrt((m - 1) / m * sum (loo - mean loo)^2)
    with np.errstate(divide="ignore", invalid="ignore"):
        skew = np.where(var > 0, np.mean(dev ** 3, axis=-1) / var ** 1.5, 0.0)
    share = 0.5 * (bw / tot[0] + cw / tot[2])
    df = np.maximum(np.sum(share ** 2, axis=-1) ** 2 / np.sum(share ** 4, axis=-1) * (m - 1) / m, 1.0)
    return estimate, se, df, skew


def _t_bounds(estimate, se, df, skew_term, confidence_level, bound_level, clip: float = 0.0):
    """(low, high, bound): the t quantiles, the lower ones moved by ``skew_term`` (2 z^2 + 1), the
    Cornish-Fisher correction of a mean's quantile at the normal z of the same level; clipped at
    ``clip`` (0 on the ratio scale; -inf on the log scale)."""
    tail = (1 - confidence_level) / 2
    q_two, q_bound = stats.t.ppf(1 - tail, df), stats.t.ppf(bound_level, df)
    q_low = q_two + skew_term * (2 * stats.norm.ppf(1 - tail) ** 2 + 1)
    q_bound = q_bound + skew_term * (2 * stats.norm.ppf(bound_level) ** 2 + 1)
    spread = se > 0
    low = np.where(spread, np.maximum(estimate - q_low * se, clip), np.nan)
    high = np.where(spread, estimate + q_two * se, np.nan)
    bound = np.where(spread, np.maximum(estimate - q_bound * se, clip), np.nan)
    return low, high, bound


def speed_bounds(sums, *, confidence_level: float = 0.95, bound_level: float = 0.95,
                 skew_factor: float = SKEW_FACTOR, min_prompts: int = MIN_PROMPTS, pairs=None,
                 limit_spread: bool = True):
    """Interval and one-sided lower bound of the ratio of totals from per-prompt sums
    (bw, bn, cw, cn): arrays of (low, high, bound) over the last axis, so a calibration can run many
    studies at once. What the speed gate uses (see the module docstring).

    The jackknife of :func:`jackknife_bounds`, with the lower quantiles moved down by a
    Cornish-Fisher term when the pseudo-values are skewed to the left (a few prompts that gain
    less and carry much of the time: the case where the plain jackknife covered 0.80-0.93), scaled
    by ``skew_factor``; never moved up. Fewer than ``min_prompts`` prompts, no spread between
    prompts, or output lengths spread wider than :func:`length_log_sd_limit` (log tokens per pair,
    from the baseline's token sums over ``pairs``, the pair counts per prompt) give NaN
    (inconclusive), never a bound of zero width."""
    estimate, se, df, skew = _jackknife(sums)
    m = np.shape(sums[0])[-1]
    term = np.maximum(0.0, -skew) * skew_factor / (6 * np.sqrt(m))
    low, high, bound = _t_bounds(estimate, se, df, term, confidence_level, bound_level)
    if m < min_prompts:
        low, high, bound = (np.full(np.shape(estimate), np.nan) for _ in range(3))
    elif limit_spread:
        wide = length_log_sd(sums[1], pairs) > length_log_sd_limit(m)
        low, high, bound = (np.where(wide, np.nan, x) for x in (low, high, bound))
    return low, high, bound


# The suite's speed from a timed subset (`suite_bounds`): strata of at least this many timed
# prompts (1, 2 or MAX_STRATA of them, `strata_count`), cut by length; suite prompts more than
# UNSEEN_FACTOR times longer than the longest timed one are unseen, and carrying more than
# UNSEEN_MAX of the suite's baseline tokens they leave no bound (CALIBRATION.md, "The suite's
# speedup from a timed subset"). Two a stratum, so 4 strata from 8 timed prompts: the top one then
# reaches a rare long tail (3% of prompts 10x longer: no bound in 24% of studies at 10 timed
# prompts, against 67% at 4 a stratum), and the thin strata's df (1) pays for it in the bound
# (coverage 0.99 or more at 8-10, a median bound of 0.30-0.48 of the speedup; 2,000 studies a row).
STRATUM_PROMPTS, MAX_STRATA, UNSEEN_FACTOR, UNSEEN_MAX = 2, 4, 1.5, 0.05
# Its Cornish-Fisher scale: at SKEW_FACTOR (6) the bound covered 0.936-0.969 over four runs of
# 1,000 studies with 50 of 200 prompts timed, lengths bimodal (30 / 300 tokens) and gains falling
# with length; at 12 it keeps a margin over 0.945 there (CALIBRATION.md). On the log scale (the
# bound since the ratio-scale one landed at 0 in most bimodal studies at 10-20 prompts) at 12 it
# covered 0.966 at 20 and at 50 timed prompts (1,000 studies each); at 6, 0.950 and 0.937, at 0,
# 0.907 and 0.907 (300 each).
SUITE_SKEW_FACTOR = 12.0


def strata_count(m: int) -> int:
    """How many length strata ``m`` timed prompts are cut into: 1, 2 or MAX_STRATA (4), at least
    STRATUM_PROMPTS (2) each. Powers of two, so that fewer strata are unions of more: a sample drawn in
    4 strata and post-stratified in 2 is still drawn evenly within each of the 2."""
    h = 1
    while h * 2 <= min(m // STRATUM_PROMPTS, MAX_STRATA):
        h *= 2
    return h


def length_strata(lengths, tokens, h: int) -> np.ndarray:
    """Stratum (0 to ``h`` - 1) of each prompt: in order of ``lengths``, the stratum its length's
    share of ``tokens`` falls in at its midpoint, so each stratum carries about 1/h of the tokens;
    prompts of one length (outputs cut at the token cap) share a stratum whatever their order. The
    one rule for the run's speed sample (``harness.run.speed_sample.by_length`` draws within these
    strata) and the suite's bound (which post-stratifies on them): an estimator that cut elsewhere
    would mix, in one stratum, prompts timed at different rates, and where the gain changes with
    length that bias was as large as the bound's spread (issue 58)."""
    values, inverse = np.unique(np.asarray(lengths, dtype=float), return_inverse=True)
    per = np.bincount(inverse.reshape(-1), weights=np.asarray(tokens, dtype=float), minlength=values.size)
    mid = (np.cumsum(per) - per / 2) / per.sum()
    return np.minimum((mid * h).astype(np.int64), h - 1)[inverse.reshape(-1)]


def _strata(x_suite, suite_tokens, timed_index):
    """Stratum of each suite prompt and of each timed one (the stratum its own prompt is in, by
    identity: its timed work's length may differ from its prompt's), and how many: the suite's
    `length_strata` at `strata_count(timed prompts)`, halved while a stratum holds fewer than 2
    timed prompts (a stratum's spread needs two), an empty one dropped."""
    h = strata_count(timed_index.size)
    while True:
        suite = np.unique(length_strata(x_suite, suite_tokens, h), return_inverse=True)[1].reshape(-1)
        k = int(suite.max()) + 1
        if h == 1 or np.bincount(suite[timed_index], minlength=k).min() >= 2:
            return suite[timed_index], suite, k
        h //= 2


def _merge_thin(g_timed, g_suite):
    """Group codes with every group holding 2 or more timed prompts (a stratum's spread needs two):
    the thinner groups pooled into one, and that pool into the group with most timed prompts where
    it is still thin."""
    g_timed, g_suite = np.asarray(g_timed).copy(), np.asarray(g_suite).copy()
    names, counts = np.unique(g_timed, return_counts=True)
    count = dict(zip(names.tolist(), counts.tolist()))
    thin = [g for g in np.unique(g_suite).tolist() if count.get(g, 0) < 2]
    if not thin:
        return g_timed, g_suite
    pool = thin[0]
    if sum(count.get(g, 0) for g in thin) < 2 and len(thin) < len(np.unique(g_suite)):
        pool = max((g for g in count if g not in thin), key=lambda g: count[g])
    for x in (g_timed, g_suite):
        x[np.isin(x, thin)] = pool
    return g_timed, g_suite


def _grouped_strata(x_suite, suite_tokens, timed_index, g_suite):
    """`_strata` within each group (a suite: the run draws each suite's speed sample on its own),
    numbered on across groups: (timed strata, suite strata, how many)."""
    timed, suite, h = np.empty(timed_index.size, np.int64), np.empty(x_suite.size, np.int64), 0
    for g in np.unique(g_suite):
        s = g_suite == g
        t = s[timed_index]
        local = np.cumsum(s) - 1   # a suite prompt's index within its group
        timed[t], suite[s], k = _strata(x_suite[s], suite_tokens[s], local[timed_index[t]])
        timed[t] += h
        suite[s] += h
        h += k
    return timed, suite, h


def _unseen(x_suite, suite_tokens, timed_index, g_suite) -> float:
    """The share of the suite's baseline tokens in prompts over UNSEEN_FACTOR x longer than any
    timed prompt of their group."""
    g_timed = g_suite[timed_index]
    top = {g: x_suite[timed_index][g_timed == g].max() for g in np.unique(g_timed)}
    limit = np.array([top.get(g, -np.inf) for g in g_suite]) + np.log(UNSEEN_FACTOR)
    return float(suite_tokens[x_suite > limit].sum() / suite_tokens.sum())


def _separate_ratio(sums, strata, h: int, weight):
    """Sum_h W_h (baseline s/token in h) / Sum_h W_h (candidate s/token in h)."""
    bw, bn, cw, cn = (np.bincount(strata, weights=x, minlength=h) for x in sums)
    return float(np.sum(weight * bw / bn) / np.sum(weight * cw / cn))


def _stratified_jackknife(sums, timed, h: int, weight) -> tuple[float, float, float]:
    """(standard error, df, skew of the pseudo-values) of the log of `_separate_ratio`, leaving out
    one timed prompt at a time, within its stratum."""
    m = sums[0].size
    keep = np.ones(m, dtype=bool)
    loo = np.empty(m)
    for i in range(m):
        keep[i] = False
        loo[i] = _separate_ratio([x[keep] for x in sums], timed[keep], h, weight)
        keep[i] = True
    # On the log scale: a bound at 10-20 prompts, moved down by the skew term, no longer lands at 0
    # (half of the bimodal design's bounds did, so a length-dependent gain could not pass a
    # min_speedup); the bound, exp of it, stays above 0 and the skew term keeps the coverage.
    loo = np.log(loo)
    n_h = np.bincount(timed, minlength=h).astype(float)
    mean_h = np.bincount(timed, weights=loo, minlength=h) / n_h
    v_h = np.bincount(timed, weights=(n_h[timed] - 1) / n_h[timed] * (loo - mean_h[timed]) ** 2, minlength=h)
    # Satterthwaite: a variance carried by a stratum of few timed prompts rests on few df; and never
    # more than the thinnest stratum's (the conservative df of Welch's problem): with 4-6 timed
    # prompts a stratum, Satterthwaite's alone covered 0.939-0.950 on the bimodal designs
    # (3,000 studies), this 0.958-0.980 at a median bound 0.01-0.02 lower (issue 58).
    df = max(min(float(v_h.sum() ** 2 / np.sum(v_h ** 2 / (n_h - 1))), float(n_h.min()) - 1), 1.0) \
        if v_h.sum() > 0 else 1.0
    # The pseudo-values' skew (m estimate - (m - 1) loo): left-skewed moves the lower quantiles down,
    # as in `speed_bounds` (a few prompts that gain less and carry much of the time).
    dev = -(loo - mean_h[timed])
    skew = float(np.mean(dev ** 3) / np.mean(dev ** 2) ** 1.5) if np.any(dev) else 0.0
    return float(np.sqrt(v_h.sum())), df, skew


def suite_bounds(sums, timed_index, suite_tokens, suite_pairs, *, suite_groups=None,
                 confidence_level: float = 0.95, bound_level: float = 0.95,
                 min_prompts: int = MIN_PROMPTS) -> tuple[float, float, float, float, str]:
    """The speedup over the whole suite from a timed subset of its prompts: (estimate, low, high,
    bound, why none). ``sums`` (bw, bn, cw, cn) per timed prompt, ``timed_index`` its prompt's
    index in ``suite_tokens`` and ``suite_pairs``, the baseline's tokens and pairs per prompt over
    every prompt of the suite (the baseline's output length is known for all of them).
    Post-stratified on length (`length_strata`, the strata a run's speed sample is drawn in, so
    that within each the timed prompts are an even draw; a timed prompt is in its own prompt's
    stratum): the timed prompts' seconds per token in each stratum, weighted by the suite's
    baseline tokens there (a separate ratio estimator; one stratum: the plain ratio of totals), so
    a subset that holds too few long prompts is set right by the suite's own mix. Its standard
    error is the stratified jackknife over timed prompts on the log scale, with Student's t at the
    Satterthwaite df of the strata's shares of it, at most the thinnest stratum's. The estimand
    is the suite's speedup (every item timed), not the traffic's. Suite prompts over
    UNSEEN_FACTOR x longer than any timed one (of their group) carrying more than UNSEEN_MAX of its
    tokens: no bound (NaN and why). ``suite_groups``: a code per suite prompt (its suite, where
    several are pooled): each group is stratified on its own, as the run draws each suite's
    sample; a group with fewer than 2 timed prompts is pooled with others."""
    sums = [np.asarray(x, dtype=float) for x in sums]
    m = sums[0].size
    timed_index = np.asarray(timed_index, dtype=np.int64).reshape(-1)
    suite_tokens = np.asarray(suite_tokens, dtype=float)
    if timed_index.size != m or np.unique(timed_index).size != m or not ((0 <= timed_index) & (timed_index < suite_tokens.size)).all():
        raise ValueError(f"timed_index must name {m} distinct prompts of the suite's {suite_tokens.size}")
    suite_pairs = np.asarray(suite_pairs, dtype=float)
    if not all(np.isfinite(x).all() and (x > 0).all() for x in (*sums, suite_tokens, suite_pairs)):
        raise ValueError("timings, tokens and pairs must be finite and positive")
    x_suite = np.log(suite_tokens / suite_pairs)
    g_suite = np.zeros(x_suite.size, np.int64) if suite_groups is None else np.asarray(suite_groups)
    g_suite = _merge_thin(g_suite[timed_index], g_suite)[1]
    unseen = _unseen(x_suite, suite_tokens, timed_index, g_suite)
    timed, suite, h = _grouped_strata(x_suite, suite_tokens, timed_index, g_suite)
    weight = np.bincount(suite, weights=suite_tokens, minlength=h)
    estimate = _separate_ratio(sums, timed, h, weight)
    nan = float("nan")
    if m < min_prompts:
        return estimate, nan, nan, nan, f"{m} timed prompt(s), fewer than the {min_prompts} a bound needs"
    if unseen > UNSEEN_MAX:
        return estimate, nan, nan, nan, (f"{unseen:.0%} of the suite's baseline tokens are in prompts over "
                                         f"{UNSEEN_FACTOR:g}x longer than any timed one")
    se, df, skew = _stratified_jackknife(sums, timed, h, weight)
    if not se > 0:
        return estimate, nan, nan, nan, "prompts whose speedups do not vary: no spread to bound it by"
    low, high, bound = np.exp(_t_bounds(np.log(estimate), np.float64(se), df,
                                        max(0.0, -skew) * SUITE_SKEW_FACTOR / (6 * np.sqrt(m)), confidence_level,
                                        bound_level, clip=-np.inf))
    return estimate, float(low), float(high), float(bound), ""


def paired_speedup(
    pairs: Sequence[Pair], *, confidence_level: float = 0.95, n_resamples: int = 9999,
    method: str = "jackknife", rng: np.random.Generator | int | None = None, alpha: float = 0.05,
    clusters: np.ndarray | None = None, decode_only: bool = False, suite: Sequence[Pair] | None = None,
) -> SpeedupResult:
    """Speedup of the candidate over the baseline in wall time per token, paired by prompt.

    ``suite``: every pair of the suite(s) the timed ``pairs`` were drawn from (the baseline's tokens
    are known for all of them). Where it holds prompts that ``pairs`` lacks, the speedup and its
    bounds are the suite's, post-stratified on the baseline's lengths (:func:`suite_bounds`).

    ``decode_only``: the decode phase only, wall - TTFT over the tokens after the first, what a
    theory of decoding steps (Leviathan's speedup) predicts; a pair where either side emitted one
    token is left out, and a record without a TTFT is an error, not a fallback to the whole wall.

    ``clusters``: the independent unit of each pair (default: its prompt, see
    :func:`analysis._common.prompt_clusters`); pass ``np.arange(len(pairs))`` to treat every pair
    as independent. ``alpha``: level of the one-sided ``lower_bound``. ``method``:
    ``"jackknife"`` (the default, :func:`speed_bounds`: the skew-corrected jackknife with its
    minimum of prompts; ``n_resamples`` and ``rng`` unused), ``"studentized"`` (the bootstrap-t of
    the log ratio, kept for comparison), or scipy's ``"BCa"``, ``"percentile"``, ``"basic"``.
    """
    if not pairs:
        raise ValueError("paired_speedup needs at least one pair")
    rows, kept = [], []
    for pair in pairs:
        if decode_only:
            sides = [_decode_timing(pair.baseline, pair.key), _decode_timing(pair.candidate, pair.key)]
            if min(n for _, n in sides) == 0:
                continue  # a side stopped at its first token: this pair has no decode phase
            (bw, bn), (cw, cn) = sides
        else:
            bw, _, bn = _timing(pair.baseline)
            cw, _, cn = _timing(pair.candidate)
        if bn == 0 or cn == 0 or bw <= 0 or cw <= 0:
            raise ValueError(f"{pair.key}: needs tokens and a positive wall time on both sides")
        rows.append((bw, bn, cw, cn))
        kept.append(pair)
    if not rows:
        raise ValueError("no pair has a decode phase (two or more tokens on both sides)")
    pairs = kept
    bw, bn, cw, cn = (np.asarray(col, dtype=float) for col in zip(*rows))
    ids = prompt_clusters(pairs) if clusters is None else np.asarray(clusters, dtype=np.int64)
    res = speedup_from_arrays(bw, bn, cw, cn, ids, confidence_level=confidence_level, n_resamples=n_resamples,
                              method=method, rng=rng, alpha=alpha,
                              resampled="prompts" if clusters is None else "given clusters")
    lengths = _suite_lengths(suite, pairs) if suite is not None and clusters is None and not decode_only else None
    if lengths is None or res.n_prompts < 2:
        return res
    return _for_the_suite(res, cluster_sums(ids, bw, bn, cw, cn), ids, pairs, *lengths)


def _for_the_suite(res: SpeedupResult, sums, ids, pairs, tokens, suite_pairs, keys) -> SpeedupResult:
    """`res` made the suite's (`suite_bounds`), each suite of the pool stratified on its own."""
    where = {key: i for i, key in enumerate(keys)}
    timed_index = np.full(sums[0].size, -1, dtype=np.int64)
    for i, p in zip(ids, pairs):
        timed_index[i] = where.get((p.key.suite, p.key.item_id), -1)
    if (timed_index < 0).any():
        raise ValueError("a timed prompt is missing from the suite's baseline lengths")
    code = {name: i for i, name in enumerate(sorted({suite for suite, _ in keys}))}
    est, low, high, bound, why = suite_bounds(
        sums, timed_index, tokens, suite_pairs, suite_groups=np.array([code[suite] for suite, _ in keys]),
        confidence_level=res.confidence_level, bound_level=res.lower_bound_level)
    return replace(res, statistic=est, ci_low=low, ci_high=high, lower_bound=bound, suite_prompts=tokens.size,
                   no_bound=why, interval="post-stratified jackknife")


def _suite_lengths(suite: Sequence[Pair], timed: Sequence[Pair]) -> tuple[np.ndarray, np.ndarray, list] | None:
    """(baseline tokens, pairs, (suite, item id)) per prompt of the suite, where it has prompts the
    timed pairs lack."""
    rows = [p for p in suite if p.baseline.get("tokens")]
    if not rows or {(p.key.suite, p.key.item_id) for p in rows} <= {(p.key.suite, p.key.item_id) for p in timed}:
        return None
    ids = prompt_clusters(rows)
    tokens = np.bincount(ids, weights=[len(p.baseline["tokens"]) for p in rows])
    keys = [("", "")] * tokens.size
    for i, p in zip(ids, rows):
        keys[i] = (p.key.suite, p.key.item_id)
    return tokens, np.bincount(ids).astype(float), keys


def speedup_from_arrays(
    bw, bn, cw, cn, clusters, *, confidence_level: float = 0.95, n_resamples: int = 9999,
    method: str = "jackknife", rng=None, alpha: float = 0.05, resampled: str = "given clusters",
) -> SpeedupResult:
    """:func:`paired_speedup` on arrays of wall seconds and token counts per pair (baseline,
    candidate) and a cluster id per pair (the calibration simulates through this)."""
    level = check_level(confidence_level)
    bound_level = 1.0 - check_level(alpha, "alpha")
    bw, bn, cw, cn = (np.asarray(a, dtype=float) for a in (bw, bn, cw, cn))
    ids = np.asarray(clusters, dtype=np.int64)
    if ids.shape != bw.shape:
        raise ValueError(f"clusters must give one id per pair ({bw.size}), got shape {ids.shape}")
    # The ratio of totals is a ratio of sums: resampling prompts is resampling their sums.
    sums = cluster_sums(ids, bw, bn, cw, cn)
    pairs = np.bincount(ids, minlength=sums[0].size)
    speedup = float(_ratio_of_rates(bw, bn, cw, cn))
    per_prompt = (sums[0] / sums[1]) / (sums[2] / sums[3])
    log_ratio = np.log(per_prompt)
    pvalue = float(signed_rank_pvalue(log_ratio)) if log_ratio.size > 1 else float("nan")
    if per_prompt.size > 1 and method == "jackknife":
        low, high, bound = (float(x) for x in speed_bounds(sums, confidence_level=level, bound_level=bound_level,
                                                            pairs=pairs))
        ci = ConfidenceInterval(low, high)
    elif per_prompt.size > 1 and method == "studentized":
        ci, bound = studentized_bounds(sums, confidence_level=level, bound_level=bound_level,
                                       n_resamples=n_resamples, rng=as_rng(rng))
    elif per_prompt.size > 1:
        ci, bound = bootstrap_bounds(sums, _ratio_of_rates, confidence_level=level, n_resamples=n_resamples,
                                     rng=as_rng(rng), method=method, bound_level=bound_level)
    else:
        ci, bound = ConfidenceInterval(float("nan"), float("nan")), float("nan")
    return SpeedupResult(
        statistic=speedup, pvalue=pvalue, n=int(bw.size),
        baseline_s_per_token=float(bw.sum() / bn.sum()), candidate_s_per_token=float(cw.sum() / cn.sum()),
        ci_low=ci.low, ci_high=ci.high, confidence_level=level, n_prompts=int(per_prompt.size),
        lower_bound=bound, lower_bound_level=bound_level, median_prompt_speedup=float(np.median(per_prompt)),
        share_prompts_slower=float(np.mean(per_prompt < 1.0)), resampled=resampled, interval=method,
        length_log_sd=float(length_log_sd(sums[1], pairs)) if per_prompt.size > 1 else float("nan"),
        length_log_sd_limit=float(length_log_sd_limit(per_prompt.size)),
    )


def decode_step_seconds(records: Sequence[Mapping[str, Any]]) -> float:
    """Mean seconds per decode step of a standard decoder: sum(wall - ttft) / sum(tokens - 1).

    This excludes prefill, so it measures one target forward per token (the unit of ``c``).
    """
    total_t, total_n = 0.0, 0
    for rec in records:
        wall, ttft, n = _timing(rec)
        if n >= 2 and np.isfinite(ttft):
            total_t += wall - ttft
            total_n += n - 1
    if total_n == 0:
        raise ValueError("no record has two or more tokens and a ttft_s: cannot time a decode step")
    return total_t / total_n
