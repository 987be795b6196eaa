"""Load as users size it: latency under an arrival rate, goodput, SLO bounds, the crossover.

Pure functions over the request rows of an open-loop level (harness.run.load writes them): one
row per request with ``ttft_s`` (send to first token), ``e2e_s`` (send to last token),
``token_times_s`` (per token, time since the previous one; the first is the TTFT), ``n_tokens``,
``stats`` (per-request acceptance where the engine reports it) and ``error``.

The metrics, with `vllm bench serve`'s names:
- **TTFT**: send to first token, per request.
- **TPOT**: time per output token after the first, ``(e2e - ttft) / (n - 1)``, per request (n >= 2).
- **ITL**: the gap before each token after the first, pooled over the level's tokens. A
  speculative engine streams a verified round's accepted drafts together: their gaps are near
  zero and the round's whole cost lands on one gap, so ITL percentiles misstate what speculation
  does to a request; TPOT amortizes it over the request and is the number to size by.
- **E2E**: send to last token, per request.
- percentiles p50 / p90 / p99 (median-unbiased, as analysis.latency): a p-quantile is given only
  where n >= 1 / (1 - p) (at least one observation expected beyond it: p99 needs 100), else it is
  None with its n. Intervals over prompts: the distribution-free order-statistic interval
  (requests are the independent units; NaN ends where n is too small), for ITL a bootstrap over
  requests (the tokens of one request are not independent).
- **output throughput**: output tokens over the level's duration (first arrival to last
  finish), with a bootstrap interval over requests at that duration.
- **goodput**: requests per second that meet every SLO (each p95 objective read as a
  per-request threshold, as `vllm bench serve --goodput` does; a failed request meets none),
  with the Clopper-Pearson interval of the share that met them.
- **acceptance**, in two weightings that are not the same number: *per token*
  (sum accepted / sum proposed over the level's requests, what a server-wide counter reports, so
  it leans toward long completions) and *per request* (the mean of each request's own rate).
- **SLO bound**: the one-sided (1 - alpha) order-statistic upper bound of a p95, with failed
  requests counted as infinitely slow; below n = 59 (at alpha = 0.05) no such bound exists and
  the SLO is undecided (None), never met.
- **speedup at a level**: the paired speedup of analysis.latency (E2E seconds per output token,
  baseline over candidate, the same item at the same offset), its interval over prompts.
- **crossover**: a candidate pays at a level when that speedup's lower bound is >= 1, it has no
  failed request and it meets every SLO; the crossover is the highest rate up to which every
  level tried paid. A level where `max_in_flight` held either side back (``held_back``), or the
  load generator sent its requests late (``sent_late``), was not offered its rate: it is not
  measured there (pays None), which ends the crossover as a level that did not pay would, and
  says so; so is a level where the load generator could not keep up (``generator_limit``: send
  lag p99 or its event loop's CPU share past a stated threshold). Rows that repeat a request
  (``repeated``) never pay.

Scope: numbers only. The open-loop schedule and its measurement live in harness.run.load, the
SLO gates in harness.verdict.slo, the figure in analysis.load_figure.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats

from ._common import as_rng, bootstrap_ci, cluster_index
from .latency import MIN_PROMPTS, PERCENTILE_METHOD, quantile_interval, speedup_from_arrays

QUANTILES = (0.5, 0.9, 0.99)
SLO_KEYS = {"ttft_p95_s": "ttft", "tpot_p95_s": "tpot", "e2e_p95_s": "e2e"}
_BIG = 1e300  # stands for "never answered" where order statistics need a number


def _seconds(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def ok(row: Mapping[str, Any]) -> bool:
    """A request that was answered, with usable times: an E2E, a TTFT within it and token gaps
    that are finite and not negative, and a whole count of tokens. Anything else (a broken clock,
    a row edited by hand) is a failed request, never a fast one: a negative TTFT met a TTFT
    objective, a TTFT past the E2E made a negative TPOT, a NaN p95 made the baseline 'over capacity'."""
    e2e, ttft, n = row.get("e2e_s"), row.get("ttft_s"), row.get("n_tokens")
    return (not row.get("error") and isinstance(n, int) and not isinstance(n, bool) and n > 0
            and _seconds(e2e) and _seconds(ttft) and ttft <= e2e
            and all(_seconds(x) for x in row.get("token_times_s") or []))


def tpot(row: Mapping[str, Any]) -> float | None:
    """Time per output token after the first; None for a request of fewer than two tokens."""
    n = int(row.get("n_tokens") or 0)
    if not ok(row) or n < 2:
        return None
    return (float(row["e2e_s"]) - float(row["ttft_s"])) / (n - 1)


def itl(row: Mapping[str, Any]) -> list[float]:
    """Gaps before each token after the first (seconds)."""
    return [float(x) for x in (row.get("token_times_s") or [])[1:]] if ok(row) else []


def metric(row: Mapping[str, Any], name: str) -> float | None:
    if name == "tpot":
        return tpot(row)
    return float(row[f"{name}_s"]) if ok(row) else None


def quantiles(values: Sequence[float], *, qs: Sequence[float] = QUANTILES, confidence_level: float = 0.95,
              groups: Sequence[Sequence[float]] | None = None, rng=None) -> dict:
    """p50/p90/p99 (keys "p50", ...) with intervals ("p50_ci": [low, high]). A quantile is given
    only where n >= 1/(1-q); otherwise None, with "p99_needs_n". `groups`: the values by request,
    for a pooled metric (ITL): its interval is then a bootstrap over requests."""
    v = np.asarray(values, dtype=float)
    out: dict = {"n": int(v.size)}
    boot = _cluster_quantile_cis(groups, qs, confidence_level, as_rng(rng)) if groups is not None else None
    for j, q in enumerate(qs):
        key = f"p{round(100 * q):d}"
        need = math.ceil(1.0 / (1.0 - q) - 1e-9)
        if v.size < max(need, 1):
            out[key], out[f"{key}_ci"], out[f"{key}_needs_n"] = None, [None, None], need
            continue
        out[key] = float(np.percentile(v, 100 * q, method=PERCENTILE_METHOD))
        if boot is None:
            ci = quantile_interval(v, q, confidence_level=confidence_level)
            out[f"{key}_ci"] = [_num(ci.low), _num(ci.high)]
        else:
            out[f"{key}_ci"] = boot[j]
    return out


def _cluster_quantile_cis(groups, qs, level: float, rng, n_resamples: int = 2000) -> list[list]:
    """Percentile-bootstrap intervals of pooled quantiles, resampling whole requests: a resample
    weighs each value by how often its request was drawn (inverted-CDF quantile of the weights)."""
    groups = [np.asarray(g, dtype=float) for g in groups if len(g)]
    if len(groups) < 2:
        return [[None, None] for _ in qs]
    values = np.concatenate(groups)
    owner = np.repeat(np.arange(len(groups)), [g.size for g in groups])
    order = np.argsort(values, kind="stable")
    values, owner = values[order], owner[order]
    counts = rng.multinomial(len(groups), np.full(len(groups), 1.0 / len(groups)), size=n_resamples)  # (B, R)
    cum = np.cumsum(counts[:, owner], axis=1)                                                        # (B, V)
    total = cum[:, -1:]
    tail = (1 - level) / 2
    out = []
    for q in qs:
        idx = np.argmax(cum >= q * total, axis=1)
        lo, hi = np.quantile(values[idx], [tail, 1 - tail])
        out.append([float(lo), float(hi)])
    return out


def _num(x) -> float | None:
    return float(x) if x is not None and np.isfinite(x) else None


def p95_bound(values: Sequence[float | None], *, alpha: float = 0.05) -> dict:
    """The p95 and its one-sided (1 - alpha) upper bound from order statistics; None values
    (failed requests) count as infinitely slow. "bound" says what the upper bound is: "exists"
    ("upper_bound" in seconds), "too few" (n < 59 at alpha 0.05: no such bound) or "on failed
    requests" (the bound, or the p95 itself, falls on a request that was never answered)."""
    v = np.asarray([_BIG if x is None else float(x) for x in values], dtype=float)
    if v.size == 0:
        return {"n": 0, "p95": None, "upper_bound": None, "bound": "too few"}
    p95 = float(np.percentile(v, 95, method=PERCENTILE_METHOD))
    high = float(stats.quantile_test(v, q=p95, p=0.95, alternative="less").confidence_interval(1 - alpha).high)
    # A value past the slowest answered request stands on a failed one, whatever its size: the
    # p95 interpolates between order statistics, and 5% of the way to _BIG was "5e+298 s".
    slowest = max((x for x in values if x is not None), default=-math.inf)
    failed = lambda x: x > slowest  # noqa: E731
    out = {"n": int(v.size), "p95": None if failed(p95) else p95, "upper_bound": None}
    if not np.isfinite(high):
        out["bound"] = "too few"
    elif failed(high):
        out["bound"] = "on failed requests"
    else:
        out.update(bound="exists", upper_bound=high)
    return out


def slo_check(rows: Sequence[Mapping[str, Any]], slo: Mapping[str, float], *, alpha: float = 0.05) -> dict:
    """Per SLO key: the level's p95, its upper bound, and whether the bound meets the threshold
    ("meets": True / False; None where n is too small for the bound: undecided, never a pass).
    "point_meets": whether the p95 itself does (what decides whether the baseline meets it)."""
    out = {}
    for key, threshold in slo.items():
        name = SLO_KEYS[key]
        vals = []
        for r in rows:
            x = metric(r, name)
            if x is None and name == "tpot" and ok(r):
                x = 0.0  # a one-token answer has no decode phase: it cannot miss a TPOT objective
            vals.append(x)
        b = p95_bound(vals, alpha=alpha)
        meets = {"exists": b["upper_bound"] is not None and b["upper_bound"] <= threshold,
                 "on failed requests": False}.get(b["bound"])
        out[key] = {**b, "threshold": float(threshold), "meets": meets,
                    "point_meets": b["p95"] is not None and b["p95"] <= threshold if b["n"] else None}
    return out


def good(row: Mapping[str, Any], slo: Mapping[str, float]) -> bool:
    """Whether one request met every objective (each p95 objective as a per-request threshold)."""
    if not ok(row):
        return False
    for key, threshold in slo.items():
        x = metric(row, SLO_KEYS[key])
        if x is not None and x > threshold:
            return False
    return True


def _acceptance(rows: Sequence[Mapping[str, Any]], level: float, rng) -> dict:
    pairs = [(float(r["stats"]["accepted"]), float(r["stats"]["proposed"])) for r in rows
             if ok(r) and (r.get("stats") or {}).get("telemetry") == "per-request"
             and "proposed" in r["stats"] and "accepted" in r["stats"]]
    if not pairs:
        return {}
    bad = [(a, p) for a, p in pairs if not (math.isfinite(a) and math.isfinite(p) and 0 <= a <= p)]
    if bad:
        # Counts that cannot be (more accepted than proposed, negative) are refused, not published,
        # as analysis.acceptance refuses them: an α of 1.2 was reported for such a level.
        return {"source": "per-request telemetry", "requests": len(pairs),
                "error": f"{len(bad)} of {len(pairs)} requests reported impossible counts (first: {bad[0][0]:g} "
                         f"accepted of {bad[0][1]:g} proposed): not measured"}
    acc, prop = (np.asarray(x) for x in zip(*pairs))
    out = {"source": "per-request telemetry", "requests": len(pairs), "proposed": int(prop.sum()),
           "accepted": int(acc.sum())}
    if prop.sum() > 0:
        ci = ([None, None] if len(pairs) < 2 else
              list(bootstrap_ci((acc, prop), lambda a, p, axis: a.sum(axis) / p.sum(axis), confidence_level=level,
                                n_resamples=2000, rng=rng, method="percentile")))
        out["per_token"] = {"value": float(acc.sum() / prop.sum()), "ci": ci,
                            "weighting": "per token: sum accepted / sum proposed (long completions weigh more)"}
    rates = acc[prop > 0] / prop[prop > 0]
    if rates.size:
        ci = ([None, None] if rates.size < 2 else
              list(bootstrap_ci((rates,), lambda x, axis: x.mean(axis), confidence_level=level, n_resamples=2000,
                                rng=rng, method="percentile")))
        out["per_request"] = {"value": float(rates.mean()), "ci": ci, "n": int(rates.size),
                              "weighting": "per request: the mean of each request's accepted / proposed"}
    return out


def level_metrics(rows: Sequence[Mapping[str, Any]], *, duration_s: float, slo: Mapping[str, float] | None = None,
                  alpha: float = 0.05, confidence_level: float = 0.95, prometheus: Mapping[str, Any] | None = None,
                  rng=0) -> dict:
    """Everything one decoder showed at one level (see the module docstring)."""
    rng = as_rng(rng)
    slo = dict(slo or {})
    fine = [r for r in rows if ok(r)]
    errors = [r for r in rows if not ok(r)]
    out: dict = {"n": len(rows), "ok": len(fine), "errors": len(errors),
                 "first_error": (errors[0].get("error") or "no tokens or no usable times") if errors else None,
                 "duration_s": float(duration_s), "repeated": repeated(rows)}
    for name in ("ttft", "tpot", "e2e"):
        out[name] = quantiles([x for x in (metric(r, name) for r in fine) if x is not None],
                              confidence_level=confidence_level)
    gaps = [itl(r) for r in fine]
    out["itl"] = quantiles([g for gs in gaps for g in gs], confidence_level=confidence_level, groups=gaps, rng=rng)
    tokens = np.asarray([float(r.get("n_tokens") or 0) if ok(r) else 0.0 for r in rows])
    if duration_s > 0 and rows:
        ci = ([None, None] if len(rows) < 2 else
              [x / duration_s for x in bootstrap_ci((tokens,), lambda t, axis: t.sum(axis), n_resamples=2000,
                                                    confidence_level=confidence_level, rng=rng, method="percentile")])
        out["output_throughput_tok_s"] = {"value": float(tokens.sum() / duration_s), "ci": ci}
        out["request_throughput_rps"] = len(fine) / duration_s
    if slo:
        out["slo"] = slo_check(rows, slo, alpha=alpha)
        k, n = sum(good(r, slo) for r in rows), len(rows)
        if n and duration_s > 0:
            ci = stats.binomtest(k, n).proportion_ci(confidence_level, method="exact")
            out["goodput_rps"] = {"value": k / duration_s, "ci": [ci.low * n / duration_s, ci.high * n / duration_s],
                                  "good": k, "of": n}
    acc = _acceptance(rows, confidence_level, rng)
    if acc:
        out["acceptance"] = acc
    if prometheus and (prometheus.get("draft_tokens") or prometheus.get("accepted")):
        # Counters differenced around the whole level: many requests were in flight, so this is
        # the level's, never one request's.
        d, a = float(prometheus["draft_tokens"]), float(prometheus.get("accepted") or 0)
        resent = sum(int(r.get("resent") or 0) for r in rows)
        if resent:   # a request sent twice may have been served twice: the counters hold it twice
            out.setdefault("acceptance", {})["level"] = {
                "value": None, "proposed": int(d), "accepted": int(a), "source": "prometheus counters around the level",
                "error": f"{resent} request(s) were sent again after a kept-alive connection closed under them "
                         f"(`resent`): a server that had read them served them twice, so the counters are "
                         f"not measured"}
            return out
        if not 0 <= a <= d:   # counters that went back (an engine restarted in the level) measure nothing
            out.setdefault("acceptance", {})["level"] = {
                "value": None, "proposed": int(d), "accepted": int(a), "source": "prometheus counters around the level",
                "error": f"the counters moved by {a:g} accepted of {d:g} drafted: reset during the level (an engine "
                         f"restart?), not measured"}
            return out
        out.setdefault("acceptance", {})["level"] = {
            "value": float(prometheus["accepted"]) / float(prometheus["draft_tokens"]),
            "proposed": int(prometheus["draft_tokens"]), "accepted": int(prometheus["accepted"]),
            "source": "prometheus counters around the level", "weighting": "per token, server-wide"}
    return out


def level_speedup(base_rows: Sequence[Mapping[str, Any]], cand_rows: Sequence[Mapping[str, Any]], *,
                  alpha: float = 0.05, confidence_level: float = 0.95) -> dict | None:
    """Paired speedup at one level: E2E seconds per output token, baseline over candidate, on
    the requests both served (paired by schedule index: the same item at the same offset)."""
    base = {r["index"]: r for r in base_rows if ok(r)}
    pairs = [(base[r["index"]], r) for r in cand_rows if ok(r) and r["index"] in base
             and base[r["index"]]["e2e_s"] > 0 and r["e2e_s"] > 0]
    if len(pairs) < 2:
        return None
    bw, bn, cw, cn = (np.asarray(col, dtype=float) for col in zip(*[
        (b["e2e_s"], b["n_tokens"], c["e2e_s"], c["n_tokens"]) for b, c in pairs]))
    clusters = cluster_index([(b.get("suite"), b.get("item_id")) for b, _ in pairs])
    res = speedup_from_arrays(bw, bn, cw, cn, clusters, confidence_level=confidence_level, alpha=alpha,
                              resampled="prompts")
    return {"statistic": res.statistic, "ci": [_num(res.ci_low), _num(res.ci_high)],
            "lower_bound": _num(res.lower_bound), "lower_bound_level": res.lower_bound_level, "n": res.n,
            "n_prompts": res.n_prompts, "length_log_sd": _num(res.length_log_sd),
            "length_log_sd_limit": _num(res.length_log_sd_limit),
            "metric": "E2E seconds per output token, baseline / candidate"}


def repeated(rows: Sequence[Mapping[str, Any]]) -> int:
    """Rows whose schedule index an earlier row already had: each request is played once per
    level, so a repeat is a row counted twice (a file appended to twice, edited, merged), and
    would pass for evidence it is not (30 requests doubled make the 59 a p95 bound needs)."""
    seen: set = set()
    extra = 0
    for r in rows:
        extra += r.get("index") in seen
        seen.add(r.get("index"))
    return extra


def pays(cand: Mapping[str, Any], speedup: Mapping[str, Any] | None) -> tuple[bool, str]:
    """Whether speculation pays at this level, and why (fail closed: missing evidence does not pay)."""
    if cand.get("repeated"):
        return False, f"{cand['repeated']} of its {cand['n']} rows repeat a request already counted"
    if cand.get("errors"):
        return False, f"{cand['errors']} of {cand['n']} requests failed ({cand.get('first_error')})"
    if not speedup:
        return False, "no speedup interval (fewer than 2 paired requests)"
    if speedup.get("lower_bound") is None:
        n = speedup.get("n_prompts") or 0
        spread, limit = speedup.get("length_log_sd"), speedup.get("length_log_sd_limit")
        if n < MIN_PROMPTS:
            return False, f"no speedup bound ({n} prompt(s), fewer than the {MIN_PROMPTS} a bound needs)"
        if spread is not None and limit is not None and spread > limit:
            return False, (f"no speedup bound (output lengths spread too widely (log-sd {spread:.2f} over {n} "
                           "prompts) for a speed bound: cap the budget or run more prompts)")
        return False, "no speedup bound (the prompts' speedups do not vary)"
    if speedup["lower_bound"] < 1.0:
        return False, f"speedup lower bound {speedup['lower_bound']:.2f} < 1"
    for key, s in (cand.get("slo") or {}).items():
        if not s["meets"]:
            return False, f"{key}: {slo_words(s)}"
    return True, f"speedup lower bound {speedup['lower_bound']:.2f} >= 1" + (", SLOs met" if cand.get("slo") else "")


def slo_words(s: Mapping[str, Any]) -> str:
    """One SLO check in words: what its bound showed against the threshold."""
    if s["bound"] == "too few":
        return f"undecided: n = {s['n']} is too few for an upper bound on the p95"
    if s["bound"] == "on failed requests":
        return f"the p95's upper bound falls on failed requests (n = {s['n']})"
    rel = "<=" if s["meets"] else ">"
    return f"p95 {s['p95']:.3g} s, upper bound {s['upper_bound']:.3g} s {rel} {s['threshold']:g} s"


def held_back(rows: Sequence[Mapping[str, Any]], rate: float) -> dict:
    """How long requests waited for a slot under `max_in_flight` before they were sent. Their
    latencies start when sent (as vLLM's benchmark counts them), so a level whose typical request
    waited longer than the mean gap between arrivals (1/rate) was not served at its nominal rate:
    `throttled`, and neither its objectives (harness.verdict.slo) nor whether it pays are judged
    at that rate."""
    waits = [r["cap_wait_s"] for r in rows if isinstance(r.get("cap_wait_s"), (int, float))]
    if not waits:
        return {"p50_s": None, "p95_s": None, "throttled": False}
    p50 = float(np.median(waits))
    return {"p50_s": p50, "p95_s": float(np.percentile(waits, 95)), "throttled": p50 > 1.0 / rate}


def sent_late(rows: Sequence[Mapping[str, Any]], rate: float) -> dict:
    """How long after its scheduled offset each request was sent: the load generator's own lag
    (a busy machine, a blocked event loop) plus any wait for a `max_in_flight` slot. Latencies
    start when sent, so a generator that fell behind offered the engine less than `rate` and the
    rows hide it: where the typical request left later than the mean gap between arrivals, the
    level was not offered its rate (`late`), like a level `held_back`."""
    delays = [float(r.get("lag_s") or 0) + float(r.get("cap_wait_s") or 0) for r in rows
              if isinstance(r.get("lag_s"), (int, float)) or isinstance(r.get("cap_wait_s"), (int, float))]
    if not delays:
        return {"p50_s": None, "p95_s": None, "late": False}
    p50 = float(np.median(delays))
    return {"p50_s": p50, "p95_s": float(np.percentile(delays, 95)), "late": p50 > 1.0 / rate}


# When the load generator is the bottleneck (generator_limit): its send lag's p99 past the larger
# of 50 ms and a tenth of the level's median TTFT, or its event loop busy more than 90% of the
# level. Either way its own stalls (late sends, tokens read late and in bursts) are in the
# level's latencies, which then measure the client as much as the engine.
GENERATOR_LAG_P99_S = 0.05
GENERATOR_LAG_SHARE_OF_TTFT = 0.1
GENERATOR_BUSY_SHARE = 0.9
# The error of each row a dead load client worker left (harness.run.load_workers): the level
# was not played as planned (those requests never reached the engine, or were never read), so
# it is the generator's limit too, and those rows are not the engine's failures.
LOST_WORKER = "LoadWorkerLost"


def generator_limit(rows: Sequence[Mapping[str, Any]], level: Mapping[str, Any] | None = None) -> dict:
    """Whether the load generator kept up at a level, and its own figures: send lag p50/p99 (how
    late each request left against its offset: `lag_s`, the slot wait of `max_in_flight` apart),
    client CPU per request and per streamed token, and the share of the level its busiest event
    loop spent on the CPU (`level`: the level's row of load_levels.jsonl). "limited": True past
    the thresholds above, or where a client worker died ("lost": its rows), with "why" in words; such a level is no evidence of the engine's
    speed or latency (judge_level, harness.verdict.slo)."""
    level = level or {}
    lost = [r for r in rows if str(r.get("error") or "").startswith(LOST_WORKER)]
    lags = np.asarray([float(r["lag_s"]) for r in rows if isinstance(r.get("lag_s"), (int, float))
                       and math.isfinite(r["lag_s"])], dtype=float)
    ttfts = [float(r["ttft_s"]) for r in rows if ok(r)]
    limit = max(GENERATOR_LAG_P99_S, GENERATOR_LAG_SHARE_OF_TTFT * float(np.median(ttfts)) if ttfts else 0.0)
    tokens = sum(int(r.get("n_tokens") or 0) for r in rows if ok(r))
    cpu, busy = level.get("harness_cpu_s"), level.get("loop_busy_share")
    out = {"lag_p50_s": float(np.median(lags)) if lags.size else None,
           "lag_p99_s": float(np.percentile(lags, 99)) if lags.size else None, "lag_limit_s": limit,
           "cpu_per_request_s": cpu / len(rows) if cpu is not None and rows else None,
           "cpu_per_token_s": cpu / tokens if cpu is not None and tokens else None,
           "busy_share": busy, "busy_limit": GENERATOR_BUSY_SHARE, "workers": level.get("client_workers", 1),
           "lost": len(lost)}
    reasons = []
    if lost:   # never sent, or sent and never read: the harness's failure, not the engine's
        reasons.append(f"{len(lost)} of its {len(rows)} requests were lost with a load client worker "
                       f"({lost[0]['error'][len(LOST_WORKER):].strip(': ')[:160]})")
    if out["lag_p99_s"] is not None and out["lag_p99_s"] > limit:
        reasons.append(f"send lag p99 {1e3 * out['lag_p99_s']:.0f} ms > {1e3 * limit:.0f} ms")
    if isinstance(busy, (int, float)) and busy > GENERATOR_BUSY_SHARE:
        reasons.append(f"its event loop was on the CPU {busy:.0%} of the level (> {GENERATOR_BUSY_SHARE:.0%})")
    out["limited"] = bool(reasons)
    out["why"] = (f"the load generator could not keep up ({'; '.join(reasons)}): its own stalls are in this "
                  f"level's latencies") if reasons else None
    return out


def crossover(levels: Sequence[tuple[float, bool | None]]) -> dict:
    """From (rate, pays) per level: the highest rate up to which every level tried paid (a level
    not measured, pays None, is not one that paid).
    "status": "pays at every level tried", "never pays" (not even at the lowest rate tried) or
    "pays up to" (with "rate", the last level that paid, and "next", the first that did not)."""
    levels = sorted(levels)
    if not levels:
        return {"status": "no levels", "rate": None, "next": None}
    first = next((i for i, (_, p) in enumerate(levels) if not p), None)
    if first is None:
        return {"status": "pays at every level tried", "rate": levels[-1][0], "next": None}
    if first == 0:
        return {"status": "never pays", "rate": None, "next": levels[0][0]}
    return {"status": "pays up to", "rate": levels[first - 1][0], "next": levels[first][0]}


def refine_rate(levels: Sequence[tuple[float, bool]], *, min_ratio: float = 1.1) -> float | None:
    """The next rate to try between a crossover's last paying level and the first that did not
    (their geometric mean, to 3 significant digits); None when there is no bracket or it is
    already narrower than `min_ratio`."""
    c = crossover(levels)
    if c["status"] != "pays up to" or c["next"] / c["rate"] < min_ratio:
        return None
    mid = math.sqrt(c["rate"] * c["next"])
    rounded = float(f"{mid:.3g}")
    return rounded if c["rate"] < rounded < c["next"] else None


def judge_level(base_rows: Sequence[Mapping[str, Any]], cand_rows: Sequence[Mapping[str, Any]], *,
                duration_s: float, slo: Mapping[str, float] | None = None, alpha: float = 0.05,
                prometheus: Mapping[str, Any] | None = None, rate: float | None = None,
                base_level: Mapping[str, Any] | None = None, cand_level: Mapping[str, Any] | None = None) -> dict:
    """A candidate at one level against the baseline at that level: its metrics, the paired
    speedup, and whether it pays (the run's bracketing and the verdict both decide with this).
    `rate`: the level's offered rate. Where `max_in_flight` held either side back the engine was
    not offered it, so the level's speedup is no evidence at that rate: "pays" is None (not
    measured), whatever the numbers say. So too where the load generator could not keep up on
    either side (generator_limit; `base_level`, `cand_level`: the sides' load_levels.jsonl rows).
    Failed or repeated requests are no timing: they fail the level whatever the client's lag."""
    metrics = level_metrics(cand_rows, duration_s=duration_s, slo=slo, alpha=alpha, prometheus=prometheus)
    speedup = level_speedup(base_rows, cand_rows, alpha=alpha)
    paid, why = pays(metrics, speedup)
    if paid and repeated(base_rows):
        paid, why = False, f"{repeated(base_rows)} of the baseline's rows repeat a request already counted"
    failed = [r for r in cand_rows if r.get("error") and not str(r["error"]).startswith(LOST_WORKER)]
    if failed or metrics.get("repeated") or repeated(base_rows):
        # Requests the engine failed (not those lost with a client worker: the harness's) or that
        # repeat fail the level whatever the timing: a late or starved client cannot make the
        # engine fail a request, so its marking must not hide that it did.
        return {"metrics": metrics, "speedup": speedup, "pays": paid, "why": why}
    for side, rows, level in (("baseline", base_rows, base_level), ("candidate", cand_rows, cand_level)):
        held = held_back(rows, rate) if rate is not None else {}
        late = sent_late(rows, rate) if rate is not None else {}
        if held.get("throttled"):
            paid, why = None, (f"max_in_flight held the {side}'s requests back (a median {held['p50_s']:.3g} s for "
                               f"a slot, longer than the mean gap between arrivals): the engine was not offered "
                               f"{rate:g} req/s")
            break
        if late.get("late"):
            paid, why = None, (f"the load generator sent the {side}'s requests late (a median {late['p50_s']:.3g} s "
                               f"after their offsets, longer than the mean gap between arrivals): the engine was "
                               f"not offered {rate:g} req/s")
            break
        gen = generator_limit(rows, level)
        if gen["limited"]:
            paid, why = None, f"the {side}'s level: {gen['why']}"
            break
    return {"metrics": metrics, "speedup": speedup, "pays": paid, "why": why}
