"""The nondeterminism floor: an exact candidate judged against the engine's disagreement with itself.

Under concurrency an engine need not be batch-invariant: its baseline run twice (A/A) can differ.
The floor is measured in the units a divergence is judged in, logit margins, not only as a rate:
- Noise. Where the two runs agree on a token, the A/A run shows how far the engine's own top-2
  margin moves (|m_base - m_aa|); where they flip, the gap between the two tokens moved by at
  least m_base + m_aa. The engine's noise scale on a suite at a level (`noise` per suite;
  `suite_level`: each suite is judged at its own scale, suites differ; `level_floor` pools them
  for the level's validity and its report line) is NOISE_FACTOR x an upper NOISE_CONFIDENCE bound
  on the moves' NOISE_QUANTILE quantile (an order statistic of the moves that moved at all, `noise_bound`),
  or the largest margin the A/A run flipped at itself if higher. Not the largest move: the
  largest of more moves is larger, so a bug diverging at a fixed margin passed more often with
  more prompts (caught 0.475 at 300, 0.265 at 1,000); the bound settles on the quantile instead.
  The factor keeps a correct engine's flips inside it as their number grows: a flip's margin
  lies below its move, and beyond 2.5 x the 99th percentile of an exponential (or lighter) tail
  with probability <= 1e-5 per flip (CALIBRATION.md, "A/A floor"; a polynomial tail is not covered).
- Beyond the noise is real. A candidate divergence whose baseline margin is above the noise scale
  (or that has no margin) fails the identity gate, whatever any rate test says: batch
  nondeterminism flips tokens at its own noise level, not at margin 0.5.
- Within the noise, a test of the ratio of rates. Divergences at margins between the near-tie
  epsilon and the noise scale are set against the A/A run's own, prompt by prompt: each prompt is
  a pair (A/A diverged?, candidate diverged?). A correct candidate and the A/A run are two draws
  of the same noise, so each discordant prompt is either's with probability 1/2: the exact
  one-sided binomial test fails a candidate shown to diverge within the noise on more prompts
  than the A/A run; not shown: pass. A candidate's greedy blocks (each suite at each level with a
  floor) are tested together (`apply_levels`), all pooled and each level's pooled, alpha split
  between the routes (harness.verdict.floor_rate), so a correct candidate is refused at most alpha
  at every size and more prompts only add power (an absolute tolerance on the excess, as before,
  let a doubled rate pass at large n).
- The plan (`plan`): at the noise rate measured (both runs pooled) and the share of divergences
  the two runs share (the baseline's own odd tokens: concordant prompts, no evidence either way),
  the exact probability that the rule passes a correct candidate and fails one whose rate is
  twice the A/A run's, summed over the binomial discordant count, over the candidate's pooled
  prompts; "enough" where both reach PLAN_PASS and PLAN_POWER, else the prompts that would catch
  a doubling. Stated beside every verdict, so a pass at a size with little power says so. Calibrated by simulation through
  `level_floor` -> `compare` -> `gate_detail` (harness.calibration.floor).
- The A/A run is gated itself: error rows, missing margins, fewer pairs than the candidate, a
  divergence rate above `gates.aa_floor_max` or a noise scale above `gates.aa_noise_max` make the
  floor invalid. A candidate that needs the floor (a divergence above the near-tie epsilon) is
  then inconclusive, the A/A run named as the cause; one that is token-identical needs none.
With an A/A run that never moves (concurrency 1, a batch-invariant engine) the noise is zero and
this is today's strict identity: any divergence above the near-tie epsilon fails.
The noise and the rate are measured on greedy pairs (a flip under sampling bounds no margin).
"""
from __future__ import annotations

import functools
import json
import math
import re
from pathlib import Path

import numpy as np
from scipy import stats

from analysis.identity import common_prefix_length
from harness.verdict.floor_rate import (  # noqa: F401  (the rate rule's statistics, used through this module too)
    PLAN_MAX_N, PLAN_PASS, PLAN_POWER, critical_counts, family_plan, pass_probability, passes, plan, rate_test, routes)

MAX_LISTED = 3  # errors and flips named in a message
PLAN_RATE = 0.05  # the engine's noise rate per prompt assumed before any A/A run measured one
NOISE_QUANTILE = 0.99  # the noise scale starts from this quantile of the A/A run's margin moves ...
NOISE_CONFIDENCE = 0.95  # ... bounded above with this confidence (an order statistic of the moves) ...
NOISE_FACTOR = 2.5  # ... times this: where the moves' tail is exponential or lighter, a correct engine flips
# beyond 2.5 x its 99th percentile with probability <= 0.01 ** 2.5 = 1e-5 per flip (CALIBRATION.md)


# ------------------------------------------------------------------ measuring the A/A run


def _margin(margins, i: int) -> float | None:
    if margins is None or i >= len(margins) or margins[i] is None:
        return None
    m = float(margins[i])
    return m if math.isfinite(m) else None


def noise(pairs) -> dict:
    """How far the engine's numbers move between the baseline and its A/A run, on one suite's
    pairs (baseline = the first run, candidate = the A/A run)."""
    shifts, flips, errors, missing, missing_at = [], [], [], 0, []
    greedy = [p for p in pairs if p.key.temperature == 0]
    for p in greedy:
        b, a = p.baseline, p.candidate
        if b.get("error") or a.get("error"):
            errors.append(f"{p.key.item_id}: {a.get('error') or b.get('error')}")
            continue
        tb, ta = b.get("tokens") or [], a.get("tokens") or []
        pos = common_prefix_length(tb, ta)
        for i in range(pos):
            x, y = _margin(b.get("margins"), i), _margin(a.get("margins"), i)
            if x is None or y is None:
                missing += 1
                missing_at.append(f"{p.key.item_id}@{i}")
            else:
                shifts.append(abs(x - y))
        if pos < max(len(tb), len(ta)):
            x, y = _margin(b.get("margins"), pos), _margin(a.get("margins"), pos)
            if x is None or y is None:
                missing += 1
                missing_at.append(f"{p.key.item_id}@{pos} (a flip)")
            flips.append({"item_id": p.key.item_id, "seed": p.key.seed, "position": pos, "margin": x,
                          "aa_margin": y, "shift": x + y if x is not None and y is not None else None})
    return {"pairs": len(greedy), "errors": errors, "missing_margins": missing,
            "missing_at": missing_at[:MAX_LISTED], "flips": flips,
            **move_summary(shifts, [f["shift"] for f in flips if f["shift"] is not None])}


def move_summary(shifts, flip_shifts) -> dict:
    """What the floor keeps of one suite's moves: the agreeing positions' margin moves (`shifts`)
    and the flips' gap moves, their largest, and of the ones that moved at all (an engine whose
    logits repeat exactly at most positions still has its noise where they do not) the largest
    ceil(NOISE_QUANTILE's tail x count) + 1, enough for `noise_bound` on a level's pooled moves."""
    s = np.asarray(shifts, dtype=float)
    moved = np.concatenate([s, np.asarray(flip_shifts, dtype=float)])
    moved = moved[moved > 0]
    keep = min(moved.size, math.ceil((1 - NOISE_QUANTILE) * moved.size) + 1)
    top = -np.partition(-moved, keep - 1)[:keep] if keep else moved
    return {"positions": int(s.size), "max_shift": float(s.max()) if s.size else 0.0,
            "p99_shift": float(np.quantile(s, 0.99)) if s.size else 0.0,
            "moved": int(moved.size), "top_moves": sorted((float(x) for x in top), reverse=True)}


@functools.lru_cache(maxsize=4096)
def _bound_rank(count: int) -> int | None:
    """r such that the r-th largest of `count` moves is an upper NOISE_CONFIDENCE bound on their
    NOISE_QUANTILE quantile (the k-th smallest is at or above it unless fewer than k fall below it:
    P(Binomial(count, q) <= k - 1)); None where even the largest is not (too few moves)."""
    k = int(stats.binom.ppf(NOISE_CONFIDENCE, count, NOISE_QUANTILE)) + 1
    return count - k + 1 if k <= count else None


def noise_bound(parts) -> tuple[float, bool]:
    """(upper NOISE_CONFIDENCE bound on the NOISE_QUANTILE quantile of the pooled moves, whether
    there were enough moves for it): an order statistic, so it settles on the quantile as moves
    accrue instead of growing with them as the largest move does. With too few moves, the largest."""
    count = sum(p.get("moved", 0) for p in parts)
    top = sorted((x for p in parts for x in p.get("top_moves", ())), reverse=True)
    rank = _bound_rank(count) if count else None
    if rank is None:
        return (top[0] if top else 0.0), False
    return top[rank - 1], True


def level_floor(aa_name: str, aa: dict, eps: float, gates) -> dict:
    """The A/A run of one level pooled over its suites: noise scale, rate, and whether it is a floor."""
    parts = [s["aa_noise"] for s in aa["suites"].values() if "aa_noise" in s]
    pairs = sum(p["pairs"] for p in parts)
    errors = [e for p in parts for e in p["errors"]]
    flips = [f for p in parts for f in p["flips"]]
    positions = sum(p["positions"] for p in parts)
    missing = sum(p["missing_margins"] for p in parts)
    shifts = [p["max_shift"] for p in parts] + [f["shift"] for f in flips if f["shift"] is not None]
    largest = max(shifts, default=0.0)
    bound, bounded = noise_bound(parts)
    # The scale does not grow with the prompts (the largest move did: a bug at a fixed margin
    # passed more often at 3,000 prompts than at 300). It reaches the A/A run's own flips: a
    # divergence at a margin the engine flipped at itself is noise by example.
    flipped = max((f["margin"] for f in flips if f["margin"] is not None), default=0.0)
    scale = max(NOISE_FACTOR * bound, flipped)
    # The rate on the pairs the noise is measured on (greedy): sampled pairs that reproduce at the
    # same seed would dilute a greedy rate above aa_floor_max, and they are not prompts of this floor.
    idents = [s["identity"]["T=0"] for s in aa["suites"].values() if "T=0" in (s.get("identity") or {})]
    n = sum(i["n"] for i in idents)
    diverged = sum(i["n"] - i["identical"] for i in idents)
    problems = []
    if errors:
        problems.append(f"{len(errors)} of {pairs} A/A pairs are errors (first: {errors[0]})")
    if missing:
        where = ", ".join(m for p in parts for m in p["missing_at"])
        problems.append(f"{missing} compared position(s) of {positions + missing} have no margin ({where})")
    if not pairs:
        problems.append("no greedy A/A pairs")
    rate = diverged / n if n else 0.0
    if not errors and rate > gates.aa_floor_max:
        problems.append(f"it diverged on {diverged} of {n} prompts ({rate:.3g} > aa_floor_max {gates.aa_floor_max:g})")
    if bound > gates.aa_noise_max:
        what = "at their 99th percentile" if bounded else "at most"
        problems.append(f"its margins moved by {bound:.3g} logits {what} ({bound:.3g} > aa_noise_max "
                        f"{gates.aa_noise_max:g}): not batch noise (another model or quantization?)")
    return {"aa": aa_name, "valid": not problems, "problems": problems, "scale": float(scale), "eps": float(eps),
            "bound": float(bound), "bounded": bounded, "max_shift": float(largest), "flip_margin": float(flipped),
            "moved": sum(p.get("moved", 0) for p in parts),
            "positions": positions, "flips": len(flips), "flips_listed": flips[:MAX_LISTED],
            "p99_shift": max((p["p99_shift"] for p in parts), default=0.0), "rate": rate, "n": n,
            "diverged": diverged, "errors": len(errors), "missing_margins": missing,
            "max": {"aa_floor_max": gates.aa_floor_max, "aa_noise_max": gates.aa_noise_max}}


# ------------------------------------------------------------------ judging a candidate


def _plan_rate(plan_from: str | None) -> tuple[float, str]:
    """The noise rate to plan at: the largest A/A rate a previous run observed, else PLAN_RATE."""
    if plan_from:
        try:
            summary = json.loads((Path(plan_from) / "summary.json").read_text())
        except (OSError, ValueError):
            summary = {}
        rates = [c["floor"]["rate"] for c in summary.get("candidates", {}).values() if (c.get("floor") or {}).get("n")]
        if rates:
            return max(rates), f"observed in {plan_from}"
    return PLAN_RATE, "assumed"


def plan_table(config, suites, plan_from: str | None = None) -> str:
    """Before the run: what the floor's routes can decide over each exact engine candidate's greedy
    prompts (one seed: greedy runs once) at each level with more than one request in flight
    (concurrency 1 is assumed batch-invariant: strict identity; its prompts join the test only if
    its A/A run moves), at the rate `_plan_rate` gives."""
    rate, source = _plan_rate(plan_from)
    prof, g = config.profile, config.gates
    if 0.0 not in prof.temperatures:
        return ""
    levels = [c for c in (prof.concurrency or ()) if c > 1]
    per_suite = {s.name: len(s.select(prof.subset)) for s in suites if hasattr(s, "select")}
    groups: dict = {}
    for c in config.candidates:
        if c.kind == "exact":
            mine = tuple(n for n in per_suite if c.suites is None or n in c.suites)
            groups.setdefault(mine, []).append(c.name)
    lines = [f"decodegate: A/A floor plan: exact engine candidates' divergences within the engine's noise pass unless "
             f"the exact test over their greedy prompts (all pooled, and each level's; alpha {g.alpha:g} split between "
             f"them) shows them more frequent than the A/A run's; at noise rate {rate:.3g} per prompt ({source}):"]
    for mine, names in groups.items():
        n = sum(per_suite[x] for x in mine)
        at = levels or [1]
        p = family_plan(round(rate, 6), {lvl: n for lvl in at}, g.alpha)
        power = "enough" if p["enough"] else (f"about {p['needed']:,} would catch it with {PLAN_POWER:g}" if p["needed"]
                                              else f"no size up to {PLAN_MAX_N} would catch it with {PLAN_POWER:g}")
        where = (f"at concurrency {', '.join(map(str, levels))}" if levels else
                 "at concurrency 1 (tested only if its A/A run moves: else strict identity)")
        least = ">= " if len(at) > 1 else ""  # over several levels the plan's figures are lower bounds
        lines.append(f"  {', '.join(names)}: {n * len(at):,} greedy prompts ({', '.join(f'{x} {per_suite[x]}' for x in mine)} "
                     f"{where}): P(pass | correct) {least}{p['pass_correct']:.3f}, P(fail | rate doubled) "
                     f"{least}{p['fail_doubled']:.3f}; {power}")
    return "\n".join(lines) if len(lines) > 1 else ""


def compare(ident: dict, floor_ident: dict | None, level: dict, alpha: float) -> dict:
    """Floor statistics for one identity block; re-labels the candidate's divergences in place:
    "near-tie" (below eps), "within-floor" (up to the A/A noise scale), "real" (beyond it), or
    "unknown" (no margin: never excused). The rate test here is this block's alone; `apply_levels`
    replaces it with the test pooled over the candidate's blocks (`pool`)."""
    key = lambda d: (d["item_id"], d["seed"])  # noqa: E731
    problems = list(level["problems"])
    if floor_ident is None:
        problems.append("it has no pairs on this suite and temperature")
    elif floor_ident["n"] != ident["n"]:
        problems.append(f"it has {floor_ident['n']} pairs here, the candidate {ident['n']}")
    valid = not problems
    scale, eps = level["scale"], level["eps"]
    for d in ident["divergences"]:
        m = d["margin"]
        if d["kind"] == "near-tie" or m is None or not math.isfinite(m) or d.get("temperature"):
            continue  # a sampled divergence's raw margin bounds no perturbed gap (analysis.identity)
        d["kind"] = "within-floor" if valid and m <= scale else "real"
    mine = {key(d) for d in ident["divergences"] if d["kind"] == "within-floor"}
    aa = {key(d) for d in (floor_ident or {}).get("divergences", [])
          if d["kind"] != "near-tie" and d["margin"] is not None and d["margin"] >= eps}
    n = ident["n"]
    counts = {k: sum(d["kind"] == k for d in ident["divergences"]) for k in ("real", "unknown", "within-floor")}
    ident["real_divergences"] = counts["real"] + counts["unknown"]
    ident["within_noise"] = counts["within-floor"]
    rate = len(floor_ident["divergences"]) / floor_ident["n"] if floor_ident and floor_ident["n"] else 0.0
    b, c = len(mine - aa), len(aa - mine)
    out = {"aa": level["aa"], "valid": valid, "problems": problems, "noise": scale, "eps": eps,
           "positions": level["positions"], "aa_flips": level["flips"], "n": n, "rate": rate,
           "candidate_rate": (n - ident["identical"]) / n if n else 0.0,
           "beyond_noise": counts["real"], "no_margin": counts["unknown"], "within_noise": counts["within-floor"],
           "blocks": 1, "pooled_n": n, "block_counts": (b, c, n), **rate_test(b, c, n, alpha)}
    if n:
        # Planned at the rate pooled over both runs (the one noise rate they share if the candidate
        # is correct; the A/A run's alone reads 0 where it flipped nothing), with the share of
        # divergences both runs have on the same prompt (the baseline's own odd tokens).
        out["block_divergences"] = (len(aa) + len(mine), len(aa & mine))
        out.update(excess=(b - c) / n, plan=_plan_at(*out["block_divergences"], {"": n}, alpha))
    return out


def _plan_at(divergences: int, both: int, sizes: dict, alpha: float) -> dict:
    """The plan at the rate pooled over both runs (`divergences` over twice the prompts) with the
    share of them on prompts where both diverged, over the prompts per level `sizes`."""
    shared = round(2 * both / divergences, 3) if divergences else 0.0
    return family_plan(round(divergences / (2 * sum(sizes.values())), 6), sizes, alpha, shared)


def judge_family(levels: dict, alpha: float) -> None:
    """One candidate's blocks judged together: `levels` maps each level to its blocks' floors. The
    routes' tests (`routes`) are written into every block's floor with the plan over all the
    prompts; a block exceeds where a route holding it does and its own candidate-only prompts
    outnumber its A/A-only ones. Each block keeps its own counts (`block_counts`)."""
    counts = {lvl: [f["block_counts"] for f in floors] for lvl, floors in levels.items()}
    tests = routes(counts, alpha)
    sizes = {lvl: sum(n for *_, n in c) for lvl, c in counts.items()}
    divs, both = (sum(f.get("block_divergences", (0, 0))[i] for fs in levels.values() for f in fs) for i in range(2))
    for lvl, floors in levels.items():
        mine = [t for t in tests if lvl in t["levels"]]
        for f in floors:
            b, c, _ = f["block_counts"]
            f.update(routes=mine, level=lvl, blocks=sum(map(len, levels.values())), pooled_n=sum(sizes.values()),
                     exceeds=b > c and any(t["exceeds"] for t in mine), pvalue=min(t["pvalue"] for t in mine))
            if sum(sizes.values()):
                f["plan"] = _plan_at(divs, both, sizes, alpha)


def family(name: str) -> str:
    """The candidate a level's copy belongs to ("llama-ngram@c2" -> "llama-ngram")."""
    return re.sub(r"@c\d+$", "", name)


def _can_excuse(level: dict) -> bool:
    """A level whose floor can excuse a divergence: valid, its noise reaching the near-tie epsilon
    (at noise 0, concurrency 1, the rule is strict identity and its rate test can never fail)."""
    return level["valid"] and level["scale"] >= level["eps"]


def apply_levels(parts, gates) -> None:
    """`apply` at every level, then each candidate's greedy blocks that a floor judges tested
    together (`judge_family`: all pooled, and each level's): parts is [(summary of one level, its
    A/A run's name, its candidates' names)]. A test per block at alpha would refuse a correct
    candidate judged in k blocks up to ~k x alpha; one at alpha / k would lose the power the
    pooled prompts carry."""
    families: dict = {}
    for summary, floor_name, candidates in parts:
        aa = summary["candidates"].get(floor_name)
        if aa is None:
            continue
        eps = (summary.get("near_tie_epsilon") or {}).get("value", 0.0)
        aa["floor"] = level = level_floor(floor_name, aa, eps, gates)
        for name, f in _attach(summary, floor_name, candidates, level, gates):
            if _can_excuse(level) and f["valid"]:
                families.setdefault(family(name), {}).setdefault(level_name(floor_name), []).append(f)
    for levels in families.values():
        judge_family(levels, gates.alpha)


def level_name(floor_name: str) -> str:
    """A level's name in the words: its concurrency ("base~aa@c4" -> "c4"), else the A/A run's name."""
    m = re.search(r"@(c\d+)$", floor_name)
    return m.group(1) if m else floor_name


def apply(summary: dict, floor_name: str, candidates: list[str], gates) -> None:
    """Measure the A/A run `floor_name` of one level (`summary["candidates"][floor_name]["floor"]`)
    and attach `identity[...]["floor"]` to each exact candidate in `candidates` of that level; one
    level alone (`apply_levels` pools a candidate's blocks over several)."""
    apply_levels([(summary, floor_name, candidates)], gates)


def suite_level(level: dict, aa_suite: dict | None) -> dict:
    """The level's floor with the noise scale of one suite's own A/A moves and flips: suites differ
    in their noise (a pooled scale from quiet suites put a noisy suite's correct flips beyond it:
    a correct engine refused 0.345 at alpha 0.05 with longform's moves 5x factual's), and a quiet
    suite's own scale keeps its power against a bug at a fixed margin. The validity stays the level's."""
    part = (aa_suite or {}).get("aa_noise")
    if not part:
        return level
    bound, bounded = noise_bound([part])
    flipped = max((f["margin"] for f in part["flips"] if f["margin"] is not None), default=0.0)
    return dict(level, scale=float(max(NOISE_FACTOR * bound, flipped)), bound=float(bound), bounded=bounded,
                positions=part["positions"], flips=len(part["flips"]), moved=part.get("moved", 0))


def _attach(summary: dict, floor_name: str, candidates, level: dict, gates):
    """Each exact candidate's identity blocks compared with the level's floor: yields (candidate
    name, the block's floor statistics)."""
    aa = summary["candidates"][floor_name]
    aa.setdefault("metrics", {})["aa_noise"] = level["scale"]
    for name in candidates:
        cand = summary["candidates"].get(name)
        if cand is None or cand["kind"] != "exact":
            continue
        for suite, s in cand["suites"].items():
            for t, ident in s.get("identity", {}).items():
                floor_ident = aa["suites"].get(suite, {}).get("identity", {}).get(t)
                ident["floor"] = compare(ident, floor_ident, suite_level(level, aa["suites"].get(suite)), gates.alpha)
                if f"{suite}.real_divergences.{t}" in cand.get("metrics", {}):
                    cand["metrics"][f"{suite}.real_divergences.{t}"] = ident["real_divergences"]
                if t == "T=0":
                    yield name, ident["floor"]


# ------------------------------------------------------------------ the gate's words


def _first(divs: list[dict]) -> str:
    d = divs[0]
    m = "no margin" if d["margin"] is None else f"baseline margin {d['margin']:.3g}"
    return f"item {d['item_id']} at token {d['position']}, {m}"


def _noise_s(f: dict) -> str:
    return (f"{NOISE_FACTOR:g} x the 99th percentile (upper {NOISE_CONFIDENCE:.0%} bound) of the margin moves the A/A "
            f"run {f['aa']} showed over {f['positions']} agreeing positions and {f['aa_flips']} flip(s), or its own "
            f"flips' margins")


def gate_detail(ident: dict) -> tuple[str, str] | None:
    """(status, detail) when an A/A floor judges this block: status "pass", "fail" or
    "inconclusive" (the gate maps it by `gates.inconclusive`); None: no floor, strict identity."""
    f = ident.get("floor")
    if not f:
        return None
    divs = ident["divergences"]
    unknown = [d for d in divs if d["kind"] == "unknown"]
    if unknown:
        return "fail", (f"{len(unknown)} divergence(s) with no margin to judge them by: no noise excuses them; "
                        f"first: {_first(unknown)}")
    above = [d for d in divs if d["kind"] != "near-tie"]
    if not f["valid"]:
        why = f"the A/A run {f['aa']} is not a valid floor: {'; '.join(f['problems'])}"
        if above:
            return "inconclusive", (f"inconclusive: {why}; {len(above)} divergence(s) above the near-tie epsilon "
                                    f"{f['eps']:g} cannot be judged against it; first: {_first(above)}")
        return "pass", (f"{ident['identical']}/{ident['n']} identical, {ident['near_ties']} near-tie divergence(s); "
                        f"{why} (none was needed)")
    real = [d for d in divs if d["kind"] == "real"]
    if real:
        d = real[0]
        return "fail", (f"{len(real)} divergence(s) beyond the engine's own noise; first: item {d['item_id']} at "
                        f"token {d['position']}, baseline margin {d['margin']:.3g} > A/A noise {f['noise']:.3g} "
                        f"({_noise_s(f)}); {f['within_noise']} within the noise")
    head = (f"{f['within_noise']} divergence(s) within the A/A noise {f['noise']:.3g} ({_noise_s(f)}), "
            f"{ident['near_ties']} near-tie(s), over {f['n']} prompts")
    if not f["within_noise"]:  # nothing of its own to excuse: the strict rule's pass (`passes` agrees)
        return "pass", f"within the floor: {head}; no divergence above the near-tie epsilon {f['eps']:g}"
    return _rate_verdict(f, head)


def _plan_s(f: dict) -> str:
    p = f["plan"]
    more = ("" if p["fail_doubled"] >= p["power_target"] else
            f" (about {p['needed']} prompts would catch it with {p['power_target']:g})" if p["needed"] else
            f" (no size up to {PLAN_MAX_N} prompts would catch it with {p['power_target']:g})")
    at = "at least " if p.get("levels", 1) > 1 else ""
    return (f"plan at the noise rate {p['noise_rate']:.3g} (both runs pooled, {p['shared']:.0%} of it shared) over "
            f"{p['n']:,} prompts at {p.get('levels', 1)} level(s): a correct engine passes with probability {at}"
            f"{p['pass_correct']:.3f}, one that doubles the rate fails with {at}{p['fail_doubled']:.3f}{more}")


def _routes_s(f: dict) -> str:
    """The tests the block was judged by: its own alone, or the routes over the candidate's blocks."""
    tests = f.get("routes") or [{"route": "this block", "candidate_only": f["candidate_only"], "n": f["n"],
                                 "floor_only": f["floor_only"], "pvalue": f["pvalue"], "alpha": f["alpha"],
                                 "exceeds": f["exceeds"]}]
    return "; ".join(f"{t['route']}: {t['candidate_only']} candidate-only against {t['floor_only']} A/A-only over "
                     f"{t['n']:,} prompts, exact one-sided p={t['pvalue']:.3g} at alpha {t['alpha']:.3g}"
                     f"{' (an excess)' if t['exceeds'] else ''}" for t in tests)


def _rate_verdict(f: dict, head: str) -> tuple[str, str]:
    """Fail where a test holding this block shows the candidate diverging within the noise on more
    prompts than the A/A run and the block's own prompts lean the same way (a ratio of rates above
    1: more prompts only add power); else pass, with the plan's power against a doubled rate."""
    detail = (f"{head}: in this block {f['candidate_only']} candidate-only, {f['floor_only']} A/A-only prompts, "
              f"excess rate {f['excess']:+.3f}; {_routes_s(f)}; {_plan_s(f)}")
    if f["exceeds"]:
        return "fail", ("more than the floor: the candidate diverges within the noise on more prompts than the A/A "
                        "run: " + detail)
    if any(t["exceeds"] for t in f.get("routes", ())):
        return "pass", ("within the floor in this block, whose own prompts show no excess; the candidate's excess "
                        "shows in another block, which fails: " + detail)
    return "pass", "within the floor: no excess over the A/A run's rate shown: " + detail


def describe(level: dict) -> str:
    """One line for the report: the A/A run's noise and whether it is a floor."""
    bound = (f"{NOISE_FACTOR:g} x the p99 bound {level['bound']:.3g}" if level["bounded"] else
             f"{NOISE_FACTOR:g} x the largest of {level['moved']} moves, too few for a p99 bound, {level['bound']:.3g}"
             if level["moved"] else "no margin moved")
    head = (f"A/A floor {level['aa']}: noise {level['scale']:.3g} logits ({bound}, over {level['positions']} agreeing "
            f"positions and {level['flips']} flip(s); largest move {level['max_shift']:.3g}, largest flip margin "
            f"{level['flip_margin']:.3g}), diverged on {level['diverged']} of {level['n']} prompts")
    return head + ("" if level["valid"] else f"; NOT A VALID FLOOR: {'; '.join(level['problems'])}")
