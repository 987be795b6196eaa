"""The nondeterminism floor: an exact candidate judged against the engine's disagreement with itself.

Under concurrency an engine need not be batch-invariant: its baseline run twice (A/A) can differ.
For each suite and temperature, per prompt: did the A/A run diverge from the baseline (floor),
did the candidate? The identity question becomes "does the candidate diverge more often than
the baseline diverges from itself?", a one-sided exact test on the discordant prompts
(candidate diverged and A/A did not, vs the reverse; Binomial(b + c, 1/2) under the null), with
Tango's one-sided bound on the difference in rates at the same level. Each divergence is then
"near-tie" (baseline top-2 margin below epsilon), "within-floor" (the A/A run also diverged on
that prompt) or "real". With a floor of zero (a batch-invariant engine, or concurrency 1) this is
today's strict identity: any real divergence fails.
"""
from __future__ import annotations

from scipy import stats

from analysis import tango_interval


def compare(ident: dict, floor_ident: dict, alpha: float) -> dict:
    """Floor statistics for one identity block; re-labels the candidate's divergences in place."""
    key = lambda d: (d["item_id"], d["seed"])  # noqa: E731
    floor = {key(d) for d in floor_ident["divergences"]}
    for d in ident["divergences"]:
        if d["kind"] != "near-tie" and key(d) in floor:
            d["kind"] = "within-floor"
    mine = {key(d) for d in ident["divergences"]}
    n = ident["n"]
    b, c = len(mine - floor), len(floor - mine)  # candidate-only and A/A-only divergences
    p = float(stats.binomtest(b, b + c, 0.5, alternative="greater").pvalue) if b + c else 1.0
    low = tango_interval(b, c, n, confidence_level=1 - alpha, alternative="greater").low if n else float("nan")
    ident["real_divergences"] = sum(d["kind"] == "real" for d in ident["divergences"])
    ident["within_floor"] = sum(d["kind"] == "within-floor" for d in ident["divergences"])
    return {"rate": len(floor) / n if n else 0.0, "candidate_rate": len(mine) / n if n else 0.0,
            "n": n, "candidate_only": b, "floor_only": c, "pvalue": p, "alpha": alpha,
            "difference_lower_bound": low, "exceeds": p < alpha}


def apply(summary: dict, floor_name: str, candidates: list[str], alpha: float) -> None:
    """Attach `identity[...]["floor"]` to each exact candidate in `candidates` of one level."""
    aa = summary["candidates"].get(floor_name)
    if aa is None:
        return
    for name in candidates:
        cand = summary["candidates"].get(name)
        if cand is None or cand["kind"] != "exact":
            continue
        for suite, s in cand["suites"].items():
            for t, ident in s.get("identity", {}).items():
                floor_ident = aa["suites"].get(suite, {}).get("identity", {}).get(t)
                if floor_ident is not None and floor_ident["n"] == ident["n"]:
                    ident["floor"] = compare(ident, floor_ident, alpha)


def gate_detail(ident: dict) -> tuple[bool, str] | None:
    """(fails, detail) when a nonzero floor decides this block; None: strict identity applies."""
    f = ident.get("floor")
    if not f or f["rate"] == 0:
        return None
    detail = (f"divergence {f['candidate_rate']:.3f} vs A/A floor {f['rate']:.3f} over {f['n']} prompts "
              f"({f['candidate_only']} candidate-only, {f['floor_only']} floor-only); one-sided p={f['pvalue']:.3g}, "
              f"difference >= {f['difference_lower_bound']:+.3f} at {1 - f['alpha']:.0%}; "
              f"{ident.get('within_floor', 0)} within the floor, {ident.get('real_divergences', 0)} real")
    return f["exceeds"], ("more than the floor: " if f["exceeds"] else "within the floor: ") + detail
