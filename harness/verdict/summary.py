"""From records to `summary.json`: the analysis of each candidate against the baseline.

Per candidate and suite: token identity (greedy, and per sampling temperature), quality delta
with its non-inferiority test, acceptance (speculative), exits (early exit), latency and paired
speedup. Only plain JSON goes out; the gate reads this structure and nothing else.
"""
from __future__ import annotations

import math

import analysis
from harness.verdict.plain import plain as _plain
from harness.config import RegressConfig


def _divergences(identity) -> list[dict]:
    return [{"item_id": d.key.item_id, "seed": d.key.seed, "temperature": d.key.temperature,
             "position": d.position, "margin": d.margin, "kind": d.kind,
             "baseline_token": d.baseline_token, "candidate_token": d.candidate_token}
            for d in identity.divergences]


def _identity(pairs, eps) -> dict:
    ident = analysis.token_identity(pairs, eps=eps)
    near = sum(d.kind == "near-tie" for d in ident.divergences)
    return {"rate": ident.statistic, "n": ident.n, "identical": ident.identical,
            "ci": [ident.ci_low, ident.ci_high], "mean_common_prefix": ident.mean_common_prefix,
            "near_ties": near, "real_divergences": len(ident.divergences) - near,
            "seeds": sorted({p.key.seed for p in pairs}), "divergences": _divergences(ident)}


def near_tie_epsilon(config: RegressConfig, numerics: dict | None) -> dict:
    """The near-tie threshold and how it was chosen: the config's number, else from the target's
    dtype, raised to twice the measured margin noise where that is larger."""
    numerics = numerics or {}
    if config.gates.near_tie_epsilon is not None:
        return {"value": float(config.gates.near_tie_epsilon), "source": "config [gates] near_tie_epsilon",
                **{k: numerics.get(k) for k in ("dtype", "margin_noise_max")}}
    value, source = analysis.identity.near_tie_epsilon(numerics.get("dtype"), numerics.get("margin_noise_max"))
    return {"value": value, "source": source, **{k: numerics.get(k) for k in ("dtype", "margin_noise_max")}}


def candidate_suite_summary(pairs, spec, suite_spec, config: RegressConfig, rng, head_cost: float = 0.0,
                            eps: float | None = None) -> dict:
    eps = eps if eps is not None else (config.gates.near_tie_epsilon if config.gates.near_tie_epsilon is not None
                                       else analysis.DEFAULT_EPS)
    out: dict = {"n_pairs": len(pairs)}
    for side, key in (("candidate", "errors"), ("baseline", "baseline_errors")):
        errors = [f"{p.key.item_id}: {getattr(p, side)['error']}" for p in pairs if getattr(p, side).get("error")]
        if errors:
            out[key] = errors
    by_temp: dict[float, list] = {}
    for p in pairs:
        by_temp.setdefault(p.key.temperature, []).append(p)
    out["identity"] = {f"T={t:g}": _identity(ps, eps) for t, ps in sorted(by_temp.items())}
    greedy = by_temp.get(0.0, [])
    if suite_spec.margin is not None:
        graded = [p for p in greedy if p.baseline.get("passed") is not None and p.candidate.get("passed") is not None]
        if graded and spec.kind == "exact" and all(
                p.baseline.get("tokens") and p.baseline["tokens"] == p.candidate.get("tokens") for p in graded):
            # Identical outputs get identical grades: no sampling uncertainty to test. Quality of an
            # exact decoder beyond these items rests on the identity gates, not on n.
            out["quality_identical"] = len(graded)
        elif graded:
            q = analysis.quality_delta(graded, margin=suite_spec.margin, alpha=config.gates.alpha, rng=rng,
                                       group=suite_spec.name, metric="passed")
            out["quality"] = _plain(q)
        else:
            out["quality_missing"] = (f"suite {suite_spec.name!r} has a quality margin but no graded greedy "
                                      f"pairs to test it on")
    stats = [p.candidate.get("stats", {}) for p in pairs]
    if any(s.get("proposed") for s in stats):  # our speculative decoder, or an engine's telemetry
        try:
            usable = [p for p in (greedy or pairs) if p.baseline.get("tokens") and p.candidate.get("tokens")]
            out["acceptance"] = _plain(analysis.acceptance_summary(usable, rng=rng))
        except ValueError as e:
            out["acceptance"] = {"error": str(e)}
    if spec.decoder == "early-exit" and any(s.get("exit_layers") for s in stats):
        out["exits"] = _plain(analysis.exit_summary([p.candidate for p in pairs], lm_head_cost=head_cost))
    if any(p.candidate.get("tokens") for p in pairs):
        out["latency"] = _plain(analysis.latency_summary([p.candidate for p in pairs if p.candidate.get("tokens")]))
    timed = timed_pairs(pairs)
    if timed:
        out["speedup"] = _plain(analysis.paired_speedup(timed, rng=rng, alpha=config.gates.alpha))
    return out


def timed_pairs(pairs) -> list:
    """Pairs a speed comparison may use: both sides generated, the baseline timed in this run
    (a reused baseline row's timing is from another day, another machine load)."""
    return [p for p in pairs if p.candidate.get("tokens") and p.baseline.get("tokens") and not p.baseline.get("reused")]


def _sequential(config, spec, suite, pairs) -> dict | None:
    """The group-sequential verdict of a lossy candidate on a gated suite (harness.verdict.looks)."""
    from harness.verdict import looks
    plan = looks.plan_for(config, spec)
    margin = config.suites[suite.name].margin
    if plan is None or margin is None or not hasattr(suite, "select"):
        return None
    graded = [p for p in pairs if p.key.temperature == 0 and p.baseline.get("passed") is not None
              and p.candidate.get("passed") is not None]
    if not graded:
        return None
    sets = looks.look_sets(plan, looks.item_order(suite, config.profile.subset))
    if sets is None:
        return None
    return _plain(looks.evaluate(plan, sets, graded, margin, config.gates.alpha))


def summarize(config: RegressConfig, records: list[dict], suites: list, exactness: dict | None = None,
              rng_seed: int = 0, lm_head_cost: dict | None = None, numerics: dict | None = None,
              stops: list[dict] | None = None) -> dict:
    """`lm_head_cost`: per candidate, one LM-head evaluation in decoder-layer units (early exit);
    `numerics`: the target's dtype and measured margin noise (`exactness_run.margin_noise`);
    `stops`: where the runner stopped a candidate early (sequential looks, --fail-fast): there
    the baseline is paired only with the items the candidate ran."""
    import numpy as np
    rng = np.random.default_rng(rng_seed)
    by_cand = analysis.split_by_candidate(records)
    base_rows = by_cand.get(config.baseline.name, [])
    summary = {"target": config.target, "profile": config.profile.name, "baseline": config.baseline.name,
               "seeds": list(config.profile.seeds), "temperatures": list(config.profile.temperatures),
               "near_tie_epsilon": near_tie_epsilon(config, numerics),
               "labels": config.labels,
               "suites": {s.name: {"version": s.version, "hash": s.hash, "n_items": len(s.select(config.profile.subset))}
                          for s in suites},
               "baseline_latency": _plain(analysis.latency_summary([r for r in base_rows if r.get("tokens")
                                                                    and not r.get("reused")]))
               if any(r.get("tokens") and not r.get("reused") for r in base_rows) else None,
               "candidates": {}}
    for spec in config.candidates:
        rows = by_cand.get(spec.name, [])
        mine = [r for r in base_rows if spec.suites is None or r["suite"] in spec.suites]
        my_stops = [st for st in stops or () if st["candidate"] == spec.name]
        if my_stops:
            cut = {st["suite"] for st in my_stops}
            ran = {(r["suite"], r["item_id"], r["seed"], r["temperature"]) for r in rows}
            mine = [r for r in mine if not ({"*", r["suite"]} & cut)
                    or (r["suite"], r["item_id"], r["seed"], r["temperature"]) in ran]
        pairs = analysis.pair_records(mine, rows)
        head = (lm_head_cost or {}).get(spec.name, 0.0)
        per_suite = {}
        for suite in suites:
            ps = [p for p in pairs if p.key.suite == suite.name]
            if ps:
                per_suite[suite.name] = candidate_suite_summary(ps, spec, config.suites[suite.name], config, rng, head,
                                                                eps=summary["near_tie_epsilon"]["value"])
                seq = _sequential(config, spec, suite, ps)
                if seq and "quality" in per_suite[suite.name]:
                    per_suite[suite.name]["quality"]["sequential"] = seq
        cand = {"decoder": spec.decoder, "kind": spec.kind, "options": spec.options,
                "target": spec.target or config.target, "labels": spec.labels, "min_speedup": spec.min_speedup,
                "suites": per_suite}
        if my_stops:
            cand["stopped"] = my_stops
        timed = timed_pairs(pairs)
        if timed:
            cand["speedup"] = _plain(analysis.paired_speedup(timed, rng=rng, alpha=config.gates.alpha))
        if any(p.candidate.get("tokens") for p in pairs):
            cand["latency"] = _plain(analysis.latency_summary([p.candidate for p in pairs if p.candidate.get("tokens")]))
        if spec.decoder == "speculative" or any(p.candidate.get("stats", {}).get("proposed") for p in pairs):
            greedy = [p for p in pairs if p.key.temperature == 0 and p.candidate.get("stats", {}).get("proposed")
                      and p.baseline.get("tokens")]
            if greedy:
                try:
                    cand["acceptance"] = _plain(analysis.acceptance_summary(greedy, rng=rng))
                    cand["acceptance_by_category"] = {
                        g: _plain(a) for g, a in analysis.acceptance_by_group(greedy, by="category", rng=rng).items()}
                except ValueError as e:  # telemetry too thin for the statistics (e.g. no draft length)
                    cand["acceptance"] = {"error": str(e)}
        if spec.decoder == "early-exit":
            cand["exits"] = _plain(analysis.exit_summary([p.candidate for p in pairs if p.candidate.get("tokens")],
                                                         lm_head_cost=head))
        if exactness and spec.name in exactness:
            cand["exactness"] = _plain(exactness[spec.name])
        cand["exactness_expected"] = spec.decoder == "speculative" and spec.options.get("verify") == "rejection"
        if any(r.get("compare_on") == "text" for r in rows + mine):
            # An engine that returns text only: identity is judged on our tokenization of its text,
            # and no near-tie forensics are possible (it gave no logprobs tied to token ids).
            cand["compare_on"] = "text"
        cand["metrics"] = headline_metrics(cand)
        summary["candidates"][spec.name] = cand
    return summary


def headline_metrics(cand: dict) -> dict:
    """The numbers worth a dashboard: what MLflow gets as metrics."""
    m: dict = {}
    if "speedup" in cand:
        sp = cand["speedup"]
        m["speedup"] = sp["statistic"]
        m["speedup_ci_low"], m["speedup_ci_high"] = sp["ci_low"], sp["ci_high"]
        m["speedup_lower_bound"] = sp.get("lower_bound")
        m["speedup_prompt_median"] = sp.get("median_prompt_speedup")
        m["share_prompts_slower"] = sp.get("share_prompts_slower")
    if "latency" in cand:
        lat = cand["latency"]
        m["latency_p50_s_per_token"] = lat["per_token"]["p50"]
        m["latency_p95_s_per_token"] = lat["per_token"]["p95"]
        m["latency_p95_ci_low_s_per_token"] = lat["per_token"].get("p95_ci_low")
        m["latency_p95_ci_high_s_per_token"] = lat["per_token"].get("p95_ci_high")
        m["latency_n"] = lat["per_token"]["n"]
        m["ttft_p50_s"], m["ttft_p95_s"] = lat["ttft"]["p50"], lat["ttft"]["p95"]
        m["tokens_per_s"] = lat["tokens_per_s"]
    if "acceptance" in cand:
        a = cand["acceptance"]
        for k in ("alpha", "tau", "c", "theoretical_speedup", "achieved_over_theoretical"):
            m[k] = a.get(k)
    if "exits" in cand:
        m["avg_layers"] = cand["exits"]["mean_layers"]
        m["exit_theoretical_speedup"] = cand["exits"]["theoretical_speedup"]
    for suite, s in cand["suites"].items():
        for t, ident in s.get("identity", {}).items():
            m[f"{suite}.identity.{t}"] = ident["rate"]
            m[f"{suite}.real_divergences.{t}"] = ident["real_divergences"]
        if "quality" in s:
            q = s["quality"]
            m[f"{suite}.quality_delta"] = q["statistic"]
            m[f"{suite}.quality_delta_ci_low"], m[f"{suite}.quality_delta_ci_high"] = q["ci_low"], q["ci_high"]
            m[f"{suite}.quality_pvalue"] = q["pvalue"]
            m[f"{suite}.ni_pvalue"] = q["non_inferiority"]["pvalue"]
            m[f"{suite}.baseline_pass_rate"], m[f"{suite}.candidate_pass_rate"] = q["baseline_mean"], q["candidate_mean"]
        if "speedup" in s:
            m[f"{suite}.speedup"] = s["speedup"]["statistic"]
    if "exactness" in cand:
        ex = cand["exactness"]
        m["exactness_min_pvalue"] = min((e["pvalue"] for e in ex.get("tests", []) if e.get("pvalue") is not None),
                                        default=None)
        for subset, res in ((ex.get("pit") or {}).get("subsets") or {}).items():
            m[f"exactness_pit_{subset}_pvalue"] = res.get("pvalue")
            m[f"exactness_pit_{subset}_tokens"] = res.get("n")
            m[f"exactness_pit_{subset}_detectable_tv"] = res.get("detectable_tv")
    return {k: v for k, v in m.items() if isinstance(v, (int, float))}
