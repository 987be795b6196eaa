"""Sequential looks at a suite's quality: the plan, the item order, and the verdict at each look.

With `looks = K` in a profile, each suite's items are taken in a fixed shuffled order (seeded by
the suite's content hash, so every run and the baseline store see the same order) and the
quality tests run at K looks (analysis.sequential). A lossy candidate that is clearly
non-inferior or clearly worse on a suite stops there; the runner and the summary call the same
`evaluate`, so what stopped a run is what the gate reports.
"""
from __future__ import annotations

import functools
import hashlib

import numpy as np

from analysis import sequential
from analysis.paired import tango_interval
from harness.config import DecoderSpec, RegressConfig


@functools.lru_cache(maxsize=16)
def _plan(looks: int, alpha: float, loss_alpha: float, spending: str) -> sequential.Plan:
    return sequential.Plan.make(looks, alpha, loss_alpha, spending)


def gated_suites(config: RegressConfig, spec: DecoderSpec) -> list[str]:
    return [s for s in config.profile.suites if config.suites[s].margin is not None
            and (spec.suites is None or s in spec.suites)]


def plan_for(config: RegressConfig, spec: DecoderSpec) -> sequential.Plan | None:
    """The candidate's plan; None for the fixed design (one look) or a candidate without quality
    gates. The loss test's level is alpha over the candidate's gated suites, as in the gate."""
    gated = gated_suites(config, spec)
    if config.profile.looks <= 1 or not gated or spec.kind != "lossy":
        return None
    g = config.gates
    return _plan(config.profile.looks, g.alpha, g.alpha / len(gated), g.spending)


def item_order(suite, subset: str) -> list:
    """The suite's items in look order: a permutation fixed by the suite's content."""
    items = list(suite.select(subset))
    seed = int.from_bytes(hashlib.sha256(f"{suite.name}:{suite.hash}".encode()).digest()[:8], "little")
    return [items[i] for i in np.random.default_rng(seed).permutation(len(items))]


def look_sets(plan: sequential.Plan, order: list, ungradable=frozenset()) -> list[set] | None:
    """Item ids in each look (cumulative), from the gradable items only; None for a suite with
    fewer gradable items than looks, which is judged by the fixed design. `ungradable`: items
    that ran on both sides and were graded `none` on one (no grade to test): left in, they would
    hold their look open forever, and the suite would end inconclusive though nothing stopped it."""
    ids = [i for i in (getattr(it, "id", it) for it in order) if i not in ungradable]
    if len(ids) < plan.looks:
        return None
    return [set(ids[:n]) for n in plan.look_sizes(len(ids))]


def _repeated_lower(q: dict, bound: float) -> float | None:
    """The one-sided lower confidence bound of delta at the look's boundary (a repeated
    confidence bound: it holds jointly over the looks)."""
    from scipy import stats
    if q.get("wins") is not None:
        return tango_interval(q["wins"], q["losses"], q["n"], confidence_level=float(stats.norm.cdf(bound)),
                              alternative="greater", continuity_correction=0.5).low
    if q.get("sd") is not None and q["n"] > 1:
        return q["statistic"] - bound * q["sd"] / np.sqrt(q["n"])
    return None


def evaluate(plan: sequential.Plan, sets: list[set], pairs: list, margin: float, alpha: float) -> dict:
    """The looks reached by these greedy graded pairs, and the first verdict.

    A look is reached when every one of its items has a pair. Returns {"looks": [...],
    "decided": "non-inferior" | "worse" | None, "look": k (1-based, where decided or last reached),
    "of": K}."""
    import analysis
    from harness.verdict.plain import plain as _plain
    have = {p.key.item_id for p in pairs}
    looks, decided = [], None
    for k, ids in enumerate(sets):
        if not ids <= have:
            break
        sub = [p for p in pairs if p.key.item_id in ids]
        q = _plain(analysis.quality_delta(sub, margin=margin, alpha=alpha, group="look", metric="passed"))
        z_ni = sequential.z_from_pvalue(q["non_inferiority"]["pvalue"])
        z_loss = sequential.z_from_pvalue(q["loss_pvalue"])
        decided = sequential.decide(plan, k, z_ni, z_loss)
        looks.append({"look": k + 1, "n": q["n"], "delta": q["statistic"], "z_ni": z_ni, "ni_bound": plan.ni_bounds[k],
                      "z_loss": z_loss, "loss_bound": plan.loss_bounds[k],
                      "lower_bound": _repeated_lower(q, plan.ni_bounds[k])})
        if decided:
            break
    return {"looks": looks, "decided": decided, "look": len(looks), "of": plan.looks,
            "spending": plan.spending, "alpha": plan.alpha, "loss_alpha": plan.loss_alpha}


def ungradable(pairs) -> set:
    """Items with a greedy pair that ran on both sides but has no grade on one (graded `none`)."""
    return {p.key.item_id for p in pairs if p.key.temperature == 0
            and (p.baseline.get("passed") is None or p.candidate.get("passed") is None)}


def _pairs(records: list[dict], base: str, cand: str, suite: str) -> list:
    """Greedy pairs of one suite, joined on the pairing key (the candidate may have run fewer
    items than the baseline: it can have stopped); graded or not."""
    from analysis.pairing import Pair, PairKey
    def key(r):
        return (r["suite"], r.get("suite_hash"), r["item_id"], r["seed"], r["temperature"])
    rows = [r for r in records if r["suite"] == suite and r["temperature"] == 0]
    b = {key(r): r for r in rows if r["candidate"] == base}
    return [Pair(PairKey(*key(r)), b[key(r)], r) for r in rows if r["candidate"] == cand and key(r) in b]


def stage_decisions(config: RegressConfig, specs, base_names, records: list[dict], suites: list, stops) -> list[dict]:
    """After a stage: the (candidate, suite) verdicts now decided, as stop rows. A candidate
    shown worse anywhere stops everywhere (its verdict is a failure whatever else it does)."""
    from harness.run import sweep
    out = []
    for level in sweep.levels(config):
        cfg = sweep.level_config(config, level)
        for spec in cfg.candidates:
            plan = plan_for(cfg, spec)
            if plan is None or stops.stopped(spec.name, "*") or any(o["candidate"] == spec.name and o["suite"] == "*"
                                                                    for o in out):
                continue
            for suite in suites:
                margin = cfg.suites[suite.name].margin
                if suite.name not in gated_suites(cfg, spec) or stops.stopped(spec.name, suite.name):
                    continue
                both = _pairs(records, cfg.baseline.name, spec.name, suite.name)
                pairs = [p for p in both if p.key.item_id not in ungradable(both)]
                if not pairs:
                    continue
                sets = look_sets(plan, item_order(suite, cfg.profile.subset), ungradable(both))
                if sets is None:
                    continue
                res = evaluate(plan, sets, pairs, margin, cfg.gates.alpha)
                if not res["decided"]:
                    continue
                last = res["looks"][-1]
                detail = (f"{suite.name} {res['decided']} at look {res['look']} of {res['of']} (n={last['n']}, "
                          f"delta {last['delta']:+.3f}); ")
                if res["decided"] == "worse":
                    out.append({"candidate": spec.name, "suite": "*", "reason": "worse", "look": res["look"],
                                "detail": detail + "stopped on every suite"})
                    break
                out.append({"candidate": spec.name, "suite": suite.name, "reason": "non-inferior", "look": res["look"],
                            "detail": detail + f"stopped on {suite.name}"})
    return out


class LookPlan:
    """The runner's look plan, handed to it up front: how many stages, each suite's item order,
    and after a stage the stop rows now decided. The runner never imports this module."""

    def __init__(self, config: RegressConfig, specs, base_names, suites: list):
        self.config, self.specs, self.base_names, self.suites = config, specs, base_names, suites
        self.count = config.profile.looks

    def order(self, suite) -> list:
        return item_order(suite, self.config.profile.subset)

    def decisions(self, records: list[dict], stops) -> list[dict]:
        return stage_decisions(self.config, self.specs, self.base_names, records, self.suites, stops)
