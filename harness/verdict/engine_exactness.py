"""The verdict on an exact engine candidate's sampled tokens (harness/run/engine_exactness.py).

- `exactness control`: the baseline engine's own samples against the reference. A failure means
  the reference does not reproduce the engine's sampler (quantized kernels against an fp32 copy,
  a sampler left on): inconclusive, never a pass, for the control and for every candidate that
  deviates no more than it; a candidate that deviates more than its control fails.
- `exactness PIT all`: every token the candidate sampled, at the positions the reference decides.
  A token of probability 0 there, or p below the level, fails; a pass says the distortion (TV)
  it could have detected at that size. A fit too small to detect any distortion (no TV up to 0.5
  with 80% power) is inconclusive, never a pass; so is one where the engine counted its drafts
  and proposed none, or rejected none (its verifier's correction never ran).
- `seed`: a baseline whose samples at different seeds agree where an honoured seed would almost
  never reproduce them ignores the seed: its draws are not independent, so no test on them can be
  read (fail). Judged prompt by prompt (harness/run/engine_exactness.py `seed_check`): each
  identical pair's chance under the reference, each token raised by the measured engine-reference
  noise, then four routes over the prompts, each at its share of SEED_LEVEL (1e-3): Fisher's
  combination (many weakly repeated prompts), the smallest prompt's p times the prompts (one deaf
  prompt among many), the product over every pair where all repeated (predictable outputs, fully
  deaf), and, for a candidate, the baseline's own pairs as control (CALIBRATION.md, "Engine seed
  gate"). Every pair identical with no route below its share is inconclusive where the bound is
  below the level or loosened by left-out positions, a warning only where an honoured seed gives
  the repeats with probability >= the level. One whose A/A run at the same seed does not
  reproduce it is named (warn).
- `candidate seed`: the same for each candidate's own samples (fail): an engine whose speculative
  path ignores the seed gives, token by token, draws the PIT accepts.
- `temperature`: a candidate whose acceptance does not move with temperature while the
  baseline's entropy does (a drafter that ignores temperature) is reported (warn), not gated.
"""
from __future__ import annotations

from harness.verdict.results import (GateResult, evidence as _evidence, failed as _failed, inconclusive_status,
                                     needed)

ALPHA_STILL = 0.02     # acceptance this close across temperatures "does not move"
ENTROPY_MOVES = 0.1    # nats: the baseline's mean entropy moved by at least this much


def _coverage(c: dict) -> str:
    return (f"{c.get('n', 0)} tokens tested of {c.get('tokens', 0)} sampled in {c.get('records', 0)} records, "
            f"{c.get('left_out', 0)} left out where the reference cannot decide the nucleus")


def _detect(c: dict) -> str:
    d = c.get("detectable_tv")
    return (f"could detect a top-two distortion of TV >= {d:.3f} with 80% power" if d
            else "too few informative tokens to detect any top-two distortion with 80% power")


def gates(cand: dict, gates_cfg) -> list[GateResult]:
    ex = cand.get("exactness") or {}
    if not ex:  # sampled records that no check looked at: no evidence, no pass
        return [GateResult("exactness", "fail", f"{cand['sampled_records']} sampled record(s) were not tested "
                           f"against the target's distribution (no exactness result for this candidate)")]
    if ex.get("error"):  # the reference or the records could not be read: no evidence, no pass
        return [GateResult("exactness", "fail", f"the sampled tokens could not be tested: {ex['error']}")]
    pit = ex.get("pit") or {}
    mine, control = (pit.get("subsets") or {}).get("all"), pit.get("control")
    if mine is None:
        return []
    level = pit.get("level", gates_cfg.exactness_pvalue / 2)
    undecided = inconclusive_status(gates_cfg)
    ref = pit.get("reference", "the reference")
    out = [_control_gate(control, level, ref, undecided),
           _pit_gate(mine, control, level, ref, undecided, _failed(control, level))]
    out += seed_gates(ex.get("seeds") or {}, undecided)
    out += candidate_seed_gates(ex.get("candidate_seeds") or {}, undecided)
    out += temperature_gates(cand, ex)
    return out


def _control_gate(control: dict | None, level: float, ref: str, undecided: str) -> GateResult:
    """The baseline engine's own samples against the reference: whether the reference can judge."""
    if _failed(control, level):
        return GateResult("exactness control", undecided, f"inconclusive: the reference does not reproduce the "
                          f"engine's sampler: the baseline engine {control.get('of', '')}'s own samples fail "
                          f"against {ref} ({_evidence(control, level)}); quantized kernels against an fp32 copy, "
                          f"or a sampler the engine did not pin off? A candidate is judged only by whether it "
                          f"deviates more than this control")
    if control is None or control.get("pvalue") is None:
        return GateResult("exactness control", undecided, f"inconclusive: the baseline engine's own samples could "
                          f"not check the reference: {(control or {}).get('note') or 'no sampled records'}")
    return GateResult("exactness control", "pass", f"the baseline engine's own samples follow {ref}: "
                      f"p={control['pvalue']:.3g} vs {level:.3g}; {_coverage(control)}; {_detect(control)}")


def _pit_gate(mine: dict, control: dict | None, level: float, ref: str, undecided: str,
              control_bad: bool) -> GateResult:
    """Every token the candidate sampled against the reference, read beside its control."""
    name = "exactness PIT all"
    drafted = f"{mine.get('proposed', 0)} draft tokens proposed, {mine.get('rejected', 0)} rejected"
    if mine.get("pvalue") is None:
        more = needed(mine) or "more sampled tokens (seeds, items) would decide"
        return GateResult(name, undecided, f"inconclusive: no p-value: {mine.get('note') or 'too few tokens'}; "
                          f"{_coverage(mine)}; {more}")
    if _failed(mine, level):
        return _pit_failed(mine, control, level, undecided, control_bad, drafted)
    if control_bad:
        return GateResult(name, undecided, f"inconclusive: fits (p={mine['pvalue']:.3g}), but against a reference "
                          f"its own control fails; {_coverage(mine)}")
    if mine.get("drafting_counted") and not mine.get("proposed"):
        # The engine counted its drafts per request and drafted none: the fit tested its plain
        # sampler, not speculative verification (llama.cpp's n-gram drafter finds nothing on
        # short prompts; a drafter that broke looks the same).
        return GateResult(name, undecided, f"inconclusive: fits (p={mine['pvalue']:.3g}), but the engine proposed "
                          f"no draft token in the {mine['drafting_counted']} record(s) that count them: speculation "
                          f"never ran, so nothing tested its verifier; {_coverage(mine)}")
    if mine.get("drafting_counted") and not mine.get("rejected"):
        # Every draft accepted: the verifier's correction after a rejection, where a wrong residual
        # would show, never ran (the in-process rejection check calls the same case inconclusive).
        return GateResult(name, undecided, f"inconclusive: fits (p={mine['pvalue']:.3g}), but the engine rejected "
                          f"none of the {mine['proposed']} draft token(s) it proposed in the "
                          f"{mine['drafting_counted']} record(s) that count them: a wrong correction after a "
                          f"rejection could not show; {_coverage(mine)}")
    if not mine.get("detectable_tv"):
        # A test that could not have failed does not pass: more sampled tokens (seeds, items) decide.
        more = needed(mine) or "more sampled tokens would decide"
        return GateResult(name, undecided, f"inconclusive: fits (p={mine['pvalue']:.3g}), but {_detect(mine)}: a "
                          f"test of this size could not have failed; {_coverage(mine)}; {drafted}; {more} (more "
                          f"seeds or items)")
    return GateResult(name, "pass", f"fits {ref}: p={mine['pvalue']:.3g} vs {level:.3g}; {_coverage(mine)}; "
                      f"{_detect(mine)}; {drafted}")


def _pit_failed(mine: dict, control: dict | None, level: float, undecided: str, control_bad: bool,
                drafted: str) -> GateResult:
    """A failing fit: the reference's fault where the candidate deviates no more than its failing
    control, else the candidate's."""
    name = "exactness PIT all"
    what = f"{_evidence(mine, level)}; {_coverage(mine)}; {drafted}"
    a, b = mine.get("deviation"), (control or {}).get("deviation")
    if control_bad and a is not None and b is not None and a <= b:
        return GateResult(name, undecided, f"inconclusive: fails ({what}), but deviates no more than its control "
                          f"(deviation {a:.3f} <= {b:.3f}): the reference is at fault")
    if control_bad:
        more = (f"deviation {a:.3f} > its control's {b:.3f}" if a is not None and b is not None
                else "its deviation cannot be set against the control's")
        return GateResult(name, "fail", f"deviates more than its control ({more}): {what}")
    return GateResult(name, "fail", f"not the target's distribution: {what}")


ROUTE_WORDS = {"fisher": "Fisher's combination over prompts", "min-p": "the most repeated prompt's, times the prompts",
               "product": "every pair's repeat together", "control": "against the baseline engine's own pairs"}


def _inconclusive_identical(seeds: dict, undecided: str, name: str, whose: str) -> GateResult | None:
    """Identical samples at every pair of seeds that no route calls ignored, where the chance an
    honoured seed gives them could not be bounded below the level: positions the reference left
    out and tokens it calls impossible count as probability 1 (the bound is loose, not the engine
    honest), or the bound lies between the product route's share of the level and the level.
    Inconclusive with its reason, never a warning naming a probability below the level."""
    if seeds.get("ignored") or not seeds.get("pairs") or seeds["identical"] != seeds["pairs"]:
        return None
    level = seeds.get("level", 1e-3)
    bound = (seeds.get("routes") or {}).get("product")
    bound = seeds["chance"] if bound is None else bound
    off = seeds.get("off_reference") or 0
    why = [f"{seeds['left_out']} position(s) the reference left out (counted as probability 1)"] if seeds.get("left_out") else []
    if off:
        why.append(f"{off} repeat(s) holding a token the reference gives probability 0, which it cannot score "
                   f"(the engine does not sample from it there; left out, counted as probability 1)")
    if not why and bound >= level:
        return None  # merely predictable: `_predictable` warns
    loosened = (f", a bound loosened by {' and '.join(why)}" if why else
                f", below the level {level:g} but not below the product route's share of it "
                f"{(seeds.get('route_levels') or {}).get('product', level):.2g}")
    return GateResult(name, undecided, f"inconclusive: {whose} samples at different seeds are "
                      f"identical on all {seeds['pairs']} pair(s); an honoured seed would give that with probability "
                      f"at most {bound:.2g}{loosened}: more seeds or items decide")


def _predictable(seeds: dict, name: str, whose: str) -> GateResult | None:
    """Every pair identical, and an honoured seed gives that with probability at least the level:
    outputs too predictable to tell (warn)."""
    if seeds.get("ignored") or not seeds.get("pairs") or seeds["identical"] != seeds["pairs"]:
        return None
    bound = (seeds.get("routes") or {}).get("product")
    bound = seeds["chance"] if bound is None else bound
    return GateResult(name, "warn", f"{whose} seed could not be checked: its samples at different seeds are identical "
                      f"on all {seeds['pairs']} pair(s), which an honoured seed gives with probability {bound:.2g} "
                      f"(>= the level {seeds.get('level', 1e-3):g}; outputs too predictable to tell)")


def _repeats(seeds: dict) -> str:
    """How often the samples at different seeds repeated, and which route found that unlikely."""
    if seeds.get("pvalue") is None:  # a result from before the per-prompt test: all pairs identical
        return (f"identical on all {seeds['pairs']} pair(s), which an honoured seed would give with probability "
                f"{seeds['chance']:.2g}")
    share = ("all " if seeds["identical"] == seeds["pairs"] else f"{seeds['identical']} of ") + f"{seeds['pairs']}"
    routes = {k: v for k, v in (seeds.get("routes") or {"fisher": seeds["pvalue"]}).items() if v is not None}
    levels = seeds.get("route_levels") or {}
    route = min(routes, key=lambda k: routes[k] / levels.get(k, 1.0))
    level = levels.get(route, seeds.get("level", 1e-3))
    return (f"identical on {share} pair(s) ({seeds.get('repeated_prompts', 0)} of {seeds.get('prompts', 0)} prompts), "
            f"which an honoured seed would give with probability {routes[route]:.2g} by {ROUTE_WORDS[route]} (< "
            f"{level:.2g}, its share of the level; each prompt's chance of the repeat under the reference, every "
            f"token raised by the measured engine-reference noise {seeds.get('noise', 0.0):.3g} logits)")


def seed_gates(seeds: dict, undecided: str = "fail") -> list[GateResult]:
    out = []
    if seeds.get("ignored"):
        out.append(GateResult("seed", "fail", f"the baseline engine {seeds.get('of', '')} ignores the request's seed: "
                              f"its samples at different seeds are {_repeats(seeds)}; its draws are "
                              f"not independent, so no sampled test can be read"))
    elif not seeds.get("pairs"):
        out.append(GateResult("seed", "warn", "the seed was not checked: the profile has one seed (give two)"))
    elif (loose := _inconclusive_identical(seeds, undecided, "seed", "the baseline's")) is not None:
        out.append(loose)
    elif (flat := _predictable(seeds, "seed", "the baseline's")) is not None:
        out.append(flat)
    if seeds.get("same_seed_pairs") and seeds["same_seed_identical"] < seeds["same_seed_pairs"]:
        out.append(GateResult("seed", "warn", f"the baseline engine does not reproduce its samples at the same seed: "
                              f"its A/A run {seeds.get('aa', '')} agrees on {seeds['same_seed_identical']} of "
                              f"{seeds['same_seed_pairs']} sampled records"))
    return out


def candidate_seed_gates(seeds: dict, undecided: str = "fail") -> list[GateResult]:
    """A candidate whose samples at different seeds repeat where an honoured seed would almost never
    reproduce them: it repeats one draw per prompt, which the PIT (each token on its own) cannot see."""
    if not seeds.get("pairs"):
        return []
    if (loose := _inconclusive_identical(seeds, undecided, "candidate seed", "the candidate's")) is not None:
        return [loose]
    if (flat := _predictable(seeds, "candidate seed", "the candidate's")) is not None:
        return [flat]
    if not seeds.get("ignored"):
        return []
    why = _repeats(seeds)
    routes = {k: v for k, v in (seeds.get("routes") or {}).items() if v is not None}
    control = seeds.get("control_p")
    levels = seeds.get("route_levels") or {}
    decided = min(routes, key=lambda k: routes[k] / levels.get(k, 1.0), default=None)
    if control is not None and (decided == "control" or "routes" not in seeds):
        why = (f"identical on all {seeds['pairs']} pair(s), where the baseline engine {seeds.get('control_of', '')}'s "
               f"own samples were identical on {seeds['control_identical']} of {seeds['control_pairs']} (Fisher's "
               f"exact p = {control:.2g})")
    return [GateResult("candidate seed", "fail", f"the candidate {seeds.get('of', '')} ignores the request's seed: "
                       f"its samples at different seeds are {why}; it "
                       f"repeats one draw per prompt whatever the seed, which a token-by-token fit cannot see")]


def temperature_gates(cand: dict, ex: dict) -> list[GateResult]:
    """Acceptance that stays put across temperatures while the baseline's entropy moves."""
    by_t = {float(t): a["all"]["alpha"] for t, a in (cand.get("acceptance_by_temperature") or {}).items()
            if isinstance(a.get("all"), dict) and a["all"].get("alpha") is not None}
    entropy = {float(t): v for t, v in ((ex.get("entropy") or {}).get("baseline") or {}).items()}
    entropy.setdefault(0.0, 0.0)  # greedy: a point mass
    temps = sorted(t for t in by_t if t in entropy)
    if len(temps) < 2:
        return []
    lo, hi = temps[0], temps[-1]
    if abs(by_t[hi] - by_t[lo]) < ALPHA_STILL and abs(entropy[hi] - entropy[lo]) >= ENTROPY_MOVES:
        return [GateResult("temperature", "warn", f"acceptance does not move with temperature: α {by_t[lo]:.3f} at "
                           f"T={lo:g}, {by_t[hi]:.3f} at T={hi:g}, while the baseline's entropy goes "
                           f"{entropy[lo]:.2f} -> {entropy[hi]:.2f} nats: a drafter that ignores temperature?")]
    return []
