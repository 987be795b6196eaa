"""The nondeterminism floor: an exact candidate judged against the engine's disagreement with itself.

Under concurrency an engine need not be batch-invariant: its baseline run twice (A/A) can differ.
The floor is measured in the units a divergence is judged in, logit margins, not only as a rate:
- Noise. Where the two runs agree on a token, the A/A run shows how far the engine's own top-2
  margin moves (|m_base - m_aa|); where they flip, the gap between the two tokens moved by at
  least m_base + m_aa. The engine's noise scale at that level (`noise` per suite, pooled per
  level in `level_floor`) is NOISE_FACTOR x an upper NOISE_CONFIDENCE bound on the moves'
  NOISE_QUANTILE quantile (an order statistic of the moves that moved at all, `noise_bound`),
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
  of the same noise, so each discordant prompt is either's with probability 1/2, in every block
  whatever its rate. A candidate is judged in several greedy blocks (each suite at each
  concurrency level with a floor), and their discordant prompts are pooled (`apply_levels`):
  one exact one-sided binomial test (`rate_test`) at `gates.alpha` over all of them, exact
  because each block's are fair coins given their count. It fails a candidate shown to diverge
  within the noise on more prompts than the A/A run; not shown: pass. Pooling, not a test per
  block at alpha split over the blocks: a candidate that doubles the rate everywhere is caught
  from every block's prompts at once (factual and longform, 217 and 45 prompts, at two levels, noise
  0.05: 0.91 pooled, 0.59 split; regress-engine.toml's floor profile, 12 blocks: 0.999 against 0.61),
  and a correct candidate is still refused at most alpha. On this scale more prompts
  only add power (an absolute tolerance on the excess, as before, let a doubled rate pass at
  large n), and a correct candidate fails at most alpha at every size.
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

MAX_LISTED = 3  # errors and flips named in a message
PLAN_PASS = 0.95  # "the size is enough": a correct candidate passes with at least this probability
PLAN_POWER = 0.8  # ... and a candidate that doubles the noise rate fails with at least this one
PLAN_MAX_N = 5000  # prompts the plan searches up to
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


@functools.lru_cache(maxsize=4096)  # a pure function of counts; callers copy the dict they get
def rate_test(b: int, c: int, n: int, alpha: float) -> dict:
    """One-sided exact test that the candidate diverges (within the noise) on more prompts than
    the A/A run: b candidate-only and c A/A-only discordant prompts, Binomial(b + c, 1/2) under
    the null (a correct candidate and the A/A run are two draws of the same noise, so each
    discordant prompt is either's with probability 1/2, whatever the rate and whatever share of
    divergences the two runs share). The test is of the ratio of the two rates: a candidate
    diverging twice as often as the noise is caught more often the more prompts there are."""
    if b + c == 0:
        return {"candidate_only": b, "floor_only": c, "pvalue": 1.0, "share_lower_bound": 0.0,
                "difference_lower_bound": 0.0 if n else float("nan"), "alpha": alpha, "exceeds": False}
    t = stats.binomtest(b, b + c, 0.5, alternative="greater")
    low = float(t.proportion_ci(confidence_level=1 - alpha, method="exact").low)
    return {"candidate_only": b, "floor_only": c, "pvalue": float(t.pvalue), "share_lower_bound": low,
            # (b - c) / n with b / (b + c) at its bound, given the discordant count
            "difference_lower_bound": (b + c) * (2 * low - 1) / n, "alpha": alpha,
            "exceeds": bool(t.pvalue < alpha)}


@functools.lru_cache(maxsize=64)
def critical_counts(n: int, alpha: float) -> np.ndarray:
    """For each discordant count D = 0..n, the fewest candidate-only prompts the exact test
    (`rate_test`) calls an excess: the smallest k with P(Binomial(D, 1/2) >= k) < alpha."""
    d = np.arange(n + 1)
    k = np.nan_to_num(stats.binom.isf(alpha, d, 0.5), nan=0.0).astype(int) + 1
    k = np.where(stats.binom.sf(k - 1, d, 0.5) < alpha, k, k + 1)  # isf's boundary, where sf == alpha
    return np.minimum(k, d + 1)  # d + 1: no count of d prompts is an excess


def passes(b, c, alpha: float):
    """The floor's rate rule, vectorised: within the floor unless the exact test shows the
    candidate diverging within the noise on more prompts than the A/A run."""
    b, c = np.asarray(b), np.asarray(c)
    return ~((b + c > 0) & (stats.binom.sf(b - 1, b + c, 0.5) < alpha))


def pass_probability(aa_rate: float, cand_rate: float, n: int, alpha: float, shared: float = 0.0) -> float:
    """P(`passes`) exactly over n prompts. Per prompt, with probability shared * aa_rate both runs
    diverge from the baseline together (the baseline's own odd token: a concordant prompt); else
    the A/A run diverges with probability aa_rate - that and the candidate with cand_rate - that,
    independently. Summed over the discordant count D, binomial, and the candidate-only share."""
    both = min(shared * aa_rate, aa_rate, cand_rate)
    a, c = (aa_rate - both) / (1 - both), (cand_rate - both) / (1 - both)
    p_aa, p_cand = (1 - both) * a * (1 - c), (1 - both) * c * (1 - a)
    if p_aa + p_cand <= 0:
        return 1.0
    d = np.arange(n + 1)
    k = critical_counts(n, alpha)
    pass_given_d = stats.binom.cdf(k - 1, d, p_cand / (p_aa + p_cand))
    return float(np.sum(stats.binom.pmf(d, n, p_aa + p_cand) * pass_given_d))


@functools.lru_cache(maxsize=1024)
def plan(aa_rate: float, n: int, alpha: float, shared: float = 0.0) -> dict:
    """What the rule decides at n prompts when the engine's noise rate is aa_rate (and that share
    of divergences is the baseline's own, in both runs): P(pass) of a correct candidate, P(fail)
    of one that doubles the rate, whether the size is enough (both targets met), and the prompts
    that would catch the doubling with PLAN_POWER (None beyond PLAN_MAX_N). P(fail | doubled) is
    non-decreasing in n (CALIBRATION.md, "A/A floor"), so the search bisects."""
    correct = pass_probability(aa_rate, aa_rate, n, alpha, shared) if n else 1.0
    doubled = 1 - pass_probability(aa_rate, min(2 * aa_rate, 1.0), n, alpha, shared) if n else 0.0
    enough = correct >= PLAN_PASS and doubled >= PLAN_POWER
    needed = n if doubled >= PLAN_POWER else _needed(aa_rate, alpha, shared, max(n, 1))
    return {"noise_rate": aa_rate, "shared": shared, "n": n, "pass_correct": correct, "fail_doubled": doubled,
            "enough": enough, "needed": needed, "target": PLAN_PASS, "power_target": PLAN_POWER}


def _needed(rate: float, alpha: float, shared: float, start: int) -> int | None:
    def caught(m):
        return 1 - pass_probability(rate, min(2 * rate, 1.0), m, alpha, shared) >= PLAN_POWER
    if rate <= 0:
        return None
    lo, hi = start, max(start + 1, 2 * start)
    while not caught(hi):
        lo, hi = hi, 2 * hi
        if lo >= PLAN_MAX_N:
            return None
    while hi - lo > 1:  # caught(hi), not known for lo
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if caught(mid) else (mid, hi)
    return hi if hi <= PLAN_MAX_N else None


def plan_table(config, suites, plan_from: str | None = None) -> str:
    """Before the run: per suite, what the floor's rule can decide over the greedy prompts the
    profile runs, at the largest A/A rate a previous run observed (`--plan-from`), else PLAN_RATE."""
    rate, source = PLAN_RATE, "assumed"
    if plan_from:
        try:
            summary = json.loads((Path(plan_from) / "summary.json").read_text())
        except (OSError, ValueError):
            summary = {}
        rates = [c["floor"]["rate"] for c in summary.get("candidates", {}).values() if (c.get("floor") or {}).get("n")]
        if rates:
            rate, source = max(rates), f"observed in {plan_from}"
    prof, g = config.profile, config.gates
    runs = len(prof.seeds) if 0.0 in prof.temperatures else 0
    sizes = [(s, len(s.select(prof.subset)) * runs if hasattr(s, "select") else 0) for s in suites]
    # a candidate's greedy blocks are pooled (`apply_levels`): each suite at each level with noise
    # (concurrency 1 is assumed batch-invariant: strict identity, no block of the pool)
    levels = max(sum(c > 1 for c in (prof.concurrency or ())), 1)
    n = sum(size for _, size in sizes) * levels
    if not n:
        return ""
    p = plan(round(rate, 6), n, g.alpha)
    power = "enough" if p["enough"] else (f"about {p['needed']} would catch it with {PLAN_POWER:g}" if p["needed"]
                                          else f"no size up to {PLAN_MAX_N} would catch it with {PLAN_POWER:g}")
    each = ", ".join(f"{s.name} {size}" for s, size in sizes if size)
    return (f"decodegate: A/A floor plan: exact engine candidates' divergences within the engine's noise pass "
            f"unless one exact test (alpha {g.alpha:g}) over the greedy prompts of all their blocks pooled shows "
            f"them more frequent than the A/A run's; {n:,} greedy prompts pooled ({each} per level, {levels} level(s)) at noise rate "
            f"{rate:.3g} per prompt ({source}): P(pass | correct) {p['pass_correct']:.3f}, "
            f"P(fail | rate doubled) {p['fail_doubled']:.3f}; {power}")


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
        out.update(excess=(b - c) / n, plan=_plan_at(*out["block_divergences"], n, alpha))
    return out


def _plan_at(divergences: int, both: int, n: int, alpha: float) -> dict:
    """The plan at the rate pooled over both runs (`divergences` over 2n) with the share of them
    on prompts where both diverged."""
    shared = round(2 * both / divergences, 3) if divergences else 0.0
    return dict(plan(round(divergences / (2 * n), 6), n, alpha, shared))


def pool(floors: list[dict], alpha: float) -> None:
    """One candidate's blocks judged together: their discordant prompts summed into one exact test
    at `alpha` (each block's are fair coins given their count under a correct candidate, so the
    sum is too), written into every block's floor with the plan over the pooled prompts; each
    block keeps its own counts in `block_counts` (candidate-only, A/A-only, prompts)."""
    b, c, n = (sum(f["block_counts"][i] for f in floors) for i in range(3))
    divs, both = (sum(f.get("block_divergences", (0, 0))[i] for f in floors) for i in range(2))
    for f in floors:
        f.update(rate_test(b, c, n, alpha), blocks=len(floors), pooled_n=n, excess=(b - c) / n if n else 0.0)
        if n:
            f["plan"] = _plan_at(divs, both, n, alpha)


def family(name: str) -> str:
    """The candidate a level's copy belongs to ("llama-ngram@c2" -> "llama-ngram")."""
    return re.sub(r"@c\d+$", "", name)


def _can_excuse(level: dict) -> bool:
    """A level whose floor can excuse a divergence: valid, its noise reaching the near-tie epsilon
    (at noise 0, concurrency 1, the rule is strict identity and its rate test can never fail)."""
    return level["valid"] and level["scale"] >= level["eps"]


def apply_levels(parts, gates) -> None:
    """`apply` at every level, each candidate's greedy blocks that a floor judges then pooled into
    one rate test at `gates.alpha` (`pool`): parts is [(summary of one level, its A/A run's name,
    its candidates' names)]. A test per block at alpha would refuse a correct candidate judged in
    k blocks up to ~k x alpha; one at alpha / k would lose the power the pooled prompts carry."""
    families: dict = {}
    for summary, floor_name, candidates in parts:
        aa = summary["candidates"].get(floor_name)
        if aa is None:
            continue
        eps = (summary.get("near_tie_epsilon") or {}).get("value", 0.0)
        aa["floor"] = level = level_floor(floor_name, aa, eps, gates)
        for name, f in _attach(summary, floor_name, candidates, level, gates):
            if _can_excuse(level) and f["valid"]:
                families.setdefault(family(name), []).append(f)
    for floors in families.values():
        pool(floors, gates.alpha)


def apply(summary: dict, floor_name: str, candidates: list[str], gates) -> None:
    """Measure the A/A run `floor_name` of one level (`summary["candidates"][floor_name]["floor"]`)
    and attach `identity[...]["floor"]` to each exact candidate in `candidates` of that level; one
    level alone (`apply_levels` pools a candidate's blocks over several)."""
    apply_levels([(summary, floor_name, candidates)], gates)


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
                ident["floor"] = compare(ident, floor_ident, level, gates.alpha)
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
    return (f"plan at the noise rate {p['noise_rate']:.3g} (both runs pooled, {p['shared']:.0%} of it shared) over "
            f"{p['n']} prompts: a correct engine passes with probability {p['pass_correct']:.3f}, one that doubles "
            f"the rate fails with {p['fail_doubled']:.3f}{more}")


def _pooled_s(f: dict) -> str:
    blocks = f.get("blocks", 1)
    if blocks <= 1:
        return ""
    b, c, n = f["block_counts"]
    return (f", pooled over the candidate's {blocks} greedy blocks, {f['pooled_n']:,} prompts; this block: {b} "
            f"candidate-only, {c} A/A-only of {n}")


def _rate_verdict(f: dict, head: str) -> tuple[str, str]:
    """Fail where the exact test shows the candidate diverging within the noise on more prompts
    than the A/A run (a ratio of rates above 1: more prompts only add power); else pass, with the
    plan's power against a doubled rate beside it."""
    detail = (f"{head}: {f['candidate_only']} candidate-only, {f['floor_only']} A/A-only prompts, excess rate "
              f"{f['excess']:+.3f} (exact one-sided p={f['pvalue']:.3g}, alpha {f['alpha']:.3g}{_pooled_s(f)}); {_plan_s(f)}")
    if f["exceeds"]:
        return "fail", ("more than the floor: the candidate diverges within the noise on more prompts than the A/A "
                        "run: " + detail)
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
