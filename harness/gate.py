"""The gate: a pure function from a candidate's analysis summary and thresholds to a decision.

Exact candidates (speculative): every greedy divergence and every coupled-sampling divergence
must be a numerical near-tie; rejection sampling must pass its goodness-of-fit test; quality must
be non-inferior. Lossy candidates (early exit, a quantized target): quality non-inferior within
each suite's margin (the refusal suite is how "refusal behaviour not worse" is checked).
Non-inferiority p-values are Holm-adjusted across the suites a candidate is gated on.
A quality comparison that neither shows non-inferiority nor a significant loss is
"inconclusive" (too few items for the margin): `gates.inconclusive` says whether that fails.
An exact candidate whose greedy outputs are token-identical on every graded item has identical
grades by construction; its quality gate passes without a test (the identity gates carry it).
"""
from __future__ import annotations

from dataclasses import dataclass

from analysis import holm
from harness.config import Gates


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


def _identity_gates(cand: dict, check_sampled: bool) -> list[GateResult]:
    out = []
    for suite, s in cand["suites"].items():
        for t, ident in s.get("identity", {}).items():
            if t != "T=0" and not check_sampled:
                continue
            real = [d for d in ident["divergences"] if d["kind"] != "near-tie"]
            name = f"identity {suite} {t}"
            if real:
                first = real[0]
                out.append(GateResult(name, "fail", f"{len(real)} real divergence(s) of {ident['n']}; first: item "
                                      f"{first['item_id']} at token {first['position']}, baseline margin "
                                      f"{first['margin'] if first['margin'] is not None else 'n/a'}"))
            else:
                out.append(GateResult(name, "pass", f"{ident['identical']}/{ident['n']} identical, "
                                      f"{ident['near_ties']} near-tie divergence(s)"))
    return out


def _quality_gates(cand: dict, gates: Gates) -> list[GateResult]:
    quality = {suite: s["quality"] for suite, s in cand["suites"].items() if "quality" in s}
    if not quality:
        return []
    adjusted = holm({k: q["non_inferiority"]["pvalue"] for k, q in quality.items()}, alpha=gates.alpha)
    out = []
    for (suite, q), p_adj, ok in zip(quality.items(), adjusted.adjusted, adjusted.reject):
        ni = q["non_inferiority"]
        desc = (f"pass rate {q['baseline_mean']:.3f} -> {q['candidate_mean']:.3f}, delta {q['statistic']:+.3f} "
                f"[{q['ci_low']:+.3f}, {q['ci_high']:+.3f}], margin {ni['margin']:.2f}, NI p={p_adj:.3g} (Holm), n={q['n']}")
        name = "refusal behaviour" if suite == "refusal" else f"quality {suite}"
        if ok:
            out.append(GateResult(name, "pass", desc))
        elif q["statistic"] < -ni["margin"] or (q["pvalue"] < gates.alpha and q["statistic"] < 0):
            out.append(GateResult(name, "fail", "worse: " + desc))
        else:
            status = "fail" if gates.inconclusive == "fail" else "warn"
            out.append(GateResult(name, status, "inconclusive (too few items to show non-inferiority): " + desc))
    return out


# Decoders that sample with the keyed noise of `standard`, so sampled outputs can be identical.
# transformers' peers sample from torch's global generator: only their greedy output can match.
KEYED_NOISE = ("standard", "early-exit")


def _sampled_identity_applies(cand: dict) -> bool:
    if cand["decoder"] == "speculative":
        # Rejection sampling is exact in distribution only; its sampled outputs may differ by design.
        return cand.get("options", {}).get("verify") == "coupled"
    return cand["decoder"] in KEYED_NOISE


def _exactness_gates(cand: dict, gates: Gates) -> list[GateResult]:
    out = []
    for test in cand.get("exactness", {}).get("tests", []):
        name = f"exactness {test['item_id']} T={test['temperature']:g}"
        if test.get("pvalue") is None:
            status = "fail" if gates.inconclusive == "fail" else "warn"
            out.append(GateResult(name, status, f"inconclusive: {test.get('note', 'too few samples')}"))
            continue
        ok = test["pvalue"] >= gates.exactness_pvalue
        out.append(GateResult(name, "pass" if ok else "fail", f"goodness of fit p={test['pvalue']:.3g} over "
                              f"{test['n']} samples (threshold {gates.exactness_pvalue})"))
    if cand.get("exactness_expected") and not out:
        out.append(GateResult("exactness", "warn", "rejection sampling was not tested: the profile has no "
                              "temperature > 0 on a sampled suite"))
    return out


def decide(cand: dict, gates: Gates) -> Decision:
    results: list[GateResult] = []
    for side in ("errors", "baseline_errors"):
        errors = [e for s in cand["suites"].values() for e in s.get(side, [])]
        if errors:
            who = "generation(s)" if side == "errors" else "baseline generation(s)"
            results.append(GateResult(side.replace("_", " "), "fail", f"{len(errors)} {who} failed; first: {errors[0]}"))
    if cand["kind"] == "exact":
        results += _identity_gates(cand, check_sampled=_sampled_identity_applies(cand))
        results += _exactness_gates(cand, gates)
    results += _quality_gates(cand, gates)
    for suite, s in cand["suites"].items():
        if s.get("quality_identical"):
            results.append(GateResult("refusal behaviour" if suite == "refusal" else f"quality {suite}", "pass",
                                      f"outputs token-identical on all {s['quality_identical']} graded items: "
                                      f"quality unchanged"))
        if s.get("quality_missing"):
            results.append(GateResult(f"quality {suite}", "fail", s["quality_missing"]))
    if cand.get("min_speedup") is not None and "speedup" in cand:
        sp = cand["speedup"]
        ok = sp["statistic"] >= cand["min_speedup"]
        results.append(GateResult("speed", "pass" if ok else "fail",
                                  f"speedup {sp['statistic']:.2f}x [{sp['ci_low']:.2f}, {sp['ci_high']:.2f}] "
                                  f"vs minimum {cand['min_speedup']:.2f}x"))
    if not results:
        # A gate that checked nothing must not pass silently (e.g. a lossy candidate on suites
        # without margins, or a profile without greedy runs).
        results.append(GateResult("coverage", "fail", "no gate applied to this candidate: give its suites a "
                                  "quality margin, or run it greedily"))
    return Decision(passed=not any(r.status == "fail" for r in results), results=tuple(results))
