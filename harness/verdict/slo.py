"""SLO gates under load: a profile's `[profiles.NAME.slo]` (`ttft_p95_s`, `tpot_p95_s`, `e2e_p95_s`).

At each load level an objective applies only where the baseline itself meets it (its p95 at or
below the threshold). There the candidate must meet it too, decided on its one-sided
(1 - alpha) upper bound of the p95 (analysis.load.p95_bound: order statistics, failed requests
counted as never answered), so a candidate passes only on evidence:
- bound at or below the threshold: pass at that level;
- bound above it, or on failed requests: fail;
- too few requests for a bound to exist (n < 59 at alpha 0.05): inconclusive, which fails under
  `[gates] inconclusive = "fail"`;
- the candidate without rows at a level the baseline ran: fail (missing evidence);
- the baseline without rows at a level: inconclusive (nothing to hold the candidate to);
- either side held back by `max_in_flight` (its median wait for a slot longer than the mean gap
  between arrivals) or sent late by the load generator (its median delay after the offsets
  longer than that gap): inconclusive, since the engine was not offered that rate;
- either side with rows that repeat a request: inconclusive (the rows are not the requests played);
- either side where the load generator could not keep up (analysis.load.generator_limit: its
  send lag p99 or its event loop's CPU share past the stated threshold): inconclusive, since its
  own stalls are in the latencies, which are then not the engine's.
A level where the baseline misses the objective (its p95 above it, or more than 5% of its
requests failed) is "over capacity": reported, not gated. But where a decoder played just before
that baseline level left requests unanswered (a timeout or a dropped connection: the client gave
up, the engine may not have), the miss may be that engine's leftover work on a shared
accelerator, not the baseline's capacity: inconclusive, naming the decoder, never left ungated.

One gate per objective and candidate; its detail gives every level's outcome, and its status is
the worst over the gated levels.

`load errors`, with or without objectives: a candidate's failed request at a level where the
baseline failed none, more failures than the baseline's (one-sided Fisher exact test at alpha), or
no candidate requests at a configured level fail, and so do requests the harness played but whose
rows are missing, and rows that repeat a request; failures on both sides that no test tells
apart are over capacity (warn). A level the candidate played without its baseline, or a baseline
that failed more than 5% of its requests at every level, compared nothing: inconclusive.
Pure: summaries in, `GateResult`s out.
"""
from __future__ import annotations

from scipy import stats

from analysis.load import slo_words
from harness.config import Gates
from harness.verdict.gate import GateResult
from harness.verdict.results import inconclusive_status

ORDER = {"fail": 3, "inconclusive": 2, "pass": 1, "over capacity": 0}


def level_outcome(key: str, base: dict | None, cand: dict | None) -> tuple[str, str]:
    """(outcome, words) of one objective at one level: "pass", "fail", "inconclusive" or "over capacity"."""
    b = ((base or {}).get("slo") or {}).get(key)
    c = ((cand or {}).get("slo") or {}).get(key)
    for side, m in (("baseline", base), ("candidate", cand)):
        held, late = (m or {}).get("held_back") or {}, (m or {}).get("sent_late") or {}
        if held.get("throttled"):
            return "inconclusive", (f"max_in_flight held the {side}'s requests back (a median {held['p50_s']:.3g} s "
                                    f"for a slot, longer than the mean gap between arrivals): the engine was not "
                                    f"offered this rate, and latencies counted from sending hide the wait")
        if late.get("late"):
            return "inconclusive", (f"the load generator sent the {side}'s requests late (a median "
                                    f"{late['p50_s']:.3g} s after their offsets, longer than the mean gap between "
                                    f"arrivals): the engine was not offered this rate, and latencies counted from "
                                    f"sending hide the delay")
        gen = (m or {}).get("generator") or {}
        if gen.get("limited"):
            return "inconclusive", f"the {side}'s level: {gen['why']}"
        if (m or {}).get("repeated"):
            return "inconclusive", (f"{m['repeated']} of the {side}'s {m['n']} rows repeat a request already "
                                    f"counted: the rows are not the requests played")
    if not b or not b["n"]:
        return "inconclusive", "no baseline requests at this level"
    if b["p95"] is None or not b["point_meets"]:
        missed = (f"the baseline failed {base.get('errors')} of {base.get('n')} requests" if b["p95"] is None
                  else f"the baseline's p95 {b['p95']:.3g} s > {b['threshold']:g} s")
        left = base.get("after_unanswered")
        if left:
            return "inconclusive", (f"{missed}, but it played right after " + ", ".join(
                f"{x['decoder']} at {x['rate']:g} req/s left {x['requests']} request(s) unanswered ({x['first']})"
                for x in left) + ": that engine may still have been busy with them on a shared accelerator, "
                "so this is not shown to be the baseline's own capacity")
        return "over capacity", missed
    if not c or not c["n"]:
        return "fail", "no candidate requests at a level where the baseline meets the objective"
    if c["meets"] is None:
        return "inconclusive", slo_words(c)
    return ("pass" if c["meets"] else "fail"), slo_words(c)


def gates(levels: list[dict], slo: dict, config_gates: Gates) -> list[GateResult]:
    """`levels`: [{"rate", "baseline": level metrics, "candidate": level metrics}, ...] of one
    candidate (analysis.load.level_metrics with the SLO), ascending by rate."""
    out = []
    for key in slo:
        parts, worst = [], None
        for lv in levels:
            outcome, words = level_outcome(key, lv.get("baseline"), lv.get("candidate"))
            parts.append(f"{lv['rate']:g} req/s: {outcome.upper() if outcome != 'over capacity' else outcome}"
                         f" ({words})")
            if outcome != "over capacity" and (worst is None or ORDER[outcome] > ORDER[worst]):
                worst = outcome
        if worst is None:
            status, head = "warn", "over capacity at every level (the baseline misses it): not gated"
        else:
            undecided = "fail" if config_gates.inconclusive == "fail" else "warn"
            status = {"pass": "pass", "fail": "fail"}.get(worst, undecided)
            head = {"pass": "met wherever the baseline meets it", "fail": "missed where the baseline meets it",
                    "inconclusive": "inconclusive"}[worst]
        out.append(GateResult(f"slo {key}", status, f"{head}, {1 - config_gates.alpha:.0%} upper bound of the "
                                                    f"p95 vs {slo[key]:g} s; " + "; ".join(parts)))
    return out


BASELINE_ERRORS_MAX = 0.05  # the share of failed baseline requests past which a level is over capacity


def error_gate(levels: list[dict], config_gates: Gates) -> GateResult:
    """Failed requests under load (see the module docstring); `levels` as for `gates`."""
    fails, shared, usable, unmatched = [], [], 0, []
    for lv in levels:
        base, cand, rate = lv.get("baseline") or {}, lv.get("candidate"), f"{lv['rate']:g} req/s"
        be, bn = base.get("errors") or 0, base.get("n") or 0
        if bn and be <= BASELINE_ERRORS_MAX * bn:
            usable += 1
        if cand is None:
            fails.append(f"{rate}: no candidate requests")
            continue
        if lv.get("baseline") is None:
            unmatched.append(f"{rate}: no baseline requests to compare the candidate's with")
        ce, cn = cand.get("errors") or 0, cand.get("n") or 0
        lost = {side: ((m or {}).get("generator") or {}).get("lost") or 0 for side, m in (("candidate", cand),
                                                                                          ("baseline", base))}
        if any(lost.values()):
            # Rows a dead load client worker left are the harness's failure, not an engine's: that
            # level decides nothing about errors (not a candidate's failure, not a pass either).
            unmatched.append(f"{rate}: " + ", ".join(f"{n} of the {side}'s requests lost with a load client worker"
                                                     for side, n in lost.items() if n))
            continue
        for side, m, n in (("candidate", cand, cn), ("baseline", base, bn)):
            if m.get("scheduled") is not None and n - (m.get("repeated") or 0) < m["scheduled"]:
                fails.append(f"{rate}: {m['scheduled'] - n + (m.get('repeated') or 0)} of the {side}'s "
                             f"{m['scheduled']} requests have no row")
            if m.get("repeated"):
                fails.append(f"{rate}: {m['repeated']} of the {side}'s rows repeat a request already counted")
        if not ce:
            continue
        what = f"{rate}: the candidate failed {ce} of {cn} ({cand.get('first_error')}), the baseline {be} of {bn}"
        if not be:
            fails.append(what)
            continue
        p = float(stats.fisher_exact([[ce, cn - ce], [be, bn - be]], alternative="greater")[1])
        (fails if p < config_gates.alpha else shared).append(f"{what}, p={p:.3g}")
    if fails:
        return GateResult("load errors", "fail", "failed or missing requests where the baseline's did not fail "
                          "as often: " + "; ".join(fails))
    if unmatched:
        # A level the candidate played without its baseline, or where a client worker died,
        # compared nothing: not a pass.
        return GateResult("load errors", inconclusive_status(config_gates), "inconclusive: " + "; ".join(unmatched))
    if not usable:
        return GateResult("load errors", inconclusive_status(config_gates), f"inconclusive: the baseline failed more than "
                          f"{BASELINE_ERRORS_MAX:.0%} of its requests at every level, so no level compared "
                          f"the candidate with a working baseline (an engine down, or every level over capacity)")
    if shared:
        return GateResult("load errors", "warn", "failed requests on both sides, not more often on the "
                          "candidate's (over capacity?): " + "; ".join(shared))
    return GateResult("load errors", "pass", f"no failed candidate request at {len(levels)} level(s)")
