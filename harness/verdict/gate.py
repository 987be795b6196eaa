"""The gate: a pure function from a candidate's analysis summary and thresholds to a decision.

Every verdict says what a test at the stated level showed, and prints the bound it decided on.

- Quality (each suite with a margin): "pass" when the one-sided (1 - alpha) lower bound of the
  delta lies above -margin (non-inferiority). A candidate passes only if every suite does, so
  by the intersection-union principle each suite is tested at alpha with no multiplicity
  correction (the family's false-pass rate stays at alpha). "worse" only from a test of a loss:
  the one-sided upper bound at 1 - alpha/m (Bonferroni over the candidate's m suites, so that
  the chance of calling any suite worse when nothing changed stays at alpha) below 0 (a
  significant loss), or below -margin (a loss larger than the margin). Anything else is
  "inconclusive", with the number of units that would decide; `gates.inconclusive` says whether
  that fails. With `looks = K` in the profile (harness.verdict.looks) the same two tests run at K
  looks against alpha-spending boundaries (analysis.sequential), the first boundary crossed
  decides, and "inconclusive" means no boundary was crossed by the last look.
  An exact candidate whose greedy outputs are token-identical on every graded item
  has identical grades by construction; its quality gate passes without a test. A suite with
  any grade the grading machinery failed to make (a row's `grade_error`: the sandbox could not
  run, a grader raised) is inconclusive on quality, however its test came out (a fail stays a
  fail): such grades are fails on both sides, and two sides failing alike look non-inferior.
- Identity (exact candidates): every greedy divergence and every coupled-sampling divergence
  must be a numerical near-tie. A sampled identity check needs two seeds, one not 0 (a decoder
  that ignores the seed passes at seed 0 alone): with fewer it warns. An engine's divergences
  are judged against its A/A run (harness.verdict.floor): beyond the engine's own margin noise
  they fail, within it a tolerance on the excess rate over the A/A run's decides (with its
  plan's power), and an invalid A/A run makes them inconclusive.
- Exactness (rejection sampling): the sequential PIT tests over the sampled tokens and the
  goodness-of-fit windows, Bonferroni at `gates.exactness_pvalue` over those that ran; a token
  of target probability 0 fails outright; a check in which the verifier never rejected a draft
  shows nothing and is inconclusive, and so is one without a p-value where drafts were rejected.
  The reference is independent of the decoders (transformers' warpers) and has two controls, in
  the same Bonferroni family: the baseline's own samples failing it fails the run, naming the
  harness's sampler, and excuses a candidate's failing PIT check only where the candidate is no
  further from the reference (`deviation`) than the baseline; a model draft's proposals not
  explained by the rebuilt q make the residual test inconclusive (the reference is broken).
- Speed (`min_speedup`): the one-sided (1 - alpha) lower bound of the speedup (skew-corrected
  jackknife over prompts, analysis.latency) must reach the minimum; the point estimate alone is a
  coin flip at the threshold. Fewer prompts than the bound needs give no bound: inconclusive.
- Missing evidence fails: a gated suite without pairs ("no items"), a summary step the records
  could not support ("analysis <step>"), a `min_speedup` without a timed pair, and a lossy
  candidate without any quality test, whatever its speed.
"""
from __future__ import annotations

import math

from analysis.acceptance_drift import MIN_PROMPTS
from analysis.latency import MIN_PROMPTS as SPEED_MIN_PROMPTS
from analysis.paired import below, loss_upper_bound, sign_sample_size
from harness.config import Gates, sampled_identity_applies
from harness.run.faults import BROKEN
from harness.verdict import engine_exactness
from harness.verdict.floor import gate_detail as floor_gate
from harness.verdict.results import (Decision, GateResult, evidence as _evidence, failed as _failed, inconclusive_status,
                                     needed)


def _pct(level: float) -> str:
    """0.95 -> '95%', 1 - 0.05/3 -> '98.3%'."""
    return f"{100 * level:.3g}%"


def _inconclusive(gates: Gates) -> str:
    return inconclusive_status(gates)


# ----------------------------------------------------------------------------------- identity


def _identity_gates(cand: dict, check_sampled: bool, gates: Gates | None = None) -> list[GateResult]:
    out = []
    for suite, s in cand["suites"].items():
        for t, ident in s.get("identity", {}).items():
            if t != "T=0" and not check_sampled:
                continue
            name = f"identity {suite} {t}"
            if not ident["n"]:
                out.append(GateResult(name, _inconclusive(gates or Gates()), f"inconclusive: all {ident.get('errored', 0)} "
                                      f"pair(s) errored on one side or both; nothing shows identity"))
                continue
            errored = f"; {ident['errored']} errored pair(s) left out" if ident.get("errored") else ""
            judged = floor_gate(ident)  # an engine's A/A floor decides (harness.verdict.floor)
            if judged is not None:
                status = _inconclusive(gates or Gates()) if judged[0] == "inconclusive" else judged[0]
                out.append(GateResult(name, status, judged[1]))
                continue
            real = [d for d in ident["divergences"] if d["kind"] not in ("near-tie", "within-floor")]
            if real:
                first = real[0]
                out.append(GateResult(name, "fail", f"{len(real)} real divergence(s) of {ident['n']}; first: item "
                                      f"{first['item_id']} at token {first['position']}, baseline margin "
                                      f"{first['margin'] if first['margin'] is not None else 'n/a'}{errored}"))
            else:
                out.append(GateResult(name, "pass", f"{ident['identical']}/{ident['n']} identical, "
                                      f"{ident['near_ties']} near-tie divergence(s){errored}"))
    return out


def _seed_gates(cand: dict) -> list[GateResult]:
    seeds = sorted({s for suite in cand["suites"].values() for t, ident in suite.get("identity", {}).items()
                    if t != "T=0" for s in ident.get("seeds", [])})
    if not seeds or (len(seeds) >= 2 and any(s != 0 for s in seeds)):
        return []
    return [GateResult("seeds", "warn", f"sampled identity checked at seed(s) {seeds} only: a decoder that ignores "
                       f"the request's seed would pass; give the profile two seeds, one not 0")]


# ------------------------------------------------------------------------------------ quality


def _sequential_detail(q: dict, gates: Gates, stopped: list) -> tuple[str, str]:
    """(verdict, detail) of a suite under a group-sequential plan (harness.verdict.looks): the
    first look whose boundary was crossed decides; none crossed by the last look: inconclusive."""
    seq = q["sequential"]
    margin = q["non_inferiority"]["margin"]
    plan = f"{seq['of']} looks, {seq['spending']} spending, overall one-sided level {seq['alpha']:g}"
    if not seq["looks"]:
        return "inconclusive", f"inconclusive: the first look ({plan}) was not reached; n={q['n']}"
    last = seq["looks"][-1]
    at = f"look {seq['look']} of {seq['of']} (n={last['n']}, delta {last['delta']:+.3f}; {plan})"
    lower = (f"; repeated lower bound {last['lower_bound']:+.3f}" if last.get("lower_bound") is not None else "")
    if seq["decided"] == "non-inferior":
        return "pass", (f"non-inferior at {at}: z {last['z_ni']:.2f} >= boundary {last['ni_bound']:.2f}{lower} "
                        f"> -{margin:.2f}")
    if seq["decided"] == "worse":
        return "worse", (f"worse at {at}: loss z {last['z_loss']:.2f} >= boundary {last['loss_bound']:.2f} (a "
                         f"significant loss at {seq['loss_alpha']:.3g}), non-inferiority not shown "
                         f"(z {last['z_ni']:.2f} < {last['ni_bound']:.2f})")
    if seq["look"] < seq["of"]:
        # "stopped" only where a stop row says so (a look not reached for want of pairs is not a stop)
        why = ("the candidate was stopped elsewhere: " + "; ".join(st["detail"] for st in stopped) if stopped
               else f"look {seq['look'] + 1} was not reached: some of its items have no pair")
        return "inconclusive", (f"inconclusive: no decision by {at} ({why}); z {last['z_ni']:.2f} < boundary "
                                f"{last['ni_bound']:.2f}")
    need = q.get("n_needed")
    need_s = f"; about {need} items would decide with 80% power if nothing changed (fixed design)" if need else ""
    return "inconclusive", (f"inconclusive at the last {at}: neither non-inferior (z {last['z_ni']:.2f} < "
                            f"{last['ni_bound']:.2f}) nor worse (loss z {last['z_loss']:.2f} < "
                            f"{last['loss_bound']:.2f}){need_s}")


def _quality_detail(q: dict, gates: Gates, worse_level: float, stopped: list = ()) -> tuple[str, str, float]:
    """(verdict, detail, upper bound) of one suite; `stopped`: the candidate's stop rows for it."""
    if q.get("sequential"):
        verdict, detail = _sequential_detail(q, gates, list(stopped))
        return verdict, detail, float("nan")
    ni = q["non_inferiority"]
    margin = ni["margin"]
    unit = "prompts" if q.get("unit") == "prompt" else "pairs"
    upper = loss_upper_bound(method=ni["method"], level=1 - worse_level, n=q["n"], wins=q.get("wins"),
                             losses=q.get("losses"), mean=q["statistic"], sd=q.get("sd"))
    head = (f"pass rate {q['baseline_mean']:.3f} -> {q['candidate_mean']:.3f}, delta {q['statistic']:+.3f}, "
            f"n={q['n']} {unit}")
    lower_s = f"one-sided {_pct(1 - gates.alpha)} lower bound {ni['lower_bound']:+.3f}"
    upper_s = f"one-sided {_pct(1 - worse_level)} upper bound {upper:+.3f}"
    if not math.isfinite(upper):
        # Differences without spread (analysis.paired.loss_upper_bound): only the exact sign test holds.
        upper_s = (f"no one-sided {_pct(1 - worse_level)} upper bound: {q['n']} {unit} that all changed alike are "
                   f"too few for the exact sign test, which needs {sign_sample_size(worse_level)}")
    if ni["passed"]:
        detail = f"non-inferior: {lower_s} > -{margin:.2f}; {head}"
        if below(upper, 0.0):
            detail += f"; a significant loss within the margin ({upper_s} < 0)"
        return "pass", detail, upper
    if below(upper, 0.0):
        beyond = below(upper, -margin)
        what = (f"loss larger than the margin: {upper_s} < -{margin:.2f}" if beyond
                else f"significant loss: {upper_s} < 0")
        return "worse", f"worse, {what}; non-inferiority not shown ({lower_s} <= -{margin:.2f}); {head}", upper
    need = q.get("n_needed")
    need_s = "no n decides it: the loss is at the margin"
    if need is not None:
        need_s = (f"about {need} {unit} would show non-inferiority with 80% power if nothing changed"
                  + (f" (at the observed discordance {(q['wins'] + q['losses']) / q['n']:.0%})"
                     if q.get("wins") is not None else ""))
        obs = q.get("n_needed_observed")
        if q["statistic"] < 0 and obs != need:
            need_s += (f", {obs} if the observed delta is real" if obs is not None
                       else "; none if the observed delta is real")
    return "inconclusive", (f"inconclusive: neither non-inferior ({lower_s} <= -{margin:.2f}) nor worse "
                            f"({upper_s}{' >= 0' if math.isfinite(upper) else ''}); {need_s}; {head}"), upper


def _grade_errors(s: dict) -> str | None:
    """What a suite's grade errors (harness.verdict.summary.grade_errors) leave unknown, or None."""
    e = s.get("grade_errors")
    if not e:
        return None
    return (f"{e['n']} grade(s) measured nothing: the grading machinery failed, not the completion "
            f"({e['baseline']} baseline, {e['candidate']} candidate row(s)); first: {e['first']}")


def _unless_grade_errors(result: GateResult, s: dict, gates: Gates) -> GateResult:
    """A suite's quality result where some grades are machinery failures, scored as fails on
    both sides: two sides failing alike look non-inferior, so nothing but a loss stands (a fail
    stays a fail); anything else is inconclusive."""
    why = _grade_errors(s)
    if why is None:
        return result
    if result.status == "fail":
        return GateResult(result.name, "fail", f"{result.detail}; and {why}")
    return GateResult(result.name, _inconclusive(gates), f"inconclusive: {why}; fix the grader (the suite's "
                      f"grader options, the sandbox) and run again; the test on these grades: {result.detail}")


def _quality_gates(cand: dict, gates: Gates) -> list[GateResult]:
    quality = {suite: s["quality"] for suite, s in cand["suites"].items() if "quality" in s}
    if not quality:
        return []
    worse_level = gates.alpha / len(quality)
    out = []
    for suite, q in quality.items():
        stops = [st for st in cand.get("stopped", []) if st.get("suite") in ("*", suite)]
        verdict, detail, _ = _quality_detail(q, gates, worse_level, stops)
        status = {"pass": "pass", "worse": "fail"}.get(verdict, _inconclusive(gates))
        out.append(_unless_grade_errors(GateResult(_quality_name(suite), status, detail), cand["suites"][suite], gates))
    return out


# ---------------------------------------------------------------------------------- exactness


def _sampled_identity_applies(cand: dict) -> bool:
    return sampled_identity_applies(cand["decoder"], cand.get("options", {}))


def _exactness_checks(ex: dict) -> list[tuple[str, dict]]:
    """(gate name, check) for every PIT subset and goodness-of-fit window."""
    checks = []
    pit = ex.get("pit") or {}
    for subset, res in (pit.get("subsets") or {}).items():
        checks.append((f"exactness PIT {subset}", res))
    for test in ex.get("tests", []):
        checks.append((f"exactness {test['item_id']}@{test.get('offset', 0)} T={test['temperature']:g}", test))
    return checks


def _rejections(ex: dict) -> int:
    """The draft tokens the run's verifier rejected, each once. Every PIT subset carries the run's
    total over the sampled records and the window samples together (harness/run/exactness.py), so
    it is that total; summing the checks counted it once per subset and the windows twice (5 real
    rejections read 17). Without a PIT subset, the windows' own counts add up."""
    subsets = (ex.get("pit") or {}).get("subsets") or {}
    if subsets:
        return max(int(c.get("rejected") or 0) for c in subsets.values())
    return sum(int(t.get("rejected") or 0) for t in ex.get("tests", []))


def _control_gates(pit: dict, level: float, gates: Gates) -> list[GateResult]:
    """The two controls of the reference itself (harness/run/exactness.py): the baseline's own
    samples, and a model draft's proposals under the rebuilt q."""
    out = []
    control, draft = pit.get("control"), pit.get("draft_control")
    ref = pit.get("reference", "the independent reference")
    if _failed(control, level):
        # The baseline samples with decoders.sampling, which every candidate shares: a bug there is
        # a bug of the harness's sampler, and the reference was built without it.
        out.append(GateResult("exactness control", "fail", f"the harness's sampler is wrong: the baseline's own "
                              f"samples fail against the independent reference ({ref}): {_evidence(control, level)}. "
                              f"decoders.sampling shapes (temperature, top-k, top-p) what the baseline and every "
                              f"candidate sample from, so no candidate is judged exact against it; fix the sampler "
                              f"(or the numerics, if the decode steps differ from teacher forcing)"))
    elif control is not None and control.get("pvalue") is None:
        out.append(GateResult("exactness control", _inconclusive(gates), f"inconclusive: the baseline's own samples "
                              f"could not check the sampler against the reference: {control.get('note') or 'too few tokens'}"))
    elif control is not None:
        out.append(GateResult("exactness control", "pass", f"the baseline's own samples follow the reference: "
                              f"p={control['pvalue']:.3g} vs {level:.3g} over {control.get('n', 0)} tokens"))
    if _failed(draft, level):
        out.append(GateResult("exactness draft control", _inconclusive(gates), f"inconclusive: the reference is broken, "
                              f"not shown wrong: the draft's q rebuilt by replay does not explain the draft's own "
                              f"proposals ({_evidence(draft, level)}), so the residual test at rejections cannot be "
                              f"read; {draft.get('what', '')}"))
    elif draft is not None and draft.get("pvalue") is not None:
        out.append(GateResult("exactness draft control", "pass", f"the rebuilt draft q explains its proposals: "
                              f"p={draft['pvalue']:.3g} vs {level:.3g}, {draft.get('n', 0)} proposals, none of q = 0"))
    return out


def _exactness_gates(cand: dict, gates: Gates) -> list[GateResult]:
    ex = cand.get("exactness") or {}
    if ex.get("engine") or cand.get("sampled_records"):
        # An exact engine's sampled tokens (harness/run/engine_exactness.py), tested or not.
        return engine_exactness.gates(cand, gates)
    checks = _exactness_checks(ex)
    if not checks:
        if cand.get("exactness_expected"):
            return [GateResult("exactness", "warn", "rejection sampling was not tested: the profile has no "
                               "temperature > 0 on a sampled suite")]
        return []
    pit = ex.get("pit") or {}
    control, draft = pit.get("control"), pit.get("draft_control")
    tested = [c for _, c in checks if c.get("pvalue") is not None]
    family = len(tested) + sum(c is not None and c.get("pvalue") is not None for c in (control, draft))
    level = gates.exactness_pvalue / max(family, 1)  # Bonferroni over the checks and controls that ran
    exercised = _rejections(ex)
    out = _control_gates(pit, level, gates)
    for name, c in checks:
        out.append(_check_gate(name, c, control, level, gates, family=family, exercised=exercised,
                               control_bad=_failed(control, level), draft_bad=_failed(draft, level)))
    return out + _exercised_gates(tested, exercised, gates)


def _check_gate(name: str, c: dict, control: dict | None, level: float, gates: Gates, *, family: int,
                exercised: int, control_bad: bool, draft_bad: bool) -> GateResult:
    """One exactness check of the in-process rejection verifier (a PIT or a window's fit)."""
    counts = f"{c.get('proposed', 0)} draft tokens proposed, {c.get('rejected', 0)} rejected"
    n = c.get("n", 0)
    failed = _failed(c, level)
    if failed and draft_bad and name == "exactness PIT rejected":
        seen = (f"{c['impossible']} correction(s) outside the residual's support" if c.get("impossible")
                else f"p={c['pvalue']:.3g}")
        return GateResult(name, _inconclusive(gates), f"inconclusive: its residual rests on the rebuilt draft q, "
                          f"which the draft control shows broken ({seen}, {n} tokens); {counts}")
    against = ""
    if failed and control_bad and "PIT" in name:
        # The shared sampler is wrong (exactness control): the candidate is excused only where it is
        # no further from the reference than the baseline's own samples.
        mine, theirs = c.get("deviation"), control.get("deviation")
        if mine is not None and theirs is not None and mine <= theirs:
            return GateResult(name, _inconclusive(gates), f"inconclusive: fails ({_evidence(c, level)}), but no "
                              f"further from the reference than the baseline's own samples (deviation {mine:.3f} "
                              f"<= {theirs:.3f}): the harness's sampler is at fault; {counts}")
        against = (f"; further from the reference than the baseline's own samples (deviation {mine:.3f} > "
                   f"{theirs:.3f})" if mine is not None and theirs is not None else
                   "; its deviation cannot be set against the baseline's")
    if c.get("impossible"):
        return GateResult(name, "fail", f"{c['impossible']} sampled token(s) have probability 0 under the "
                          f"distribution they must follow (p = 0); {n} tokens, {counts}{against}")
    if c.get("pvalue") is None:
        # No p-value where drafts were rejected, samples failed or windows are missing is missing
        # evidence; a window without drafts is uninformative, and fails only where nothing else
        # exercised the verifier.
        missing = c.get("rejected") or c.get("errors") or c.get("shortfall")
        status = _inconclusive(gates) if missing or not exercised else "warn"
        more = f"; {needed(c)}" if needed(c) else ""
        return GateResult(name, status, f"inconclusive: no p-value: {c.get('note', 'too few samples')}; {counts}{more}")
    detect = c.get("detectable_tv")
    detect_s = (f"; could detect a top-two distortion of TV >= {detect:.3f} with 80% power" if detect
                else "; too few samples to detect any top-two distortion with 80% power")
    desc = f"p={c['pvalue']:.3g} vs {level:.3g} ({gates.exactness_pvalue:g} over {family} checks); " \
           f"{n} {'tokens' if 'PIT' in name else 'samples'}, {counts}{detect_s}"
    if failed:
        return GateResult(name, "fail", f"not the target's distribution: {desc}{against}")
    if not c.get("rejected"):
        return GateResult(name, "warn" if exercised else _inconclusive(gates), f"inconclusive: the verifier "
                          f"rejected no draft here, so a wrong correction could not show; {desc}")
    if not detect:  # could not have failed; the candidate's verdict rests on the checks that could
        more = f"; {needed(c)}" if needed(c) else ""
        return GateResult(name, "warn", f"inconclusive: fits, but could not have failed: {desc}{more}")
    return GateResult(name, "pass", f"fits: {desc}")


def _exercised_gates(tested: list[dict], exercised: int, gates: Gates) -> list[GateResult]:
    """Whether any check put the verifier to the test: rejections, a p-value, and the power to see."""
    if not exercised:
        return [GateResult("exactness", _inconclusive(gates), "inconclusive: the verifier rejected no draft in "
                           "any sampled token: its exactness was never put to the test")]
    if not tested:
        return [GateResult("exactness", _inconclusive(gates), f"inconclusive: no exactness check yielded a "
                           f"p-value although the verifier rejected {exercised} draft token(s)")]
    if not any(c.get("detectable_tv") and c.get("rejected") for c in tested):
        ways = [needed(c) for c in tested if c.get("rejected") and needed(c)]
        return [GateResult("exactness", _inconclusive(gates), f"inconclusive: no exactness check of a window "
                           f"with rejections was large enough to detect any top-two distortion (TV up to 0.5) "
                           f"with 80% power; {exercised} draft token(s) rejected; "
                           f"{ways[0] + ' ' if ways else ''}(raise exactness_samples, or more prompts and seeds)")]
    return []


# -------------------------------------------------------------------------------------- speed


def _speed_gate(cand: dict) -> list[GateResult]:
    if cand.get("min_speedup") is None or "speedup" not in cand:
        return []
    sp, minimum = cand["speedup"], cand["min_speedup"]
    bound, level = sp.get("lower_bound"), sp.get("lower_bound_level", 0.95)
    extra = ""
    if sp.get("median_prompt_speedup") is not None:
        extra = (f"; per-prompt median {sp['median_prompt_speedup']:.2f}x, "
                 f"{sp['share_prompts_slower']:.0%} of {sp.get('n_prompts', '?')} prompts slower")
    if bound is None:
        n = sp.get("n_prompts") or 0
        spread, limit = sp.get("length_log_sd"), sp.get("length_log_sd_limit")
        if sp.get("no_bound"):  # the suite's speedup from a timed subset (analysis.latency.suite_bounds)
            why = (f"{sp['no_bound']}, of the {sp.get('suite_prompts')} prompts the timed {n} stand for: "
                   "time more of the suite (speed_items)")
        elif n < SPEED_MIN_PROMPTS:
            why = f"{n} prompt(s), fewer than the {SPEED_MIN_PROMPTS} a bound needs"
        elif _finite(spread) and _finite(limit) and spread > limit:
            # analysis.latency.length_log_sd_limit: a rare long tail carries the total, unseen
            why = (f"output lengths spread too widely (log-sd {spread:.2f} over {n} prompts, above {limit:.2f}) "
                   "for a speed bound: cap the budget or run more prompts")
        else:
            why = "prompts whose speedups do not vary: no spread to bound it by"
        return [GateResult("speed", "fail", f"inconclusive: speedup {sp['statistic']:.2f}x has no lower bound ({why}); "
                           f"more prompts decide; minimum {minimum:.2f}x{extra}")]
    ok = bound >= minimum
    return [GateResult("speed", "pass" if ok else "fail",
                       f"one-sided {_pct(level)} lower bound {bound:.2f}x {'>=' if ok else '<'} minimum {minimum:.2f}x "
                       f"(speedup {sp['statistic']:.2f}x, {_speed_method(sp)}){extra}")]


def _speed_method(sp: dict) -> str:
    if sp.get("suite_prompts"):
        return (f"the suite's {sp['suite_prompts']} prompts from {sp.get('n_prompts')} timed, post-stratified on "
                f"the baseline's lengths, stratified jackknife")
    return "ratio of totals, skew-corrected jackknife over prompts"


# ------------------------------------------------------------------------- acceptance drift


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _num(x) -> str:
    return f"{x:.3f}" if _finite(x) else "not computable"


def _acceptance_gates(cand: dict, gates: Gates) -> list[GateResult]:
    """`acceptance_reference`: α and τ, overall and per category with enough rounds, must not fall
    below the reference beyond the tolerance with an interval that excludes it (see
    analysis.acceptance_drift: paired bootstrap over prompts, Bonferroni over the comparisons).
    A candidate that drafts in too few rounds where the reference drafted in enough, on the same
    prompts, is not "not gated": its drafter stopped proposing, and nothing shows it did not regress.
    Fewer than `min_prompts` (5) paired prompts overall is inconclusive: the bootstrap over prompts
    has nothing to resample (categories with as few are reported, not gated)."""
    drift = cand.get("acceptance_drift")
    if not drift:
        return []
    if drift.get("error"):
        return [GateResult("acceptance drift", "fail", f"against {drift['reference']}: {drift['error']}")]
    out = [g for g in (_comparison_gate(c, drift, gates) for c in drift["comparisons"]) if g is not None]
    if not out:
        out.append(GateResult("acceptance drift", "warn", f"not gated: fewer than {drift['min_rounds']} drafting "
                              f"rounds on one side in every group (against {drift['reference']})"))
    return out


def _comparison_gate(c: dict, drift: dict, gates: Gates) -> GateResult | None:
    """One comparison of analysis.acceptance_drift as a gate: failed, passed (overall only) or
    inconclusive where nothing decides; None where it is reported, not gated."""
    tol = drift["tolerance"]
    min_prompts = drift.get("min_prompts", MIN_PROMPTS)
    if (c["group"] == "all" and c["rounds_reference"] >= drift["min_rounds"] > c["rounds_candidate"]):
        return GateResult(f"acceptance all {c['quantity']}", _inconclusive(gates), f"inconclusive: the "
                          f"candidate drafted in {c['rounds_candidate']} round(s) where the reference "
                          f"{drift['reference']} drafted in {c['rounds_reference']} on the same "
                          f"{c['n_prompts']} prompts (fewer than {drift['min_rounds']}): its drafter stopped "
                          f"proposing, so its {c['quantity']} cannot be shown within -{tol:.0%}")
    enough_rounds = min(c["rounds_reference"], c["rounds_candidate"]) >= drift["min_rounds"]
    if c["group"] == "all" and enough_rounds and c["n_prompts"] < min_prompts:
        # A bootstrap over fewer prompts collapses to the point estimate: neither a drop nor its
        # absence is shown (analysis.acceptance_drift.MIN_PROMPTS).
        return GateResult(f"acceptance all {c['quantity']}", _inconclusive(gates), f"inconclusive: "
                          f"{c['quantity']} {_num(c['reference'])} -> {_num(c['candidate'])} on "
                          f"{c['n_prompts']} prompt(s) only: the interval resamples prompts, and fewer than "
                          f"{min_prompts} show nothing against {drift['reference']}; at least {min_prompts} "
                          f"paired prompts would decide")
    if not c["gated"]:
        if c["group"] == "all" and enough_rounds:
            # Enough rounds on both sides, and still no interval: a side's records lack what the
            # quantity is computed from (τ: the target's forwards). Not gated would drop it unseen.
            vals = ", ".join(f"{side} {c[side]:.3f}" if _finite(c[side]) else f"{side} not computable"
                             for side in ("reference", "candidate"))
            return GateResult(f"acceptance all {c['quantity']}", _inconclusive(gates), f"inconclusive: "
                              f"both sides drafted in enough rounds ({c['rounds_reference']} and "
                              f"{c['rounds_candidate']}), but {c['quantity']} could not be compared "
                              f"({vals}): the records lack the counts it is computed from"
                              f"{' (the target forwards per request)' if c['quantity'] == 'tau' else ''}")
        return None  # too few rounds on one side: reported, not gated
    what = f"{c['quantity']} {c['reference']:.3f} -> {c['candidate']:.3f} ({c['relative_change']:+.1%}"
    if c["upper_bound"] is not None:
        what += f"; one-sided {_pct(c['upper_level'])} upper bound {c['upper_bound']:+.1%}"
    what += f"; {c['n_prompts']} prompts, {c['rounds_candidate']} rounds vs {c['rounds_reference']})"
    name = f"acceptance {c['group']} {c['quantity']}"
    if c["regressed"]:
        return GateResult(name, "fail", f"below the reference {drift['reference']} beyond the "
                          f"tolerance -{tol:.0%}: {what}")
    if c["group"] == "all":
        return GateResult(name, "pass", f"within -{tol:.0%} of {drift['reference']} or not shown "
                          f"below it: {what}")
    return None  # a category within the tolerance: reported, not gated


# --------------------------------------------------------------------------- missing evidence

# Summary steps that record {"error": why} when the records cannot support them (harness.verdict.summary).
ANALYSIS_STEPS = ("exits", "acceptance", "latency", "speedup")


def _analysis_gates(cand: dict) -> list[GateResult]:
    """A summary step that lacked data is a failed gate, never a silent gap (nor a crash)."""
    out = []
    places = [("all suites", cand)] + [(f"suite {name}", s) for name, s in cand["suites"].items()]
    for step in ANALYSIS_STEPS:
        for where, part in places:
            res = part.get(step)
            if isinstance(res, dict) and res.get("error"):
                out.append(GateResult(f"analysis {step}", "fail", f"{step} could not be computed ({where}): "
                                      f"{res['error']}"))
    return out


def _quality_name(suite: str) -> str:
    return "refusal behaviour" if suite == "refusal" else f"quality {suite}"


def _is_quality(result: GateResult) -> bool:
    return result.name == "refusal behaviour" or result.name.startswith("quality ")


def _checks_outputs(result: GateResult) -> bool:
    """A gate that looked at whether the candidate's own outputs moved: identity, a test of its
    sampled tokens (not the controls, which test the reference), or quality."""
    if _is_quality(result) or result.name.startswith("identity "):
        return True
    return result.name.startswith("exactness ") and "control" not in result.name


# ----------------------------------------------------------------------------------- decision

# Results that do not count as a gate having checked something.
INFORMATIONAL = ("seeds", "exactness")


def decide(cand: dict, gates: Gates) -> Decision:
    results: list[GateResult] = []
    for side in ("errors", "baseline_errors"):
        errors = [e for s in cand["suites"].values() for e in s.get(side, [])]
        if errors:
            who = "generation(s)" if side == "errors" else "baseline generation(s)"
            results.append(GateResult(side.replace("_", " "), "fail", f"{len(errors)} {who} failed; first: {errors[0]}"))
    if cand["kind"] == "exact":
        sampled = _sampled_identity_applies(cand)
        results += _identity_gates(cand, check_sampled=sampled, gates=gates)
        if sampled:
            results += _seed_gates(cand)
        results += _exactness_gates(cand, gates)
    results += _quality_gates(cand, gates)
    for suite, s in cand["suites"].items():
        if s.get("quality_identical"):
            results.append(_unless_grade_errors(GateResult(
                _quality_name(suite), "pass", f"outputs token-identical on all {s['quality_identical']} graded "
                f"items: quality unchanged"), s, gates))
        if s.get("quality_missing"):
            results.append(GateResult(f"quality {suite}", "fail", s["quality_missing"]))
        if s.get("no_items"):  # a gated suite that yielded no pairs (harness.verdict.summary)
            results.append(GateResult(_quality_name(suite), "fail", s["no_items"]))
    for st in cand.get("stopped", []):
        if st.get("reason") == "fail-fast":
            results.append(GateResult("fail-fast", "fail", f"stopped early (--fail-fast): {st['detail']}"))
        elif st.get("reason") in BROKEN:  # the candidate broke: one list, harness.run.faults
            results.append(GateResult(st["reason"], "fail", st["detail"]))
    sp = cand.get("speedup")
    if cand.get("min_speedup") is not None and (sp is None or sp.get("error")):
        why = sp["error"] if sp else ("no timed pairs: no item has tokens on both sides with the baseline "
                                      "generated in this run")
        results.append(GateResult("speed", "fail", f"minimum {cand['min_speedup']:.2f}x set, but there is no "
                                  f"speedup to hold against it: {why}"))
    else:
        results += _speed_gate(cand)
    results += _acceptance_gates(cand, gates)
    results += _analysis_gates(cand)
    if not [r for r in results if r.name not in INFORMATIONAL]:
        # A gate that checked nothing must not pass silently (e.g. a lossy candidate on suites
        # without margins, or a profile without greedy runs).
        results.append(GateResult("coverage", "fail", "no gate applied to this candidate: give its suites a "
                                  "quality margin, or run it greedily"))
    elif cand["kind"] == "exact" and not any(_checks_outputs(r) for r in results):
        # Speed, acceptance drift or a seed warning say nothing about whether outputs moved.
        results.append(GateResult("coverage", "fail", "no identity, exactness or quality gate applied: nothing "
                                  "checked that this exact candidate's outputs are the baseline's; run it "
                                  "greedily (temperature 0: token identity), or sample it where its "
                                  "distribution is tested, or give its suites a quality margin"))
    elif cand["kind"] == "lossy" and not any(_is_quality(r) for r in results):
        # A lossy decoder changes outputs by design: speed or acceptance cannot stand in for quality.
        results.append(GateResult("quality", "fail", "no quality test: a lossy candidate changes outputs by "
                                  "design, and none of its suites has a quality margin with graded greedy "
                                  "pairs; give one a margin"))
    return Decision(passed=not any(r.status == "fail" for r in results), results=tuple(results))
