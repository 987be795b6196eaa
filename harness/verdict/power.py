"""The sample size, said before the run: can this profile decide each gated suite?

For every suite with a quality margin and every lossy candidate: the items the non-inferiority
test needs to pass with 80% power if nothing changed, at the discordance a previous run observed
(`--plan-from RUN_DIR`), else the suite's stated `discordance`, else `[gates] discordance`;
against the items the profile runs, and the probability that the suite passes at the planned n.
The fixed design (`looks = 1`) takes its n from Tango's score test's normal approximation
(analysis.paired.ni_sample_size). With `looks > 1` the figures are the sequential plan's own
operating characteristics, exact for pass/fail pairs (analysis.sequential.exact_operating, the
same boundaries and loss level as the gate): the fixed design's pass probability is up to 0.04
above the 3-look plan's at n = 30-300 (CALIBRATION.md), and its n times the plan's normal-theory
inflation asked for 147 items at discordance 0.2 (margin 0.1) where 141 give 80%. The pass
probability is exact in both designs. A profile that cannot decide says so and what n would;
`gates.inconclusive` still decides what an undecided suite does to the gate.
"""
from __future__ import annotations

import functools
import json
import math
from pathlib import Path

from analysis import sequential
from analysis.paired import ni_sample_size
from harness.config import ConfigError, RegressConfig

POWER = 0.8
EXACT_MAX_N = 1500   # exact operating figures up to this many items (an (n + 1)^2 table per look)


@functools.lru_cache(maxsize=512)
def pass_probability(plan: sequential.Plan, n: int, discordance: float, margin: float) -> float | None:
    """P(the suite is called non-inferior) when nothing changed, exactly, under ``plan``; None
    where n is beyond EXACT_MAX_N (or below the plan's looks)."""
    if not plan.looks <= n <= EXACT_MAX_N:
        return None
    return sequential.exact_operating(plan, n, discordance, 0.0, margin).non_inferior


def sequential_needed(plan: sequential.Plan, discordance: float, margin: float, start: int) -> int | None:
    """The n from which ``plan`` passes an unchanged candidate with probability POWER, exactly, by
    bisection from ``start`` (the fixed design's n times the plan's inflation). The power of
    discrete counts saws up and down by a little from one n to the next, so this is the crossing
    the bisection finds, within a few items of the first. None where it lies beyond EXACT_MAX_N."""
    def enough(n):
        return pass_probability(plan, n, discordance, margin) >= POWER
    lo, hi = max(plan.looks, int(0.7 * start)), start
    while not enough(hi):
        lo, hi = hi, int(hi * 1.3) + 1
        if hi > EXACT_MAX_N:
            return None
    if enough(lo):
        return lo
    while hi - lo > 1:  # enough(hi), not enough(lo)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid, hi)
    return hi


def _observed(plan_from: str | None) -> tuple[dict, str | None]:
    """{(candidate, suite): discordance} from a previous run's summary.json."""
    if not plan_from:
        return {}, None
    path = Path(plan_from) / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"--plan-from {plan_from}: cannot read {path} ({e})") from None
    out = {}
    for name, cand in summary.get("candidates", {}).items():
        for suite, s in cand.get("suites", {}).items():
            q = s.get("quality") or {}
            if q.get("wins") is not None and q.get("n"):
                out[(name, suite)] = (q["wins"] + q["losses"]) / q["n"]
    return out, summary.get("run_uid") or str(plan_from)


def plan(config: RegressConfig, suites: list, plan_from: str | None = None) -> dict:
    from harness.verdict.looks import gated_suites, plan_for
    observed, source_run = _observed(plan_from)
    g, prof = config.gates, config.profile
    factor = 1.0
    if prof.looks > 1:
        from analysis.sequential import fractions, inflation
        factor = inflation(fractions(prof.looks), g.alpha, g.spending, POWER)
    sizes = {s.name: len(s.select(prof.subset)) for s in suites}
    rows = []
    for spec in config.candidates:
        if spec.kind != "lossy":
            continue  # an exact candidate's quality rests on token identity, not on n
        for name in gated_suites(config, spec):
            if name not in sizes:
                continue  # lmeval:<task> suites: their size is known only once lm-eval loads them
            margin = config.suites[name].margin
            if (spec.name, name) in observed:
                disc, src = observed[(spec.name, name)], f"observed in {source_run}"
            elif config.suites[name].discordance is not None:
                disc, src = config.suites[name].discordance, f"stated [suites.{name}]"
            else:
                disc, src = g.discordance, "stated [gates]"
            fixed = ni_sample_size(max(disc, 1e-6), margin, alpha=g.alpha, power=POWER)
            needed = math.ceil(fixed * factor) if fixed is not None else None
            design = plan_for(config, spec) or sequential.Plan.make(1, g.alpha, g.alpha / len(gated_suites(config, spec)))
            if design.looks > 1 and needed is not None:
                needed = sequential_needed(design, max(disc, 1e-6), margin, needed) or needed  # past EXACT_MAX_N
            rows.append({"candidate": spec.name, "suite": name, "margin": margin, "discordance": disc,
                         "source": src, "needed": needed, "planned": sizes[name],
                         "pass_probability": pass_probability(design, sizes[name], max(disc, 1e-6), margin),
                         "decides": needed is not None and sizes[name] >= needed})
    return {"power": POWER, "alpha": g.alpha, "looks": prof.looks, "spending": g.spending, "inflation": factor,
            "rows": rows}


def table(p: dict, config: RegressConfig) -> str:
    if not p["rows"]:
        return "decodegate: sample size: no lossy candidate on a gated suite (exact candidates rest on token identity)"
    design = (f"{p['looks']} looks, {p['spending']} (max n x{p['inflation']:.3f})" if p["looks"] > 1
              else "fixed design")
    lines = [f"decodegate: sample size: items needed for power {p['power']:.0%} to show non-inferiority if nothing "
             f"changed (one-sided alpha {p['alpha']:g}, {design}), and P(pass) at the items run"
             + (" (exact, looks included)" if p["looks"] > 1 else " (exact)") + ":",
             f"  {'candidate':<22} {'suite':<10} {'margin':>6}  {'discordance':<30} {'needed':>6} {'runs':>5} "
             f"{'P(pass)':>7}"]
    for r in p["rows"]:
        need = "-" if r["needed"] is None else str(r["needed"])
        verdict = "can decide" if r["decides"] else (
            f"cannot decide: about {r['needed']} items would" if r["needed"] else "cannot decide at any n")
        if not r["decides"]:
            verdict += f" (gates.inconclusive = {config.gates.inconclusive!r})"
        chance = "-" if r["pass_probability"] is None else f"{r['pass_probability']:.3f}"
        lines.append(f"  {r['candidate']:<22} {r['suite']:<10} {r['margin']:>6.2f}  "
                     f"{r['discordance']:.2f} {r['source']:<25} {need:>6} {r['planned']:>5} {chance:>7}  {verdict}")
    return "\n".join(lines)
