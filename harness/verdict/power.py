"""The sample size, said before the run: can this profile decide each gated suite?

For every suite with a quality margin and every lossy candidate: the items the non-inferiority
test needs to pass with 80% power if nothing changed (Tango's score test, analysis.paired
.ni_sample_size; times the sequential plan's inflation with `looks > 1`), at the discordance a
previous run observed (`--plan-from RUN_DIR`), else the suite's stated `discordance`, else
`[gates] discordance`; against the items the profile runs. A profile that cannot decide says so
and what n would; `gates.inconclusive` still decides what an undecided suite does to the gate.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from analysis.paired import ni_sample_size
from harness.config import ConfigError, RegressConfig

POWER = 0.8


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
    from harness.verdict.looks import gated_suites
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
            rows.append({"candidate": spec.name, "suite": name, "margin": margin, "discordance": disc,
                         "source": src, "needed": needed, "planned": sizes[name],
                         "decides": needed is not None and sizes[name] >= needed})
    return {"power": POWER, "alpha": g.alpha, "looks": prof.looks, "spending": g.spending, "inflation": factor,
            "rows": rows}


def table(p: dict, config: RegressConfig) -> str:
    if not p["rows"]:
        return "decodegate: sample size: no lossy candidate on a gated suite (exact candidates rest on token identity)"
    design = (f"{p['looks']} looks, {p['spending']} (max n x{p['inflation']:.3f})" if p["looks"] > 1
              else "fixed design")
    lines = [f"decodegate: sample size: items needed for power {p['power']:.0%} to show non-inferiority if nothing "
             f"changed (one-sided alpha {p['alpha']:g}, {design}):",
             f"  {'candidate':<22} {'suite':<10} {'margin':>6}  {'discordance':<30} {'needed':>6} {'runs':>5}"]
    for r in p["rows"]:
        need = "-" if r["needed"] is None else str(r["needed"])
        verdict = "can decide" if r["decides"] else (
            f"cannot decide: about {r['needed']} items would" if r["needed"] else "cannot decide at any n")
        if not r["decides"]:
            verdict += f" (gates.inconclusive = {config.gates.inconclusive!r})"
        lines.append(f"  {r['candidate']:<22} {r['suite']:<10} {r['margin']:>6.2f}  "
                     f"{r['discordance']:.2f} {r['source']:<25} {need:>6} {r['planned']:>5}  {verdict}")
    return "\n".join(lines)
