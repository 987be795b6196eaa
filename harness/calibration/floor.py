"""Calibration of the A/A floor's rate rule, by simulation through the gate's own code.

Part of ``python -m harness.calibration.report`` (the section "A/A floor" in CALIBRATION.md).
Each simulated study builds one suite's identity blocks as the summary does (an A/A run and an
exact candidate over ``n`` greedy prompts, one pair each) and judges them with
``harness.verdict.floor.level_floor`` -> ``compare`` -> ``gate_detail``, the functions the gate
calls; a study fails when the verdict is not "pass" (``inconclusive = "fail"``, shipped).

The noise model: on each prompt the engine flips a token with probability ``rate`` per run,
independently between runs, at a top-2 margin uniform on (eps, NOISE / 2), so the flip moves the
two tokens' gap by at most the A/A noise scale NOISE (every flip lies within the measured noise).
Candidates, by shape:
- ``correct``: the same noise as the A/A run (its false-fail rate is what "crying wolf" means);
- ``small-margins``: a bug that doubles the rate, its extra flips at the same small margins, so
  only the rate rule can see it (its detection is set against the plan's stated power);
- ``wider-noise``: a bug whose own noise is twice as wide: twice the rate, margins up to 2 NOISE,
  so some flips lie beyond the A/A noise and fail outright.
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


def gate_status(aa_prompts, aa_margins, cand_prompts, cand_margins, n: int, gates=GATES) -> str:
    """The gate's verdict ("pass", "fail" or "inconclusive") on one study, through level_floor,
    compare and gate_detail."""
    aa_ident = {"n": n, "identical": n - len(aa_prompts), "divergences": _divs(aa_prompts, aa_margins),
                "near_ties": 0}
    flips = [{"item_id": d["item_id"], "seed": 0, "position": 3, "margin": d["margin"], "aa_margin": d["margin"],
              "shift": 2 * d["margin"]} for d in aa_ident["divergences"]]
    aa = {"suites": {"s": {"aa_noise": {"pairs": n, "errors": [], "flips": flips, "positions": 8 * n,
                                        "missing_margins": 0, "missing_at": [], "max_shift": NOISE,
                                        "p99_shift": NOISE / 2},
                           "identity": {"T=0": aa_ident}}}}
    level = floor.level_floor("base~aa", aa, EPS, gates)
    ident = {"n": n, "identical": n - len(cand_prompts), "divergences": _divs(cand_prompts, cand_margins),
             "near_ties": 0}
    ident["floor"] = floor.compare(ident, aa_ident, level, gates.alpha, gates.aa_excess_tolerance)
    return floor.gate_detail(ident)[0]


def _draw(rng, rate: float, n: int, width: float):
    hit = np.flatnonzero(rng.random(n) < rate)
    return hit, rng.uniform(EPS, width, hit.size)


def fail_rate(rate: float, n: int, shape: str, studies: int, rng, judge=gate_status) -> Rate:
    """P(the verdict is not "pass") for a candidate of ``shape`` at noise ``rate`` over ``n`` prompts."""
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {SHAPES}, not {shape!r}")
    cand_rate = rate if shape == "correct" else min(2 * rate, 1.0)
    width = 2 * NOISE if shape == "wider-noise" else NOISE / 2
    fails = 0
    for _ in range(studies):
        aa = _draw(rng, rate, n, NOISE / 2)
        cand = _draw(rng, cand_rate, n, width)
        fails += judge(*aa, *cand, n) != "pass"
    return Rate(fails / studies, studies, None)


def report_lines(*, rng, grid: str = "full") -> list[str]:
    rates = pick((0.01, 0.02, 0.05, 0.1, 0.15, 0.25), (0.05,), grid)
    sizes = pick((10, 25, 50, 100, 150, 200), (150,), grid)
    studies = pick(2000, 100, grid)
    tol = GATES.aa_excess_tolerance
    out = [HEADING, "",
           f"Through the gate's own code (`harness.verdict.floor`: `level_floor` -> `compare` -> `gate_detail`; "
           f"harness/calibration/floor.py), {studies:,} simulated studies per cell, tolerance "
           f"`aa_excess_tolerance` = {tol:g}, alpha {ALPHA}, `inconclusive = \"fail\"`. Per prompt the engine "
           f"flips with probability `rate` in each run independently, within the A/A noise; the small-margin "
           f"bug doubles the rate at the same margins; the wider-noise bug doubles it with margins up to twice "
           f"the noise. 'plan' is `floor.plan` at the true rate (exact enumeration of the same rule): "
           f"P(pass | correct) and P(fail | rate doubled); 'enough' where P(pass | correct) >= "
           f"{floor.PLAN_PASS}. Simulated rates ± 1.96 Monte Carlo SE.", "",
           "| noise rate | prompts | plan P(pass) correct | enough | simulated fail: correct | plan P(fail) doubled "
           "| simulated fail: small-margin bug | difference | simulated fail: wider-noise bug |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rates:
        for n in sizes:
            p = floor.plan(r, n, tol, ALPHA)
            ok = fail_rate(r, n, "correct", studies, rng)
            bug = fail_rate(r, n, "small-margins", studies, rng)
            wide = fail_rate(r, n, "wider-noise", studies, rng)
            ci = lambda x: f"{x.simulated:.4f} ± {1.96 * x.mc_se:.4f}"  # noqa: E731
            out.append(f"| {r:g} | {n} | {p['pass_correct']:.4f} | {'yes' if p['enough'] else 'no'} | {ci(ok)} | "
                       f"{p['fail_doubled']:.4f} | {ci(bug)} | {bug.simulated - p['fail_doubled']:+.4f} | {ci(wide)} |")
    needed = ", ".join(f"{r:g}: {floor.plan(r, 10, tol, ALPHA)['needed']}" for r in rates)
    out += ["", f"Prompts the plan asks for (a correct engine passes with probability >= {floor.PLAN_PASS}), by "
            f"noise rate: {needed}.", ""]
    return out + planned_size_lines(rates, sizes, studies, rng)


def planned_size_lines(rates, sizes, studies: int, rng) -> list[str]:
    """The noise rates no grid size is enough for, at the size the plan asks for: a correct
    engine's false fails there are the plan's own 1 - P(pass), by construction near 0.05."""
    tol = GATES.aa_excess_tolerance
    rows = []
    for r in rates:
        n = floor.plan(r, max(sizes), tol, ALPHA)["needed"]
        if n is None or n <= max(sizes):
            continue
        p = floor.plan(r, n, tol, ALPHA)
        ok, bug, wide = (fail_rate(r, n, shape, studies, rng) for shape in ("correct", "small-margins", "wider-noise"))
        rows.append(f"| {r:g} | {n} | {p['pass_correct']:.4f} | {ok.simulated:.4f} ± {1.96 * ok.mc_se:.4f} | "
                    f"{p['fail_doubled']:.4f} | {bug.simulated:.4f} ± {1.96 * bug.mc_se:.4f} | "
                    f"{wide.simulated:.4f} ± {1.96 * wide.mc_se:.4f} |")
    if not rows:
        return []
    return [f"### At the size the plan asks for, where no grid size up to {max(sizes)} prompts is enough", "",
            "| noise rate | prompts (plan) | plan P(pass) correct | simulated fail: correct | plan P(fail) doubled "
            "| simulated fail: small-margin bug | simulated fail: wider-noise bug |",
            "|---|---|---|---|---|---|---|", *rows, ""]
