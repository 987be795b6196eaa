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
- the baseline without rows at a level: inconclusive (nothing to hold the candidate to).
A level where the baseline misses the objective (its p95 above it, or more than 5% of its
requests failed) is "over capacity": reported, not gated.

One gate per objective and candidate; its detail gives every level's outcome, and its status is
the worst over the gated levels. Pure: summaries in, `GateResult`s out.
"""
from __future__ import annotations

from analysis.load import slo_words
from harness.config import Gates
from harness.verdict.gate import GateResult

ORDER = {"fail": 3, "inconclusive": 2, "pass": 1, "over capacity": 0}


def level_outcome(key: str, base: dict | None, cand: dict | None) -> tuple[str, str]:
    """(outcome, words) of one objective at one level: "pass", "fail", "inconclusive" or "over capacity"."""
    b = ((base or {}).get("slo") or {}).get(key)
    c = ((cand or {}).get("slo") or {}).get(key)
    if not b or not b["n"]:
        return "inconclusive", "no baseline requests at this level"
    if b["p95"] is None:  # more than 5% of the baseline's requests failed
        return "over capacity", f"the baseline failed {base.get('errors')} of {base.get('n')} requests"
    if not b["point_meets"]:
        return "over capacity", f"the baseline's p95 {b['p95']:.3g} s > {b['threshold']:g} s"
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
