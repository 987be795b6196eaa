"""Timing bias: the A/A run's speedup must be 1 within its interval, or no speed verdict stands.

The A/A run (role "aa-floor") is the baseline decoder timed again on the same items: its true
speedup over the baseline is 1. When its (two-sided, over prompts) interval excludes 1, the
run's timing is biased: a cold server read as a slower baseline (`make regress-vllm` once
reported "speedup vllm~aa 1.09x", lower bound 1.02x, its first baseline request 5.28 s against
2.13 s in the repeat), a machine whose speed moved between the runs. The same bias reaches
every candidate timed after the baseline, so:
- `bias(summary)` says whether the A/A interval excludes 1, in words (None: it contains 1, or
  there is no A/A speedup to check: an unchecked run is judged as before);
- `apply(summary, gates)` turns each candidate's `speed` gate that passed into an inconclusive
  one naming the bias (a fail stays a fail: a bias never rescues a slow candidate either way,
  but it never lets one pass), and says so in `summary["timing"]`.
The load verdict (harness.verdict.load) asks `bias` too: its levels then do not pay, "not
measured" with the reason. Pure: summary in, summary out.
"""
from __future__ import annotations

from harness.verdict.results import inconclusive_status


def _aas(summary: dict) -> list[tuple[str, dict]]:
    return [(name, cand) for name, cand in (summary.get("candidates") or {}).items()
            if cand.get("role") == "aa-floor"]


def bias(summary: dict) -> str | None:
    """Why the run's timing is biased, or None (see the module docstring). Every A/A run is
    checked (a sweep has one per concurrency level, a config may name several): the first one
    alone let a biased one at another level leave every speed verdict standing."""
    found = []
    for name, aa in _aas(summary):
        sp = aa.get("speedup") or {}
        lo, hi = sp.get("ci_low"), sp.get("ci_high")
        if sp.get("error") or not isinstance(lo, (int, float)) or not isinstance(hi, (int, float)):
            continue
        if lo <= 1.0 <= hi:
            continue
        level = sp.get("confidence_level") or 0.95
        found.append(f"the A/A run {name!r} (the baseline timed again) reads {sp['statistic']:.2f}x the baseline, "
                     f"{level:.0%} interval [{lo:.2f}, {hi:.2f}] without 1")
    if not found:
        return None
    return (f"timing biased: {'; '.join(found)} (a cold server, or a machine whose speed moved between the "
            f"runs): no speed verdict of this run stands on it")


def apply(summary: dict, gates) -> bool:
    """Mark the speed gates of a biased run (see the module docstring); True when nothing failed."""
    why = bias(summary)
    summary["timing"] = {"biased": why is not None, "why": why}
    if why is None:
        return True
    passed = True
    status = inconclusive_status(gates)
    for cand in summary["candidates"].values():
        if cand.get("role") == "aa-floor":
            continue
        for g in cand.get("gates") or []:
            if g["name"] == "speed" and g["status"] == "pass":
                g["status"], g["detail"] = status, f"inconclusive: {why}; was: {g['detail']}"
        if any(g["status"] == "fail" for g in cand.get("gates") or []):
            cand["verdict"], passed = "fail", False
    return passed
