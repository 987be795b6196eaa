"""Latency: time to first token, per-token latency, percentiles, throughput, paired speedup.

Timing convention (the decoders' ``Timing``): ``wall_s`` is the whole request, prefill included;
``ttft_s`` the time from the request's start to the first new token; ``token_times_s[i]`` the
time from token ``i - 1`` to token ``i`` (``token_times_s[0]`` is the TTFT). Inter-token latencies
are ``token_times_s[1:]``; a speculative decoder emits several tokens per round, so many are
near zero and a few are a whole round. Records without ``token_times_s`` fall back to the mean
decode time per token, ``(wall_s - ttft_s) / (n - 1)``.

The paired speedup is (baseline seconds per token) / (candidate seconds per token) over all
pairs, i.e. the candidate's tokens/s over the baseline's, with a paired bootstrap interval
(resampling prompts) and a Wilcoxon signed-rank p-value on per-pair log ratios.

Scope: numbers only; plots are in ``figures``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._common import ConfidenceInterval, as_rng, bootstrap_ci, check_level
from .paired import signed_rank_pvalue
from .pairing import Pair


@dataclass(frozen=True)
class Percentiles:
    """Mean and p50/p95/p99 of a latency sample (seconds), with its size."""

    n: int
    mean: float
    p50: float
    p95: float
    p99: float


def percentiles(values: Sequence[float]) -> Percentiles:
    """Mean, p50, p95, p99 (numpy's linear interpolation); NaNs for an empty sample."""
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return Percentiles(0, *(float("nan"),) * 4)
    p50, p95, p99 = np.percentile(v, [50, 95, 99])
    return Percentiles(int(v.size), float(v.mean()), float(p50), float(p95), float(p99))


def _timing(record: Mapping[str, Any]) -> tuple[float, float, int]:
    timing = record.get("timing") or {}
    tokens = record.get("tokens") or []
    if "wall_s" not in timing:
        raise ValueError(f"record {record.get('item_id')!r} has no timing.wall_s")
    return float(timing["wall_s"]), float(timing.get("ttft_s", np.nan)), len(tokens)


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

    ``pvalue``: two-sided Wilcoxon signed-rank test of per-pair log(baseline/candidate)
    s/token against 0; ``confidence_interval()``: paired bootstrap over prompts.
    """

    statistic: float
    pvalue: float
    n: int
    baseline_s_per_token: float
    candidate_s_per_token: float
    ci_low: float
    ci_high: float
    confidence_level: float

    def confidence_interval(self) -> ConfidenceInterval:
        return ConfidenceInterval(self.ci_low, self.ci_high)


def _ratio_of_rates(bw, bn, cw, cn, axis=-1):
    return (np.sum(bw, axis=axis) / np.sum(bn, axis=axis)) / (np.sum(cw, axis=axis) / np.sum(cn, axis=axis))


def paired_speedup(
    pairs: Sequence[Pair], *, confidence_level: float = 0.95, n_resamples: int = 9999,
    method: str = "BCa", rng: np.random.Generator | int | None = None,
) -> SpeedupResult:
    """Speedup of the candidate over the baseline in wall time per token, paired by prompt."""
    level = check_level(confidence_level)
    if not pairs:
        raise ValueError("paired_speedup needs at least one pair")
    rows = []
    for pair in pairs:
        bw, _, bn = _timing(pair.baseline)
        cw, _, cn = _timing(pair.candidate)
        if bn == 0 or cn == 0 or bw <= 0 or cw <= 0:
            raise ValueError(f"{pair.key}: needs tokens and a positive wall time on both sides")
        rows.append((bw, bn, cw, cn))
    bw, bn, cw, cn = (np.asarray(col, dtype=float) for col in zip(*rows))
    speedup = float(_ratio_of_rates(bw, bn, cw, cn))
    log_ratio = np.log(bw / bn) - np.log(cw / cn)
    pvalue = float(signed_rank_pvalue(log_ratio)) if log_ratio.size > 1 else float("nan")
    if len(pairs) > 1:
        ci = bootstrap_ci((bw, bn, cw, cn), _ratio_of_rates, confidence_level=level,
                          n_resamples=n_resamples, rng=as_rng(rng), method=method)
    else:
        ci = ConfidenceInterval(float("nan"), float("nan"))
    return SpeedupResult(
        statistic=speedup, pvalue=pvalue, n=len(pairs),
        baseline_s_per_token=float(bw.sum() / bn.sum()), candidate_s_per_token=float(cw.sum() / cn.sum()),
        ci_low=ci.low, ci_high=ci.high, confidence_level=level,
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
