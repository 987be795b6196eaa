"""Calibration of the suite's speedup from a timed subset (``analysis.latency.suite_bounds``, what
``paired_speedup(..., suite=...)`` and so the speed gate use when only the speed sample is timed).

Part of ``python -m harness.calibration.report`` (the section "The suite's speedup from a timed
subset" in CALIBRATION.md). A study: a suite of ``SUITE`` prompts drawn from a design, its
baseline's tokens known for every prompt, ``m`` prompts timed, chosen as a run with a baseline
store chooses them (``harness.run.speed_sample.by_length`` on each prompt's tokens per pair, its
strata weighted by the prompt's tokens), one pair (a work: seed, temperature) of each timed, as a
run times one; the estimand is the suite's speedup, E[baseline wall] / E[candidate wall] summed
over every pair of the suite (what timing all of it converges to). Per prompt: a per-token step
log-normal (log-sd 0.25), a gain log-normal (log-sd 0.35) around a curve in its length
(``GAINS``), 1-3 pairs with lengths 0.6-1.4x the prompt's, per-pair noise log-sd 0.05 and a
fixed overhead per request. Designs (issue 58's, and one with ties):
- ``bimodal``: 90% of prompts about 30 tokens, 10% about 300 (log-sd 0.2 around each);
- ``rare-long``: log-normal around 60 (log-sd 0.5), 3% of prompts 10x longer;
- ``log-sd 1.2``: log-normal around 60 tokens with log-sd 1.2;
- ``capped``: the same, every output cut at CAP tokens (prompts tied at the cap: a stratum must
  not split them one way for the sample and another for the bound).
Gain curves: ``falling`` (1.3x at 60 tokens, -0.3 per log token: long outputs gain less, the
issue's), ``rising`` (+0.3), ``hump`` (+0.5 up to 150 tokens, -1.0 beyond) and ``step``
(1.6x up to 200 tokens, 0.6x beyond): the bound must not lean on any one shape.
The last row is a limit, not a design the bound meets: a flat 1.5x gain (log-sd 0.15) with 3% of prompts
SLOW_GAIN x as fast whatever their length. A sample of m prompts misses all of them with
probability 0.97^m (0.74 at 10), and no bound from a sample can see what it did not time: time
more of the suite (a larger `speed_items`) where such a slow path is possible.
The bound is the stratified jackknife on the log scale (``suite_bounds``); suite prompts over
UNSEEN_FACTOR x longer than any timed one carrying over UNSEEN_MAX of the tokens give no bound.
Beside it: the same bound with a simple random subset of ``m`` prompts timed (the speed sample
before issue 58's length strata), and the bound on the timed prompts alone (``speed_bounds``, the
gate's bound when issue 58 was filed), on the same suite. No bound counts as covering (it can
never pass a `min_speedup`); its share and the median bound / the suite's speedup are what it costs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analysis.latency import UNSEEN_FACTOR, UNSEEN_MAX, speed_bounds, suite_bounds
from harness.run import speed_sample

from .common import Rate, pick

STEP_S, STEP_SD, GAIN, GAIN_SD, NOISE_SD, OVERHEAD_S, LENGTH_MID = 0.06, 0.25, 1.3, 0.35, 0.05, 0.05, 60.0
SUITE = 200
DESIGNS = ("bimodal", "rare-long", "log-sd 1.2", "capped")
CAP = 256  # "capped": outputs cut at this many tokens, so a fifth of the prompts tie at it
GAINS = {  # the median gain at a prompt's length, and the log-sd of prompts' gains around it
    "falling": (lambda n: GAIN * (n / LENGTH_MID) ** -0.3, GAIN_SD),
    "rising": (lambda n: GAIN * (n / LENGTH_MID) ** 0.3, GAIN_SD),
    "hump": (lambda n: GAIN * (n / LENGTH_MID) ** 0.5 / np.maximum(n / 150.0, 1.0) ** 1.5, GAIN_SD),
    "step": (lambda n: np.where(n > 200, 0.6, 1.6), GAIN_SD),
    "flat": (lambda n: np.full(np.shape(n), 1.5), 0.15),
}
SLOW_GAIN = 0.25
# (design, gain, share of slow prompts); the last: a limit no timed subset escapes (its docstring)
ROWS = (*((d, "falling", 0.0) for d in DESIGNS), ("bimodal", "rising", 0.0), ("log-sd 1.2", "rising", 0.0),
        ("bimodal", "hump", 0.0), ("bimodal", "step", 0.0), ("capped", "step", 0.0), ("bimodal", "flat", 0.03))
HEADING = "## The suite's speedup from a timed subset"


def lengths(design: str, rng, n: int) -> np.ndarray:
    """Each prompt's natural output length (tokens)."""
    if design == "bimodal":
        return np.exp(np.where(rng.random(n) < 0.10, np.log(300), np.log(30)) + rng.normal(0, 0.2, n))
    if design == "rare-long":
        return np.exp(np.log(LENGTH_MID) + rng.normal(0, 0.5, n)) * np.where(rng.random(n) < 0.03, 10, 1)
    if design in ("log-sd 1.2", "capped"):
        return np.exp(np.log(LENGTH_MID) + rng.normal(0, 1.2, n))
    raise ValueError(f"design must be one of {DESIGNS}, not {design!r}")


@dataclass(frozen=True)
class Suite:
    """One simulated suite: per pair (bw, tokens, cw) and its prompt; per prompt the sums (bw, bn,
    cw, cn) over its pairs and its pair count `k`; the suite's true speedup."""

    pair: tuple
    prompt: np.ndarray
    sums: list
    k: np.ndarray
    truth: float


def suite(design: str, rng, n: int = SUITE, gain: str = "falling", slow: float = 0.0) -> Suite:
    """One suite; `gain`: the curve of the median gain in length (``GAINS``); `slow`: the share of
    prompts SLOW_GAIN x as fast whatever their length (a slow path the length does not show)."""
    length = lengths(design, rng, n)
    step = rng.lognormal(np.log(STEP_S), STEP_SD, n)
    curve, spread = GAINS[gain]
    speedup = curve(length) * np.exp(rng.normal(0, spread, n))
    if slow:   # drawn only here: the other rows keep their random stream
        speedup = np.where(rng.random(n) < slow, SLOW_GAIN, speedup)
    k = rng.integers(1, 4, n)
    prompt = np.repeat(np.arange(n), k)
    tokens = np.maximum(np.floor(length[prompt] * rng.uniform(0.6, 1.4, prompt.size)), 2.0)
    if design == "capped":
        tokens = np.minimum(tokens, CAP)
    mean_noise = np.exp(NOISE_SD ** 2 / 2)
    truth = (np.sum(step[prompt] * tokens * mean_noise + OVERHEAD_S)
             / np.sum((step / speedup)[prompt] * tokens * mean_noise + OVERHEAD_S))
    bw = step[prompt] * tokens * rng.lognormal(0, NOISE_SD, tokens.size) + OVERHEAD_S
    cw = (step / speedup)[prompt] * tokens * rng.lognormal(0, NOISE_SD, tokens.size) + OVERHEAD_S
    sums = [np.bincount(prompt, weights=x, minlength=n) for x in (bw, tokens, cw, tokens)]
    return Suite((bw, tokens, cw), prompt, sums, k, float(truth))


def timed(s: Suite, prompts, rng) -> list:
    """(bw, bn, cw, cn) of one pair of each of `prompts`, drawn at random: a run times one work
    (seed, temperature) of each prompt it samples."""
    prompts = np.asarray(prompts)
    first = np.cumsum(s.k) - s.k
    j = first[prompts] + (rng.random(prompts.size) * s.k[prompts]).astype(int)
    bw, tokens, cw = (x[j] for x in s.pair)
    return [bw, tokens, cw, tokens]


def timed_bounds(s: Suite, prompts, rng) -> tuple[float, float]:
    """(the suite bound, the bound on the timed prompts alone) with one pair of `prompts` timed."""
    sub = timed(s, prompts, rng)
    return (suite_bounds(sub, prompts, s.sums[1], s.k)[3],
            float(speed_bounds([x[None] for x in sub])[2][0]))


def sample(s: Suite, m: int, rng) -> np.ndarray:
    """The `m` prompts a run times: drawn by length (``speed_sample.by_length``, on each prompt's
    tokens per pair)."""
    return np.asarray(speed_sample.by_length(s.sums[1] / s.k, m, int(rng.integers(2 ** 62)), tokens=s.sums[1]))


def study(design: str, m: int, rng, gain: str = "falling", slow: float = 0.0) -> tuple[float, ...]:
    """(truth; the suite bound with the subset drawn by length; the suite bound and the bound on the
    timed prompts alone with a simple random subset) of one study."""
    s = suite(design, rng, gain=gain, slow=slow)
    by_length = timed_bounds(s, sample(s, m, rng), rng)
    return (s.truth, by_length[0], *timed_bounds(s, rng.choice(SUITE, m, replace=False), rng))


def operating(design: str, m: int, studies: int, rng, gain: str = "falling", slow: float = 0.0) -> dict:
    """Per way of bounding ("now": the suite bound on a subset by length; "random": the suite bound
    on a random subset; "alone": the timed prompts' own bound, random subset): coverage (no bound
    counting as covering), the share with no bound, the median bound / the suite's speedup (0
    where none: what a `min_speedup` can be shown) and that where a bound is given."""
    rows = np.array([study(design, m, rng, gain, slow) for _ in range(studies)])
    truth = rows[:, 0]
    out = {}
    for name, bound in (("now", rows[:, 1]), ("random", rows[:, 2]), ("alone", rows[:, 3])):
        given = np.isfinite(bound)
        out[name] = (Rate(float(np.mean(np.where(given, bound <= truth, True))), studies, None),
                     float(1 - given.mean()), float(np.median(np.where(given, bound, 0.0) / truth)),
                     float(np.median(bound[given] / truth[given])) if given.any() else float("nan"))
    return out


def report_lines(*, rng, grid: str = "full") -> list[str]:
    sizes, studies = pick((8, 10, 20, 50, 100), (10,), grid), pick(2000, 100, grid)
    out = [HEADING, "",
           f"Through `analysis.latency.suite_bounds` (what `paired_speedup(..., suite=...)` gives the speed gate; "
           f"harness/calibration/suite_speed.py, the model in its docstring), {studies:,} studies per row: a suite "
           f"of {SUITE} prompts, m of them timed, drawn by length as a run draws its speed sample "
           f"(`harness.run.speed_sample.by_length`: 1, 2 or 4 strata of equal baseline tokens, an equal share "
           f"each), the suite's speedup post-stratified on the same strata, the stratified jackknife on the log "
           f"scale; suite prompts over {UNSEEN_FACTOR:g}x longer than any timed one carrying over "
           f"{UNSEEN_MAX:.0%} of its tokens give no bound. Coverage of the one-sided 95% bound against the "
           f"suite's speedup (no bound counts as covering; target 0.945), the share with no bound, and the median "
           f"bound / the suite's speedup (0 where none: what a `min_speedup` can be shown; and where a bound is "
           f"given). One work (pair) of each timed prompt is timed, as in a run. The gain falls with length in "
           f"the issue's designs; rising, hump and step are there so that no one shape of gain is assumed; "
           f"'capped' cuts every output at {CAP} tokens (ties). The last row is a limit of any timed subset, "
           f"not a design the bound meets: 3% of prompts {SLOW_GAIN:g}x as fast whatever their length are all "
           f"missed by m timed prompts with probability 0.97^m; where such a slow path is possible, time more. "
           f"'random': the same bound with m prompts timed at random (the speed sample before issue 58's length "
           f"strata); 'alone': the bound on those timed prompts alone (`speed_bounds`, the speed gate's when "
           f"issue 58 was filed). ± 1.96 Monte Carlo SE.", "",
           "| design | gain | timed prompts | coverage | no bound | median bound / speedup | ... where given "
           "| coverage: random | no bound: random | median: random | coverage: alone | no bound: alone "
           "| median: alone |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for design, gain, slow in ROWS:
        label = f"{gain}, {slow:.0%} of prompts {SLOW_GAIN:g}x" if slow else gain
        for m in sizes:
            r = operating(design, m, studies, rng, gain, slow)
            (now, none, med, given), rand, alone = r["now"], r["random"], r["alone"]
            out.append(f"| {design} | {label} | {m} | {now.simulated:.3f} ± {1.96 * now.mc_se:.3f} | {none:.2f} | "
                       f"{med:.2f} | {given:.2f} | " + " | ".join(
                           f"{c.simulated:.3f} | {n:.2f} | {md:.2f}" for c, n, md, _ in (rand, alone)) + " |")
    return out + [""]
