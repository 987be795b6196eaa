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
  has identical grades by construction; its quality gate passes without a test.
- Identity (exact candidates): every greedy divergence and every coupled-sampling divergence
  must be a numerical near-tie. A sampled identity check needs two seeds, one not 0 (a decoder
  that ignores the seed passes at seed 0 alone): with fewer it warns.
- Exactness (rejection sampling): the sequential PIT tests over the sampled tokens and the
  goodness-of-fit windows, Bonferroni at `gates.exactness_pvalue` over those that ran; a token
  of target probability 0 fails outright; a check in which the verifier never rejected a draft
  shows nothing and is inconclusive; a check the baseline itself fails says the numerics, not
  the candidate, are off (inconclusive).
- Speed (`min_speedup`): the one-sided (1 - alpha) lower bound of the speedup (bootstrap over
  prompts) must reach the minimum; the point estimate alone is a coin flip at the threshold.
"""
from __future__ import annotations

from dataclasses import dataclass

from analysis.paired import below, loss_upper_bound
from harness.config import Gates, sampled_identity_applies
from harness.verdict.floor import gate_detail as floor_gate


@dataclass(frozen=True)
class GateResult:
    name: str
    status: str         # "pass", "fail", or "warn" (does not fail the run)
    detail: str


@dataclass(frozen=True)
class Decision:
    passed: bool
    results: tuple[GateResult, ...]

    @property
    def failures(self) -> list[GateResult]:
        return [r for r in self.results if r.status == "fail"]


def _pct(level: float) -> str:
    """0.95 -> '95%', 1 - 0.05/3 -> '98.3%'."""
    return f"{100 * level:.3g}%"


def _inconclusive(gates: Gates) -> str:
    return "fail" if gates.inconclusive == "fail" else "warn"


# ----------------------------------------------------------------------------------- identity


def _identity_gates(cand: dict, check_sampled: bool) -> list[GateResult]:
    out = []
    for suite, s in cand["suites"].items():
        for t, ident in s.get("identity", {}).items():
            if t != "T=0" and not check_sampled:
                continue
            name = f"identity {suite} {t}"
            judged = floor_gate(ident)  # an engine's nonzero A/A floor decides (harness.verdict.floor)
            if judged is not None:
                out.append(GateResult(name, "fail" if judged[0] else "pass", judged[1]))
                continue
            real = [d for d in ident["divergences"] if d["kind"] not in ("near-tie", "within-floor")]
            if real:
                first = real[0]
                out.append(GateResult(name, "fail", f"{len(real)} real divergence(s) of {ident['n']}; first: item "
                                      f"{first['item_id']} at token {first['position']}, baseline margin "
                                      f"{first['margin'] if first['margin'] is not None else 'n/a'}"))
            else:
                out.append(GateResult(name, "pass", f"{ident['identical']}/{ident['n']} identical, "
                                      f"{ident['near_ties']} near-tie divergence(s)"))
    return out


def _seed_gates(cand: dict) -> list[GateResult]:
    seeds = sorted({s for suite in cand["suites"].values() for t, ident in suite.get("identity", {}).items()
                    if t != "T=0" for s in ident.get("seeds", [])})
    if not seeds or (len(seeds) >= 2 and any(s != 0 for s in seeds)):
        return []
    return [GateResult("seeds", "warn", f"sampled identity checked at seed(s) {seeds} only: a decoder that ignores "
                       f"the request's seed would pass; give the profile two seeds, one not 0")]


# ------------------------------------------------------------------------------------ quality


def _sequential_detail(q: dict, gates: Gates) -> tuple[str, str]:
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
        return "inconclusive", (f"inconclusive: stopped at {at} before a decision (the candidate was stopped "
                                f"elsewhere); z {last['z_ni']:.2f} < boundary {last['ni_bound']:.2f}")
    need = q.get("n_needed")
    need_s = f"; about {need} items would decide with 80% power if nothing changed (fixed design)" if need else ""
    return "inconclusive", (f"inconclusive at the last {at}: neither non-inferior (z {last['z_ni']:.2f} < "
                            f"{last['ni_bound']:.2f}) nor worse (loss z {last['z_loss']:.2f} < "
                            f"{last['loss_bound']:.2f}){need_s}")


def _quality_detail(q: dict, gates: Gates, worse_level: float) -> tuple[str, str, float]:
    """(verdict, detail, upper bound) of one suite."""
    if q.get("sequential"):
        verdict, detail = _sequential_detail(q, gates)
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
                            f"({upper_s} >= 0); {need_s}; {head}"), upper


def _quality_gates(cand: dict, gates: Gates) -> list[GateResult]:
    quality = {suite: s["quality"] for suite, s in cand["suites"].items() if "quality" in s}
    if not quality:
        return []
    worse_level = gates.alpha / len(quality)
    out = []
    for suite, q in quality.items():
        verdict, detail, _ = _quality_detail(q, gates, worse_level)
        status = {"pass": "pass", "worse": "fail"}.get(verdict, _inconclusive(gates))
        out.append(GateResult("refusal behaviour" if suite == "refusal" else f"quality {suite}", status, detail))
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


def _exactness_gates(cand: dict, gates: Gates) -> list[GateResult]:
    ex = cand.get("exactness") or {}
    checks = _exactness_checks(ex)
    if not checks:
        if cand.get("exactness_expected"):
            return [GateResult("exactness", "warn", "rejection sampling was not tested: the profile has no "
                               "temperature > 0 on a sampled suite")]
        return []
    tested = [c for _, c in checks if c.get("pvalue") is not None]
    level = gates.exactness_pvalue / max(len(tested), 1)  # Bonferroni over the checks that ran
    exercised = sum(int(c.get("rejected") or 0) for _, c in checks)
    control = (ex.get("pit") or {}).get("control")
    control_bad = control is not None and control.get("pvalue") is not None and control["pvalue"] < level
    out = []
    for name, c in checks:
        counts = f"{c.get('proposed', 0)} draft tokens proposed, {c.get('rejected', 0)} rejected"
        n = c.get("n", 0)
        if c.get("impossible"):
            out.append(GateResult(name, "fail", f"{c['impossible']} sampled token(s) have probability 0 under the "
                                  f"distribution they must follow (p = 0); {n} tokens, {counts}"))
            continue
        if c.get("pvalue") is None:
            # A window without drafts is uninformative; it fails only where nothing else exercised the verifier.
            status = "warn" if exercised else _inconclusive(gates)
            out.append(GateResult(name, status, f"inconclusive: {c.get('note', 'too few samples')}; {counts}"))
            continue
        detect = c.get("detectable_tv")
        detect_s = (f"; could detect a top-two distortion of TV >= {detect:.3f} with 80% power" if detect
                    else "; too few samples to detect any top-two distortion with 80% power")
        desc = f"p={c['pvalue']:.3g} vs {level:.3g} ({gates.exactness_pvalue:g} over {len(tested)} checks); " \
               f"{n} {'tokens' if 'PIT' in name else 'samples'}, {counts}{detect_s}"
        if c["pvalue"] < level:
            if control_bad and "PIT" in name:
                out.append(GateResult(name, _inconclusive(gates), f"inconclusive: the baseline's own samples fail "
                                      f"the same test (p={control['pvalue']:.3g}): teacher forcing does not reproduce "
                                      f"the sampler (numerics, dtype?); {desc}"))
            else:
                out.append(GateResult(name, "fail", f"not the target's distribution: {desc}"))
        elif not c.get("rejected"):
            status = "warn" if exercised else _inconclusive(gates)
            out.append(GateResult(name, status, f"inconclusive: the verifier rejected no draft here, so a wrong "
                                  f"correction could not show; {desc}"))
        else:
            out.append(GateResult(name, "pass", f"fits: {desc}"))
    if not exercised:
        out.append(GateResult("exactness", _inconclusive(gates), "inconclusive: the verifier rejected no draft in "
                              "any sampled token: its exactness was never put to the test"))
    return out


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
        return [GateResult("speed", "fail", f"speedup {sp['statistic']:.2f}x has no lower bound (one prompt?); "
                           f"minimum {minimum:.2f}x{extra}")]
    ok = bound >= minimum
    return [GateResult("speed", "pass" if ok else "fail",
                       f"one-sided {_pct(level)} lower bound {bound:.2f}x {'>=' if ok else '<'} minimum {minimum:.2f}x "
                       f"(speedup {sp['statistic']:.2f}x, ratio of totals, bootstrap over prompts){extra}")]


# ------------------------------------------------------------------------- acceptance drift


def _acceptance_gates(cand: dict) -> list[GateResult]:
    """`acceptance_reference`: α and τ, overall and per category with enough rounds, must not fall
    below the reference beyond the tolerance with an interval that excludes it (see
    analysis.acceptance_drift: paired bootstrap over prompts, Bonferroni over the comparisons)."""
    drift = cand.get("acceptance_drift")
    if not drift:
        return []
    if drift.get("error"):
        return [GateResult("acceptance drift", "fail", f"against {drift['reference']}: {drift['error']}")]
    tol = drift["tolerance"]
    out = []
    for c in drift["comparisons"]:
        if not c["gated"]:
            continue  # too few rounds on one side (or no interval): reported, not gated
        what = f"{c['quantity']} {c['reference']:.3f} -> {c['candidate']:.3f} ({c['relative_change']:+.1%}"
        if c["upper_bound"] is not None:
            what += f"; one-sided {_pct(c['upper_level'])} upper bound {c['upper_bound']:+.1%}"
        what += f"; {c['n_prompts']} prompts, {c['rounds_candidate']} rounds vs {c['rounds_reference']})"
        name = f"acceptance {c['group']} {c['quantity']}"
        if c["regressed"]:
            out.append(GateResult(name, "fail", f"below the reference {drift['reference']} beyond the "
                                  f"tolerance -{tol:.0%}: {what}"))
        elif c["group"] == "all":
            out.append(GateResult(name, "pass", f"within -{tol:.0%} of {drift['reference']} or not shown "
                                  f"below it: {what}"))
    if not out:
        out.append(GateResult("acceptance drift", "warn", f"not gated: fewer than {drift['min_rounds']} drafting "
                              f"rounds on one side in every group (against {drift['reference']})"))
    return out


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
        results += _identity_gates(cand, check_sampled=sampled)
        if sampled:
            results += _seed_gates(cand)
        results += _exactness_gates(cand, gates)
    results += _quality_gates(cand, gates)
    for suite, s in cand["suites"].items():
        if s.get("quality_identical"):
            results.append(GateResult("refusal behaviour" if suite == "refusal" else f"quality {suite}", "pass",
                                      f"outputs token-identical on all {s['quality_identical']} graded items: "
                                      f"quality unchanged"))
        if s.get("quality_missing"):
            results.append(GateResult(f"quality {suite}", "fail", s["quality_missing"]))
    for st in cand.get("stopped", []):
        if st.get("reason") == "fail-fast":
            results.append(GateResult("fail-fast", "fail", f"stopped early (--fail-fast): {st['detail']}"))
    results += _speed_gate(cand)
    results += _acceptance_gates(cand)
    if not [r for r in results if r.name not in INFORMATIONAL]:
        # A gate that checked nothing must not pass silently (e.g. a lossy candidate on suites
        # without margins, or a profile without greedy runs).
        results.append(GateResult("coverage", "fail", "no gate applied to this candidate: give its suites a "
                                  "quality margin, or run it greedily"))
    return Decision(passed=not any(r.status == "fail" for r in results), results=tuple(results))
