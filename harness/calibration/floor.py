"""Calibration of the A/A floor's rate rule, by simulation through the gate's own code.

Part of ``python -m harness.calibration.report`` (the section "A/A floor" in CALIBRATION.md).
Each simulated study builds one suite's identity blocks as the summary does (an A/A run and an
exact candidate over ``n`` greedy prompts, one pair each) and judges them with
``harness.verdict.floor.level_floor`` -> ``compare`` -> ``gate_detail``, the functions the gate
calls; a study fails when the verdict is not "pass" (``inconclusive = "fail"``, shipped).

The noise model: on each prompt the engine flips a token with probability ``rate`` per run, at
a top-2 margin uniform on (eps, NOISE / 2), so the flip moves the two tokens' gap by at most the
A/A noise scale NOISE (every flip lies within the measured noise). A share ``shared`` of those
flips is the baseline's own odd token, so the A/A run and the candidate both leave it on that
prompt; the rest are each run's own, independent between runs. Candidates, by shape:
- ``correct``: the same noise as the A/A run (its false-fail rate is what "crying wolf" means);
- ``small-margins``: a bug that doubles the rate, its extra flips at the same small margins, so
  only the rate rule can see it (its detection is set against the plan's stated power);
- ``wider-noise``: a bug whose own noise is twice as wide: twice the rate, margins up to 2 NOISE,
  so some flips lie beyond the A/A noise and fail outright.
The shipped sweep (regress-engine.toml: factual 10 and longform 8 greedy prompts at the two
levels with a floor, concurrency 2 and 4) is four such blocks; the candidate passes when all four do,
each tested at alpha / 4 (``floor.apply_levels``, the gate's split over a candidate's blocks).
The A/A run's validity cap is lifted (``aa_floor_max = 1``): at the default 0.25 an A/A run at
noise rate 0.25 is no floor half the time, a separate check with its own words.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from harness.config import Gates
from harness.verdict import floor

from .common import ALPHA, Rate, pick

NOISE = 0.1       # the A/A noise scale, logits
EPS = 1e-3        # the near-tie epsilon
SHAPES = ("correct", "small-margins", "wider-noise")
GATES = replace(Gates(), aa_floor_max=1.0)
HEADING = "## A/A floor: false fails of a correct engine and power against a rate-doubling bug"


def _divs(prompts, margins) -> list[dict]:
    return [{"item_id": f"p{i}", "seed": 0, "temperature": 0.0, "position": 3, "margin": float(m),
             "kind": "divergence"} for i, m in zip(prompts, margins)]


SHIPPED_BLOCKS = (10, 8, 10, 8)  # regress-engine.toml's sweep: (factual, longform) x (c2, c4)


def _aa_summary(aa_prompts, aa_margins, n: int) -> dict:
    """One suite's A/A run as the summary holds it: its identity block and its noise."""
    aa_ident = {"n": n, "identical": n - len(aa_prompts), "divergences": _divs(aa_prompts, aa_margins),
                "near_ties": 0}
    flips = [{"item_id": d["item_id"], "seed": 0, "position": 3, "margin": d["margin"], "aa_margin": d["margin"],
              "shift": 2 * d["margin"]} for d in aa_ident["divergences"]]
    return {"aa_noise": {"pairs": n, "errors": [], "flips": flips, "positions": 8 * n, "missing_margins": 0,
                         "missing_at": [], "max_shift": NOISE, "p99_shift": NOISE / 2},
            "identity": {"T=0": aa_ident}}


def _cand_ident(cand_prompts, cand_margins, n: int) -> dict:
    return {"n": n, "identical": n - len(cand_prompts), "divergences": _divs(cand_prompts, cand_margins),
            "near_ties": 0}


def family_statuses(blocks, gates=GATES) -> list[str]:
    """The gate's verdicts on one candidate's blocks, each (aa_prompts, aa_margins, cand_prompts,
    cand_margins, n), one block per suite at one level: through apply_levels (alpha split over the
    candidate's blocks) -> level_floor -> compare -> gate_detail."""
    summary = {"near_tie_epsilon": {"value": EPS},
               "candidates": {"base~aa": {"suites": {}}, "cand": {"kind": "exact", "suites": {}}}}
    for i, (aa_p, aa_m, c_p, c_m, n) in enumerate(blocks):
        summary["candidates"]["base~aa"]["suites"][f"s{i}"] = _aa_summary(aa_p, aa_m, n)
        summary["candidates"]["cand"]["suites"][f"s{i}"] = {"identity": {"T=0": _cand_ident(c_p, c_m, n)}}
    floor.apply_levels([(summary, "base~aa", ["cand"])], gates)
    return [floor.gate_detail(s["identity"]["T=0"])[0] for s in summary["candidates"]["cand"]["suites"].values()]


def gate_status(aa_prompts, aa_margins, cand_prompts, cand_margins, n: int, gates=GATES) -> str:
    """The gate's verdict ("pass", "fail" or "inconclusive") on one study, one block, through
    level_floor, compare and gate_detail."""
    return family_statuses([(aa_prompts, aa_margins, cand_prompts, cand_margins, n)], gates)[0]


def _draw(rng, common, rate: float, n: int, width: float):
    """One run's divergences: the shared ones (`common`, the baseline's own) and its own at the
    rate left, so that each prompt diverges with probability ``rate`` in all."""
    left = max(rate - common.mean_rate, 0.0) / (1 - common.mean_rate)
    own = np.flatnonzero((rng.random(n) < left) & ~common.mask)
    hit = np.union1d(np.flatnonzero(common.mask), own)
    return hit, rng.uniform(EPS, np.where(np.isin(hit, own), width, NOISE / 2))


class _Common:
    def __init__(self, rng, rate: float, shared: float, n: int):
        self.mean_rate = shared * rate
        self.mask = rng.random(n) < self.mean_rate


def draw(rng, rate: float, n: int, shape: str, shared: float = 0.0) -> tuple:
    """One block's (aa_prompts, aa_margins, cand_prompts, cand_margins, n) for a candidate of ``shape``."""
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {SHAPES}, not {shape!r}")
    cand_rate = rate if shape == "correct" else min(2 * rate, 1.0)
    width = 2 * NOISE if shape == "wider-noise" else NOISE / 2
    common = _Common(rng, rate, shared, n)
    return (*_draw(rng, common, rate, n, NOISE / 2), *_draw(rng, common, cand_rate, n, width), n)


def study(rng, rate: float, n: int, shape: str, shared: float = 0.0, judge=gate_status) -> str:
    """One simulated study's verdict for a candidate of ``shape``, one block."""
    return judge(*draw(rng, rate, n, shape, shared))


def fail_rate(rate: float, n: int, shape: str, studies: int, rng, judge=gate_status, shared: float = 0.0) -> Rate:
    """P(the verdict is not "pass") for a candidate of ``shape`` at noise ``rate`` over ``n`` prompts."""
    fails = sum(study(rng, rate, n, shape, shared, judge) != "pass" for _ in range(studies))
    return Rate(fails / studies, studies, None)


def profile_fail_rate(rate: float, shape: str, studies: int, rng, blocks=SHIPPED_BLOCKS, shared: float = 0.0) -> Rate:
    """P(some block of the profile is not "pass"): the candidate is refused. The blocks are one
    candidate's family, judged together (alpha split over them, as the gate does)."""
    fails = sum(any(s != "pass" for s in family_statuses([draw(rng, rate, n, shape, shared) for n in blocks]))
                for _ in range(studies))
    return Rate(fails / studies, studies, None)


def profile_plan(rate: float, blocks=SHIPPED_BLOCKS, shared: float = 0.0) -> tuple[float, float]:
    """Exact (P(pass | correct), P(fail | doubled)) over the profile's blocks, independent, each
    at alpha split over the blocks."""
    plans = [floor.plan(rate, n, ALPHA / len(blocks), shared) for n in blocks]
    return float(np.prod([p["pass_correct"] for p in plans])), 1 - float(np.prod([1 - p["fail_doubled"] for p in plans]))


def _ci(x: Rate) -> str:
    return f"{x.simulated:.4f} ± {1.96 * x.mc_se:.4f}"


def report_lines(*, rng, grid: str = "full") -> list[str]:
    rates = pick((0.01, 0.02, 0.05, 0.1, 0.25), (0.05,), grid)
    sizes = pick((8, 10, 50, 100, 200, 500), (10, 100), grid)
    studies = pick(1000, 100, grid)
    out = [HEADING, "",
           f"Through the gate's own code (`harness.verdict.floor`: `level_floor` -> `compare` -> `gate_detail`; "
           f"harness/calibration/floor.py), {studies:,} simulated studies per cell, alpha {ALPHA}, "
           f"`inconclusive = \"fail\"`. Per prompt the engine flips with probability `rate` in each run "
           f"independently, within the A/A noise; the small-margin bug doubles the rate at the same margins; the "
           f"wider-noise bug doubles it with margins up to twice the noise. 'plan' is `floor.plan` at the true rate "
           f"(exact: the same rule summed over the binomial discordant count): P(pass | correct) and P(fail | rate "
           f"doubled). Simulated rates ± 1.96 Monte Carlo SE.", "",
           "| noise rate | prompts | plan P(pass) correct | simulated fail: correct | plan P(fail) doubled "
           "| simulated fail: small-margin bug | simulated fail: wider-noise bug |",
           "|---|---|---|---|---|---|---|"]
    for r in rates:
        for n in sizes:
            p = floor.plan(r, n, ALPHA)
            ok, bug, wide = (fail_rate(r, n, shape, studies, rng) for shape in SHAPES)
            out.append(f"| {r:g} | {n} | {p['pass_correct']:.4f} | {_ci(ok)} | {p['fail_doubled']:.4f} | {_ci(bug)} "
                       f"| {_ci(wide)} |")
    needed = ", ".join(f"{r:g}: {floor.plan(r, 10, ALPHA)['needed']}" for r in rates)
    out += ["", f"Prompts per block the plan asks for to catch a doubled rate with probability >= "
            f"{floor.PLAN_POWER}, by noise rate: {needed}.", ""]
    return out + monotone_lines(rates) + shipped_lines(rates, studies, rng)


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
    """The shipped sweep's four blocks, and the same with half the divergences shared."""
    rows = []
    for shared in (0.0, 0.5):
        for r in rates:
            ok_p, bug_p = profile_plan(r, shared=shared)
            ok = profile_fail_rate(r, "correct", studies, rng, shared=shared)
            bug = profile_fail_rate(r, "small-margins", studies, rng, shared=shared)
            rows.append(f"| {shared:g} | {r:g} | {ok_p:.4f} | {_ci(ok)} | {bug_p:.4f} | {_ci(bug)} |")
    return [f"### The shipped sweep: blocks of {', '.join(map(str, SHIPPED_BLOCKS))} greedy prompts, "
            f"refused when any block is", "",
            "| shared share | noise rate | plan P(pass) correct | simulated refused: correct "
            "| plan P(fail) doubled | simulated refused: small-margin bug |",
            "|---|---|---|---|---|---|", *rows, ""]
