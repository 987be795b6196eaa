"""Calibration of the suite's speedup from a timed subset (``analysis.latency.suite_bounds``, what
``paired_speedup(..., suite=...)`` and so the speed gate use when only the speed sample is timed).

Part of ``python -m harness.calibration.report`` (the section "The suite's speedup from a timed
subset" in CALIBRATION.md). A study: a suite of ``SUITE`` prompts drawn from a design, its
baseline's tokens known for every prompt, a simple random subset of ``m`` prompts timed (baseline
and candidate); the estimand is the suite's speedup, E[baseline wall] / E[candidate wall] summed
over every pair of the suite (what timing all of it converges to). Per prompt: a per-token step
log-normal (log-sd 0.25), a gain log-normal around 1.3x (log-sd 0.35) with a slope of -0.3 per
log token of its length (long outputs gain less), 1-3 pairs with lengths 0.6-1.4x the prompt's,
per-pair noise log-sd 0.05 and a fixed overhead per request. Designs (issue 58's):
- ``bimodal``: 90% of prompts about 30 tokens, 10% about 300 (log-sd 0.2 around each);
- ``rare-long``: log-normal around 60 (log-sd 0.5), 3% of prompts 10x longer;
- ``log-sd 1.2``: log-normal around 60 tokens with log-sd 1.2.
The bound is the stratified jackknife on the log scale (``suite_bounds``). Every refusal at 10-20
timed prompts on these designs is the unseen rule (suite prompts over UNSEEN_FACTOR x longer than
any timed one carrying over UNSEEN_MAX of the tokens): at 2x a bimodal suite's bound covered 0.937
at 20 timed prompts (300 studies), so the rule stays.
"before": the bound the gate used on the timed prompts alone (``speed_bounds``, whose estimand is
the population of prompts), set against the same suite truth. No bound counts as covering (it can
never pass a `min_speedup`); its share and the median bound / the timed ratio are what it costs.
"""
from __future__ import annotations

import numpy as np

from analysis.latency import UNSEEN_FACTOR, UNSEEN_MAX, speed_bounds, suite_bounds

from .common import Rate, pick

STEP_S, STEP_SD, GAIN, GAIN_SD, SLOPE, NOISE_SD, OVERHEAD_S, LENGTH_MID = 0.06, 0.25, 1.3, 0.35, -0.3, 0.05, 0.05, 60.0
SUITE = 200
DESIGNS = ("bimodal", "rare-long", "log-sd 1.2")
HEADING = "## The suite's speedup from a timed subset"


def lengths(design: str, rng, n: int) -> np.ndarray:
    """Each prompt's natural output length (tokens)."""
    if design == "bimodal":
        return np.exp(np.where(rng.random(n) < 0.10, np.log(300), np.log(30)) + rng.normal(0, 0.2, n))
    if design == "rare-long":
        return np.exp(np.log(LENGTH_MID) + rng.normal(0, 0.5, n)) * np.where(rng.random(n) < 0.03, 10, 1)
    if design == "log-sd 1.2":
        return np.exp(np.log(LENGTH_MID) + rng.normal(0, 1.2, n))
    raise ValueError(f"design must be one of {DESIGNS}, not {design!r}")


def suite(design: str, rng, n: int = SUITE):
    """One suite: per-prompt sums (bw, bn, cw, cn) as if every prompt were timed, pairs per prompt,
    and the suite's true speedup."""
    length = lengths(design, rng, n)
    step = rng.lognormal(np.log(STEP_S), STEP_SD, n)
    gain = np.exp(np.log(GAIN) + SLOPE * (np.log(length) - np.log(LENGTH_MID)) + rng.normal(0, GAIN_SD, n))
    k = rng.integers(1, 4, n)
    prompt = np.repeat(np.arange(n), k)
    tokens = np.maximum(np.floor(length[prompt] * rng.uniform(0.6, 1.4, prompt.size)), 2.0)
    mean_noise = np.exp(NOISE_SD ** 2 / 2)
    truth = (np.sum(step[prompt] * tokens * mean_noise + OVERHEAD_S)
             / np.sum((step / gain)[prompt] * tokens * mean_noise + OVERHEAD_S))
    bw = step[prompt] * tokens * rng.lognormal(0, NOISE_SD, tokens.size) + OVERHEAD_S
    cw = (step / gain)[prompt] * tokens * rng.lognormal(0, NOISE_SD, tokens.size) + OVERHEAD_S
    sums = [np.bincount(prompt, weights=x, minlength=n) for x in (bw, tokens, cw, tokens)]
    return sums, k, float(truth)


def study(design: str, m: int, rng) -> tuple[float, float, float, float]:
    """(truth, the suite bound, the bound before, the timed subset's ratio of totals) of one study."""
    sums, k, truth = suite(design, rng)
    timed = rng.choice(SUITE, m, replace=False)
    sub = [x[timed] for x in sums]
    bound = suite_bounds(sub, k[timed], sums[1], k)[3]
    before = float(speed_bounds([x[None] for x in sub], pairs=k[timed][None])[2][0])
    return truth, bound, before, float((sub[0].sum() / sub[1].sum()) / (sub[2].sum() / sub[3].sum()))


def operating(design: str, m: int, studies: int, rng) -> dict:
    """Coverage (no bound counting as covering), share with no bound and the median bound / timed
    ratio (0 where none) and where a bound is given, now and before."""
    rows = np.array([study(design, m, rng) for _ in range(studies)])
    truth, ratio = rows[:, 0], rows[:, 3]
    out = {}
    for name, bound in (("now", rows[:, 1]), ("before", rows[:, 2])):
        given = np.isfinite(bound)
        out[name] = (Rate(float(np.mean(np.where(given, bound <= truth, True))), studies, None),
                     float(1 - given.mean()), float(np.median(np.where(given, bound, 0.0) / ratio)),
                     float(np.median(bound[given] / ratio[given])) if given.any() else float("nan"))
    return out


def report_lines(*, rng, grid: str = "full") -> list[str]:
    sizes, studies = pick((8, 10, 20, 50, 100), (10,), grid), pick(2000, 100, grid)
    out = [HEADING, "",
           f"Through `analysis.latency.suite_bounds` (what `paired_speedup(..., suite=...)` gives the speed gate; "
           f"harness/calibration/suite_speed.py, the model in its docstring), {studies:,} studies per row: a suite "
           f"of {SUITE} prompts, m of them timed at random, gains falling with length (slope {SLOPE:g} per log "
           f"token). Strata by the suite's token-weighted length quantiles, the stratified jackknife on the log "
           f"scale (since issue 58: on the ratio scale the bound, moved down by its skew term, was 0 in half the "
           f"bimodal studies that got one at 10-20 prompts); suite prompts over {UNSEEN_FACTOR:g}x "
           f"longer than any timed one carrying over {UNSEEN_MAX:.0%} of its tokens give no bound. Coverage of the "
           f"one-sided 95% bound against the suite's speedup (no bound counts as covering; target 0.945), the "
           f"share with no bound, and the median bound / the timed ratio (0 where none; and where a bound is "
           f"given). 'before': the bound on "
           f"the timed prompts alone (`speed_bounds`). ± 1.96 Monte Carlo SE.", "",
           "| design | timed prompts | coverage: now | no bound: now | median bound / ratio: now | ... where given "
           "| coverage: before | no bound: before | median bound / ratio: before | ... where given |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for design in DESIGNS:
        for m in sizes:
            r = operating(design, m, studies, rng)
            (now, none_now, med_now, given_now), (old, none_old, med_old, given_old) = r["now"], r["before"]
            out.append(f"| {design} | {m} | {now.simulated:.3f} ± {1.96 * now.mc_se:.3f} | {none_now:.2f} | "
                       f"{med_now:.2f} | {given_now:.2f} | {old.simulated:.3f} ± {1.96 * old.mc_se:.3f} | "
                       f"{none_old:.2f} | {med_old:.2f} | {given_old:.2f} |")
    return out + [""]
