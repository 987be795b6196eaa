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
    """Identity over the pairs where both sides produced output: a pair where either failed shows
    nothing about identity (two empty outputs are not "identical"); it is counted as `errored`,
    and the errors gates judge it."""
    ok = [p for p in pairs if not p.baseline.get("error") and not p.candidate.get("error")]
    seeds = sorted({p.key.seed for p in pairs})
    errored = len(pairs) - len(ok)
    if not ok:
        return {"rate": None, "n": 0, "identical": 0, "ci": [None, None], "mean_common_prefix": None,
                "near_ties": 0, "real_divergences": 0, "seeds": seeds, "divergences": [], "errored": errored}
    ident = analysis.token_identity(ok, eps=eps)
    near = sum(d.kind == "near-tie" for d in ident.divergences)
    return {"rate": ident.statistic, "n": ident.n, "identical": ident.identical,
            "ci": [ident.ci_low, ident.ci_high], "mean_common_prefix": ident.mean_common_prefix,
            "near_ties": near, "real_divergences": len(ident.divergences) - near,
            "seeds": seeds, "divergences": _divergences(ident), "errored": errored}


# What the graders write where their own machinery failed (suites.graders: "sandbox error",
# "grader error"): in records written before rows carried `grade_error`.
GRADE_ERROR_PREFIXES = ("sandbox error", "grader error")


def grade_error(row: dict) -> str | None:
    """Why this row's grade measured nothing (the grading machinery failed, not the completion):
    its `grade_error` (harness.run.runner.make_row), or, in a record written before that field,
    a grade detail only the machinery writes. None for a real grade."""
    if row.get("grade_error"):
        return str(row["grade_error"])
    detail = row.get("grade_detail")
    if isinstance(detail, str) and detail.startswith(GRADE_ERROR_PREFIXES):
        return detail
    return None


def grade_errors(pairs) -> dict | None:
    """{"n", "baseline", "candidate", "first"} over the pairs' rows whose grade is a machinery
    failure (a fail that shows nothing); None when every grade is real."""
    found = [(side, p.key.item_id, why) for p in pairs for side in ("baseline", "candidate")
             if (why := grade_error(getattr(p, side)))]
    if not found:
        return None
    side, item, why = found[0]
    return {"n": len(found), "baseline": sum(f[0] == "baseline" for f in found),
            "candidate": sum(f[0] == "candidate" for f in found), "first": f"{side} {item}: {why}"}


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
    if spec.role == "aa-floor":  # the baseline run again: how far the engine's own margins move
        from harness.verdict.floor import noise
        out["aa_noise"] = noise(pairs)
    greedy = by_temp.get(0.0, [])
    errors = grade_errors(pairs)
    if errors:  # the gate makes this suite's quality inconclusive (harness.verdict.gate)
        out["grade_errors"] = errors
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
        out["exits"] = exits_step([p.candidate for p in pairs], head_cost)
    if any(p.candidate.get("tokens") for p in pairs):
        out["latency"] = step(analysis.latency_summary, [p.candidate for p in pairs if p.candidate.get("tokens")])
    timed = timed_pairs(pairs)
    if timed:
        out["speedup"] = step(analysis.paired_speedup, timed, rng=rng, alpha=config.gates.alpha, suite=pairs)
    return out


def step(fn, *args, **kwargs) -> dict:
    """One analysis step as plain JSON, or {"error": why} where the records cannot support it:
    the gate fails that step by name (harness.verdict.gate), and the rest of the run is still
    summarized. One bad row must not end the run."""
    try:
        return _plain(fn(*args, **kwargs))
    except ValueError as e:
        return {"error": str(e)}


def exits_step(records: list[dict], head_cost: float) -> dict:
    """Exit statistics over the generations that produced tokens (a failed generation has no
    exit layers); none at all is an error the gate fails on."""
    usable = [r for r in records if r.get("tokens")]
    if not usable:
        failed = sum(1 for r in records if r.get("error"))
        return {"error": f"no tokens to take exit statistics from: {failed} of {len(records)} early-exit "
                         f"generation(s) failed" + ("" if failed else " or produced nothing")}
    return step(analysis.exit_summary, usable, lm_head_cost=head_cost)


def gated_suites(config: RegressConfig, spec) -> list[str]:
    from harness.verdict.looks import gated_suites as gated
    return gated(config, spec)


def no_items(config: RegressConfig, suite, stopped: bool) -> str:
    """Why a gated suite has no pairs, for the gate's "no items" failure."""
    n = len(suite.select(config.profile.subset))
    why = (f"the {config.profile.subset!r} subset selects none of its items" if n == 0 else
           f"{n} item(s) selected, but none paired with the baseline"
           + (" (the candidate was stopped early)" if stopped else ""))
    return (f"no items: suite {suite.name!r} has a quality margin but no pairs to test it on ({why}); "
            f"nothing shows the candidate's quality there")


def timed_pairs(pairs) -> list:
    """Pairs a speed comparison may use: both sides generated, the baseline timed in this run
    (a reused baseline row's timing is from another day, another machine load), and where any
    baseline row was reused, only the stratified speed sample (harness.run.speed_sample)."""
    from harness.run.speed_sample import rests_on
    keep = {id(r) for r in rests_on([p.baseline for p in pairs])}
    return [p for p in pairs if p.candidate.get("tokens") and id(p.baseline) in keep]


def speed_basis(timed, pairs) -> dict:
    """Which items a speedup rests on, for the report: how many per suite, and whether they are
    every pair or the stratified sample timed beside the candidate."""
    from harness.run.speed_sample import composition
    sampled = any(p.baseline.get("reused") for p in pairs)
    return {"n": len(timed), "of": len(pairs), "by_suite": composition([p.baseline for p in timed]),
            "basis": "stratified sample (the rest of the baseline came from the store)" if sampled
            else "every pair (the whole baseline was generated in this run)"}


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
    sets = looks.look_sets(plan, looks.item_order(suite, config.profile.subset), looks.ungradable(pairs))
    if sets is None:
        return None
    return _plain(looks.evaluate(plan, sets, graded, margin, config.gates.alpha))


def acceptance_by_temperature(pairs, rng) -> dict:
    """{temperature: {"all": α/τ summary, "by_category": {...}}} over the pairs that drafted:
    "temperature effects" (does acceptance move with temperature?)."""
    out = {}
    for t in sorted({p.key.temperature for p in pairs}):
        mine = [p for p in pairs if p.key.temperature == t and p.candidate.get("stats", {}).get("proposed") is not None
                and p.baseline.get("tokens")]
        if not mine:
            continue
        try:
            out[f"{t:g}"] = {"all": _plain(analysis.acceptance_summary(mine, rng=rng)),
                             "by_category": {g: _plain(a) for g, a in
                                             analysis.acceptance_by_group(mine, by="category", rng=rng).items()}}
        except ValueError as e:
            out[f"{t:g}"] = {"error": str(e)}
    return out


def _header(config: RegressConfig, suites: list, base_rows: list[dict], numerics: dict | None) -> dict:
    """The run's part of the summary: what ran, the near-tie threshold, the baseline's latency."""
    fresh = [r for r in base_rows if r.get("tokens") and not r.get("reused")]
    return {"target": config.target, "profile": config.profile.name, "baseline": config.baseline.name,
            "seeds": list(config.profile.seeds), "temperatures": list(config.profile.temperatures),
            "near_tie_epsilon": near_tie_epsilon(config, numerics),
            "labels": config.labels,
            "suites": {s.name: {"version": s.version, "hash": s.hash, "n_items": len(s.select(config.profile.subset))}
                       for s in suites},
            "baseline_latency": step(analysis.latency_summary, fresh) if fresh else None,
            "candidates": {}}


def _pairs(spec, base_rows: list[dict], rows: list[dict], stops: list[dict]) -> tuple[list, list[dict]]:
    """The candidate's pairs with the baseline, and the baseline rows it is paired against: where
    the runner stopped it early, only the items it ran."""
    mine = [r for r in base_rows if spec.suites is None or r["suite"] in spec.suites]
    if stops:
        cut = {st["suite"] for st in stops}
        ran = {(r["suite"], r["item_id"], r["seed"], r["temperature"]) for r in rows}
        mine = [r for r in mine if not ({"*", r["suite"]} & cut)
                or (r["suite"], r["item_id"], r["seed"], r["temperature"]) in ran]
    # Nothing on either side (every suite empty): no pairs, which the gates fail by suite
    # ("no items"); records on one side only are a pairing error, raised.
    return (analysis.pair_records(mine, rows) if mine or rows else []), mine


def _suites(config: RegressConfig, spec, suites: list, pairs, rng, head: float, eps, stopped: bool) -> dict:
    per_suite = {}
    for suite in suites:
        ps = [p for p in pairs if p.key.suite == suite.name]
        if ps:
            per_suite[suite.name] = candidate_suite_summary(ps, spec, config.suites[suite.name], config, rng, head,
                                                            eps=eps)
            seq = _sequential(config, spec, suite, ps)
            if seq and "quality" in per_suite[suite.name]:
                per_suite[suite.name]["quality"]["sequential"] = seq
        elif suite.name in gated_suites(config, spec):
            # A gated suite that yielded nothing must not drop out of the verdict silently.
            per_suite[suite.name] = {"n_pairs": 0, "no_items": no_items(config, suite, stopped)}
    return per_suite


def _acceptance(cand: dict, spec, pairs, rng) -> None:
    """α and τ of a drafting candidate: greedy overall and by category, and by temperature."""
    if not (spec.decoder == "speculative" or any(p.candidate.get("stats", {}).get("proposed") for p in pairs)):
        return
    greedy = [p for p in pairs if p.key.temperature == 0 and p.candidate.get("stats", {}).get("proposed")
              and p.baseline.get("tokens")]
    if greedy:
        try:
            cand["acceptance"] = _plain(analysis.acceptance_summary(greedy, rng=rng))
            cand["acceptance_by_category"] = {
                g: _plain(a) for g, a in analysis.acceptance_by_group(greedy, by="category", rng=rng).items()}
        except ValueError as e:  # telemetry too thin for the statistics (e.g. no draft length)
            cand["acceptance"] = {"error": str(e)}
    by_temp = acceptance_by_temperature(pairs, rng)
    if len(by_temp) > 1 or any(t != "0" for t in by_temp):
        cand["acceptance_by_temperature"] = by_temp


def _candidate(config: RegressConfig, spec, pairs, rows: list[dict], mine: list[dict], per_suite: dict,
               stops: list[dict], exactness: dict | None, head: float, rng) -> dict:
    """One candidate's summary, from its pairs and its suites' summaries (the rng's draws in the
    order they always were: speedup, then acceptance)."""
    cand = {"decoder": spec.decoder, "kind": spec.kind, "options": spec.options,
            "target": spec.target or config.target, "labels": spec.labels, "min_speedup": spec.min_speedup,
            "suites": per_suite}
    if stops:
        cand["stopped"] = stops
    timed = timed_pairs(pairs)
    if timed:
        cand["speedup"] = step(analysis.paired_speedup, timed, rng=rng, alpha=config.gates.alpha, suite=pairs)
        cand["speedup"]["rests_on"] = speed_basis(timed, pairs)
    if any(p.candidate.get("tokens") for p in pairs):
        cand["latency"] = step(analysis.latency_summary, [p.candidate for p in pairs if p.candidate.get("tokens")])
    _acceptance(cand, spec, pairs, rng)
    if spec.decoder == "early-exit":
        cand["exits"] = exits_step([p.candidate for p in pairs], head)
    if exactness and spec.name in exactness:
        cand["exactness"] = _plain(exactness[spec.name])
    cand["exactness_expected"] = spec.decoder == "speculative" and spec.options.get("verify") == "rejection"
    if isinstance(spec.options.get("engine"), str) and spec.kind == "exact":
        # An exact engine's sampled records must have been tested (harness/run/engine_exactness.py).
        cand["sampled_records"] = sum(1 for r in rows if r.get("temperature", 0) > 0 and r.get("tokens"))
    if any(r.get("compare_on") == "text" for r in rows + mine):
        # An engine that returns text only: identity is judged on our tokenization of its text,
        # and no near-tie forensics are possible (it gave no logprobs tied to token ids).
        cand["compare_on"] = "text"
    cand["metrics"] = headline_metrics(cand)
    return cand


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
    summary = _header(config, suites, base_rows, numerics)
    for spec in config.candidates:
        rows = by_cand.get(spec.name, [])
        my_stops = [st for st in stops or () if st["candidate"] == spec.name]
        pairs, mine = _pairs(spec, base_rows, rows, my_stops)
        head = (lm_head_cost or {}).get(spec.name, 0.0)
        per_suite = _suites(config, spec, suites, pairs, rng, head, summary["near_tie_epsilon"]["value"],
                            bool(my_stops))
        summary["candidates"][spec.name] = _candidate(config, spec, pairs, rows, mine, per_suite, my_stops,
                                                      exactness, head, rng)
    return summary


def headline_metrics(cand: dict) -> dict:
    """The numbers worth a dashboard: what MLflow gets as metrics."""
    m: dict = {}

    def ok(part: dict, step: str) -> bool:  # present and not a step that lacked data
        return step in part and not part[step].get("error")

    if ok(cand, "speedup"):
        sp = cand["speedup"]
        m["speedup"] = sp["statistic"]
        m["speedup_ci_low"], m["speedup_ci_high"] = sp["ci_low"], sp["ci_high"]
        m["speedup_lower_bound"] = sp.get("lower_bound")
        m["speedup_prompt_median"] = sp.get("median_prompt_speedup")
        m["share_prompts_slower"] = sp.get("share_prompts_slower")
    if ok(cand, "latency"):
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
        m["decode_speedup"] = (a.get("achieved_decode") or {}).get("statistic")  # what the theory is held to
    if ok(cand, "exits"):
        m["avg_layers"] = cand["exits"]["mean_layers"]
        m["exit_theoretical_speedup"] = cand["exits"]["theoretical_speedup"]
    for suite, s in cand["suites"].items():
        m.update(_suite_metrics(suite, s))
    if "exactness" in cand:
        ex = cand["exactness"]
        m["exactness_min_pvalue"] = min((e["pvalue"] for e in ex.get("tests", []) if e.get("pvalue") is not None),
                                        default=None)
        for subset, res in ((ex.get("pit") or {}).get("subsets") or {}).items():
            m[f"exactness_pit_{subset}_pvalue"] = res.get("pvalue")
            m[f"exactness_pit_{subset}_tokens"] = res.get("n")
            m[f"exactness_pit_{subset}_detectable_tv"] = res.get("detectable_tv")
        for control in ("control", "draft_control"):  # the reference's own checks (harness/run/exactness.py)
            res = (ex.get("pit") or {}).get(control) or {}
            m[f"exactness_{control}_pvalue"] = res.get("pvalue")
            m[f"exactness_{control}_impossible"] = res.get("impossible")
    return {k: v for k, v in m.items() if isinstance(v, (int, float))}


def _suite_metrics(suite: str, s: dict) -> dict:
    """One suite's metrics, named SUITE.METRIC."""
    m: dict = {}
    for t, ident in s.get("identity", {}).items():
        if not ident.get("n"):  # every pair errored: identity was not measured, which is not 0 divergences
            continue
        m[f"{suite}.identity.{t}"] = ident["rate"]
        m[f"{suite}.real_divergences.{t}"] = ident["real_divergences"]
    if "quality" in s:
        q = s["quality"]
        m[f"{suite}.quality_delta"] = q["statistic"]
        m[f"{suite}.quality_delta_ci_low"], m[f"{suite}.quality_delta_ci_high"] = q["ci_low"], q["ci_high"]
        m[f"{suite}.quality_pvalue"] = q["pvalue"]
        m[f"{suite}.ni_pvalue"] = q["non_inferiority"]["pvalue"]
        m[f"{suite}.baseline_pass_rate"], m[f"{suite}.candidate_pass_rate"] = q["baseline_mean"], q["candidate_mean"]
    if "speedup" in s and not s["speedup"].get("error"):
        m[f"{suite}.speedup"] = s["speedup"]["statistic"]
    if s.get("grade_errors"):
        m[f"{suite}.grade_errors"] = s["grade_errors"]["n"]
    return m
