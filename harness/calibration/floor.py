"""Calibration of the A/A floor's rate rule, by simulation through the gate's own code.

Part of ``python -m harness.calibration.report`` (the section "A/A floor" in CALIBRATION.md).
Each simulated study builds one suite's identity blocks as the summary does (an A/A run and an
exact candidate over ``n`` greedy prompts, one pair each) and judges them with
``harness.verdict.floor.level_floor`` -> ``compare`` -> ``gate_detail``, the functions the gate
calls; a study fails when the verdict is not "pass" (``inconclusive = "fail"``, shipped).

The noise model: between two runs the engine moves each position's top-2 margin by
|N(0, SIGMA)| (TOKENS compared positions per prompt: the A/A run's moves where it agrees, from
which `floor.noise` reads the noise scale), and on each prompt a run flips a token with
probability ``rate``: a flip needs a move beyond the margin, so its move is size-biased (a
Rayleigh) and its baseline margin uniform below the move. A share ``shared`` of those flips is
the baseline's own odd token, so the A/A run and the candidate both leave it on that prompt; the
rest are each run's own, independent between runs. Candidates, by shape:
- ``correct``: the same noise as the A/A run (its false-fail rate is what "crying wolf" means);
- ``small-margins``: a bug that doubles the rate, its extra flips at the same margins, so only
  the rate rule can see it (its detection is set against the plan's stated power);
- ``wider-noise``: a bug whose own noise is twice as wide (2 SIGMA), flipping twice as often;
- ``fixed-margin``: the engine's noise plus a bug of its own on FIXED_SHARE x rate more prompts,
  at one margin FIXED (4 SIGMA: beyond nearly every move, within the largest of many): with the
  largest move as the noise scale, more prompts let it pass more often (the issue-58 review).
A candidate's blocks are judged together (``floor.apply_levels``: all pooled, and each level's,
alpha split between the routes; harness.verdict.floor_rate). regress-engine.toml's sweep (factual
10 and longform 8 greedy prompts at the two levels with a floor, concurrency 2 and 4) is four such
blocks; its floor profile (the four suites' 217, 72, 84 and 45 prompts at concurrency 2, 3 and 4)
twelve. Each level is simulated with its own A/A run, at the same noise.
The A/A run's validity cap is lifted (``aa_floor_max = 1``): at the default 0.25 an A/A run at
noise rate 0.25 is no floor half the time, a separate check with its own words.
"""
from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import numpy as np
from scipy import integrate, stats

from harness.config import Gates
from harness.verdict import floor

from .common import ALPHA, Rate, pick

SIGMA = 0.025     # the engine's margin move per position: |N(0, SIGMA)| logits between two runs
TOKENS = 48       # compared positions per prompt (regress-engine.toml's max_new_tokens)
EPS = 1e-3        # the near-tie epsilon
FIXED = 4 * SIGMA  # the fixed-margin bug's margin: beyond most moves, within the largest of many
FIXED_SHARE = 0.2  # ... on this share of prompts (on top of the engine's noise)
SHAPES = ("correct", "small-margins", "wider-noise", "fixed-margin")
GATES = replace(Gates(), aa_floor_max=1.0)
HEADING = "## A/A floor: false fails of a correct engine and power against a rate-doubling bug"


class Block(NamedTuple):
    """One suite at one level: the A/A run's flips (prompts, baseline margins, the gap each moved)
    and its moves where it agreed, the candidate's divergences, over n prompts."""

    aa_prompts: np.ndarray
    aa_margins: np.ndarray
    aa_shifts: np.ndarray
    cand_prompts: np.ndarray
    cand_margins: np.ndarray
    n: int
    moves: np.ndarray


def _divs(prompts, margins) -> list[dict]:
    return [{"item_id": f"p{i}", "seed": 0, "temperature": 0.0, "position": 3, "margin": float(m),
             "kind": "divergence"} for i, m in zip(prompts, margins)]


SWEEP_BLOCKS = ((10, 8),) * 2  # regress-engine.toml's sweep: levels c2, c4 of (factual, longform)
FLOOR_BLOCKS = ((217, 72, 84, 45),) * 3  # its floor profile: levels c2, c3, c4 of (factual, code, refusal, longform)
PROFILES = {"sweep": SWEEP_BLOCKS, "floor": FLOOR_BLOCKS}


def _aa_summary(b: Block) -> dict:
    """One suite's A/A run as the summary holds it: its identity block and its noise (`floor.noise`'s
    fields, from the same `floor.move_summary`)."""
    aa_ident = {"n": b.n, "identical": b.n - len(b.aa_prompts), "divergences": _divs(b.aa_prompts, b.aa_margins),
                "near_ties": 0}
    flips = [{"item_id": d["item_id"], "seed": 0, "position": 3, "margin": d["margin"],
              "aa_margin": float(s) - d["margin"], "shift": float(s)}
             for d, s in zip(aa_ident["divergences"], b.aa_shifts)]
    return {"aa_noise": {"pairs": b.n, "errors": [], "flips": flips, "missing_margins": 0, "missing_at": [],
                         **floor.move_summary(b.moves, b.aa_shifts)},
            "identity": {"T=0": aa_ident}}


def _cand_ident(cand_prompts, cand_margins, n: int) -> dict:
    return {"n": n, "identical": n - len(cand_prompts), "divergences": _divs(cand_prompts, cand_margins),
            "near_ties": 0}


def family_statuses(levels, gates=GATES) -> list[str]:
    """The gate's verdicts on one candidate's blocks (`levels`: a list of levels, each a list of
    `Block`s, one per suite, with its own A/A run): through apply_levels (the candidate's blocks
    tested together) -> level_floor -> compare -> gate_detail."""
    parts = []
    for lvl, blocks in enumerate(levels):
        aa, cand = f"base~aa@c{lvl + 2}", f"cand@c{lvl + 2}"
        summary = {"near_tie_epsilon": {"value": EPS}, "candidates": {aa: {"suites": {}}, cand: {"kind": "exact", "suites": {}}}}
        for i, b in enumerate(blocks):
            summary["candidates"][aa]["suites"][f"s{i}"] = _aa_summary(b)
            summary["candidates"][cand]["suites"][f"s{i}"] = {
                "identity": {"T=0": _cand_ident(b.cand_prompts, b.cand_margins, b.n)}}
        parts.append((summary, aa, [cand]))
    floor.apply_levels(parts, gates)
    return [floor.gate_detail(s["identity"]["T=0"])[0] for summary, _, (cand,) in parts
            for s in summary["candidates"][cand]["suites"].values()]


def gate_status(block: Block, gates=GATES) -> str:
    """The gate's verdict ("pass", "fail" or "inconclusive") on one study, one block, through
    level_floor, compare and gate_detail."""
    return family_statuses([[block]], gates)[0]


def _flips(rng, hit: np.ndarray, sigma: float):
    """Baseline margins and gap moves of flips under a noise of scale sigma: a flip needs a move
    beyond the margin, so (margins near 0 about uniform) the move is size-biased |N(0, sigma)|,
    a Rayleigh, and the margin uniform below it."""
    moved = rng.rayleigh(sigma, hit.size)
    return EPS + rng.random(hit.size) * moved, EPS + moved


def _draw(rng, common, rate: float, n: int, sigma: float):
    """One run's divergences: the shared ones (`common`, the baseline's own) and its own at the
    rate left, so that each prompt diverges with probability ``rate`` in all."""
    left = max(rate - common.mean_rate, 0.0) / (1 - common.mean_rate)
    own = np.flatnonzero((rng.random(n) < left) & ~common.mask)
    hit = np.union1d(np.flatnonzero(common.mask), own)
    margins, shifts = _flips(rng, hit, np.where(np.isin(hit, own), sigma, SIGMA))
    return hit, margins, shifts


class _Common:
    def __init__(self, rng, rate: float, shared: float, n: int):
        self.mean_rate = shared * rate
        self.mask = rng.random(n) < self.mean_rate


def draw(rng, rate: float, n: int, shape: str, shared: float = 0.0) -> Block:
    """One block for a candidate of ``shape`` at noise ``rate`` over ``n`` prompts."""
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {SHAPES}, not {shape!r}")
    cand_rate = rate if shape in ("correct", "fixed-margin") else min(2 * rate, 1.0)
    common = _Common(rng, rate, shared, n)
    aa_p, aa_m, aa_s = _draw(rng, common, rate, n, SIGMA)
    c_p, c_m, _ = _draw(rng, common, cand_rate, n, 2 * SIGMA if shape == "wider-noise" else SIGMA)
    if shape == "fixed-margin":  # a bug of its own on a few more prompts, at one margin
        extra = np.setdiff1d(np.flatnonzero(rng.random(n) < FIXED_SHARE * rate), c_p)
        c_p, c_m = np.concatenate([c_p, extra]), np.concatenate([c_m, np.full(extra.size, FIXED)])
    moves = np.abs(rng.normal(0.0, SIGMA, TOKENS * n - aa_p.size))
    return Block(aa_p, aa_m, aa_s, c_p, c_m, n, moves)


def study(rng, rate: float, n: int, shape: str, shared: float = 0.0, judge=gate_status) -> str:
    """One simulated study's verdict for a candidate of ``shape``, one block."""
    return judge(draw(rng, rate, n, shape, shared))


def fail_rate(rate: float, n: int, shape: str, studies: int, rng, judge=gate_status, shared: float = 0.0) -> Rate:
    """P(the verdict is not "pass") for a candidate of ``shape`` at noise ``rate`` over ``n`` prompts."""
    fails = sum(study(rng, rate, n, shape, shared, judge) != "pass" for _ in range(studies))
    return Rate(fails / studies, studies, None)


def profile_fail_rate(rate: float, shape: str, studies: int, rng, blocks=SWEEP_BLOCKS, shared: float = 0.0) -> Rate:
    """P(some block of the profile is not "pass"): the candidate is refused. The blocks are one
    candidate's family, judged together (pooled into one test, as the gate does)."""
    fails = sum(any(s != "pass" for s in family_statuses([[draw(rng, rate, n, shape, shared) for n in level]
                                                           for level in blocks]))
                for _ in range(studies))
    return Rate(fails / studies, studies, None)


def profile_plan(rate: float, blocks=SWEEP_BLOCKS, shared: float = 0.0) -> tuple[float, float]:
    """(P(pass | correct), P(fail | doubled)) of the routes over the profile's levels of blocks:
    `floor.family_plan` (exact per route; over several levels the bounds it states)."""
    p = floor.family_plan(rate, {i: sum(level) for i, level in enumerate(blocks)}, ALPHA, shared)
    return p["pass_correct"], p["fail_doubled"]


def _ci(x: Rate) -> str:
    return f"{x.simulated:.4f} ± {1.96 * x.mc_se:.4f}"


def report_lines(*, rng, grid: str = "full") -> list[str]:
    rates = pick((0.01, 0.02, 0.05, 0.1, 0.25), (0.05,), grid)
    sizes = pick((8, 10, 50, 100, 200, 500), (10, 100), grid)
    studies = pick(1000, 100, grid)
    out = [HEADING, "",
           f"Through the gate's own code (`harness.verdict.floor`: `level_floor` -> `compare` -> `gate_detail`; "
           f"harness/calibration/floor.py), {studies:,} simulated studies per cell, alpha {ALPHA}, "
           f"`inconclusive = \"fail\"`. Between two runs each position's top-2 margin moves by |N(0, {SIGMA:g})| "
           f"logits ({TOKENS} positions per prompt), and per prompt each run flips with probability `rate`, "
           f"independently; a flip's move is size-biased (Rayleigh) and its margin uniform below it. The noise "
           f"scale is {floor.NOISE_FACTOR:g} x an upper {floor.NOISE_CONFIDENCE:.0%} bound on the A/A moves' "
           f"{floor.NOISE_QUANTILE:.0%} quantile (an order statistic), or the A/A run's largest flip margin if "
           f"higher; a divergence beyond it fails, one within it goes to the rate test. The small-margin bug doubles "
           f"the rate at the same margins; the wider-noise bug doubles it with a noise twice as wide; the "
           f"fixed-margin bug adds divergences on {FIXED_SHARE:g} x rate more prompts at margin {FIXED:g} "
           f"({FIXED / SIGMA:g} sigma). 'plan' is `floor.plan` at the true rate (exact: the rate rule summed over "
           f"the binomial discordant count): P(pass | correct) and P(fail | rate doubled). Simulated rates ± 1.96 "
           f"Monte Carlo SE.", "",
           "| noise rate | prompts | plan P(pass) correct | simulated fail: correct | plan P(fail) doubled "
           "| simulated fail: small-margin bug | simulated fail: wider-noise bug | simulated fail: fixed-margin bug |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rates:
        for n in sizes:
            p = floor.plan(r, n, ALPHA)
            ok, bug, wide, fixed = (fail_rate(r, n, shape, studies, rng) for shape in SHAPES)
            out.append(f"| {r:g} | {n} | {p['pass_correct']:.4f} | {_ci(ok)} | {p['fail_doubled']:.4f} | {_ci(bug)} "
                       f"| {_ci(wide)} | {_ci(fixed)} |")
    needed = ", ".join(f"{r:g}: {floor.plan(r, 10, ALPHA)['needed']}" for r in rates)
    out += ["", f"Prompts (a candidate's blocks pooled) the plan asks for to catch a doubled rate with probability >= "
            f"{floor.PLAN_POWER}, by noise rate: {needed}.", ""]
    return (out + monotone_lines(rates) + growing_lines(rng, grid) + tail_lines()
            + shipped_lines(rates, studies, rng))


GROWING_SIZES = (50, 100, 200, 500, 1000, 2000)


def growing_lines(rng, grid: str) -> list[str]:
    """P(fail) at 50-2,000 prompts through the gate, every shape: the rate rule's power does not
    fall (above, exactly), and neither may the noise scale's: it must not grow with the prompts."""
    rates, sizes = pick((0.02, 0.05), (0.05,), grid), pick(GROWING_SIZES, (50, 300), grid)
    studies = pick(400, 30, grid)
    rows = []
    for r in rates:
        for shape in SHAPES:
            cells = [fail_rate(r, n, shape, studies, rng) for n in sizes]
            steps = np.diff([c.simulated for c in cells])
            worst = int(np.argmin(steps))
            se = 1.96 * np.hypot(cells[worst].mc_se, cells[worst + 1].mc_se)
            rows.append(f"| {r:g} | {shape} | " + " | ".join(f"{c.simulated:.3f}" for c in cells)
                        + f" | {steps[worst]:+.3f} ± {se:.3f} |")
    return [f"### More prompts never let a bug pass more often: P(fail) through the gate, {studies:,} studies per cell",
            "", "The noise scale was the largest A/A move before (main 8c106b0); the largest of more moves is larger, "
            "so a bug diverging at a fixed margin passed more often with more prompts: the fixed-margin bug at rate "
            "0.05 was caught 0.475 at 300 prompts and 0.265 at 1,000 (200 studies each). A correct engine's row is "
            "its false-fail rate (<= alpha at every size); 'smallest step' is the largest fall between neighbouring "
            "sizes, with its 1.96 Monte Carlo SE.", "",
            "| noise rate | candidate | " + " | ".join(f"{n:,}" for n in sizes) + " | smallest step |",
            "|---|---|" + "---|" * len(sizes) + "---|", *rows, ""]


def tail_lines() -> list[str]:
    """Why the noise scale is 2.5 x the moves' p99: a correct engine's flips beyond it, per flip,
    exactly. A flip's move is size-biased and its margin uniform below it, so P(margin > t) =
    E[(move - t)+] / E[move] = integral of the moves' survival beyond t over their mean."""
    rows = []
    for name, law in (("half-normal, sigma 1", stats.halfnorm()), ("exponential, mean 1", stats.expon()),
                      ("absolute Student t, 3 df (heavier than exponential)", _abs_t3())):
        t = floor.NOISE_FACTOR * float(law.ppf(floor.NOISE_QUANTILE))
        beyond = integrate.quad(law.sf, t, np.inf)[0] / float(law.mean())
        rows.append(f"| {name} | {law.ppf(floor.NOISE_QUANTILE):.3g} | {beyond:.2e} | {200 * beyond:.4f} |")
    return ["### A correct engine's flips beyond the noise scale", "",
            f"A correct candidate's flip lies beyond the scale when its margin exceeds {floor.NOISE_FACTOR:g} x the "
            f"moves' {floor.NOISE_QUANTILE:.0%} quantile (the bound sits at or above it). A flip's move is size-biased "
            f"and its margin uniform below it, so per flip that is E[(move - t)+] / E[move], exactly, below; with k "
            f"flips the candidate is refused about k times it. For a tail exponential or lighter it is at most "
            f"{1 - floor.NOISE_QUANTILE:g} ** {floor.NOISE_FACTOR:g} = {(1 - floor.NOISE_QUANTILE) ** floor.NOISE_FACTOR:.0e} "
            f"per flip; a polynomial tail (last row) is not covered.", "",
            "| moves | p99 | P(flip beyond 2.5 x p99) | x 200 flips (2,000 prompts at rate 0.1) |",
            "|---|---|---|---|", *rows, ""]


def _abs_t3():
    """|T| for Student's t with 3 degrees of freedom, as a frozen law with sf, ppf and mean."""
    class AbsT3:
        sf = staticmethod(lambda x: 2 * stats.t.sf(x, 3))
        ppf = staticmethod(lambda q: stats.t.ppf((1 + q) / 2, 3))
        mean = staticmethod(lambda: 2 * np.sqrt(3) / np.pi)
    return AbsT3()


def monotone_lines(rates) -> list[str]:
    """P(fail | doubled) over 50-2,000 prompts in steps of 10: its smallest step (>= 0: more
    prompts never make a doubled rate more likely to pass), exactly from the plan."""
    rows = []
    for r in rates:
        ns = np.arange(50, 2001, 10)
        power = np.array([floor.plan(r, int(n), ALPHA)["fail_doubled"] for n in ns])
        rows.append(f"| {r:g} | {power[0]:.4f} | {power[-1]:.4f} | {np.diff(power).min():+.2e} |")
    return ["### More prompts only add power", "",
            "| noise rate | P(fail doubled) at 50 | at 2,000 | smallest step over n = 50, 60, ..., 2,000 |",
            "|---|---|---|---|", *rows, ""]


def shipped_lines(rates, studies: int, rng) -> list[str]:
    """regress-engine.toml's sweep and floor profiles (their blocks pooled), and the same with half
    the divergences shared: a correct engine refused, and a bug that doubles the rate caught."""
    out = []
    for name, blocks in PROFILES.items():
        rows = []
        for shared in (0.0, 0.5):
            for r in rates:
                ok_p, bug_p = profile_plan(r, blocks, shared)
                ok = profile_fail_rate(r, "correct", studies, rng, blocks, shared)
                bug = profile_fail_rate(r, "small-margins", studies, rng, blocks, shared)
                rows.append(f"| {shared:g} | {r:g} | {ok_p:.4f} | {_ci(ok)} | {bug_p:.4f} | {_ci(bug)} |")
        sizes = ", ".join(map(str, blocks[0]))
        out += [f"### regress-engine.toml's {name} profile: {len(blocks)} levels of {sizes} greedy prompts "
                f"({sum(map(sum, blocks)):,} in all), refused when any block is", "",
                "'plan' is `floor.family_plan`: over several levels, a lower bound on P(pass | correct) (one less each "
                "route's exact false-fail rate) and on P(fail | doubled).", "",
                "| shared share | noise rate | plan P(pass) correct | simulated refused: correct "
                "| plan P(fail) doubled | simulated refused: small-margin bug |",
                "|---|---|---|---|---|---|", *rows, ""]
    return out
